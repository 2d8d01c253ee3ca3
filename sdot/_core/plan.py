"""From a solved problem to the transport plan's quantities.

Duplicates share their representative's cell: each gets the share of the
cell's mass proportional to its own mass, the cell's barycentre and weight.
Zero-mass Diracs get an empty cell and the weight
``min(psi) - D^2`` (D the diameter of the domain and the seeds), which keeps
their cell empty. Weights are reported with mean 0.

The solve runs in coordinates centred on the domain and scaled by its longest side
(:func:`normalised`): translating or scaling a problem (by a power of two) gives the
same computation, bit for bit, and W2^2 changes by the exact factor.
"""
from __future__ import annotations

import array_api_compat as aac

from . import _compat, evaluation, geometry, newton, periodic
from .gradients import GradientState
from .options import DEFAULT


def solve_plan(xp, prob, tol, max_iter, log=None, capacity=None, options=DEFAULT):
    """Solve ``prob`` with the Newton ``options`` (a :class:`.options.NewtonOptions`), or by
    the geometry's closed form if it has one (``solve``: 1D, :mod:`.linear`); a
    dict of arrays (see :class:`sdot.OtPlan`), with the ``solution``, the ``active`` mask,
    the :class:`GradientState` ``state`` and ``overflow`` (a cell needed more than
    ``capacity`` vertices, or a solve that did not converge rejected trials whose cells
    did: only under tracing)."""
    given = prob
    if prob.period is not None:             # the Diracs on the torus; the plan's arrays next to the given ones
        prob = prob._replace(seeds=periodic.fold_onto(xp, prob.seeds, prob.lo, prob.period))
    rep, active, targets = evaluation.group_duplicates(xp, prob.seeds, prob.masses)
    closed_form = getattr(geometry.of_seeds(prob.seeds), "solve", None)
    unit = prob
    if closed_form is not None:             # 1D: sorted, in closed form, in the problem's units
        sol = closed_form(xp, prob, active, targets, log=log)
    else:
        unit, scale = normalised(xp, prob)
        order = None if prob.period is not None else _spatial_order(xp, unit.seeds)
        if order is None:
            sol = newton.solve(xp, unit, tol, max_iter, active, targets, log=log, capacity=capacity, options=options)
        else:                               # renumbered so that neighbours are close in memory
            take = lambda a: xp.take(a, order, axis=0)      # noqa: E731
            sol = newton.solve(xp, unit._replace(seeds=take(unit.seeds), masses=take(unit.masses)), tol, max_iter,
                               take(active), take(targets), log=log, capacity=capacity, options=options)
            sol = _numbered_back(xp, sol, order)
        sol = sol._replace(psi=sol.psi * (scale * scale), evaluation=_in_units(xp, sol.evaluation, scale))
    out = _plan_arrays(xp, given, sol.evaluation.moments, sol.psi, rep, active, targets)
    state = GradientState(sol.evaluation.cells, sol.evaluation.moments, out.pop("psi"), rep, active, targets,
                          *_sites(xp, prob, unit, sol.evaluation.cells))
    return dict(out, residual=sol.residual, iterations=sol.iterations, converged=sol.converged,
                solution=sol, active=active, state=state, overflow=xp.any(sol.evaluation.cells.overflow) | (sol.trials_overflowed & ~sol.converged),
                status=sol.status)


def _sites(xp, prob, unit, cells):
    """``(sites, owner)`` of ``cells`` on a periodic domain (:mod:`.periodic`) in ``prob``'s units
    (the images those of the solve in ``unit`` coordinates), else ``(None, None)``."""
    if prob.period is None:
        return None, None
    return periodic.sites_of(xp, prob, cells, units=unit)


def _spatial_order(xp, seeds):
    """Where the compiled kernels run (:func:`.._compat.compiled_call`), an order of the seeds in
    which neighbours are close (:func:`sdot._host.compiled.tree.spatial_order`); else None."""
    def kernel(points):
        from .._host.compiled import tree

        return (tree.spatial_order(points),)
    found = _compat.compiled_call(xp, kernel, seeds)
    return None if found is None else found[0]


def _numbered_back(xp, sol, order):
    """The :class:`.evaluation.Solution` of the seeds ``seeds[order]`` for the seeds themselves: its
    rows in their order, the cells' neighbour labels renamed."""
    n = order.shape[0]
    dev = aac.device(order)
    inverse = _compat.put_rows(xp, xp.zeros((n,), dtype=order.dtype, device=dev), order,
                               xp.arange(n, dtype=order.dtype, device=dev))
    rows = lambda a: xp.take(a, inverse, axis=0)            # noqa: E731
    cells = sol.evaluation.cells
    fields = {}
    for name, a in zip(cells._fields, cells):
        if name == "labels":                # neighbour j of the renumbered seeds is order[j]
            named = xp.reshape(xp.take(order, xp.reshape(xp.where(a >= 0, a, 0), (-1,))), a.shape)
            a = xp.where(a >= 0, named, a)
        if name != "certified":
            fields[name] = rows(a)
    ev = sol.evaluation._replace(cells=cells._replace(**fields), moments=rows(sol.evaluation.moments),
                                 facet=rows(sol.evaluation.facet))
    return sol._replace(psi=rows(sol.psi), evaluation=ev)


@_compat.jit_on_jax()
def normalised(xp, prob):
    """``prob`` in coordinates centred on the domain and divided by its longest side L
    (the density times L^d, so that masses are unchanged), and L."""
    centre = 0.5 * (prob.lo + prob.hi)
    scale = xp.max(prob.hi - prob.lo)
    period = None if prob.period is None else prob.period / scale
    return prob._replace(seeds=(prob.seeds - centre) / scale, density=prob.density.normalised(centre, scale),
                         period=period), scale


@_compat.jit_on_jax()
def _in_units(xp, ev, scale):
    """An evaluation of :func:`normalised` coordinates in the problem's: vertices (relative
    to the seeds) times L, first moments times L, second moments times L^2, facet
    integrals divided by L."""
    first = [scale] * (ev.moments.shape[1] - 2)
    factors = xp.stack([xp.ones_like(scale)] + first + [scale * scale])
    return ev._replace(cells=ev.cells._replace(vertices=ev.cells.vertices * scale),
                       moments=ev.moments * factors[None, :], facet=ev.facet / scale)


@_compat.jit_on_jax()
def _plan_arrays(xp, prob, mom, psi_opt, rep, active, targets):
    seeds, masses = prob.seeds, prob.masses
    g = mom[:, 0]
    has_mass = g > 0
    safe = xp.where(has_mass, g, 1.0)
    bary = seeds + xp.where(has_mass[:, None], mom[:, 1:-1] / safe[:, None], 0.0)
    # means of points of the domain: in it, whatever the rounding (FP32: a cell of mass 3e-8
    # beside the domain's side had its barycentre 2.5e-5 outside)
    if prob.period is None:     # (on a torus, next to the Dirac: it may be beyond a side)
        bary = xp.where(has_mass[:, None], xp.minimum(xp.maximum(bary, prob.lo[None, :]), prob.hi[None, :]), bary)
    group_mass = xp.take(targets, rep)
    share = xp.where(group_mass > 0, masses / xp.where(group_mass > 0, group_mass, 1.0), 0.0)
    cell_masses = xp.take(g, rep) * share
    barycenters = xp.take(bary, rep, axis=0)
    count = xp.maximum(xp.sum(xp.astype(active, psi_opt.dtype)), 1.0)
    centred = xp.where(active, psi_opt - xp.sum(xp.where(active, psi_opt, 0.0)) / count, 0.0)
    lives = xp.take(active, rep)
    diam2 = evaluation.squared_diameter(xp, seeds, prob.lo, prob.hi)
    psi_min = xp.min(xp.where(active, centred, xp.inf))
    psi = xp.where(lives, xp.take(centred, rep), psi_min - diam2)
    n_lives = xp.maximum(xp.sum(xp.astype(lives, psi.dtype)), 1.0)
    psi = psi - xp.sum(xp.where(lives, psi, 0.0)) / n_lives
    distance = xp.asarray(xp.sum(xp.where(active, mom[:, -1], 0.0)))
    return dict(distance=distance, barycenters=barycenters, cell_masses=cell_masses,
                brenier_potential=psi, psi=centred)


def diagram(xp, seeds, psi, density):
    """Cells and per-cell moments of the power diagram ``(seeds, psi)`` in the box of
    ``density`` (a kind of :mod:`.density`).

    Of exact duplicates, the one of largest weight keeps the cell (the first
    on ties); the others are empty.
    """
    _, active, _ = evaluation.group_duplicates(xp, seeds, xp.ones_like(psi), psi)
    prob = evaluation.Problem(seeds, None, density)
    return grown_until_fits(lambda capacity: evaluation.evaluate(xp, prob, psi, active, capacity=capacity),
                            lambda ev: xp.any(ev.cells.overflow), seeds.shape[1])


def diagram_on_torus(xp, seeds, psi, density, period):
    """``(evaluation, sites, owner)``: :func:`diagram` on the torus of ``period`` (:mod:`.periodic`),
    with the sites of its cells and the seed of each."""
    period = xp.asarray(period, dtype=seeds.dtype, device=aac.device(seeds))
    seeds = periodic.fold_onto(xp, seeds, density.lo, period)
    _, active, _ = evaluation.group_duplicates(xp, seeds, xp.ones_like(psi), psi)
    prob = evaluation.Problem(seeds, None, density, period)
    ev = grown_until_fits(lambda capacity: evaluation.evaluate(xp, prob, psi, active, capacity=capacity),
                          lambda ev: xp.any(ev.cells.overflow), seeds.shape[1])
    return (ev,) + periodic.sites_of(xp, prob, ev.cells)


def evaluation_at(xp, prob, psi, active, with_sites=False):
    """The :class:`.evaluation.Evaluation` (cells, moments, facet integrals) of ``prob`` at the
    weights ``psi`` (in the problem's units) for the ``active`` Diracs, computed as
    :func:`solve_plan` computes its last one: in :func:`normalised` coordinates (in 1D, in
    the problem's), brought back to the problem's units. What a solve's derivatives need,
    rebuilt from its weights without a Newton step. ``with_sites``: and the ``(sites, owner)``
    of its cells on a periodic domain (``(None, None)`` else), as :func:`solve_plan`'s state."""
    if prob.period is not None:
        prob = prob._replace(seeds=periodic.fold_onto(xp, prob.seeds, prob.lo, prob.period))
    if getattr(geometry.of_seeds(prob.seeds), "solve", None) is not None:
        ev = grown_until_fits(lambda capacity: evaluation.evaluate(xp, prob, psi, active, capacity=capacity),
                              lambda ev: xp.any(ev.cells.overflow), prob.seeds.shape[1])
        return (ev, _sites(xp, prob, prob, ev.cells)) if with_sites else ev
    unit, scale = normalised(xp, prob)
    ev = grown_until_fits(lambda capacity: evaluation.evaluate(xp, unit, psi / (scale * scale), active,
                                                           capacity=capacity),
                          lambda ev: xp.any(ev.cells.overflow), prob.seeds.shape[1])
    ev = _in_units(xp, ev, scale)
    return (ev, _sites(xp, prob, unit, ev.cells)) if with_sites else ev


def grown_until_fits(run, overflowed, dim=2):
    """``run(capacity)`` from the ``CAPACITY`` of the geometry of dimension ``dim`` (:mod:`.geometry`), run again with twice
    as many (up to 1024) while ``overflowed(result)``. Eagerly the cells grow by
    themselves; with static shapes they cannot, and only a concrete flag can be retried
    (traced, the overflow is reported: the solve gives nan)."""
    capacity = geometry.of(dim).CAPACITY
    while True:
        out = run(capacity)
        flag = overflowed(out)
        if _compat.is_traced(flag) or capacity >= 1024 or not bool(flag):
            return out
        capacity *= 2
