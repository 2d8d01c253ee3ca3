"""The inputs checked before any work (kinds, options, magnitudes the dtype can square) and
the core problem built from them, in the computation namespace and dtype."""
from __future__ import annotations

import functools
import math
import numbers

import array_api_compat as aac
import numpy as np

from . import _autodiff, _driver, _partial, metrics
from ._core import evaluation, geometry
from ._core.density import grid_density
from ._grid_batches import _BatchOfGrids
from ._grids import PolynomialGrid
from ._measures import _Diracs, align


def check_kinds(name, source, target):
    """Refuse what is not a pair (or batch) of Diracs and grid, naming the function ``name``."""
    if not isinstance(source, _Diracs):
        raise TypeError(f"{name}: source must be a sum of Diracs (SumOfDiracs, BatchOfSumOfDiracs...), "
                        f"got {type(source).__name__}")
    if not isinstance(target, (PolynomialGrid, _BatchOfGrids)):
        raise TypeError(f"{name}: target must be a grid (PolynomialGrid, Grid, BatchOfPolynomialGrid...), "
                        f"got {type(target).__name__}")


def check_pair(source, target, name="optimal_transport_plan"):
    check_kinds(name, source, target)
    if source.dim not in (1, 2, 3):
        raise NotImplementedError(f"sdot solves problems in 1, 2 and 3 dimensions; the source has dimension {source.dim}")
    target = target.with_dim(source.dim)
    if target.degree > 0 and not hasattr(geometry.of(source.dim).integrate, "bernstein_cell_integrals"):
        raise NotImplementedError(
            f"PolynomialGrid of degree {target.degree} is not supported yet in {source.dim}D: use one value per cell")
    return align(source, target)


def check_options(tol, max_iter):
    """``tol`` (None or a finite number > 0) and ``max_iter`` (an integer >= 0), checked
    before any work. Under ``jax.jit`` both may be traced 0-d JAX arrays (then unchecked):
    changing them does not compile the solve again."""
    traced_tol, traced_iter = _driver.is_tracer(tol), _driver.is_tracer(max_iter)
    if traced_tol and (tol.ndim != 0 or not np.issubdtype(tol.dtype, np.floating)):
        raise TypeError(f"tol must be a number > 0 or None, got a traced array of shape {tol.shape}, {tol.dtype}")
    if traced_iter and (max_iter.ndim != 0 or not np.issubdtype(max_iter.dtype, np.integer)):
        raise TypeError(f"max_iter must be an integer >= 0, got a traced array of shape {max_iter.shape}, "
                        f"{max_iter.dtype}")
    if traced_tol or traced_iter:
        return (tol if traced_tol else check_options(tol, 0)[0]), (max_iter if traced_iter else
                                                                    check_options(None, max_iter)[1])
    if aac.is_jax_array(tol) and tol.ndim == 0:
        tol = float(tol)
    if aac.is_jax_array(max_iter) and max_iter.ndim == 0 and np.issubdtype(max_iter.dtype, np.integer):
        max_iter = int(max_iter)
    if tol is not None:
        if isinstance(tol, bool) or not isinstance(tol, numbers.Real):
            raise TypeError(f"tol must be a number > 0 or None, got {type(tol).__name__}")
        tol = float(tol)
        if not (math.isfinite(tol) and tol > 0):
            raise ValueError(f"tol must be a finite number > 0, got {tol}")
    if isinstance(max_iter, bool) or not isinstance(max_iter, numbers.Integral):
        raise TypeError(f"max_iter must be an integer >= 0, got {type(max_iter).__name__} {max_iter!r}")
    if max_iter < 0:
        raise ValueError(f"max_iter must be an integer >= 0, got {max_iter}")
    return tol, int(max_iter)


#: Largest distance from the domain, in units of its longest side, of a Dirac the solver
#: takes: it squares distances and weights (about this squared) in the computation dtype.
def _max_reach(dtype_max):
    return math.sqrt(dtype_max) * 1e-4


def _check_range(xp, prob):
    """Eagerly, refuse magnitudes the computation dtype cannot square (a ``ValueError``
    that says which), before any work."""
    ops, (lo, hi, seeds, masses, rho) = _driver.checkable(prob.lo, prob.hi, prob.seeds, prob.masses,
                                                           prob.density.values)
    side = float(ops.max(hi - lo))
    finfo = xp.finfo(prob.seeds.dtype)
    dtype = prob.seeds.dtype
    if not math.isfinite(side):
        raise ValueError("domain: its sides overflow the computation dtype "
                         f"({dtype}); rescale the problem")
    volume = float(ops.prod(hi - lo))
    if not (side * side >= float(finfo.smallest_normal) / float(finfo.eps) and volume >= float(finfo.smallest_normal)):
        raise ValueError(f"domain: sides of {side:.3g} (volume {volume:.3g}) are too small for {dtype}: the solver "
                         "squares lengths and divides by the volume; rescale the problem")
    total = float(ops.sum(masses))
    if not (math.isfinite(total) and total > 0):
        raise ValueError(f"weights: normalised in {dtype}, the masses of the Diracs are "
                         + ("0: the sum of the weights overflows" if total == 0 else
                            "not finite: the sum of the weights is too small to divide by")
                         + "; rescale the weights")
    if not bool(ops.all(ops.isfinite(rho))) or not bool(ops.any(rho > 0)):
        raise ValueError(f"values: normalised in {dtype} to a density of the target's mass, the grid's values "
                         "give " + ("0 everywhere: their sum overflows" if bool(ops.all(ops.isfinite(rho)))
                                    else "values that are not finite: their sum is too small to divide by")
                         + "; rescale the values")
    centre = 0.5 * (lo + hi)
    reach = float(ops.max(ops.abs(seeds - centre))) / side
    if not reach <= _max_reach(float(finfo.max)):
        raise ValueError(f"positions: a Dirac lies {reach:.3g} domain sides from the domain's centre; "
                         f"the solver squares such distances, which {prob.seeds.dtype} cannot represent "
                         f"beyond about {_max_reach(float(finfo.max)):.3g}: move or drop it, or rescale")
    if not math.isfinite(side * side * (reach + 1.0) ** 2):
        raise ValueError(f"the problem's scale ({side:.3g}) squared overflows {prob.seeds.dtype}: rescale it")


def problem(source, target):
    """The core problem in the computation namespace and dtype (rule 3), checked (under
    ``torch.func`` transforms, the checks wait for the values: :func:`solve_per_item`)."""
    return checked_problem(source, target)[:2]


def checked_problem(source, target):
    """:func:`problem` and whether the transport is partial (a target heavier than the
    source: :mod:`._partial`)."""
    xp = _driver.namespace(source.positions, target.values)
    dtype = _driver.compute_dtype(xp)
    host = _host_views_of(xp, source, target)
    if host is not None:            # concrete JAX on the CPU: normalise in NumPy (eager JAX ops compile)
        like = source.positions
        source, target = (m.astype(np.dtype(dtype)) for m in host)
        on_host = evaluation.Problem(source.positions, source.masses, grid_density(target.density, *target.domain))
        to_jax = functools.partial(_driver.convert_like, like=like)
        prob = evaluation.Problem(to_jax(on_host.seeds), to_jax(on_host.masses),
                              type(on_host.density)(*map(to_jax, on_host.density)))
    else:
        source, target = source.astype(dtype), target.astype(dtype)   # normalise in `dtype`
        prob = evaluation.Problem(source.positions, source.masses, grid_density(target.density, *target.domain))
    arrays = (prob.seeds, prob.masses) + tuple(prob.density)
    given = (source.mass, target.mass)
    known = all(isinstance(m, numbers.Real) for m in given)
    if any(_driver.is_tracer(a) for a in arrays):   # values unknown: the masses given, if given
        return xp, prob, known and _partial.is_partial(*map(float, given))
    total_rho = total_mass(target)
    if not _autodiff.transformed(*arrays, total_rho):
        return xp, prob, check_values(xp, prob, total_rho)
    return xp, prob, known and _partial.is_partial(*map(float, given))     # torch.func: the masses given


def _host_views_of(xp, source, target):
    """``(source, target)`` on NumPy views of their arrays if they are concrete JAX arrays on
    the CPU (not traced, not differentiated), else None. Their normalisation then runs in
    NumPy: eagerly, JAX compiles each of its operations for each new shape (13 programs,
    about 0.5 s, at a first call)."""
    if not aac.is_jax_namespace(xp):
        return None
    flat = [m._tree_flatten() for m in (source, target)]
    views = [_driver.host_views(*children) for children, _ in flat]
    if any(v is None or any(_driver.is_tracer(c) for c in children) for v, (children, _) in zip(views, flat)):
        return None
    return tuple(m._tree_unflatten(aux, v) for m, (_, aux), v in zip((source, target), flat, views))


def total_mass(target):
    """The target's total mass (an array under ``torch.func``, to be checked per item)."""
    return _autodiff.detach(target.integral) if target.mass is None else target.mass


def check_values(xp, prob, total_rho):
    """Refuse magnitudes the dtype cannot square and a source heavier than the target; whether
    the transport is partial (the target heavier)."""
    _check_range(xp, prob)
    ops, (masses,) = _driver.checkable(prob.masses)
    return _partial.is_partial(float(ops.sum(masses)), float(total_rho))


def check_metric(metric):
    """Whether ``metric`` (None, :class:`.metrics.Norm2` or :class:`.metrics.PeriodicMetric`) is
    periodic; a ``TypeError`` for anything else, before any work."""
    if metric is None or isinstance(metric, metrics.Norm2):
        return False
    if isinstance(metric, metrics.PeriodicMetric):
        return True
    raise TypeError(f"metric must be sdot.metrics.Norm2() or sdot.metrics.PeriodicMetric(...), got {metric!r}")


def with_metric(xp, prob, metric, partial):
    """``prob`` with the period of each axis of a periodic ``metric`` (:mod:`._core.periodic`),
    where that is solved: on the host (NumPy, torch, array_api_strict, JAX on the CPU, eagerly
    or by the callback under ``jax.jit``: :mod:`._routes`), in 1D, 2D and 3D, balanced transport.
    Otherwise a ``NotImplementedError`` that says what is supported."""
    if not check_metric(metric):
        return prob
    dim = prob.seeds.shape[1]
    lo, hi = (_autodiff.detach(a) for a in (prob.lo, prob.hi))
    func = not aac.is_jax_namespace(xp) and _autodiff.transformed(prob.seeds, prob.masses, *prob.density)
    if _driver.is_tracer(lo) or _driver.is_tracer(hi) or func:
        # a traced domain (or one wrapped by torch.func): the metric's periods, unchecked
        period = [0.0 if p is None else p for p in metric.period]
        if len(period) != dim:
            raise ValueError(f"PeriodicMetric has {len(period)} periods for a {dim}D problem")
    else:
        lo, hi = (np.asarray(_driver._to_host(a), dtype=np.float64).tolist() for a in (lo, hi))
        period = metrics.periods(metric, lo, hi)
    like = _autodiff.detach(prob.lo)
    if aac.is_jax_namespace(xp) or func:    # solved on the host (:mod:`._jax_host`), or per item on plain
        # tensors (:func:`._routes.solve_per_item`): constants, never traced
        return prob._replace(period=np.asarray(period, dtype=np.float64 if func else np.dtype(like.dtype)))
    return prob._replace(period=xp.asarray(np.asarray(period), dtype=like.dtype, device=aac.device(like)))
