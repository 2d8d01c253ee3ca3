"""The distributed solve (sdot.dask) in 3D, and on Bernstein grids (degree 1, 2D and 3D), on a
LocalCluster of 2 workers against the single-process NumPy solve: the same W2^2 (1e-10
relative), barycentres and cell masses on the uniform cube and a voxel Gaussian, clustered
Diracs, a first halo too narrow for the certificate; the k-d tiles and the halo test in 3D
against brute force; positions of dimension 4 refused. Small problems (N <= 1000): a 3D solve
costs a few seconds."""
from __future__ import annotations

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
pytest.importorskip("distributed")

import sdot                                     # noqa: E402
import sdot.dask                                # noqa: E402
from sdot._dask import tiling                   # noqa: E402

TOL = 1e-12


#: the single-process references run the NumPy core (grids built here hold NumPy values)
pytestmark = pytest.mark.usefixtures("numpy_driver")


def _voxels(size, *bumps, floor=0.0):
    """A ``size^3`` voxel image: ``floor`` plus Gaussian ``bumps`` ``(centre, sigma, weight)``."""
    t = (np.arange(size) + 0.5) / size
    x, y, z = np.meshgrid(t, t, t, indexing="ij")
    return sdot.Grid(floor + sum(w * np.exp(-((x - c) ** 2 + (y - c) ** 2 + (z - c) ** 2) / (2 * s * s))
                                 for c, s, w in bumps))


def _compare(client, X, grid, chunks=500, **options):
    """The distributed solve of ``X`` against the single process's: W2^2 to 1e-10 relative,
    cell masses within the tolerance, barycentres to 1e-9."""
    sol = sdot.dask.solve(da.from_array(X, chunks=(chunks, 3)), grid, client=client, tol=TOL, **options)
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(X), grid, tol=TOL)
    w2 = float(plan.distance)
    assert sol.converged
    assert abs(sol.distance - w2) <= 1e-10 * w2
    masses, _, bary = sol.gather()
    assert np.max(np.abs(masses - 1.0 / X.shape[0])) <= TOL
    assert np.max(np.abs(masses - np.asarray(plan.cell_masses))) <= 2 * TOL
    assert np.max(np.abs(bary - np.asarray(plan.barycenters))) <= 1e-9
    return sol


def test_uniform_cube(client):
    X = np.random.default_rng(31).random((1000, 3))
    sol = _compare(client, X, sdot.Grid(np.ones((1, 1, 1))))
    assert len(sol.tiles) == 4 and sol.iterations > 2


def test_voxel_gaussian_and_halo_growth(client):
    """An 8^3 voxel Gaussian; a first halo of half a spacing cannot certify the cells: tiles
    grow theirs."""
    X = np.random.default_rng(32).random((600, 3))
    sol = _compare(client, X, _voxels(8, (0.5, 0.3, 1.0), floor=0.2), halo=1.0, chunks=150)
    assert sol.halo_growths > 0


def test_clustered_diracs(client):
    """Two tight blobs (240 and 60 Diracs) on a density of two bumps: the k-d cuts still give
    tiles of equal counts, and the answer is the single process's."""
    rng = np.random.default_rng(33)
    X = np.concatenate([0.3 + 0.05 * rng.standard_normal((240, 3)), 0.7 + 0.05 * rng.standard_normal((60, 3))])
    X = np.clip(X, 0.01, 0.99)
    sol = _compare(client, X, _voxels(4, (0.3, 0.1, 4.0), (0.7, 0.1, 1.0), floor=0.05), chunks=100)
    counts = [t.sizes().result()[0] for t in sol.tiles]
    assert max(counts) - min(counts) <= 1


def test_public_distance_in_3d(client):
    """sdot.distance and sdot.barycenters of SumOfDiracs(dask (n, 3)) against a 3D grid."""
    X = np.random.default_rng(34).random((300, 3))
    grid = _voxels(4, (0.5, 0.3, 1.0), floor=0.5)
    source = sdot.SumOfDiracs(da.from_array(X, chunks=(100, 3)))
    w2 = sdot.distance(source, grid, tol=TOL)
    bary = sdot.barycenters(source, grid, tol=TOL)
    assert isinstance(w2, da.Array) and bary.chunks == ((100,) * 3, (3,))
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(X), grid, tol=TOL)
    assert abs(float(w2.compute()) - float(plan.distance)) <= 1e-10 * float(plan.distance)
    assert np.max(np.abs(bary.compute() - np.asarray(plan.barycenters))) <= 1e-9


@pytest.mark.parametrize("dim, n", [(2, 600), (3, 400)])
def test_bernstein_grid_of_degree_1(client, dim, n):
    """PolynomialGrid(values, degree=1) (coefficients positive, varying within and across
    cells): the tiles integrate it as the single process does."""
    rng = np.random.default_rng(37 + dim)
    X = rng.random((n, dim))
    grid = sdot.PolynomialGrid(rng.uniform(0.3, 2.0, (4,) * dim + (2 ** dim,)))
    sol = sdot.dask.solve(da.from_array(X, chunks=(n // 4, dim)), grid, client=client, tol=TOL)
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(X), grid, tol=TOL)
    assert sol.converged and abs(sol.distance - float(plan.distance)) <= 1e-10 * float(plan.distance)
    masses, _, bary = sol.gather()
    assert np.max(np.abs(masses - np.asarray(plan.cell_masses))) <= 2 * TOL
    assert np.max(np.abs(bary - np.asarray(plan.barycenters))) <= 1e-9


def test_kd_tiles_in_3d_cut_the_longest_side():
    """Balanced counts on clustered points, one box each, and the first cut across the
    longest extent (z here)."""
    rng = np.random.default_rng(35)
    points = np.concatenate([1e-3 * rng.standard_normal((3000, 3)), [1.0, 1.0, 5.0] * rng.random((1000, 3))])
    lo, hi, owner = tiling.kd_tiles(points, 3)
    assert lo.shape == hi.shape == (8, 3)
    assert np.array_equal(owner, tiling.tile_of(points, lo, hi))
    inside = (points[:, None, :] >= lo[None]) & (points[:, None, :] < hi[None])
    assert np.all(np.sum(np.all(inside, axis=2), axis=1) == 1)
    counts = np.bincount(owner, minlength=8)
    assert counts.max() - counts.min() <= 1
    first = tiling.kd_tiles(points, 1)
    assert np.isfinite(first[0][1, 2]) and np.all(np.isinf(first[0][1, :2]))


def test_halo_certificate_in_3d_against_brute_force():
    """The halo tests accept a cell only if every Dirac outside the halo has a larger power at
    each of its vertices in use (a mask, as 3D cells give them; the slots not in use hold
    far points that must be ignored): checked against every Dirac."""
    rng = np.random.default_rng(36)
    seeds = rng.random((1500, 3))
    psi = 2e-3 * rng.standard_normal(1500)
    lo, hi = np.array([0.3, 0.3, 0.3]), np.array([0.6, 0.6, 0.6])
    width = 0.1
    owned = np.all((seeds >= lo) & (seeds < hi), axis=1)
    outside = ~owned & (tiling.distance_to_box(seeds, lo, hi) > width)
    own = np.flatnonzero(owned)
    vertices = rng.uniform(0.005, 0.06, (own.size, 1, 1)) * rng.standard_normal((own.size, 10, 3))
    used = rng.random((own.size, 10)) < 0.7
    used[:, 0] = True
    vertices[~used] = 10.0                      # garbage in the slots not in use
    ok = tiling.halo_certified(seeds[own], psi[own], vertices, used, np.ones(own.size, bool), lo, hi,
                               np.array([width]), np.array([psi.max()]))
    points = seeds[own][:, None, :] + vertices
    power_own = np.sum(vertices ** 2, axis=2) - psi[own][:, None]
    power_out = np.min(np.sum((points[:, :, None, :] - seeds[outside][None, None]) ** 2, axis=3) - psi[outside], axis=2)
    truly = np.all(~used | (power_own <= power_out), axis=1)
    assert np.all(truly[ok])                    # no false certificate
    assert ok.sum() > 0 and (~ok).sum() > 0     # both outcomes occur
    box_lo, box_hi, top = tiling.box_maxima(seeds[outside], psi[outside], 0.05)
    assert box_lo.shape[1] == 3
    by_boxes = tiling.boxes_certified(seeds[own], psi[own], vertices, used, box_lo, box_hi, top, np.arange(own.size))
    assert np.all(truly[by_boxes])
    assert by_boxes.sum() > ok.sum()            # sharper than one bound for all outside Diracs


def test_dimension_4_is_refused(client):
    grid = sdot.Grid(np.ones((1, 1, 1)))
    with pytest.raises(NotImplementedError, match="2D and 3D.*dimension 4"):
        sdot.dask.solve(da.zeros((10, 4), chunks=(5, 4)), grid, client=client)
    with pytest.raises(ValueError, match="dimension"):
        sdot.dask.solve(da.from_array(np.random.default_rng(0).random((10, 3)), chunks=(5, 3)),
                        sdot.Grid(np.ones((1, 1))), client=client)
