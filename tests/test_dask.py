"""The distributed solve (sdot.dask) on a LocalCluster of 2 workers against the
single-process NumPy solve: the same W2^2 (1e-10 relative) and cell masses (within the
tolerance), on uniform and Gaussian targets, clustered Diracs, tiles without Diracs and a
first halo too narrow for the certificate; the k-d tiles' balance and the halo test; clear
errors on bad inputs. Small problems (N <= 2000): each solve costs seconds of actor calls."""
from __future__ import annotations

import os
import signal

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
pytest.importorskip("distributed")

import sdot                                     # noqa: E402
import sdot.dask                                # noqa: E402
from sdot._dask import tiling                   # noqa: E402

TOL = 1e-12


def _gaussian_grid(sigma=0.3, size=32):
    t = (np.arange(size) + 0.5) / size
    return sdot.Grid(np.exp(-((t[:, None] - 0.5) ** 2 + (t[None, :] - 0.5) ** 2) / (2 * sigma ** 2)))


#: the single-process references run the NumPy core (grids built here hold NumPy values)
pytestmark = pytest.mark.usefixtures("numpy_driver")


def _single(X, grid):
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(X), grid, tol=TOL)
    return float(plan.distance), np.asarray(plan.cell_masses)


def _compare(client, X, grid, chunks=500, **options):
    sol = sdot.dask.solve(da.from_array(X, chunks=(chunks, 2)), grid, client=client, tol=TOL, **options)
    w2, masses = _single(X, grid)
    assert sol.converged
    assert abs(sol.distance - w2) <= 1e-10 * w2
    dask_masses, _, _ = sol.gather()
    assert np.max(np.abs(dask_masses - 1.0 / X.shape[0])) <= TOL
    assert np.max(np.abs(dask_masses - masses)) <= 2 * TOL
    return sol


def test_uniform_target(client):
    X = np.random.default_rng(1).random((2000, 2))
    sol = _compare(client, X, sdot.Grid(np.ones((1, 1))))
    assert len(sol.tiles) == 4 and sol.iterations > 2


def test_gaussian_target_and_halo_growth(client):
    """A first halo of half a spacing cannot certify the cells: tiles grow theirs."""
    X = np.random.default_rng(2).random((1500, 2))
    sol = _compare(client, X, _gaussian_grid(), halo=0.5)
    assert sol.halo_growths > 0


def test_clustered_diracs(client):
    """Two tight blobs (500 and 100 Diracs): the k-d cuts still give equal counts."""
    rng = np.random.default_rng(3)
    X = np.concatenate([0.25 + 0.03 * rng.standard_normal((500, 2)), 0.75 + 0.03 * rng.standard_normal((100, 2))])
    X = np.clip(X, 0.01, 0.99)
    t = (np.arange(32) + 0.5) / 32
    bump = lambda c, s, w: w * np.exp(-((t[:, None] - c) ** 2 + (t[None, :] - c) ** 2) / (2 * s * s))   # noqa: E731
    grid = sdot.Grid(bump(0.25, 0.06, 5.0) + bump(0.75, 0.06, 1.0) + 1e-2)
    sol = _compare(client, X, grid, chunks=300)
    counts = [t.sizes().result()[0] for t in sol.tiles]
    assert max(counts) - min(counts) <= 1


def test_tiles_without_diracs(client):
    """12 Diracs in 16 tiles: some tiles own nothing."""
    X = np.random.default_rng(4).random((12, 2))
    sol = _compare(client, X, sdot.Grid(np.ones((1, 1))), chunks=5, tiles_per_worker=8)
    counts = [t.sizes().result()[0] for t in sol.tiles]
    assert counts.count(0) > 0 and sum(counts) == 12


def test_public_functions_take_dask_arrays(client):
    """sdot.distance and sdot.barycenters of SumOfDiracs(dask array): dask arrays, the
    single-process values."""
    X = np.random.default_rng(7).random((300, 2))
    grid = _gaussian_grid()
    source = sdot.SumOfDiracs(da.from_array(X, chunks=(100, 2)))
    w2 = sdot.distance(source, grid, tol=TOL)
    assert isinstance(w2, da.Array) and w2.shape == ()
    bary = sdot.barycenters(source, grid, tol=TOL)
    assert isinstance(bary, da.Array) and bary.chunks == ((100, 100, 100), (2,))
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(X), grid, tol=TOL)
    assert abs(float(w2.compute()) - float(plan.distance)) <= 1e-10 * float(plan.distance)
    assert np.max(np.abs(bary.compute() - np.asarray(plan.barycenters))) <= 1e-8
    with pytest.raises(NotImplementedError, match="optimal_transport_plan"):
        sdot.optimal_transport_plan(source, grid)
    with pytest.raises(NotImplementedError, match="partial transport is solved in one process"):
        sdot.distance(source, sdot.Grid(np.ones((4, 4)), mass=2.0))


def test_distances_over_a_dask_batch_solve_each_item_on_the_cluster(client):
    """sdot.distances of BatchOfSumOfDiracs(dask array (b, n, 2)): a (b,) dask array equal to
    the single-process distances of the items."""
    X = np.random.default_rng(8).random((2, 300, 2))
    X[1] = 0.2 + 0.6 * X[1]                                          # another problem
    grid = _gaussian_grid()
    got = sdot.distances(sdot.BatchOfSumOfDiracs(da.from_array(X, chunks=(1, 100, 2))), grid, tol=TOL)
    assert isinstance(got, da.Array) and got.shape == (2,)
    want = [float(sdot.distance(sdot.SumOfDiracs(x), grid, tol=TOL)) for x in X]
    np.testing.assert_allclose(got.compute(), want, rtol=1e-10)


def test_lost_worker_costs_one_step(client):
    """A worker process killed after Newton step 1 (its nanny restarts it): the tiles are
    rebuilt from the checkpointed weights and the solve ends at the single-process answer."""
    X = np.random.default_rng(8).random((2000, 2))
    grid = _gaussian_grid()
    pid = next(iter(client.run(os.getpid).values()))
    steps = []

    def kill_after_first_step(step, residual, damping):
        steps.append(step)
        if step == 1:
            os.kill(pid, signal.SIGKILL)
    with pytest.warns(RuntimeWarning, match="worker was lost"):
        sol = sdot.dask.solve(da.from_array(X, chunks=(500, 2)), grid, client=client, tol=TOL,
                              callback=kill_after_first_step)
    client.wait_for_workers(2, timeout=30)
    assert pid not in client.run(os.getpid).values()
    assert sol.recoveries == 1 and sol.converged
    assert steps == list(range(sol.iterations + 1))         # no step lost: step 2 was redone
    w2, masses = _single(X, grid)
    assert abs(sol.distance - w2) <= 1e-10 * w2
    assert np.max(np.abs(sol.gather()[0] - masses)) <= 2 * TOL


def test_weighted_diracs(client):
    """SumOfWeightedDiracs(X, w), w a dask array (some zero masses) or NumPy: the masses
    per Dirac and W2^2 of the single-process solve."""
    rng = np.random.default_rng(9)
    X = rng.random((800, 2))
    w = rng.uniform(0.5, 2.0, 800)
    w[::67] = 0.0
    grid = _gaussian_grid()
    plan = sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(X, w), grid, tol=TOL)
    Xd = da.from_array(X, chunks=(300, 2))
    sol = sdot.dask.solve(Xd, grid, client=client, tol=TOL, masses=da.from_array(w, chunks=200))
    assert abs(sol.distance - float(plan.distance)) <= 1e-10 * float(plan.distance)
    masses = sol.gather()[0]
    assert np.max(np.abs(masses - w / w.sum())) <= TOL
    assert np.all(masses[::67] == 0.0)
    w2 = sdot.distance(sdot.SumOfWeightedDiracs(Xd, w), grid, tol=TOL)
    assert abs(float(w2.compute()) - float(plan.distance)) <= 1e-10 * float(plan.distance)
    with pytest.raises(ValueError, match="masses"):
        sdot.dask.solve(Xd, grid, client=client, masses=-w)


def test_kd_tiles_balance_and_partition():
    rng = np.random.default_rng(5)
    points = np.concatenate([1e-3 * rng.standard_normal((3000, 2)), 5.0 + rng.random((1000, 2))])
    lo, hi, owner = tiling.kd_tiles(points, 3)
    assert np.array_equal(owner, tiling.tile_of(points, lo, hi))
    inside = (points[:, None, :] >= lo[None]) & (points[:, None, :] < hi[None])
    assert np.all(np.sum(np.all(inside, axis=2), axis=1) == 1)          # one tile each
    counts = np.bincount(owner, minlength=8)
    assert counts.max() - counts.min() <= 1


def test_halo_certificate_against_brute_force():
    """The halo test accepts a vertex only if every Dirac outside the halo has a larger power
    there: checked against every Dirac on random vertices and weights."""
    rng = np.random.default_rng(6)
    seeds = rng.random((400, 2))
    psi = 1e-3 * rng.standard_normal(400)
    lo, hi = np.array([0.3, 0.3]), np.array([0.6, 0.6])
    width = 0.08
    owned = np.all((seeds >= lo) & (seeds < hi), axis=1)
    halo = ~owned & (tiling.distance_to_box(seeds, lo, hi) <= width)
    outside = ~owned & ~halo
    own = np.flatnonzero(owned)
    vertices = rng.uniform(0.005, 0.05, (own.size, 1, 1)) * rng.standard_normal((own.size, 6, 2))
    count = np.full(own.size, 6)
    ok = tiling.halo_certified(seeds[own], psi[own], vertices, count, np.ones(own.size, bool), lo, hi,
                               np.array([width]), np.array([psi.max()]))
    points = seeds[own][:, None, :] + vertices
    power_own = np.sum(vertices ** 2, axis=2) - psi[own][:, None]
    power_out = np.min(np.sum((points[:, :, None, :] - seeds[outside][None, None]) ** 2, axis=3) - psi[outside], axis=2)
    truly = np.all(power_own <= power_out, axis=1)
    assert np.all(truly[ok])                    # no false certificate
    assert ok.sum() > 0 and (~ok).sum() > 0     # both outcomes occur
    # the per-cell pre-test loses nothing: the same answer as the test of every vertex
    gap = np.maximum(np.maximum(lo - points, points - hi), 0.0)
    every_vertex = tiling._vertices_certified(np.sqrt(np.sum(gap * gap, axis=2)), power_own, np.ones((own.size, 6), bool),
                                              psi[own], [(width, psi.max())], seeds.dtype)
    assert np.array_equal(ok, every_vertex)
    # the local test by boxes of the outside Diracs (their bounding boxes and largest weights)
    box_lo, box_hi, top = tiling.box_maxima(seeds[outside], psi[outside], 0.05)
    by_boxes = tiling.boxes_certified(seeds[own], psi[own], vertices, count, box_lo, box_hi, top, np.arange(own.size))
    assert np.all(truly[by_boxes])
    assert by_boxes.sum() > ok.sum()            # sharper than one bound for all outside Diracs


def test_errors(client):
    grid = sdot.Grid(np.ones((1, 1)))
    with pytest.raises(TypeError, match="dask array"):
        sdot.dask.solve(np.zeros((4, 2)), grid, client=client)
    with pytest.raises(ValueError, match="unknown chunk sizes"):
        x = da.from_array(np.random.default_rng(0).random((20, 2)), chunks=(5, 2))
        sdot.dask.solve(x[x[:, 0] > 0.5], grid, client=client)
    with pytest.raises(NotImplementedError, match="2D and 3D"):
        sdot.dask.solve(da.zeros((10, 4), chunks=(5, 4)), grid, client=client)
    with pytest.raises(ValueError, match="shape"):
        sdot.dask.solve(da.zeros((10,), chunks=5), grid, client=client)
    bad = np.random.default_rng(0).random((20, 2))
    bad[7, 1] = np.nan
    with pytest.raises(ValueError, match="nan"):
        sdot.dask.solve(da.from_array(bad, chunks=(5, 2)), grid, client=client)
