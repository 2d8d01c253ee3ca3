"""Partial transport: a source lighter than the target (damped Newton on capped cells).

Dirac i takes its mass ``m_i`` from its capped cell ``C_i = L_i & B_i``, its Laguerre cell cut
by the ball ``B_i = {|x - y_i|^2 <= psi_i}``; the density outside every ball stays. The
weights solve ``G(psi) = m`` with ``G_i`` the mass of ``C_i`` (they maximise the concave dual
``sum_i m_i psi_i + int min(min_i |x - y_i|^2 - psi_i, 0) rho``; no gauge: the balls fix them).
The Jacobian is the weighted Laplacian of :mod:`.newton_matrix` (its facets cut by the balls)
plus the diagonal ``A_ii = (int of rho along the arcs of C_i) / (2 sqrt(psi_i))``: symmetric
and positive definite where each group of neighbouring cells has an arc. The steps are damped by
the rules of :mod:`.newton`, written once in :mod:`.damping` (Kitagawa, Merigot and Thibert): every
cell keeps at least half the smallest of its target and its first mass, and the error norm falls by
``1 - t / 2``. The loop is its own (eager, no hiding bound); where its steps stall on a density
with zero regions, it goes on over uniform backgrounds (:func:`background_levels`), not blurred.

The start: see :func:`initial_weights`.

1D grids of any degree and 2D grids of one value per cell, eagerly (the public layer,
:mod:`sdot._partial`, brings JAX arrays to the host); the other cases are refused by
:func:`check_supported`.
"""
from __future__ import annotations

import math

import array_api_compat as aac

from . import _compat, damping, geometry, newton, periodic
from .evaluation import CONVERGED, MAX_ITERATIONS, STALLED, Evaluation, Solution
from .newton_matrix import _facet_entries
from .options import DEFAULT
from .linear import capped as linear_capped
from .planar import capped as planar_capped



def capped(seeds):
    """The module of the integrals over cells cut by balls in the seeds' dimension (1 or 2)."""
    return linear_capped if seeds.shape[1] == 1 else planar_capped


def check_supported(dim, pixels):
    """Raise ``NotImplementedError`` for the partial transport this version does not solve
    (``pixels``: the density has one value per grid cell)."""
    if dim not in (1, 2):
        raise NotImplementedError(f"partial transport (a target heavier than the source) is solved in 1D and 2D; "
                                  f"this source is {dim}D")
    if not pixels and dim != 1:
        raise NotImplementedError("partial transport is solved against grids of one value per cell "
                                  "(Grid / PolynomialGrid of degree 0) in 2D, and against polynomial and spline "
                                  "grids in 1D only; this target is a 2D polynomial or spline grid")


def evaluate(xp, prob, psi, active, previous=None):
    """``(Evaluation, arc)`` of the capped cells at weights ``psi`` (``arc``: per cell the
    density along its arcs); ``previous``: cells at other weights, updated (see
    :func:`.planar.power_cells`). On a periodic domain the cells are those of the sites (the
    seeds and their images, :func:`.periodic.diagram_of_sites`), their integrals folded onto
    the seeds."""
    if prob.period is None:
        cells = geometry.of_seeds(prob.seeds).power_cells(xp, prob.seeds, psi, active, prob.lo, prob.hi,
                                                          previous=previous)
    else:
        cells = periodic.diagram_of_sites(xp, prob, psi, active, previous=previous)[0]
    moments, facet, arc = capped_at(xp, prob, cells, xp.where(active, psi, 0.0))
    return Evaluation(cells, moments, facet), arc


def capped_at(xp, prob, cells, psi):
    """``(moments, facet, arc)`` of :func:`.planar.capped.capped_integrals` (or the line's) of the
    ``cells`` cut by the balls of weights ``psi``; on a periodic domain, of the cells of its
    sites, the moments and arcs folded onto the seeds."""
    if prob.period is None:
        return capped(prob.seeds).capped_integrals(xp, prob.seeds, cells, psi, prob.density.values, prob.lo, prob.hi)
    sites, owner = periodic.sites_of(xp, prob, cells)
    n = prob.seeds.shape[0]
    moments, facet, arc = capped(prob.seeds).capped_integrals(xp, sites, cells, xp.take(psi, owner),
                                                              prob.density.values, prob.lo, prob.hi)
    return periodic.folded_rows(xp, moments, owner, n), facet, periodic.folded_rows(xp, arc, owner, n)


def _direction(xp, prob, ev, arc, psi, active, rhs, solver, rtol):
    """Solve ``(D + A - W) d = rhs`` (see the module docstring) to the relative residual ``rtol``."""
    if prob.period is None:
        rows, cols, w = _facet_entries(xp, prob.seeds, ev.cells, ev.facet)
    else:
        sites, owner = periodic.sites_of(xp, prob, ev.cells)
        rows, cols, w = periodic.folded_entries(xp, *_facet_entries(xp, sites, ev.cells, ev.facet), owner)
    n = psi.shape[0]
    radius = xp.sqrt(xp.where(active, psi, 1.0))
    diag = _compat.segment_sum(xp, w, rows, n) + xp.where(active, arc / (2.0 * radius), 1.0)
    return xp.where(active, solver.solve(xp, rows, cols, w, diag, xp.where(active, rhs, 0.0), rtol, fresh=None), 0.0)


def _reach(xp, cells):
    """Per cell the squared distance from its seed to its farthest vertex."""
    k = xp.arange(cells.vertices.shape[1], device=aac.device(cells.vertices))[None, :]
    return xp.max(xp.where(k < cells.count[:, None], xp.sum(cells.vertices * cells.vertices, axis=2), 0.0), axis=1)


def initial_weights(xp, prob, active, targets, options=DEFAULT, max_iter=300):
    """Equal weights ``psi_i = c``: the Voronoi cells cut by balls of one radius, each holding
    mass wherever the density is positive about its Dirac. ``c`` is about the smallest at which
    every capped cell holds ``options.partial_start_share`` of its target, or of its Voronoi cell's mass if
    that is less (``options.partial_start_bisections`` bisections of ``log c``: the cells do not change
    with ``c``), between the
    ``c`` at which no ball can hold the smallest target and the one at which every ball holds its
    whole cell.

    If a Voronoi cell holds less than ``options.partial_start_least`` of its target (Diracs far
    from the support, zero regions between them, clusters), the start is :func:`balanced_start`."""
    if prob.period is None:
        cells = geometry.of_seeds(prob.seeds).power_cells(xp, prob.seeds, xp.zeros_like(targets), active,
                                                          prob.lo, prob.hi)
    else:
        cells = periodic.diagram_of_sites(xp, prob, xp.zeros_like(targets), active)[0]
    ones = xp.where(active, xp.ones_like(targets), 0.0)
    at = lambda c: capped_at(xp, prob, cells, c * ones)      # noqa: E731
    high = 1.01 * float(xp.max(_reach(xp, cells)))
    moments, facet, arc = at(high)
    if bool(xp.any(active & (moments[:, 0] <= options.partial_start_least * targets))):
        return balanced_start(xp, prob, active, targets, options, max_iter)
    goal = options.partial_start_share * xp.minimum(targets, moments[:, 0])
    low = float(xp.min(xp.where(active, goal, xp.inf))) / (math.pi * float(xp.max(prob.density.values)))
    for _ in range(options.partial_start_bisections):
        mid = math.sqrt(low * high)
        found = at(mid)
        if bool(xp.all(xp.where(active, found[0][:, 0] >= goal, True))):
            high, (moments, facet, arc) = mid, found
        else:
            low = mid
    return high * ones, Evaluation(cells, moments, facet), arc


def _total_mass(xp, prob):
    """The density's mass: per grid cell its volume times its mean value (that of its Bernstein
    coefficients, for a polynomial grid)."""
    values, dim = prob.density.values, prob.seeds.shape[1]
    means = xp.mean(values, axis=-1) if values.ndim > dim else values
    cells = xp.asarray(means.shape, dtype=prob.hi.dtype, device=aac.device(values))
    return float(xp.sum(means) * xp.prod((prob.hi - prob.lo) / cells))


def balanced_start(xp, prob, active, targets, options=DEFAULT, max_iter=300):
    """The balanced transport's cells ``L_i`` (weights ``w``) to the target scaled to the
    source's mass, each holding its target times ``M_t / M_s``, cut by the balls of weights
    ``psi_i = w_i + c`` (the cells do not change with ``c``), ``c`` the smallest at which
    every cut cell holds ``options.partial_balanced_share`` of its target (bisection; the
    balanced solve takes at most ``max_iter`` steps). Every
    cell then holds mass, but the balls cover most cells whole (no arc: the Newton matrix is a
    Laplacian there), and the steps are short: 1,000 to 10,000 Diracs uniform in the unit square
    over a 20x20 square of a 64x64 image take 38 to 139 steps (7 or 8 for their balanced transport)."""
    ratio = _total_mass(xp, prob) / float(xp.sum(xp.where(active, targets, 0.0)))
    smallest = float(xp.min(xp.where(active, targets, xp.inf)))
    balanced = newton.solve(xp, prob, options.partial_balanced_tol * smallest * ratio, max_iter, active,
                            targets * ratio, options=options)
    w, cells = balanced.psi, balanced.evaluation.cells
    reach = _reach(xp, cells)
    at = lambda c: capped_at(xp, prob, cells, xp.where(active, w + c, 0.0))      # noqa: E731
    low = float(xp.max(xp.where(active, -w, -xp.inf)))          # a ball of radius 0
    if prob.period is not None:         # per site: the farthest of all bounds each seed's
        reach = xp.full(w.shape, xp.max(reach), dtype=w.dtype, device=aac.device(w))
    high = float(xp.max(xp.where(active, reach - w, -xp.inf))) + 1e-3 * float(xp.max(reach))   # every cell whole
    goal = options.partial_balanced_share * targets
    found = at(high)
    for _ in range(options.partial_balanced_bisections):
        mid = 0.5 * (low + high)
        trial = at(mid)
        if bool(xp.all(xp.where(active, trial[0][:, 0] >= goal, True))):
            high, found = mid, trial
        else:
            low = mid
    moments, facet, arc = found
    return xp.where(active, w + high, 0.0), Evaluation(cells, moments, facet), arc


def background_levels(xp, values, options):
    """The uniform backgrounds ``eps_k`` added to a density with zero regions after the steps
    stalled on it, before it is solved itself again (``[]`` for a positive density): ``options.partial_background`` times its mean value,
    divided by ``options.partial_background_factor`` at each of ``options.partial_background_stages``
    stages.

    Where a group of cells holds a piece of the support whole, its balls' edges in the zero region
    (no arc, its rows of the Newton matrix a Laplacian), the group's weights can shift together
    without changing its masses: a null direction, and the damped Newton method stalls (800 Diracs
    uniform in the square over two squares on black, 300 in a cluster over them: 6 of 12 such cases
    stalled). Over a background every ball's edge has density; each stage starts from the last
    one's weights, and the density itself from weights where each cell holds within
    ``options.partial_stage_tol`` of its target against the last background (2 or 3 steps there).
    """
    if not bool(xp.any(values <= 0)):
        return []
    mean = float(xp.mean(values))
    return [options.partial_background * mean / options.partial_background_factor ** k
            for k in range(options.partial_background_stages)]


def solve(xp, prob, tol, max_iter, active, targets, log=None, options=None):
    """Damped Newton for partial transport: a :class:`.evaluation.Solution` (``width`` 0) from
    :func:`initial_weights` by :func:`_newton`; if its steps stall, on from there through the
    backgrounds of :func:`background_levels` (``max_iter`` counts the steps of all stages)."""
    options = DEFAULT if options is None else options
    solver = options.linear.solver()
    values = prob.density.values
    smallest_target = float(xp.min(xp.where(active, targets, xp.inf)))
    psi, ev, arc = initial_weights(xp, prob, active, targets, options, max_iter)
    psi, ev, arc, err, it, status, last = _newton(xp, prob, tol, max_iter, 0, active, targets, psi, ev, arc, solver,
                                                  log, options)
    if status == STALLED:
        for level in background_levels(xp, values, options) + [0.0]:
            stage = prob if level == 0 else prob._replace(density=prob.density._replace(values=values + level))
            ev, arc = evaluate(xp, stage, psi, active)
            stage_tol = tol if level == 0 else max(tol, options.partial_stage_tol * smallest_target)
            psi, ev, arc, err, it, status, last = _newton(xp, stage, stage_tol, max_iter, it, active, targets, psi,
                                                          ev, arc, solver, log, options)
    dev = aac.device(psi)
    real = lambda v: xp.asarray(v, dtype=psi.dtype, device=dev)       # noqa: E731
    return Solution(psi, ev, real(err), xp.asarray(it, device=dev), xp.asarray(status == CONVERGED, device=dev),
                    xp.asarray(status, device=dev), real(0.0), real(last), xp.asarray(False, device=dev))


def _newton(xp, prob, tol, max_iter, it, active, targets, psi, ev, arc, solver, log, options):
    """Damped Newton steps from ``psi`` (its evaluation ``ev`` and ``arc``) until the max cell-mass
    error is at most ``tol``, ``it`` reaches ``max_iter`` or the steps stall: ``(psi, ev, arc, err, it,
    status, last damping)``. By the rules of :mod:`.damping` (the first trial, the backtracking, the
    damping test, the stall rule and the linear solve's forcing; the :class:`.options.NewtonOptions`
    ``options``). No hiding bound: instead the first trial lowers no weight ``psi_i``
    by more than ``options.partial_shrink`` of it (a ball shrunk to nothing holds no mass: on
    the Gaussian image at 1e4 Diracs most trials were refused for it, 30 evaluations for 8
    steps, 1.37 s; with 0.9, 0.63 s). A trial whose step would leave cells below the floor is
    tried once more with those cells' weights kept (from the balanced start, whose balls cover
    most cells whole, the Newton step shrinks them all and the cells that barely reach the
    support fall first: 1,000 Diracs over a 20x20 square of a 64x64 image took 121 steps
    without it, 23 with)."""
    dev = aac.device(psi)
    real = lambda v: xp.asarray(v, dtype=psi.dtype, device=dev)       # noqa: E731

    def errors(ev):
        e = xp.where(active, targets - ev.moments[:, 0], 0.0)
        return e, float(xp.max(xp.abs(e))), float(xp.sqrt(xp.sum(e * e)))

    def smallest(x):
        return float(xp.min(xp.where(active, x, xp.inf)))

    e, err, norm = errors(ev)
    floor = float(damping.mass_floor(xp, targets, ev.moments[:, 0], active))
    spread = smallest(targets) / float(xp.max(xp.where(active, targets, 0.0)))
    stalls, first, last = 0, 1.0, 1.0
    while err > tol and it < max_iter and not damping.stopped(stalls, options):
        rtol = damping.linear_rtol(xp, tol, real(norm), real(last), spread, options)
        d = _direction(xp, prob, ev, arc, psi, active, e, solver, rtol)
        t = first
        falling = active & (d < 0)          # no ball shrinks to nothing: psi_i falls by partial_shrink at most
        if bool(xp.any(falling)):
            reach = xp.where(falling, psi / xp.where(falling, -d, 1.0), xp.inf)
            t = min(t, options.partial_shrink * float(xp.min(reach)))

        def attempt(t):
            trial = xp.where(active, psi + t * d, 0.0)
            new, new_arc = evaluate(xp, prob, trial, active, previous=ev.cells)
            low = active & (new.moments[:, 0] < floor)
            if bool(xp.any(low)):           # these cells keep their weights: try again once
                trial = xp.where(low, psi, trial)
                new, new_arc = evaluate(xp, prob, trial, active, previous=ev.cells)
            e_new, err_new, norm_new = errors(new)
            ok = damping.accepted(bool(new.cells.certified), smallest(new.moments[:, 0]), floor, norm_new, norm, t)
            return (trial, new, new_arc, e_new, err_new, norm_new), bool(ok)

        t, found, ok = damping.backtracking(t, attempt, options)
        if ok:
            psi, ev, arc, e, err, norm = found
            first = float(damping.next_first(xp, real(t), real(first), options))
        stalls = int(damping.stalls_after(xp, xp.asarray(ok, device=dev), real(t), xp.asarray(stalls, device=dev), options))
        last = t if ok else 0.0
        it += 1
        if log is not None:
            log(it, err, last, 0.0)
    status = CONVERGED if err <= tol else STALLED if damping.stopped(stalls, options) else MAX_ITERATIONS
    return psi, ev, arc, err, it, status, last
