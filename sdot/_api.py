"""Public functions: validate, convert, dispatch to ``sdot._core``; no numerics here."""
from __future__ import annotations

import functools
import math
import numbers
import time
import types
from dataclasses import dataclass, field

import array_api_compat as aac
import numpy as np

from . import _autodiff, _batched, _differentiable, _driver, _jax_host, _partial
from ._core import _compat, newton, plan
from ._core import geometry
from ._core.density import grid_density
from ._core.options import DEFAULT as NEWTON_OPTIONS
from ._grid_batches import _BatchOfGrids
from ._grids import PolynomialGrid
from ._measures import BatchOfSumOfDiracs, SumOfDiracs, SumOfWeightedDiracs, _Diracs, align
from ._spline_grid import SplineGrid
from ._diagram import PowerDiagram
from ._pytrees import JaxPytree

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
class OtPlan(JaxPytree):
    """The solution of a semi-discrete transport problem.

    Attributes are arrays of the framework of the inputs (rule 1) or of the
    driver (rule 2): ``distance`` (W2^2), ``barycenters`` ``(n, d)``,
    ``cell_masses`` ``(n,)``, ``brenier_potential`` ``(n,)`` (the Laguerre
    weights psi, mean 0 over the Diracs of positive mass; in partial transport the radii
    squared of the balls, no gauge), ``transported_mass`` (the sum of ``cell_masses``), ``power_diagram``
    (a :class:`PowerDiagram` at the optimal weights), and how the solve went:
    ``converged``, ``iterations``, ``residual`` (max absolute cell-mass error) and
    ``status`` (0: converged; 1: ``max_iter`` reached; 2: stalled, no admissible step;
    3: the last diagram could not be certified). A partial plan's masses, barycentres
    and distance are those of its weights' diagram against the density itself.
    In 1D the plan is the sorted closed form: no Newton step (``iterations`` 0), exact up
    to rounding (``residual`` is that rounding).

    ``converged``, ``iterations``, ``residual`` and ``status`` are 0-d arrays of the
    plan's framework, on its device, of one dtype on every framework (eager or under
    ``jax.jit``): ``converged`` bool, ``iterations`` and ``status`` int64 (int32 on JAX
    without ``jax_enable_x64``, which sdot turns on in FP64), ``residual`` the computation
    dtype (float64 in FP64, float32 in FP32). NumPy: ``numpy.ndarray`` of shape ``()``
    (not NumPy scalars); torch: ``torch.Tensor``; JAX: ``jax.Array`` (tracers under
    ``jit``); array_api_strict: its ``Array``. ``bool()``, ``int()`` and ``float()`` read
    them eagerly.

    The plan of a batch (:func:`optimal_transport_plan` with a batch of sources, of targets
    or both, of ``b`` items) is the plans of the items stacked: every array above has a
    leading axis ``b`` (``converged``... have shape ``(b,)``) and ``power_diagram`` is a
    tuple of ``b`` :class:`PowerDiagram`.
    """

    distance: object
    barycenters: object
    cell_masses: object
    brenier_potential: object
    power_diagram: object
    converged: object
    iterations: object
    residual: object
    status: object
    _linearization: object = field(default=None, repr=False, compare=False)
    _normalisation: object = field(default=None, repr=False, compare=False)

    @property
    def transported_mass(self):
        """The mass moved: the sum of ``cell_masses`` (per item for a batch), the source's mass;
        less than the target's in partial transport."""
        xp = _driver.namespace(self.cell_masses)
        return xp.sum(self.cell_masses, axis=-1)

    def jvp(self, positions=None, weights=None, values=None, domain=None):
        """NumPy's forward-mode derivative: the tangents of ``distance``, ``barycenters``,
        ``brenier_potential`` and ``cell_masses`` (a dict) along tangents of the inputs (None
        for zero): the Dirac ``positions`` (n, d), their ``weights`` (n,) (the masses before
        normalisation; SumOfDiracs has none), the grid's ``values`` (a SplineGrid's own,
        through its linear map) and its ``domain`` ``(lo, hi)``, each of shape (d,). By implicit differentiation: one sparse solve.
        torch and JAX users differentiate the plan's arrays directly. A partial transport plan
        gives the tangent of ``distance`` alone (its other arrays are not differentiable yet), and
        none along the domain (``NotImplementedError``)."""
        norm = self._normaliser("jvp")
        lo, hi = (None, None) if domain is None else (np.asarray(domain[0], float), np.asarray(domain[1], float))
        given = [None if t is None else np.asarray(t, dtype=norm.lin.seeds.dtype) for t in (positions, weights, values)]
        shapes = (tuple(norm.lin.seeds.shape), None if norm.weights is None else tuple(norm.weights.shape),
                  tuple(norm.user_values_shape))
        for name, t, shape in zip(("positions", "weights", "values"), given, shapes):
            if t is not None and shape is None:
                raise ValueError("OtPlan.jvp: the source has no weights (SumOfDiracs); pass weights=None")
            if t is not None and tuple(t.shape) != shape:
                raise ValueError(f"OtPlan.jvp: the tangent of {name} must have the shape of {name}, {shape}, "
                                 f"got {tuple(t.shape)}")
        tangents = norm.forward(*given, lo, hi)
        rule = self._rules()
        return dict(zip(rule.outputs, rule.jvp(norm.lin, tangents)))

    def vjp(self, distance=None, barycenters=None, brenier_potential=None, cell_masses=None):
        """NumPy's reverse-mode derivative: the cotangents of the inputs (a dict: ``positions``,
        ``weights``, ``values``, ``domain`` as ``(lo, hi)``) of cotangents of the outputs (None
        for zero); see :meth:`jvp`. Of a partial transport plan: of a cotangent of ``distance``
        alone, and ``domain`` None (not computed yet)."""
        norm = self._normaliser("vjp")
        lin = norm.lin
        zero = lambda shape: np.zeros(shape, dtype=lin.seeds.dtype)        # noqa: E731
        n, d = lin.seeds.shape
        cts = [np.asarray(c, dtype=lin.seeds.dtype) if c is not None else zero(shape)
               for c, shape in zip((barycenters, brenier_potential, cell_masses, distance), ((n, d), (n,), (n,), ()))]
        rule = self._rules()
        grads = rule.vjp(lin, (cts[3],) + tuple(cts[:3]), (True,) * 5)
        positions, weights, values, lo, hi = norm.backward(*grads)
        partial = getattr(self.power_diagram, "capped", False)      # (its domain's derivative: not yet)
        return dict(positions=positions, weights=weights, values=values, domain=None if partial else (lo, hi))

    def _normaliser(self, what):
        if self._normalisation is None and getattr(self.distance, "ndim", 0) == 1:
            raise TypeError(f"OtPlan.{what} is for the plan of one source and one target: solve the "
                            "items of a batch one by one for NumPy's derivatives")
        if self._normalisation is None:
            raise TypeError(f"OtPlan.{what} is NumPy's: differentiate torch and JAX plans with their autodiff")
        return self._normalisation

    def _rules(self):
        """The rule of :meth:`jvp` and :meth:`vjp`, kept (with its facets and factors)."""
        if getattr(self, "_kept_rule", None) is None:
            self._kept_rule = _differentiable.PlanRule(("distance",) + _differentiable.PLAN_OUTPUTS)
        return self._kept_rule

    def _tree_flatten(self):
        """JAX pytree children: the public fields (the diagram is a pytree too). The state of
        NumPy's :meth:`jvp` and :meth:`vjp` is dropped: a rebuilt plan has none."""
        return tuple(getattr(self, name) for name in _PLAN_FIELDS), None

    @classmethod
    def _tree_unflatten(cls, aux, children):
        return cls(*children)


#: The public fields of :class:`OtPlan`, in order: the children of its pytree.
_PLAN_FIELDS = ("distance", "barycenters", "cell_masses", "brenier_potential", "power_diagram", "converged",
                "iterations", "residual", "status")


def _check_kinds(name, source, target):
    """Refuse what is not a pair (or batch) of Diracs and grid, naming the function ``name``."""
    if not isinstance(source, _Diracs):
        raise TypeError(f"{name}: source must be a sum of Diracs (SumOfDiracs, BatchOfSumOfDiracs...), "
                        f"got {type(source).__name__}")
    if not isinstance(target, (PolynomialGrid, _BatchOfGrids)):
        raise TypeError(f"{name}: target must be a grid (PolynomialGrid, Grid, BatchOfPolynomialGrid...), "
                        f"got {type(target).__name__}")


def _check_pair(source, target, name="optimal_transport_plan"):
    _check_kinds(name, source, target)
    if source.dim not in (1, 2, 3):
        raise NotImplementedError(f"sdot solves problems in 1, 2 and 3 dimensions; the source has dimension {source.dim}")
    target = target.with_dim(source.dim)
    if target.degree > 0 and not hasattr(geometry.of(source.dim).integrate, "bernstein_cell_integrals"):
        raise NotImplementedError(
            f"PolynomialGrid of degree {target.degree} is not supported yet in {source.dim}D: use one value per cell")
    return align(source, target)


def _check_options(tol, max_iter):
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
        return (tol if traced_tol else _check_options(tol, 0)[0]), (max_iter if traced_iter else
                                                                    _check_options(None, max_iter)[1])
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


def _problem(source, target):
    """The core problem in the computation namespace and dtype (rule 3), checked (under
    ``torch.func`` transforms, the checks wait for the values: :func:`_solve_per_item`)."""
    return _checked_problem(source, target)[:2]


def _checked_problem(source, target):
    """:func:`_problem` and whether the transport is partial (a target heavier than the
    source: :mod:`._partial`)."""
    xp = _driver.namespace(source.positions, target.values)
    dtype = _driver.compute_dtype(xp)
    host = _host_views_of(xp, source, target)
    if host is not None:            # concrete JAX on the CPU: normalise in NumPy (eager JAX ops compile)
        like = source.positions
        source, target = (m.astype(np.dtype(dtype)) for m in host)
        on_host = newton.Problem(source.positions, source.masses, grid_density(target.density, *target.domain))
        to_jax = functools.partial(_driver.convert_like, like=like)
        prob = newton.Problem(to_jax(on_host.seeds), to_jax(on_host.masses),
                              type(on_host.density)(*map(to_jax, on_host.density)))
    else:
        source, target = source.astype(dtype), target.astype(dtype)   # normalise in `dtype`
        prob = newton.Problem(source.positions, source.masses, grid_density(target.density, *target.domain))
    arrays = (prob.seeds, prob.masses) + tuple(prob.density)
    if any(_driver.is_tracer(a) for a in arrays):   # values unknown: the masses given, if given
        given = (source.mass, target.mass)
        known = all(isinstance(m, numbers.Real) for m in given)
        return xp, prob, known and _partial.is_partial(*map(float, given))
    total_rho = _total_mass(target)
    if not _autodiff.transformed(*arrays, total_rho):
        return xp, prob, _check_values(xp, prob, total_rho)
    return xp, prob, False


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


def _total_mass(target):
    """The target's total mass (an array under ``torch.func``, to be checked per item)."""
    return _autodiff.detach(target.integral) if target.mass is None else target.mass


def _check_values(xp, prob, total_rho):
    """Refuse magnitudes the dtype cannot square and a source heavier than the target; whether
    the transport is partial (the target heavier)."""
    _check_range(xp, prob)
    ops, (masses,) = _driver.checkable(prob.masses)
    return _partial.is_partial(float(ops.sum(masses)), float(total_rho))


_CLOCK = {"start": 0.0}


def _log_step(step, residual, damping, width):
    """The ``verbose`` line of one Newton step (a module-level function: a static
    argument of the jitted JAX solve)."""
    stage = f"  width {float(width):.3g}" if float(width) > 0 else ""
    print(f"sdot newton step {int(step):3d}  residual {float(residual):.3e}  "
          f"damping {float(damping):.4g}{stage}  time {time.perf_counter() - _CLOCK['start']:.3f}s")


def _printer(verbose):
    _CLOCK["start"] = time.perf_counter()
    return _log_step if verbose else None


@functools.cache
def _jax_solve_plan():
    """:func:`plan.solve_plan` under one ``jax.jit`` (compiled once per shape, inlined
    in the caller's trace). JAX compiles every eager operation separately: one
    program for the whole solve is faster, and eager and traced calls share it."""
    import jax

    def run(prob, tol, max_iter, log, capacity, options):
        return plan.solve_plan(_driver.namespace(prob.seeds), prob, tol, max_iter, log, capacity, options)
    return jax.jit(run, static_argnames=("log", "capacity", "options"))


def optimal_transport_plan(source, target, tol=None, max_iter=300, verbose=False,
                           raise_on_failure=True):
    """Solve the semi-discrete transport from ``source`` (Diracs) to ``target`` (grid).

    Parameters
    ----------
    source : SumOfDiracs, SumOfWeightedDiracs or a batch of them
    target : PolynomialGrid, Grid or a batch of them (BatchOfPolynomialGrid)
    tol : float, optional
        Stopping tolerance on ``max_i |cell mass_i - m_i|`` (masses normalised
        to 1). Default 1e-10 in FP64, 1e-5 in FP32.
    max_iter : int
        Maximum number of Newton steps (all widths of the continuation included).
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
        ``distance``, ``barycenters``, ``brenier_potential`` and ``cell_masses`` are
        differentiable (torch autograd, JAX transformations; NumPy: :meth:`OtPlan.jvp`,
        :meth:`OtPlan.vjp`) with respect to the positions and masses of the Diracs and the
        values and domain of the grid, by implicit differentiation of the optimality
        condition; ``distance`` has second derivatives. With a batch on either side
        (a batch of sources and one of targets of the same size ``b`` pair item by item;
        a single measure is shared by every item), every array has a leading axis ``b``
        (item ``i`` is the plan of item ``i``) and ``power_diagram`` is a tuple of ``b``
        diagrams. NumPy, torch, array_api_strict and concrete JAX arrays loop over the items;
        traced JAX arrays (under ``jax.jit``, ``jax.vmap``) run one ``jax.vmap`` of the solve.
    """
    return _plan("optimal_transport_plan", _PLAN_FIELDS, source, target, tol=tol, max_iter=max_iter,
                 verbose=verbose, raise_on_failure=raise_on_failure)


_OPTIONS = ("tol", "max_iter", "verbose", "raise_on_failure")


def _plan(name, keep, source, target, orders=1, **options):
    """The :class:`OtPlan` of the public function ``name``. For batches, one plan per item,
    stacked; under ``jax.vmap`` only the fields ``keep`` are computed (the others are None).
    Its arrays are differentiated at most ``orders`` times under ``torch.func`` (2 for
    :func:`distance`: its rule is the plan's first derivatives)."""
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError(f"{name}() got unexpected keyword arguments {unknown}; its options are those of "
                        f"optimal_transport_plan: {', '.join(_OPTIONS)}")
    tol, max_iter, verbose, raise_on_failure = (options.get(k, default) for k, default in
                                                zip(_OPTIONS, (None, 300, False, True)))
    tol, max_iter = _check_options(tol, max_iter)
    _check_kinds(name, source, target)
    if _driver.driver.framework == "dask" and aac.is_numpy_array(source.positions):
        source = _distributed(source)                # rule 2: NumPy positions go to the driver's dask
    if aac.is_dask_array(source.positions):          # rule 1 for dask arrays: the distributed solve
        from . import dask as _dask

        return _dask.public_plan(name, source, target, tol, max_iter, verbose, raise_on_failure)
    if not (_batched.is_batch(source) or _batched.is_batch(target)):
        return _plan_of_pair(source, target, tol, max_iter, verbose, raise_on_failure, orders)
    b = _batched.batch_size(name, source, target)
    failures = []

    def solve(source, target):
        try:
            out = _plan_of_pair(source, target, tol, max_iter, verbose, raise_on_failure, orders)
        except OtNotConverged as failure:
            out = failure.plan
            failures.append(str(failure))
        return {f: getattr(out, f) for f in _PLAN_FIELDS}

    out = OtPlan(**{**dict.fromkeys(_PLAN_FIELDS), **_batched.over_items(solve, *align(source, target), b, keep)})
    if failures:
        bad = np.flatnonzero(~_driver._to_host(_autodiff.detach(out.converged))).tolist()
        raise OtNotConverged(f"{name}: {len(bad)} of the {b} items of the batch did not converge "
                             f"(items {bad}); item {bad[0]}: {failures[0]}", out)
    return out


def _distributed(source):
    """``source`` with its NumPy positions (and weights) as dask arrays (``driver.framework
    = "dask"``), in chunks of at most 1e6 Diracs and at least 8 chunks from 8e4 Diracs
    (a batch: one item per chunk); other measures as they are."""
    import dask.array as da

    if type(source) not in (SumOfDiracs, SumOfWeightedDiracs, BatchOfSumOfDiracs):
        return source
    n, d = source.positions.shape[-2:]
    rows = min(max(10_000, -(-n // 8)), 1_000_000, max(n, 1))
    if type(source) is BatchOfSumOfDiracs:
        return BatchOfSumOfDiracs(da.from_array(source.positions, chunks=(1, rows, d)), mass=source._mass)
    positions = da.from_array(source.positions, chunks=(rows, d))
    if type(source) is SumOfDiracs:
        return SumOfDiracs(positions, mass=source._mass)
    return SumOfWeightedDiracs(positions, da.from_array(source._weights, chunks=(rows,)), mass=source._mass)


def _plan_of_pair(source, target, tol, max_iter, verbose, raise_on_failure, orders):
    """The plan of one source and one target (``tol`` and ``max_iter`` checked; ``orders``:
    see :func:`_plan`)."""
    spline = target if isinstance(target, SplineGrid) else None     # NumPy's jvp/vjp: its values
    source, target = _check_pair(source, target)
    xp, prob, partial = _checked_problem(source, target)
    tol = default_tolerance() if tol is None else tol
    if partial:
        return _partial_plan(xp, prob, tol, max_iter, verbose, raise_on_failure, source, target)
    if _autodiff.transformed(prob.seeds, prob.masses, *prob.density):   # torch.func: per item, checked there
        _check_depth(prob, orders)
        return _solve_per_item(prob, _total_mass(target.astype(prob.seeds.dtype)), tol, max_iter,
                               _printer(verbose), raise_on_failure, NEWTON_OPTIONS)
    out, stop = _solve(xp, prob, tol, max_iter, _printer(verbose), raise_on_failure, NEWTON_OPTIONS)
    if aac.is_numpy_array(out.barycenters):
        out._normalisation = _differentiable.Normalisation(source, target, out._linearization, spline)
    if raise_on_failure and not _driver.is_tracer(out.converged) and not bool(out.converged):
        raise OtNotConverged(_failure(out, stop, tol, max_iter, prob, NEWTON_OPTIONS), out)
    return out


def _partial_plan(xp, prob, tol, max_iter, verbose, raise_on_failure, source, target):
    """The plan of a partial transport (:mod:`._partial`), refused where not solved yet; on
    NumPy, with the derivatives of its distance (:class:`._partial.DistanceRule`)."""
    with _driver.quiet_int64(), _driver.one_thread(xp):
        fields, sol, active, host = _partial.plan_of(xp, prob, tol, max_iter, _printer(verbose), NEWTON_OPTIONS)
    potential = _autodiff.detach(fields["brenier_potential"])
    if sol is None:                         # under jax.jit: the cells are computed when asked
        diagram = PowerDiagram._at_weights(prob.seeds, potential, prob.density)
    else:
        diagram = PowerDiagram._from_solution(newton.Problem(_autodiff.detach(prob.seeds), None, host.density),
                                              potential, sol.evaluation.cells, sol.evaluation.moments, active)
    diagram.capped = True
    out = OtPlan(power_diagram=diagram, **fields)
    if sol is not None and aac.is_numpy_array(out.barycenters):
        lin = types.SimpleNamespace(seeds=host.seeds, lo=host.lo, hi=host.hi, values=host.density.values)
        out._normalisation = _differentiable.Normalisation(source, target, lin)
        out._kept_rule = _partial.numpy_rule(host, fields, sol, active)
    if raise_on_failure and not _driver.is_tracer(out.converged) and not bool(out.converged):
        raise OtNotConverged(f"partial transport did not converge: {_STATUS[int(out.status)]} after "
                             f"{int(out.iterations)} Newton steps, max cell-mass error {float(out.residual):.3g} "
                             f"(tol {tol:.3g}). The partial plan is the exception's .plan (converged=False).", out)
    return out


_STATUS = {0: "converged", 1: "max_iter", 2: "stalled", 3: "uncertified"}


def _near_duplicates(prob, tol):
    """A sentence on the closest distinct Diracs, when the dtype cannot resolve their cells.

    One rounding of the weights (``eps`` times the domain's size squared) moves the facet
    between Diracs ``delta`` apart by ``eps L^2 / delta``, so their cells' masses are only
    known to about ``eps L^2 rho h / delta`` (``h`` a cell's size, ``rho`` the density):
    below ``tol`` only if ``delta`` is above about that divided by ``tol``."""
    from scipy.spatial import cKDTree

    seeds = _driver._to_host(_autodiff.detach(prob.seeds))
    keep = _driver._to_host(_autodiff.detach(prob.masses)) > 0
    pts = np.unique(seeds[keep], axis=0)
    if len(pts) < 2:
        return "the Diracs are all at one point"
    dist, idx = cKDTree(pts).query(pts, k=2)
    k = int(np.argmin(dist[:, 1]))
    lo, hi = (_driver._to_host(_autodiff.detach(a)) for a in (prob.lo, prob.hi))
    side = float(np.max(hi - lo))
    dens = _driver._to_host(_autodiff.detach(prob.density.values))
    contrast = float(dens.max() / max(dens.mean(), np.finfo(float).tiny))
    eps = float(np.finfo(seeds.dtype).eps)
    resolved = 4.0 * eps * contrast / (np.sqrt(len(pts)) * tol) * side
    closest = float(dist[k, 1])
    if closest > resolved:
        return "no two Diracs are too close for the dtype to resolve their cells at this tol"
    return (f"the closest Diracs, at {pts[k].tolist()} and {pts[idx[k, 1]].tolist()}, are {closest:.3g} apart: "
            f"{prob.seeds.dtype} resolves the masses of cells to tol={tol:.1e} only for Diracs about "
            f"{resolved:.1g} or more apart; merge such Diracs (exact duplicates are merged) or raise tol")


def _support_pieces(prob):
    """How many separate pieces the density's support has: its positive grid cells, joined
    across the sides they share (not across corners)."""
    from scipy import ndimage

    values = _driver._to_host(_autodiff.detach(prob.density.values))
    dim = prob.seeds.shape[1]
    positive = values > 0
    while positive.ndim > dim:                  # a polynomial's coefficients per grid cell
        positive = positive.any(axis=-1)
    return int(ndimage.label(positive)[1])


#: Distance from the domain, in its sides, up to which the tests solve a far Dirac (FP64).
_TESTED_REACH = 1e6


def _empty_cells(prob, empty):
    """A sentence on the Diracs of positive mass whose cells are empty (``empty`` (n,)): how
    many, the first few by index and position, and those too far from the domain."""
    seeds = _driver._to_host(_autodiff.detach(prob.seeds))
    lo, hi = (_driver._to_host(_autodiff.detach(a)) for a in (prob.lo, prob.hi))
    side = float(np.max(hi - lo))
    reach = np.max(np.maximum(np.maximum(lo - seeds, seeds - hi), 0.0), axis=1) / side
    which = np.flatnonzero(empty)
    named = ", ".join(f"{i} at {seeds[i].tolist()}" for i in which[:3]) + (", ..." if len(which) > 3 else "")
    sentence = f"{len(which)} Diracs of positive mass have empty cells (index {named})"
    far = which[reach[which] > _TESTED_REACH]
    if len(far):
        sentence += (f"; Dirac {int(far[0])} lies {float(reach[far[0]]):.3g} domain sides from the domain: "
                     f"{seeds.dtype} places the facets of so far a Dirac only to about its eps times that "
                     f"distance (tested to {_TESTED_REACH:.0e} sides): move it closer, or drop it")
    return sentence


def _failure(plan, stop, tol, max_iter, prob, options):
    """Why a solve did not converge (with the Newton ``options``), for :class:`OtNotConverged`."""
    status = _STATUS[int(plan.status)]
    width, damping = (float(_autodiff.detach(a)) for a in stop)
    masses = _driver._to_host(_autodiff.detach(plan.cell_masses))
    wanted = _driver._to_host(_autodiff.detach(prob.masses)) > 0
    empty = int(((masses <= 0) & wanted).sum())
    lines = [f"no convergence: residual {float(plan.residual):.3e} > tol {tol:.1e} after "
             f"{int(plan.iterations)} Newton steps"]
    if status == "max_iter":
        lines.append(f"max_iter={max_iter} reached" + (
            f", the continuation still at width {width:.3g} of the domain (raise max_iter)" if width > 0 else ""))
    elif status == "stalled":
        lines.append(f"stalled: no step length of at least {options.stall_step:g} kept every cell above its floor and reduced "
                     f"the residual (last accepted damping {damping:.3g})")
        lines.append(_near_duplicates(prob, tol))
        pieces = _support_pieces(prob)
        if pieces > 1:
            lines.append(f"the density's support has {pieces} separate pieces (zero between them): their masses "
                         "balance only through cells that reach across the gaps, which the damped Newton steps did "
                         "not find (a known limit with many small pieces)")
    else:
        lines.append("the last power diagram could not be certified (its cells may overlap or leave gaps): "
                     "its masses need not sum to the total")
    if empty:
        lines.append(_empty_cells(prob, (masses <= 0) & wanted))
    return "; ".join(lines) + ". The partial plan is the exception's .plan (converged=False)."


def _solve(xp, prob, tol, max_iter, log, nan_on_failure, options):
    """Solve with the Newton ``options`` (a :class:`._core.options.NewtonOptions`) on inputs
    cut from the autodiff graph, then attach the analytic gradients."""
    with _driver.quiet_int64(), _driver.one_thread(xp):
        return _solve_quietly(xp, prob, tol, max_iter, log, nan_on_failure, options)


def _solve_quietly(xp, prob, tol, max_iter, log, nan_on_failure, options):
    cut = newton.Problem(_autodiff.detach(prob.seeds), _autodiff.detach(prob.masses),
                         type(prob.density)(*(_autodiff.detach(a) for a in prob.density)))
    host = None if _driver.is_tracer(tol) or _driver.is_tracer(max_iter) else _jax_on_host(xp, cut)
    if host is not None:
        return _solve_on_host(xp, prob, host, tol, max_iter, log, options)
    if _jax_host.takes(xp, cut):                # traced JAX on the CPU: the NumPy core in one callback
        fields, stop = _jax_host.solve(prob, cut, tol, max_iter, log, nan_on_failure, options)
        return OtPlan(**fields), stop
    if aac.is_jax_namespace(xp) or _compat.static_shapes(cut.seeds):
        solve = _jax_solve_plan() if aac.is_jax_namespace(xp) else functools.partial(plan.solve_plan, xp)
        if aac.is_jax_namespace(xp):            # traced, not static: a new tol or max_iter compiles nothing
            tol, max_iter = xp.asarray(tol, dtype=cut.seeds.dtype), xp.asarray(max_iter)
        res = plan.grown_until_fits(lambda capacity: solve(cut, tol=tol, max_iter=max_iter, log=log,
                                                           capacity=capacity, options=options),
                                    lambda res: res["overflow"], cut.seeds.shape[1])
    else:
        with _autodiff.without_autodiff(xp):
            res = plan.solve_plan(xp, cut, tol, max_iter, log=log, options=options)
        res.update({k: _autodiff.released(res[k]) for k in _PLAN_ARRAYS + ("distance",)})
    lin = _differentiable.linearization(cut, res)
    inputs = (prob.seeds, prob.masses, prob.density.values, prob.lo, prob.hi)
    kept = _differentiable.Kept()
    outputs = _autodiff.attach_linear(tuple(res[k] for k in _differentiable.PLAN_OUTPUTS), inputs, lin,
                                      _differentiable.PlanRule(_differentiable.PLAN_OUTPUTS, kept))
    distance = _autodiff.attach(res["distance"], inputs, (lin, res["barycenters"], res["brenier_potential"]),
                                functools.partial(_differentiable.distance_gradients,
                                                  functools.partial(_differentiable.PlanRule, kept=kept)))
    if nan_on_failure and _driver.is_tracer(res["converged"]):
        distance = xp.where(res["converged"], distance, xp.nan)
    sol = res["solution"]
    diagram = PowerDiagram._from_solution(cut, _autodiff.released(sol.psi), sol.evaluation.cells,
                                          sol.evaluation.moments, res["active"])
    arrays = dict(zip(_differentiable.PLAN_OUTPUTS, outputs))
    arrays.update({k: _zero_d(res[k]) for k in _PLAN_ARRAYS if k not in arrays})
    out = OtPlan(distance=distance, power_diagram=diagram, _linearization=lin, **arrays)
    out._kept_rule = _differentiable.PlanRule(("distance",) + _differentiable.PLAN_OUTPUTS, kept)
    return out, (sol.width, sol.damping)


def _check_depth(prob, orders):
    """Raise if ``torch.func`` transforms nest deeper around the problem ``prob`` than the rules
    differentiate (``orders``: 2 for W2^2, 1 for the plan's arrays): the rules' products are
    computed outside the transforms, which would take a further derivative of them as zero."""
    depth = _autodiff.differentiation_depth(prob.seeds, prob.masses, *prob.density)
    if depth > orders:
        what = ("third derivatives of W2^2" if orders == 2 else
                "second derivatives of the plan's arrays (third derivatives of W2^2; for the Hessian of "
                "W2^2 under torch.func, differentiate sdot.distance)")
        raise NotImplementedError(f"sdot: {what} are not implemented ({depth} nested torch.func "
                                  "derivative transforms)")


class _ItemSolves(_autodiff.ItemState):
    """The solves of one call under ``torch.func`` transforms, one per item (of a ``vmap``),
    each kept under the values of its inputs (seeds, masses, density values, lo, hi): the
    transforms' products find the solve of their item there (or solve it again)."""

    def __init__(self, tol, max_iter, log, raise_on_failure, options):
        self.tol, self.max_iter, self.log, self.options = tol, max_iter, log, options
        self.raise_on_failure, self.items = raise_on_failure, {}

    @staticmethod
    def _key(inputs):
        return tuple((tuple(x.shape), _driver._to_host(x).tobytes()) for x in inputs)

    def solve(self, seeds, masses, values, lo, hi, total_rho=None):
        """The plan's arrays (:data:`_ITEM_ARRAYS`) of one item (plain tensors), solved and kept."""
        xp = _driver.namespace(seeds)
        prob = newton.Problem(seeds, masses, grid_density(values, lo, hi))
        if total_rho is not None and _check_values(xp, prob, total_rho):
            raise NotImplementedError("partial transport (a target heavier than the source) is solved eagerly, "
                                      "not under torch.func transforms yet")
        with _autodiff.without_autodiff(xp):
            res = plan.solve_plan(xp, prob, self.tol, self.max_iter, log=self.log, options=self.options)
        res.update({k: _autodiff.released(res[k]) for k in _PLAN_ARRAYS + ("distance",)})
        lin = _differentiable.linearization(prob, res)
        self.items[self._key((seeds, masses, values, lo, hi))] = (lin, res, _differentiable.Kept())
        if self.raise_on_failure and not bool(res["converged"]):
            partial = OtPlan(distance=res["distance"], power_diagram=None, **{k: res[k] for k in _PLAN_ARRAYS})
            stop = (res["solution"].width, res["solution"].damping)
            raise OtNotConverged(_failure(partial, stop, self.tol, self.max_iter, prob, self.options), partial)
        return tuple(xp.asarray(res[k]) for k in _ITEM_ARRAYS)

    def of(self, inputs):
        """The :class:`._core.sensitivity.Linearization` of the item of ``inputs``."""
        return self.item(inputs)[0]

    def item(self, inputs):
        """``(linearization, solve result, Kept)`` of the item of ``inputs``."""
        key = self._key(inputs)
        if key not in self.items:
            self.solve(*inputs)
        return self.items[key]


#: The arrays of an item of :class:`_ItemSolves`, in this order.
_ITEM_ARRAYS = ("distance", "barycenters", "brenier_potential", "cell_masses", "converged", "iterations",
                "residual", "status")


def _solve_per_item(prob, total_rho, tol, max_iter, log, raise_on_failure, options):
    """The plan of a problem of tensors wrapped by ``torch.func`` transforms: every item (of a
    ``vmap``) solved on its values (:class:`_ItemSolves`), the derivatives attached by the
    torch rules, per item. The power diagram is that of a lone item (None under ``vmap``)."""
    solves = _ItemSolves(tol, max_iter, log, raise_on_failure, options)
    inputs = (prob.seeds, prob.masses, prob.density.values, prob.lo, prob.hi)
    xp = _driver.namespace(prob.seeds)
    total = total_rho if aac.is_torch_array(total_rho) else xp.asarray(float(total_rho), dtype=prob.seeds.dtype)
    res = dict(zip(_ITEM_ARRAYS, _autodiff.host_map(solves.solve, *inputs, total)))
    outputs = _autodiff.attach_linear(tuple(res[k] for k in _differentiable.PLAN_OUTPUTS), inputs, solves,
                                      _differentiable.PlanRule(_differentiable.PLAN_OUTPUTS))
    distance = _autodiff.attach(res["distance"], inputs, solves, functools.partial(_gradients_per_item, solves))
    arrays = dict(zip(_differentiable.PLAN_OUTPUTS, outputs))
    arrays.update({k: res[k] for k in _PLAN_ARRAYS if k not in arrays})
    lin, diagram = None, None
    if len(solves.items) == 1:
        (lin, item, _), = solves.items.values()
        sol = item["solution"]
        diagram = PowerDiagram._from_solution(lin_problem(lin), sol.psi, sol.evaluation.cells,
                                              sol.evaluation.moments, item["active"])
    return OtPlan(distance=distance, power_diagram=diagram, _linearization=lin, **arrays)


def lin_problem(lin):
    """The (plain) problem of the linearization ``lin``."""
    return newton.Problem(lin.seeds, lin.masses, grid_density(lin.values, lin.lo, lin.hi))


def _gradients_per_item(solves, inputs, _, needs):
    """The gradient rule of W2^2 under ``torch.func`` (see :func:`_solve_per_item`): the values
    per item (:func:`._differentiable.first_derivatives`), made differentiable by the plan's
    rules (second derivatives)."""
    def values(*plain):
        lin, res, kept = solves.item(plain)
        rule_for = functools.partial(_differentiable.PlanRule, kept=kept)
        return (*_differentiable.first_derivatives(lin, rule_for, needs), res["barycenters"],
                res["brenier_potential"])
    *grads, barycenters, potential = _autodiff.host_map(values, *inputs)
    rule_of = lambda outputs: (solves, _differentiable.PlanRule(outputs))     # noqa: E731
    return _differentiable.recorded(inputs, grads, barycenters, potential, rule_of, needs)


def _jax_on_host(xp, cut):
    """NumPy views (no copy) of the problem ``cut`` if its arrays are concrete JAX arrays on
    the CPU (eager calls, ``jax.grad`` and ``jax.jvp`` outside ``jit``), else None."""
    views = _driver.host_views(cut.seeds, cut.masses, *cut.density) if aac.is_jax_namespace(xp) else None
    return None if views is None else newton.Problem(views[0], views[1], type(cut.density)(*views[2:]))


def _solve_on_host(xp, prob, host, tol, max_iter, log, options):
    """The eager NumPy solve of the concrete JAX problem ``host`` (NumPy views): nothing
    compiles. The plan's arrays come back as JAX arrays; the solver's state stays on the
    host, in the bounded store of :mod:`._jax_host` under a token, and the derivative rules
    reach it through callbacks (:class:`._jax_host.CallbackRule`), as under ``jit``: JAX's
    caches of those rules then hold the token, never the state."""
    res = plan.solve_plan(_compat.namespace(host.seeds), host, tol, max_iter, log=log, options=options)
    like = _autodiff.detach(prob.seeds)
    to_jax = lambda a: _driver.convert_like(np.asarray(a), like)      # noqa: E731 (jax.device_put)
    lin = _differentiable.linearization(host, res)
    spec = _jax_host.Spec(*host.seeds.shape, tuple(host.density.values.shape), type(host.density),
                          np.dtype(host.seeds.dtype))
    token = _jax_host.STORE.put(_jax_host.Entry(lin, _differentiable.Kept()))
    detached = (like, _autodiff.detach(prob.masses)) + tuple(_autodiff.detach(a) for a in prob.density)
    state = (_driver.convert_like(np.asarray(token, dtype=np.int32), like),) + detached + (to_jax(lin.psi),)
    inputs = (prob.seeds, prob.masses, prob.density.values, prob.lo, prob.hi)
    plan_arrays = tuple(to_jax(res[k]) for k in _differentiable.PLAN_OUTPUTS)
    outputs = _autodiff.attach_linear(plan_arrays, inputs, state,
                                      _jax_host.CallbackRule(_differentiable.PLAN_OUTPUTS, spec))
    barycenters, potential = (plan_arrays[_differentiable.PLAN_OUTPUTS.index(k)]
                              for k in ("barycenters", "brenier_potential"))
    distance = _autodiff.attach(to_jax(res["distance"]), inputs, (state, barycenters, potential),
                                functools.partial(_jax_host._distance_gradients, spec))
    sol = res["solution"]
    diagram = PowerDiagram._from_solution(newton.Problem(prob.seeds, None, host.density), to_jax(sol.psi),
                                          sol.evaluation.cells, sol.evaluation.moments, res["active"])
    arrays = dict(zip(_differentiable.PLAN_OUTPUTS, outputs))
    arrays.update({k: to_jax(res[k]) for k in _PLAN_ARRAYS if k not in arrays})
    return OtPlan(distance=distance, power_diagram=diagram, _linearization=lin, **arrays), (sol.width, sol.damping)


def _zero_d(value):
    """A 0-d NumPy array for a NumPy scalar (NumPy's operations on 0-d arrays return scalars),
    so that :class:`OtPlan`'s ``iterations``... are 0-d arrays on every framework."""
    return np.asarray(value) if isinstance(value, np.generic) else value


#: The arrays of an :class:`OtPlan` besides the distance and the diagram.
_PLAN_ARRAYS = ("barycenters", "cell_masses", "brenier_potential", "converged", "iterations", "residual",
                "status")


def distance(source, target, **options):
    """W2^2 between ``source`` and ``target``: a scalar, or shape ``(b,)`` for batches.

    With a batch on either side, item ``i`` is W2^2 of item ``i`` of the batch of sources
    and item ``i`` of the batch of targets; a single source or target is shared by every
    item (broadcast). Batches of different sizes raise ``ValueError``.
    Differentiable twice with respect to the Dirac positions and masses and the grid
    values, once with respect to the grid's domain (torch autograd, double backward
    included; JAX ``grad``, ``jvp``, ``hessian``, ``jit``, ``vmap``, ``scan``), item by item.
    ``options`` are those of :func:`optimal_transport_plan`.
    """
    return _plan("distance", ("distance",), source, target, orders=2, **options).distance


def distances(source, target, **options):
    """W2^2 of every item of a batch, shape ``(b,)``: :func:`distance` where at least one of
    ``source`` (``BatchOfSumOfDiracs``...) and ``target`` (``BatchOfPolynomialGrid``...) is a
    batch; two single measures raise ``TypeError`` (a call meant for a batch says so).

    Traced JAX batches (under ``jit``, ``vmap``) run as one ``jax.vmap`` of the solve; others,
    concrete JAX arrays on the CPU included, loop over the items.
    """
    if not (_batched.is_batch(source) or _batched.is_batch(target)):
        raise TypeError("distances takes a batch of sources (BatchOfSumOfDiracs, BatchOfSumOfWeightedDiracs) "
                        "or of targets (BatchOfPolynomialGrid), or both; use distance for one pair, got "
                        f"{type(source).__name__} and {type(target).__name__}")
    return _plan("distances", ("distance",), source, target, orders=2, **options).distance


def barycenters(source, target, **options):
    """Barycentre of each Dirac's Laguerre cell under ``target``, shape ``(n, d)``
    (``(b, n, d)`` for batches, paired as in :func:`distance`); differentiable like
    :attr:`OtPlan.barycenters`. ``options`` are those of :func:`optimal_transport_plan`."""
    return _plan("barycenters", ("barycenters",), source, target, **options).barycenters
