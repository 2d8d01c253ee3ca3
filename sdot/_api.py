"""Public functions: validate, convert, dispatch to ``sdot._core``; no numerics here."""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import array_api_compat as aac

from . import _autodiff, _driver
from ._core import geometry, gradients, newton, plan
from ._grids import PolynomialGrid
from ._measures import _Diracs, align
from ._diagram import PowerDiagram

__all__ = ["distance", "distances", "barycenters", "optimal_transport_plan", "OtPlan",
           "OtNotConverged", "default_tolerance"]

#: Default stopping tolerance on the max absolute cell-mass error (masses normalised to 1).
TOLERANCE = {"FP64": 1e-10, "FP32": 1e-5}


def default_tolerance(dtype=None):
    """Default tolerance for ``dtype`` ("FP64" or "FP32"; default: the driver's)."""
    return TOLERANCE[dtype or _driver.driver.dtype]


class OtNotConverged(RuntimeError):
    """The Newton solve did not reach the tolerance within ``max_iter`` steps.

    ``plan`` holds the partial :class:`OtPlan` (``plan.converged`` is False).
    """

    def __init__(self, message, plan):
        super().__init__(message)
        self.plan = plan


@dataclass
class OtPlan:
    """The solution of a semi-discrete transport problem.

    Attributes are arrays of the framework of the inputs (rule 1) or of the
    driver (rule 2): ``distance`` (W2^2), ``barycenters`` ``(n, d)``,
    ``cell_masses`` ``(n,)``, ``brenier_potential`` ``(n,)`` (the Laguerre
    weights psi, mean 0 over the Diracs of positive mass), ``power_diagram``
    (a :class:`PowerDiagram` at the optimal weights), and how the solve went:
    ``converged``, ``iterations``, ``residual`` (max absolute cell-mass error).
    """

    distance: object
    barycenters: object
    cell_masses: object
    brenier_potential: object
    power_diagram: object
    converged: object
    iterations: object
    residual: object


def _check_pair(source, target):
    if not isinstance(source, _Diracs):
        raise TypeError(f"source must be a sum of Diracs (SumOfDiracs, ...), got {type(source).__name__}")
    if not isinstance(target, PolynomialGrid):
        raise TypeError(f"target must be a PolynomialGrid or Grid, got {type(target).__name__}")
    if source.dim != 2:
        raise NotImplementedError(f"sdot solves 2D problems for now; the source has dimension {source.dim}")
    target = target.with_dim(source.dim)
    if target.degree > 0:
        raise NotImplementedError(
            f"PolynomialGrid of degree {target.degree} is not supported yet: use one value per cell")
    return align(source, target)


def _problem(source, target):
    """The core problem in the computation namespace and dtype (rule 3)."""
    xp = _driver.namespace(source.positions, target.values)
    dtype = _driver.compute_dtype(xp)
    source, target = source.astype(dtype), target.astype(dtype)   # normalise in `dtype`
    prob = newton.Problem(source.positions, source.masses, target.density, *target.domain)
    if any(_driver.is_tracer(a) for a in prob):
        return xp, prob                     # values unknown: no mass check under tracing
    total_m = float(_autodiff.detach(xp.sum(prob.masses)))
    total_rho = float(_autodiff.detach(target.integral) if target.mass is None else target.mass)
    if abs(total_m - total_rho) > 1e-6 * max(abs(total_rho), 1e-300):
        raise ValueError(f"mass mismatch: the source has mass {total_m}, the target {total_rho}; "
                         "use the default mass=1 on both, or equal masses")
    return xp, prob


_CLOCK = {"start": 0.0}


def _log_step(step, residual, damping):
    """The ``verbose`` line of one Newton step (a module-level function: a static
    argument of the jitted JAX solve)."""
    print(f"sdot newton step {int(step):3d}  residual {float(residual):.3e}  "
          f"damping {float(damping):.4g}  time {time.perf_counter() - _CLOCK['start']:.3f}s")


def _printer(verbose):
    _CLOCK["start"] = time.perf_counter()
    return _log_step if verbose else None


@functools.cache
def _jax_solve_plan():
    """:func:`plan.solve_plan` under one ``jax.jit`` (compiled once per shape, inlined
    in the caller's trace). JAX compiles every eager operation separately: one
    program for the whole solve is faster, and eager and traced calls share it."""
    import jax

    def run(prob, tol, max_iter, log, capacity):
        return plan.solve_plan(_driver.namespace(prob.seeds), prob, tol, max_iter, log, capacity)
    return jax.jit(run, static_argnames=("tol", "max_iter", "log", "capacity"))


def optimal_transport_plan(source, target, tol=None, max_iter=100, verbose=False,
                           raise_on_failure=True):
    """Solve the semi-discrete transport from ``source`` (Diracs) to ``target`` (grid).

    Parameters
    ----------
    source : SumOfDiracs or SumOfWeightedDiracs
    target : PolynomialGrid or Grid
    tol : float, optional
        Stopping tolerance on ``max_i |cell mass_i - m_i|`` (masses normalised
        to 1). Default 1e-10 in FP64, 1e-5 in FP32.
    max_iter : int
        Maximum number of Newton steps.
    verbose : bool
        Print one line per Newton step (step, residual, damping, time).
    raise_on_failure : bool
        Raise :class:`OtNotConverged` (carrying the partial plan) if not
        converged; otherwise return the partial plan. Under ``jax.jit`` (or
        any JAX transformation) nothing can be raised: a failed solve gives
        ``distance = nan`` instead (``plan.converged`` says which).

    Returns
    -------
    OtPlan
        ``distance`` is differentiable (torch autograd, JAX transformations)
        with respect to the positions and masses of the Diracs and the values
        of the grid; the other attributes are not.
    """
    source, target = _check_pair(source, target)
    if source.batched:
        raise ValueError("optimal_transport_plan takes one source; use distances() for batches")
    xp, prob = _problem(source, target)
    tol = default_tolerance() if tol is None else float(tol)
    out = _solve(xp, prob, tol, int(max_iter), _printer(verbose), raise_on_failure)
    if raise_on_failure and not _driver.is_tracer(out.converged) and not bool(out.converged):
        raise OtNotConverged(f"no convergence in {int(out.iterations)} Newton steps: residual "
                             f"{float(out.residual):.3e} > tol {tol:.1e}", out)
    return out


def _solve(xp, prob, tol, max_iter, log, nan_on_failure):
    """Solve on inputs cut from the autodiff graph, then attach the analytic gradients."""
    cut = newton.Problem(*(_autodiff.detach(a) for a in prob))
    if aac.is_jax_namespace(xp):
        capacity = geometry.CAPACITY
        while True:   # eagerly, a vertex-capacity overflow is retried; traced, it gives nan
            res = _jax_solve_plan()(cut, tol=tol, max_iter=max_iter, log=log, capacity=capacity)
            if _driver.is_tracer(res["overflow"]) or not bool(res["overflow"]) or capacity >= 1024:
                break
            capacity *= 2
    else:
        with _autodiff.without_autodiff(xp):
            res = plan.solve_plan(xp, cut, tol, max_iter, log=log)
        res.update({k: _autodiff.released(res[k]) for k in _PLAN_ARRAYS + ("distance",)})
    distance = _autodiff.attach(res["distance"], (prob.seeds, prob.masses, prob.density),
                                (cut.lo, cut.hi, res["state"]), _gradients)
    if nan_on_failure and _driver.is_tracer(res["converged"]):
        distance = xp.where(res["converged"], distance, xp.nan)
    sol = res["solution"]
    diagram = PowerDiagram._from_solution(cut, _autodiff.released(sol.psi), sol.evaluation.cells,
                                          sol.evaluation.moments, res["active"])
    return OtPlan(distance=distance, power_diagram=diagram, **{k: res[k] for k in _PLAN_ARRAYS})


#: The arrays of an :class:`OtPlan` besides the distance and the diagram.
_PLAN_ARRAYS = ("barycenters", "cell_masses", "brenier_potential", "converged", "iterations", "residual")


def _gradients(inputs, state, needs):
    """``dW/d(seeds, masses, density)`` (see :mod:`sdot._core.gradients`)."""
    seeds, masses, density = inputs
    lo, hi, gstate = state
    return gradients.gradients(_driver.namespace(seeds), seeds, masses, density, lo, hi, gstate, needs)


def distance(source, target, **options):
    """W2^2 between ``source`` and ``target``: a scalar, or shape ``(b,)`` for a batch.

    Differentiable with respect to the Dirac positions and masses and the grid
    values (torch autograd; JAX ``grad``, ``jvp``, ``jit``, ``vmap``, ``scan``).
    ``options`` are those of :func:`optimal_transport_plan`.
    """
    if isinstance(source, _Diracs) and source.batched:
        return distances(source, target, **options)
    return optimal_transport_plan(source, target, **options).distance


def distances(sources, target, **options):
    """W2^2 of every item of a batch of sources (``BatchOfSumOfDiracs``...), shape ``(b,)``.

    JAX batches run as one ``jax.vmap`` of the solve; other frameworks loop over the items.
    """
    if not (isinstance(sources, _Diracs) and sources.batched):
        raise TypeError("distances takes a BatchOfSumOfDiracs or BatchOfSumOfWeightedDiracs")
    sources, target = align(sources, target)
    if aac.is_jax_array(sources.positions):
        import jax

        _driver.compute_dtype(aac.array_namespace(sources.positions))   # x64 policy first
        return jax.vmap(lambda item: distance(item, target, **options))(_items(sources))
    values = [distance(item, target, **options) for item in sources]
    return _driver.namespace(*values).stack(values)


def _items(batch):
    """The batch as one unbatched measure whose arrays keep the batch axis (for ``vmap``)."""
    item = batch[0]
    item._positions, item._weights = batch.positions, batch._weights
    return item


def barycenters(source, target, **options):
    """Barycentre of each Dirac's Laguerre cell under ``target``, shape ``(n, d)``."""
    return optimal_transport_plan(source, target, **options).barycenters
