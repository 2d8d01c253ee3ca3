"""Semi-discrete transport distributed over a dask.distributed cluster (2D and 3D, first version).

``sdot.distance(sdot.SumOfDiracs(X), grid)`` (or ``SumOfWeightedDiracs(X, w)``) with ``X``
a ``dask.array`` ``(n, 2)`` or ``(n, 3)`` (or
``sdot.dask.solve(X, grid)``, which reports more) solves the problem on the workers of the
current ``distributed`` client: the plane (or space) is cut into tiles of equal Dirac counts, each a dask actor
holding its Diracs, a halo of neighbours, their weights and cells; the client drives the
damped Newton method and a conjugate gradient with scalars and halo rows only. See
docs/dask.md.
"""
from __future__ import annotations

import numpy as np

from ._core.density import grid_density
from ._grids import PolynomialGrid
from ._core.options import DEFAULT
from ._dask import dimensions, setup
from ._dask.solve import DaskSolution, solve as _solve

__all__ = ["distance", "solve", "DaskSolution"]

#: The public functions that take dask arrays (``sdot.distance(sdot.SumOfDiracs(X), grid)``...).
_PUBLIC = ("distance", "barycenters", "distances")


def _client(client):
    """``client``, else the current ``distributed`` client, else a new ``LocalCluster``'s."""
    if client is not None:
        return client
    from distributed import Client, LocalCluster, get_client

    try:
        return get_client()
    except ValueError:
        cluster = LocalCluster()
        print(f"sdot.dask: no dask.distributed client; started {cluster!r} (dashboard {cluster.dashboard_link})")
        return Client(cluster)


def solve(positions, grid, client=None, tol=None, max_iter=300, tiles_per_worker=None, halo=None,
          aggregate_size=32, verbose=False, raise_on_failure=True, masses=None, callback=None):
    """Solve the transport from Diracs at ``positions`` (equal masses, or ``masses``) to
    ``grid`` on a dask cluster.

    Parameters
    ----------
    positions : dask.array.Array, shape (n, d)
        ``d`` 2 or 3. Chunk sizes must be known; chunks stay on the workers.
    grid : sdot.Grid or sdot.PolynomialGrid
        A grid of NumPy values of the same dimension (one value per cell, or Bernstein
        coefficients of degree p: ``PolynomialGrid(values, degree=p)``), normalised to mass 1.
    client : distributed.Client, optional
        Default: the current client (``distributed.get_client()``), else a new
        ``LocalCluster`` (reported on stdout).
    tol : float, optional
        Max absolute cell-mass error (masses sum to 1); default ``sdot.default_tolerance("FP64")``.
    max_iter : int
        Newton steps.
    tiles_per_worker : int, optional
        Tiles per worker (rounded up to a power of two in all). Default: 2, or more so that
        no tile owns more than 250,000 Diracs (a worker's peak memory holds the temporaries
        of one tile's diagram on top of its tiles' state).
    halo : float, optional
        First halo width, in mean Dirac spacings (tiles whose cells it does not certify
        get a halo twice as wide, as often as needed); default 8 in 2D, 4 in 3D.
    aggregate_size : int
        Diracs per aggregate of the coarse level of the preconditioner.
    verbose : bool
        Print one line per Newton step.
    raise_on_failure : bool
        Raise ``RuntimeError`` if the solve does not reach ``tol``.
    masses : dask.array.Array or array_like, shape (n,), optional
        The Diracs' masses, >= 0 (normalised here to sum 1; zero masses get no cell); a
        NumPy array is chunked like ``positions``. Default: equal masses ``1/n``.
    callback : callable, optional
        Called on the client after each Newton step as ``callback(step, residual, damping)``
        (``damping`` 0 for a rejected step).

    A worker lost during the solve costs the step it interrupted: the client keeps the
    weights of the last accepted step, rebuilds the tiles on the live workers (restarted
    ones included) and redoes the step (a ``RuntimeWarning`` says so; at most 3 times).

    Returns
    -------
    DaskSolution
        ``distance`` (W2^2, a float), ``residual``, ``converged``, ``iterations``,
        ``cg_iterations`` (per Newton step), ``halo_growths``, ``recoveries`` (rebuilds after a
        lost worker); ``gather()`` brings the cell
        masses, the potential and the barycentres to the client.
    """
    from ._driver import default_tolerance

    positions = setup.checked(positions)
    masses, total = setup.checked_masses(masses, positions)
    grid = grid.with_dim(positions.shape[1])
    values = np.asarray(grid.density, dtype=np.float64)
    lo, hi = (np.asarray(a, dtype=np.float64) for a in grid.domain)
    density = grid_density(values, lo, hi)
    centre, scale = 0.5 * (lo + hi), np.max(hi - lo)        # the core's normalisation (plan.normalised)
    def log(it, err, t):
        if verbose:
            print(f"sdot.dask newton step {it:3d}  residual {err:.3e}  damping {t:.4g}")
        if callback is not None:
            callback(it, err, t)
    tol = default_tolerance("FP64") if tol is None else tol
    out = _solve(_client(client), positions, masses, total, density.normalised(centre, scale), centre, scale, tol,
                 max_iter, tiles_per_worker, dimensions.first_halo(positions.shape[1], halo), aggregate_size, DEFAULT,
                 log)
    if raise_on_failure and not out.converged:
        raise RuntimeError(f"sdot.dask: no convergence: residual {out.residual:.3e} > tol {tol:.1e} after "
                           f"{out.iterations} Newton steps")
    return out


def distance(positions, grid, client=None, **options):
    """W2^2 between Diracs at ``positions`` (a dask array ``(n, d)``) and ``grid``,
    solved on the dask cluster (see :func:`solve` for ``client`` and ``options``): a float."""
    return solve(positions, grid, client, **options).distance


class _DaskPlan:
    """What :func:`sdot.distance` and :func:`sdot.barycenters` read of a distributed solve:
    ``distance`` a 0-d dask array, ``barycenters`` a dask array chunked like the positions."""

    def __init__(self, solution, chunks, name):
        import dask.array as da

        self.distance = da.from_array(np.asarray(solution.distance), chunks=())
        self.barycenters = None
        if name == "barycenters":       # through the client for now (see docs/dask.md)
            self.barycenters = da.from_array(solution.gather()[2], chunks=chunks)

    @classmethod
    def of_distances(cls, distances):
        """The plan of a batch: its ``distance`` the ``(b,)`` dask array ``distances``."""
        plan = object.__new__(cls)
        plan.distance, plan.barycenters = distances, None
        return plan


def _batch_distances(source, target, tol, max_iter, verbose, raise_on_failure):
    """``sdot.distances`` of a batch of sources whose positions are a dask array ``(b, n, d)``
    against one grid: each item solved on the cluster in turn (its Diracs spread over the
    workers), the ``(b,)`` distances as a dask array."""
    import dask.array as da

    from ._measures import BatchOfSumOfDiracs

    if type(source) is not BatchOfSumOfDiracs or source._mass != 1.0 or not isinstance(target, PolynomialGrid):
        raise NotImplementedError("sdot.distances with dask arrays takes BatchOfSumOfDiracs(X) (mass 1) against "
                                  "one grid for now")
    positions = source.positions
    if positions.ndim != 3:
        raise ValueError(f"a batch of positions must have shape (b, n, d), got {positions.shape}")
    values = [solve(setup.checked(positions[i]), target, tol=tol, max_iter=max_iter, verbose=verbose,
                    raise_on_failure=raise_on_failure).distance for i in range(positions.shape[0])]
    return _DaskPlan.of_distances(da.from_array(np.asarray(values, dtype=np.float64), chunks=(1,)))


def public_plan(name, source, target, tol, max_iter, verbose, raise_on_failure):
    """``sdot.<name>(source, target)`` with the positions of ``source`` a dask array: solved on
    the current dask.distributed client (see :func:`solve`)."""
    from ._measures import SumOfDiracs, SumOfWeightedDiracs

    if name not in _PUBLIC:
        raise NotImplementedError(f"sdot.{name} with dask arrays is not distributed yet; "
                                  f"sdot.distance, sdot.distances and sdot.barycenters are")
    if name == "distances":
        return _batch_distances(source, target, tol, max_iter, verbose, raise_on_failure)
    if type(source) not in (SumOfDiracs, SumOfWeightedDiracs) or source.batched or source._mass != 1.0:
        raise NotImplementedError("the dask solve takes SumOfDiracs(X) or SumOfWeightedDiracs(X, w) of mass 1 "
                                  "(the default) for now")
    if not isinstance(target, PolynomialGrid):
        raise NotImplementedError("the dask solve takes one grid, not a batch")
    total = float(target.integral) if target.mass is None else float(target.mass)
    if abs(total - 1.0) > 1e-6:
        raise NotImplementedError(f"the dask solve is balanced: the target has mass {total:.6g}, the source 1 "
                                  "(partial transport is solved in one process: NumPy, torch or JAX positions)")
    positions = setup.checked(source.positions)
    sol = solve(positions, target, tol=tol, max_iter=max_iter, verbose=verbose, raise_on_failure=raise_on_failure,
                masses=source._weights)
    return _DaskPlan(sol, positions.chunks, name)
