"""The public route of partial transport: a target heavier than the source (see
:mod:`._core.partial`).

The solve runs eagerly: NumPy and torch through the array API, JAX (concrete arrays, and
``jax.grad``/``jax.jvp`` outside ``jit``) on NumPy views of the primal values, the results
converted back; under ``jax.jit`` (on the CPU) in one host callback. ``distance`` is
differentiable to first order with respect to the Dirac positions, their masses and the pixel
values, with the formulas at the optimum (envelope theorem on the dual
``sum_i m_i psi_i + int min(min_i |x - y_i|^2 - psi_i, 0) rho``):

    dW/dy_i = 2 m_i (y_i - b_i),   dW/dm_i = psi_i,   dW/drho = min(min_i |x - y_i|^2 - psi_i, 0),

the last integrated over each pixel (``capped_polynomial_integrals`` of :mod:`._core.planar.capped`,
:mod:`._core.linear.capped`).
The plan's other arrays are not differentiable yet: a derivative of them raises (torch) or is
NaN (JAX). What is not solved is refused before any work with ``NotImplementedError``.
"""
from __future__ import annotations

import functools

import array_api_compat as aac
import numpy as np

from . import _autodiff, _driver, _jax_host
from ._core import _compat, evaluation, partial, periodic, plan
from ._core.density import PixelDensity, grid_density
from ._core.options import DEFAULT

#: Relative difference of total masses below which the transport is balanced.
BALANCED = 1e-6
_PLAN_ARRAYS = ("barycenters", "brenier_potential", "cell_masses")


def is_partial(total_source, total_target):
    """Whether a target of mass ``total_target`` is heavier than the source beyond rounding;
    a heavier source raises ``NotImplementedError``."""
    if total_source > total_target * (1.0 + BALANCED):
        raise NotImplementedError(f"the source (mass {total_source}) is heavier than the target (mass "
                                  f"{total_target}): only a source lighter than the target (partial transport: "
                                  "each Dirac takes its mass from the density near it) or of equal mass is solved")
    return total_source < total_target * (1.0 - BALANCED)


def _host_problem(xp, prob):
    """The problem cut from autodiff, on NumPy views for JAX (None under ``jax.jit``)."""
    cut = evaluation.Problem(_autodiff.detach(prob.seeds), _autodiff.detach(prob.masses),
                             type(prob.density)(*(_autodiff.detach(a) for a in prob.density)), prob.period)
    if not aac.is_jax_namespace(xp):
        return cut
    views = _driver.host_views(cut.seeds, cut.masses, *cut.density)
    return None if views is None else evaluation.Problem(views[0], views[1], type(prob.density)(*views[2:]),
                                                         prob.period)


def check(xp, prob, tol, max_iter):
    """The problem to solve (see :func:`_host_problem`; None: traced JAX, solved in a host
    callback), or ``NotImplementedError`` for the partial transport not solved yet (see
    :func:`._core.partial.check_supported`)."""
    partial.check_supported(prob.seeds.shape[1], isinstance(prob.density, PixelDensity))
    host = _host_problem(xp, prob)
    if host is None:
        cut = evaluation.Problem(*(_autodiff.detach(a) for a in (prob.seeds, prob.masses)), prob.density)
        if not _jax_host.takes(xp, cut) or _driver.is_tracer(tol) or _driver.is_tracer(max_iter):
            raise NotImplementedError("partial transport under jax.jit runs in a host callback on the CPU "
                                      "(jit_route='callback', the default), with tol and max_iter static")
    elif _compat.static_shapes(host.seeds):
        raise NotImplementedError("partial transport is solved with data-dependent shapes: not on a static-shape "
                                  "namespace yet")
    return host


def solve_arrays(xp, prob, tol, max_iter, log=None, options=DEFAULT):
    """The plan's arrays (a dict, see :class:`sdot.OtPlan`), the solution, the active Diracs
    and, on a periodic domain, the ``(sites, owner)`` of its cells (else ``(None, None)``), in
    ``prob``'s units."""
    given = prob
    if prob.period is not None:         # the Diracs on the torus; the plan's arrays next to the given ones
        prob = prob._replace(seeds=periodic.fold_onto(xp, prob.seeds, prob.lo, prob.period))
    rep, active, targets = evaluation.group_duplicates(xp, prob.seeds, prob.masses)
    unit, scale = plan.normalised(xp, prob)
    sol = partial.solve(xp, unit, tol, max_iter, active, targets, log=log, options=options)
    sol = sol._replace(psi=sol.psi * (scale * scale), evaluation=plan._in_units(xp, sol.evaluation, scale))
    out = plan._plan_arrays(xp, given, sol.evaluation.moments, sol.psi, rep, active, targets)
    sites = plan._sites(xp, prob, unit, sol.evaluation.cells)
    lives = xp.take(active, rep)
    out["brenier_potential"] = xp.where(lives, xp.take(sol.psi, rep), 0.0)   # fixed by the balls: no gauge
    del out["psi"]
    return dict(out, residual=sol.residual, iterations=sol.iterations, converged=sol.converged,
                status=sol.status), sol, active, sites


def _pixel_gradients(xp, host, sol, active, sites):
    """``dW/drho`` per pixel: ``int_pixel min(min_i |x - y_i|^2 - psi_i, 0)`` (on a periodic
    domain, over the cells of the ``sites`` of :func:`solve_arrays`)."""
    zero = xp.zeros_like(sol.psi)
    live = xp.where(active, xp.ones_like(sol.psi), 0.0)
    first = [zero] * host.seeds.shape[1]
    coefficients = xp.stack([-sol.psi * live] + first + [live], axis=1)
    psi = xp.where(active, sol.psi, 0.0)
    sites, owner = sites
    if owner is None:
        sites = host.seeds
    else:
        coefficients, psi = xp.take(coefficients, owner, axis=0), xp.take(psi, owner)
    return partial.capped(host.seeds).capped_polynomial_integrals(
        xp, sites, sol.evaluation.cells, psi, coefficients, host.lo, host.hi, tuple(host.density.values.shape))


def plan_of(xp, prob, tol, max_iter, log, options=DEFAULT):
    """``(fields, solution, active, host problem)`` of the partial plan of ``prob``: its arrays
    in ``prob``'s framework, ``distance`` differentiable (see the module docstring); traced JAX
    (``jax.jit``): ``(fields, None, None, None)``, solved in one host callback."""
    host = check(xp, prob, tol, max_iter)
    inputs = (prob.seeds, prob.masses, prob.density.values, prob.lo, prob.hi)
    if host is None:
        fields, state = _traced_fields(prob, tol, max_iter, options)
        sol = active = sites = None
    else:
        hxp = _compat.namespace(host.seeds)
        out, sol, active, sites = solve_arrays(hxp, host, tol, max_iter, log, options)
        like = _autodiff.detach(prob.seeds)
        back = (lambda a: _driver.convert_like(np.asarray(a), like)) if hxp is not xp else (lambda a: a)
        fields = {k: back(v) for k, v in out.items()}
        state = None
        if any(_is_recorded(a) for a in inputs):
            pixels = _pixel_gradients(hxp, host, sol, active, sites) if _is_recorded(prob.density.values) else None
            state = (back(_seeds_gradient(out, host)), back(out["brenier_potential"]))
            state += () if pixels is None else (back(pixels),)
    if state is not None:
        fields["distance"] = _autodiff.attach(fields["distance"], inputs, state, _distance_gradients)
        for k in _PLAN_ARRAYS:
            fields[k] = _autodiff.not_differentiable(fields[k], inputs, f"the partial plan's {k}")
    return fields, sol, active, host, sites


class DistanceRule:
    """NumPy's :meth:`sdot.OtPlan.jvp` and :meth:`sdot.OtPlan.vjp` of a partial plan: those of
    its ``distance`` alone, from the gradients at the optimum (the module docstring), computed
    on the first call by ``gradients() -> (dW/dseeds, dW/dmasses, dW/dvalues)``."""

    outputs = ("distance",)

    def __init__(self, gradients):
        self._gradients, self._kept = gradients, None

    def _grads(self):
        if self._kept is None:
            self._kept = tuple(np.asarray(g) for g in self._gradients())
        return self._kept

    def jvp(self, lin, tangents):
        """``(dW,)`` along the problem's tangents ``(seeds, masses, values, lo, hi)``."""
        if tangents[3] is not None or tangents[4] is not None:
            raise NotImplementedError("OtPlan.jvp of a partial transport plan along the grid's domain is not "
                                      "implemented yet")
        total = sum(float(np.sum(t * g)) for t, g in zip(tangents[:3], self._grads()) if t is not None)
        return (np.asarray(total, dtype=self._grads()[0].dtype),)

    def vjp(self, lin, cotangents, needs):
        """The problem's cotangents ``(seeds, masses, values, None, None)`` of ``(distance, ...)``."""
        if any(np.any(c != 0) for c in cotangents[1:]):
            raise NotImplementedError("OtPlan.vjp of a partial transport plan is that of its distance: the "
                                      "barycenters, brenier_potential and cell_masses are not differentiable yet")
        return tuple(cotangents[0] * g for g in self._grads()) + (None, None)


def numpy_rule(host, out, sol, active, sites):
    """The :class:`DistanceRule` of a plan solved on NumPy (``out``: its arrays; ``sites``: those of
    :func:`solve_arrays`)."""
    return DistanceRule(lambda: (_seeds_gradient(out, host), out["brenier_potential"],
                                 _pixel_gradients(np, host, sol, active, sites)))


def _seeds_gradient(out, host):
    """``2 m_i (y_i - b_i)`` (the cell masses are the Dirac masses)."""
    return 2.0 * out["cell_masses"][:, None] * (host.seeds - out["barycenters"])


_TRACED = ("distance", "barycenters", "brenier_potential", "cell_masses", "residual", "converged", "iterations",
           "status")


def _traced_fields(prob, tol, max_iter, options):
    """The fields and the gradients' state of a traced JAX problem, from one host callback;
    ``distance`` is NaN where the solve did not converge (nothing can be raised under jit)."""
    import jax.numpy as jnp

    n, d = prob.seeds.shape
    real = np.dtype(prob.seeds.dtype)
    integer = np.dtype(jnp.asarray(0).dtype)
    shapes = (((), real), ((n, d), real), ((n,), real), ((n,), real), ((), real), ((), np.dtype(bool)),
              ((), integer), ((), integer), ((n, d), real), (tuple(prob.density.values.shape), real))
    arrays = [_autodiff.detach(a) for a in (prob.seeds, prob.masses, prob.density.values, prob.lo, prob.hi)]
    period = None if prob.period is None else np.asarray(prob.period, dtype=np.float64)
    results = _jax_host._callback(functools.partial(_on_host, float(tol), int(max_iter), options, period), shapes,
                                  *arrays)
    fields = dict(zip(_TRACED, results[:8]))
    fields["distance"] = jnp.where(fields["converged"], fields["distance"], jnp.nan)
    return fields, (results[8], fields["brenier_potential"], results[9])


def _on_host(tol, max_iter, options, period, seeds, masses, values, lo, hi):
    """The host side of :func:`_traced_fields` (NumPy in and out; ``period`` of a periodic domain)."""
    host = evaluation.Problem(seeds, masses, grid_density(values, lo, hi),
                              None if period is None else np.asarray(period, dtype=seeds.dtype))
    with _driver.quiet_int64():
        out, sol, active, sites = solve_arrays(np, host, tol, max_iter, options=options)
        pixels = _pixel_gradients(np, host, sol, active, sites)
    return tuple(out[k] for k in _TRACED) + (_seeds_gradient(out, host), pixels)


class _PartialItems(_autodiff.ItemState):
    """The partial solves of one call under ``torch.func`` transforms, one per item (of a
    ``vmap``), kept under the values of its inputs: the gradients of each item's W2^2 are read
    there (or solved again)."""

    def __init__(self, tol, max_iter, log, raise_on_failure, options, period):
        self.tol, self.max_iter, self.log, self.options, self.period, self.items = (tol, max_iter, log, options,
                                                                                    period, {})
        self.raise_on_failure = raise_on_failure

    def solve(self, seeds, masses, values, lo, hi):
        """The fields :data:`_TRACED` of one item (plain tensors), solved and kept."""
        xp = _driver.namespace(seeds)
        period = None if self.period is None else xp.asarray(self.period, dtype=seeds.dtype, device=aac.device(seeds))
        host = evaluation.Problem(seeds, masses, grid_density(values, lo, hi), period)
        with _autodiff.without_autodiff(xp), _driver.quiet_int64():
            out, sol, active, sites = solve_arrays(xp, host, self.tol, self.max_iter, self.log, self.options)
            grads = (_seeds_gradient(out, host), out["brenier_potential"],
                     _pixel_gradients(xp, host, sol, active, sites))
        if self.raise_on_failure and not bool(out["converged"]):
            from ._ot_plan import OtNotConverged

            raise OtNotConverged(f"partial transport did not converge on an item (torch.func): max cell-mass error "
                                 f"{float(out['residual']):.3g} after {int(out['iterations'])} Newton steps "
                                 f"(tol {self.tol:.3g})", None)
        self.items[self.key((seeds, masses, values, lo, hi))] = grads
        return tuple(xp.asarray(out[k]) for k in _TRACED)

    def of(self, inputs):
        key = self.key(inputs)
        if key not in self.items:
            self.solve(*inputs)
        return self.items[key]


def plan_per_item(prob, tol, max_iter, log, raise_on_failure=True, options=DEFAULT):
    """The fields of the partial plan of a problem of tensors wrapped by ``torch.func``
    transforms: every item solved on its values (:class:`_PartialItems`), ``distance``
    differentiable to first order, per item."""
    inputs = (prob.seeds, prob.masses, prob.density.values, prob.lo, prob.hi)
    items = _PartialItems(tol, max_iter, log, raise_on_failure, options, prob.period)
    fields = dict(zip(_TRACED, _autodiff.host_map(items.solve, *inputs)))

    def gradients(inputs, _, needs):
        if needs[3] or needs[4]:
            raise NotImplementedError("the derivative of partial transport's W2^2 with respect to the grid's "
                                      "domain is not implemented yet")
        grads = _autodiff.host_map(lambda *plain: items.of(plain), *inputs)
        what = "partial transport's W2^2 gradient"
        return tuple(_autodiff.first_order(g, inputs, what) if need else None
                     for g, need in zip(grads, needs[:3])) + (None, None)
    fields["distance"] = _autodiff.attach(fields["distance"], inputs, items, gradients)
    for k in _PLAN_ARRAYS:
        fields[k] = _autodiff.not_differentiable(fields[k], inputs, f"the partial plan's {k}")
    return fields


def _is_recorded(x):
    return _driver.is_tracer(x) or bool(getattr(x, "requires_grad", False))


def _distance_gradients(inputs, state, needs):
    """``dW/d(seeds, masses, values, lo, hi)`` of partial transport from the precomputed
    ``state`` (see :func:`plan_of`); first order only."""
    if needs[3] or needs[4]:
        raise NotImplementedError("the derivative of partial transport's W2^2 with respect to the grid's domain "
                                  "is not implemented yet")
    if needs[2] and len(state) < 3:      # pragma: no cover (the values are recorded whenever they need one)
        raise NotImplementedError("partial transport: the grid values were not recorded at the solve")
    what = "partial transport's W2^2 gradient"
    grads = [state[k] if needs[k] else None for k in range(3)] + [None, None]
    return tuple(None if g is None else _autodiff.first_order(g, inputs, what) for g in grads)
