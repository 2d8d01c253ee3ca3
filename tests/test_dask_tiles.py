"""The tile count of the distributed solve and what a tile keeps of its diagrams
(the memory per Dirac: docs/dask.md)."""
from __future__ import annotations

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")

import sdot                                     # noqa: E402
import sdot.dask                                # noqa: E402
from sdot._core import evaluation                   # noqa: E402
from sdot._core.density import grid_density     # noqa: E402
from sdot._dask import setup                    # noqa: E402
from sdot._dask.tile_system import cells_of, kept   # noqa: E402

TOL = 1e-12


def test_default_tile_count_bounds_the_tiles():
    """2 tiles per worker, more when a tile would own more than MAX_TILE Diracs; the count
    rounds up to a power of two."""
    assert 2 ** setup.tile_levels(200_000, 2) == 4
    assert 2 ** setup.tile_levels(1_000_000, 2) == 4                # 250,000 a tile
    assert 2 ** setup.tile_levels(1_000_001, 2) == 8
    assert 2 ** setup.tile_levels(4_000_000, 2) == 16
    assert 2 ** setup.tile_levels(4_000_000, 3) == 32               # 6 a worker: 18 tiles, rounded up
    assert 2 ** setup.tile_levels(10, 1) == 2
    assert 2 ** setup.tile_levels(4_000_000, 2, tiles_per_worker=1) == 2   # an explicit count is kept
    for bad in (0, -1, 1.5, "2"):
        with pytest.raises(ValueError, match="tiles_per_worker"):
            setup.tile_levels(1000, 2, bad)


class _SlowScheduler:
    """A client whose scheduler misses its first ``misses`` answers: ``scheduler_info()`` then
    returns the client's cache, which lists no workers (distributed 2026.8)."""

    def __init__(self, misses):
        self.misses = misses

    def scheduler_info(self):
        self.misses -= 1
        return {"workers": {} if self.misses >= 0 else {"tcp://w0": {"nthreads": 1}}}


def test_workers_are_asked_again_when_the_scheduler_is_slow():
    """A stale answer with no workers is asked again (a CI run once placed tiles on an empty
    list: IndexError); a cluster that stays empty is a clear error, not an IndexError."""
    assert list(setup.live_workers(_SlowScheduler(3), timeout=5)) == ["tcp://w0"]
    with pytest.raises(RuntimeError, match="no live worker"):
        setup.live_workers(_SlowScheduler(10 ** 6), timeout=0.5)


def test_kept_labels_are_exact(array_kernels):
    """A tile keeps its cells' labels in int32; the core gets them back in int64, equal."""
    rng = np.random.default_rng(0)
    seeds = rng.random((500, 2)) - 0.5
    density = grid_density(np.ones((1, 1)), np.zeros(2), np.ones(2)).normalised(np.full(2, 0.5), 1.0)
    ev = evaluation.evaluate(np, evaluation.Problem(seeds, None, density), 1e-4 * rng.random(500), np.ones(500, bool))
    small = kept(ev)
    assert small.cells.labels.dtype == np.int32 and ev.cells.labels.dtype == np.int64
    assert np.array_equal(small.cells.labels, ev.cells.labels)
    assert np.min(ev.cells.labels) == -4 and np.max(ev.cells.labels) == 499    # the box's sides, the last Dirac
    back = cells_of(small)
    assert back.labels.dtype == np.int64 and np.array_equal(back.labels, ev.cells.labels)
    assert back.vertices is ev.cells.vertices


def test_default_tile_count_caps_the_tiles():
    """By default 2 tiles per worker, more where a tile would hold more than ``MAX_TILE``
    (250,000) Diracs: ``2^depth`` tiles."""
    assert setup.MAX_TILE == 250_000
    assert [setup.tile_levels(n, 2) for n in (2000, 1_000_000, 1_000_001, 2_000_001)] == [2, 2, 3, 4]
    assert setup.tile_levels(2000, 2, tiles_per_worker=4) == 3


def test_small_tiles_same_answer():
    """With 4 tiles per worker (8 tiles of at most 300 Diracs for 2000 Diracs on 2 workers),
    the solve gives the single process's W2^2 and masses."""
    saved, sdot.driver.framework = sdot.driver.framework, "numpy"
    try:
        X = np.random.default_rng(5).random((2000, 2))
        grid = sdot.Grid(np.ones((1, 1)))
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster, \
                distributed.Client(cluster) as client:
            sol = sdot.dask.solve(da.from_array(X, chunks=(500, 2)), grid, client=client, tol=TOL, tiles_per_worker=4)
            masses = sol.gather()[0]
            counts = [t.sizes().result()[0] for t in sol.tiles]
        plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(X), grid, tol=TOL)
    finally:
        sdot.driver.framework = saved
    assert len(sol.tiles) == 8 and max(counts) <= 300 and sum(counts) == 2000
    assert sol.converged and abs(sol.distance - float(plan.distance)) <= 1e-10 * float(plan.distance)
    assert np.max(np.abs(masses - np.asarray(plan.cell_masses))) <= 2 * TOL
