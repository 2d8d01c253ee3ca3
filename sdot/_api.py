"""Public functions: validate, convert, dispatch to the routes of :mod:`._routes`; no numerics
here (the plan object: :mod:`._ot_plan`; the checks: :mod:`._checks`; the diagnosis of a
failed solve: :mod:`._diagnosis`)."""
from __future__ import annotations

import time
import types

import array_api_compat as aac
import numpy as np

from . import _autodiff, _batched, _differentiable, _driver, _partial
from ._core import evaluation
from ._core.options import DEFAULT as NEWTON_OPTIONS
from ._spline_grid import SplineGrid
from ._diagram import PowerDiagram
from ._driver import default_tolerance
from ._measures import BatchOfSumOfDiracs, SumOfDiracs, SumOfWeightedDiracs, align
from ._checks import (check_kinds, check_metric, check_options, check_pair, checked_problem, total_mass,
                      with_metric)
from ._diagnosis import failure, STATUS
from ._ot_plan import OtNotConverged, OtPlan, PLAN_FIELDS
from ._routes import check_depth, solve, solve_per_item


__all__ = ["distance", "distances", "barycenters", "optimal_transport_plan", "OtPlan",
           "OtNotConverged", "default_tolerance"]


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


def optimal_transport_plan(source, target, tol=None, max_iter=300, verbose=False,
                           raise_on_failure=True, metric=None):
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
    metric : sdot.metrics.Norm2 or sdot.metrics.PeriodicMetric, optional
        The ground cost (default ``Norm2()``, ``|x - y|^2``); ``PeriodicMetric`` is the squared
        distance on the torus (or cylinder) of the target's domain: see :mod:`sdot.metrics`.

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
    return _plan("optimal_transport_plan", PLAN_FIELDS, source, target, tol=tol, max_iter=max_iter,
                 verbose=verbose, raise_on_failure=raise_on_failure, metric=metric)


PowerDiagram._solve = staticmethod(optimal_transport_plan)      # PowerDiagram.adjust_weights's solve


_OPTIONS = ("tol", "max_iter", "verbose", "raise_on_failure", "metric")


def _plan(name, keep, source, target, orders=1, **options):
    """The :class:`OtPlan` of the public function ``name``. For batches, one plan per item,
    stacked; under ``jax.vmap`` only the fields ``keep`` are computed (the others are None).
    Its arrays are differentiated at most ``orders`` times under ``torch.func`` (2 for
    :func:`distance`: its rule is the plan's first derivatives)."""
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise TypeError(f"{name}() got unexpected keyword arguments {unknown}; its options are those of "
                        f"optimal_transport_plan: {', '.join(_OPTIONS)}")
    tol, max_iter, verbose, raise_on_failure, metric = (options.get(k, default) for k, default in
                                                        zip(_OPTIONS, (None, 300, False, True, None)))
    tol, max_iter = check_options(tol, max_iter)
    check_kinds(name, source, target)
    periodic = check_metric(metric)
    if _driver.driver.framework == "dask" and aac.is_numpy_array(source.positions):
        source = _distributed(source)                # rule 2: NumPy positions go to the driver's dask
    if aac.is_dask_array(source.positions):          # rule 1 for dask arrays: the distributed solve
        from . import dask as _dask

        if periodic:
            raise NotImplementedError(f"{name}: the distributed solve (dask) does not support metric=PeriodicMetric "
                                      "yet; solve with NumPy, torch or JAX arrays")

        return _dask.public_plan(name, source, target, tol, max_iter, verbose, raise_on_failure)
    if not (_batched.is_batch(source) or _batched.is_batch(target)):
        return _plan_of_pair(source, target, tol, max_iter, verbose, raise_on_failure, orders, metric)
    b = _batched.batch_size(name, source, target)
    failures = []

    def solve(source, target):
        try:
            out = _plan_of_pair(source, target, tol, max_iter, verbose, raise_on_failure, orders, metric)
        except OtNotConverged as failure:
            out = failure.plan
            failures.append(str(failure))
        return {f: getattr(out, f) for f in PLAN_FIELDS}

    out = OtPlan(**{**dict.fromkeys(PLAN_FIELDS), **_batched.over_items(solve, *align(source, target), b, keep)})
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


def _plan_of_pair(source, target, tol, max_iter, verbose, raise_on_failure, orders, metric=None,
                  options=NEWTON_OPTIONS):
    """The plan of one source and one target (``tol`` and ``max_iter`` checked; ``orders``:
    see :func:`_plan`) for the ground ``metric`` (:mod:`sdot.metrics`), solved with the Newton
    ``options`` (a :class:`._core.options.NewtonOptions`)."""
    spline = target if isinstance(target, SplineGrid) else None     # NumPy's jvp/vjp: its values
    source, target = check_pair(source, target)
    xp, prob, partial = checked_problem(source, target)
    prob = with_metric(xp, prob, metric, partial)
    tol = default_tolerance() if tol is None else tol
    if partial:
        return _partial_plan(xp, prob, tol, max_iter, verbose, raise_on_failure, source, target, options)
    if _autodiff.transformed(prob.seeds, prob.masses, *prob.density):   # torch.func: per item, checked there
        check_depth(prob, orders)
        return solve_per_item(prob, total_mass(target.astype(prob.seeds.dtype)), tol, max_iter,
                               _printer(verbose), raise_on_failure, options)
    out, stop = solve(xp, prob, tol, max_iter, _printer(verbose), raise_on_failure, options)
    if aac.is_numpy_array(out.barycenters):
        out._normalisation = _differentiable.Normalisation(source, target, out._linearization, spline)
    if raise_on_failure and not _driver.is_tracer(out.converged) and not bool(out.converged):
        raise OtNotConverged(failure(out, stop, tol, max_iter, prob, options), out)
    return out


def _partial_plan(xp, prob, tol, max_iter, verbose, raise_on_failure, source, target, options):
    """The plan of a partial transport (:mod:`._partial`), refused where not solved yet; on
    NumPy, with the derivatives of its distance (:class:`._partial.DistanceRule`)."""
    if _autodiff.transformed(prob.seeds, prob.masses, *prob.density):     # torch.func: per item
        return OtPlan(power_diagram=None, **_partial.plan_per_item(prob, tol, max_iter, _printer(verbose),
                                                                   raise_on_failure, options))
    with _driver.quiet_int64(), _driver.one_thread(xp):
        fields, sol, active, host, sites = _partial.plan_of(xp, prob, tol, max_iter, _printer(verbose), options)
    potential = _autodiff.detach(fields["brenier_potential"])
    if sol is None:                         # under jax.jit: the cells are computed when asked
        period = None if prob.period is None else tuple(np.asarray(prob.period, dtype=np.float64).tolist())
        diagram = PowerDiagram._at_weights(prob.seeds, potential, prob.density, period)
    else:
        diagram = PowerDiagram._from_solution(evaluation.Problem(_autodiff.detach(prob.seeds), None, host.density,
                                                                 host.period),
                                              potential, sol.evaluation.cells, sol.evaluation.moments, active,
                                              *sites)
    diagram.capped = True
    out = OtPlan(power_diagram=diagram, **fields)
    if sol is not None and aac.is_numpy_array(out.barycenters):
        lin = types.SimpleNamespace(seeds=host.seeds, lo=host.lo, hi=host.hi, values=host.density.values)
        out._normalisation = _differentiable.Normalisation(source, target, lin)
        out._kept_rule = _partial.numpy_rule(host, fields, sol, active, sites)
    if raise_on_failure and not _driver.is_tracer(out.converged) and not bool(out.converged):
        raise OtNotConverged(f"partial transport did not converge: {STATUS[int(out.status)]} after "
                             f"{int(out.iterations)} Newton steps, max cell-mass error {float(out.residual):.3g} "
                             f"(tol {tol:.3g}). The partial plan is the exception's .plan (converged=False).", out)
    return out


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
