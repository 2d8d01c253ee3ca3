"""The compiled host kernels (sdot/_host/compiled, numba) against the ground truth of scipy and
against the array-API route on the same inputs (DESIGN.md rule 7).

The cells in 2D and 3D (each clipped by a k-d tree of the seeds, or moved from the previous
diagram and certified by the area or volume sum), the pixel and voxel integrals, the hiding
step's fans and the conjugate gradient; whole solves on both routes; the torch and eager JAX
inputs that take the compiled route; and the array route with a warning when numba is missing.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import sdot
from spatial_cells import cell_moments, facet_integrals, power_cells as scipy_soup
from test_spatial import scipy_cells

pytest.importorskip("numba")

from sdot._host import compiled  # noqa: E402
from sdot._host.threads import host_settings  # noqa: E402
from sdot._core.options import DIAGRAM  # noqa: E402
from sdot._host.compiled import cells3d, integrals3d  # noqa: E402

LO, HI = np.zeros(3), np.ones(3)
#: The solver's thresholds of the compiled cells.
CELLS = DIAGRAM.compiled


def _seeds(kind, rng):
    """Seeds and weights of a kind: uniform, weighted with hidden cells, a third outside
    the box, a lattice (four planes at a vertex everywhere), a 1e-4 cluster (scipy's own limit)."""
    if kind == "lattice":
        g = (np.arange(5) + 0.5) / 5
        x = np.stack(np.meshgrid(g, g, g, indexing="ij"), -1).reshape(-1, 3)
        return x, np.zeros(len(x))
    x = rng.random((150, 3))
    if kind == "outside":
        x = 1.6 * x - 0.3
    if kind == "cluster":
        x[100:120] = 0.4 + 1e-4 * rng.random((20, 3))
    psi = 0.04 * rng.random(150) if kind == "hidden" else np.zeros(150)
    return x, psi


def _by_label(cells, i):
    """``{label: facet area}`` of cell ``i`` from the compiled integrals of the unit density."""
    vertices, corners, adjacent, size, labels, count = cells
    _, facet = integrals3d.cell_integrals(np.zeros((1, 3)), vertices[i:i + 1], corners[i:i + 1], adjacent[i:i + 1],
                                          size[i:i + 1], count[i:i + 1], np.ones((1, 1, 1)), LO, HI,
                                          labels.shape[1])
    return {int(labels[i, k]): facet[0, k] for k in range(int(count[i])) if facet[0, k] > 0}


@pytest.mark.parametrize("kind", ["uniform", "hidden", "outside", "lattice", "cluster"])
def test_cells_equal_scipy(kind):
    """Every cell's volume, first moment and facet areas (by neighbour) equal scipy's
    half-space intersection, whatever the weights; from the previous diagram of other
    weights too (moved, or clipped again)."""
    rng = np.random.default_rng(3)
    x, psi = _seeds(kind, rng)
    n = len(x)
    fresh = cells3d.power_cells(x, psi, np.ones(n, bool), LO, HI, 48, options=CELLS)
    assert np.all(fresh[-1] == cells3d.FINE)
    # from a diagram at other weights: a small change (moved) and a large one (the tree)
    other = cells3d.power_cells(x, psi + 1e-3 * rng.random(n), np.ones(n, bool), LO, HI, 48, options=CELLS)[:6]
    nudged = cells3d.power_cells(x, psi + 1e-9 * rng.random(n), np.ones(n, bool), LO, HI, 48, fresh[:6], options=CELLS)
    ref = scipy_cells(x, psi, LO, HI)
    moments, _ = integrals3d.cell_integrals(x, *fresh[:4], fresh[5], np.ones((1, 1, 1)), LO, HI, 48)
    again = cells3d.power_cells(x, psi, np.ones(n, bool), LO, HI, 48, other, options=CELLS)
    again_moments, _ = integrals3d.cell_integrals(x, *again[:4], again[5], np.ones((1, 1, 1)), LO, HI, 48)
    np.testing.assert_allclose(moments[:, 0], [r[0] for r in ref], rtol=0, atol=1e-13)
    np.testing.assert_allclose(moments[:, 1:4], [r[1] for r in ref], rtol=0, atol=1e-13)
    np.testing.assert_allclose(again_moments, moments, rtol=0, atol=1e-13)
    assert np.all(nudged[-1] == cells3d.FINE)
    for i in range(0, n, 7):
        got, want = _by_label(fresh[:6], i), ref[i][2]
        assert set(k for k, a in want.items() if a > 1e-10) <= set(got)
        for label, area in want.items():
            assert got.get(label, 0.0) == pytest.approx(area, abs=1e-12)


def test_voxel_integrals_equal_scipy_and_the_array_route():
    """The moments and facet integrals of a voxel density over the compiled cells equal the
    slow scipy computation (each cell clipped by each voxel) and the array route's."""
    from sdot._core.spatial import integrate
    from sdot._core.spatial.polyhedra import Cells

    rng = np.random.default_rng(5)
    x = rng.random((40, 3))
    psi = 1e-3 * rng.random(40)
    values = rng.random((3, 4, 5)) + 0.1
    values[1, 2, 3] = 0.0
    cells = cells3d.power_cells(x, psi, np.ones(40, bool), LO, HI, 48, options=CELLS)
    moments, facet = integrals3d.cell_integrals(x, *cells[:4], cells[5], values, LO, HI, 48)
    _, _, _, F, info = scipy_soup(x, psi, LO, HI)
    np.testing.assert_allclose(moments, cell_moments(x, info, values, LO, HI), rtol=0, atol=1e-13)
    by_label = facet_integrals(info, values, LO, HI, F)
    for i in range(40):
        want = {info[i]["labels"][k]: by_label[i, k] for k in info[i]["labels"]}
        got = {int(cells[4][i, k]): facet[i, k] for k in range(int(cells[5][i]))}
        for label, value in want.items():
            assert got.get(label, 0.0) == pytest.approx(value, abs=1e-13)
    array = Cells(*cells[:6], cells[6] != 0, np.asarray(True))
    with host_settings(compiled=False):
        ref = integrate.cell_integrals(np, x, array, values, LO, HI)
    np.testing.assert_allclose(moments, ref[0], rtol=0, atol=1e-14)
    np.testing.assert_allclose(facet, ref[1], rtol=0, atol=1e-14)


def test_cells_of_the_array_route_integrate_too():
    """The compiled integrals read cells with free vertex slots (``corners < 0``), as the array
    route's clip leaves them: the same moments as that route's own integrals."""
    from sdot._core.spatial import diagram, integrate

    rng = np.random.default_rng(6)
    x, values = rng.random((300, 3)), rng.random((4, 4, 4))
    with host_settings(compiled=False):
        cells = diagram.power_cells(np, x, 1e-3 * rng.random(300), np.ones(300, bool), LO, HI)
        ref = integrate.cell_integrals(np, x, cells, values, LO, HI)
    assert np.any((cells.corners[..., 0] < 0) & (np.arange(cells.corners.shape[1]) < cells.size[:, None]))
    got = integrate.cell_integrals(np, x, cells, values, LO, HI)
    np.testing.assert_allclose(got[0], ref[0], rtol=0, atol=1e-14)
    np.testing.assert_allclose(got[1], ref[1], rtol=0, atol=1e-14)


def _plan(x, values, compiled_kernels, tol=1e-10):
    with host_settings(compiled=compiled_kernels):
        return sdot.optimal_transport_plan(sdot.SumOfDiracs(x), sdot.Grid(values), tol=tol)


def _assert_same_solve(fast, slow, density):
    """Both routes converged to the same W2^2 (1e-10), barycentres (1e-8) and, on positive
    densities, in the same Newton steps."""
    assert bool(fast.converged) and bool(slow.converged)
    assert float(fast.distance) == pytest.approx(float(slow.distance), rel=1e-10)
    if density != "zero region":
        assert int(fast.iterations) == int(slow.iterations)
    np.testing.assert_allclose(fast.barycenters, slow.barycenters, rtol=0, atol=1e-8)


@pytest.mark.parametrize("density", ["uniform", "voxels", "zero region", "duplicates"])
def test_solves_equal_the_array_route_3d(numpy_driver, density):
    """A whole solve on both routes: W2^2 to 1e-10 relative, the same Newton steps on
    positive densities, the same barycentres."""
    rng = np.random.default_rng(7)
    x = rng.random((400, 3))
    c = (np.arange(6) + 0.5) / 6
    r2 = sum(a ** 2 for a in np.meshgrid(c - 0.5, c - 0.5, c - 0.5, indexing="ij"))
    values = {"uniform": np.ones((1, 1, 1)), "voxels": 0.3 + np.exp(-r2 / 0.05), "zero region": (r2 < 0.16) * 1.0,
              "duplicates": np.ones((1, 1, 1))}[density]
    if density == "duplicates":
        x[200:220] = x[:20]
    fast, slow = _plan(x, values, True), _plan(x, values, False)
    _assert_same_solve(fast, slow, density)


def test_torch_and_eager_jax_take_the_compiled_route(sdot_driver, monkeypatch):
    """CPU torch tensors and eager JAX arrays are solved by the compiled kernels (on NumPy
    views), and give NumPy's W2^2."""
    import jax.numpy as jnp
    import torch

    calls = []
    original = cells3d.power_cells
    monkeypatch.setattr(cells3d, "power_cells", lambda *a, **k: calls.append(1) or original(*a, **k))
    x = np.random.default_rng(8).random((300, 3))
    values = np.ones((1, 1, 1))
    results = []
    for wrap in (np.asarray, torch.tensor, jnp.asarray):
        calls.clear()
        results.append(float(sdot.distance(sdot.SumOfDiracs(wrap(x)), sdot.Grid(wrap(values)))))
        assert calls
    assert results[1] == pytest.approx(results[0], rel=1e-12) and results[2] == pytest.approx(results[0], rel=1e-12)


def test_without_numba_the_array_route_runs_and_says_so_once(numpy_driver, monkeypatch):
    """numba missing: a PerformanceWarning, once, and the array kernels' answer."""
    monkeypatch.setattr(compiled, "numba", None)
    monkeypatch.setattr(compiled, "_warned", [])
    x = np.random.default_rng(9).random((200, 3))
    with pytest.warns(compiled.PerformanceWarning, match="pip install numba"):
        first = sdot.distance(sdot.SumOfDiracs(x), sdot.Grid(np.ones((1, 1, 1))))
    with warnings.catch_warnings():
        warnings.simplefilter("error", compiled.PerformanceWarning)
        sdot.distance(sdot.SumOfDiracs(x), sdot.Grid(np.ones((1, 1, 1))))
    monkeypatch.undo()
    assert float(first) == pytest.approx(float(sdot.distance(sdot.SumOfDiracs(x), sdot.Grid(np.ones((1, 1, 1))))),
                                         rel=1e-10)


def test_conjugate_gradient_equals_scipy():
    """The compiled conjugate gradient preconditioned by the diagonal reaches the tolerance
    on a graph Laplacian and agrees with scipy's solve."""
    import scipy.sparse as sp
    from scipy.sparse.linalg import spsolve

    from sdot._host.compiled.linalg import jacobi_cg

    rng = np.random.default_rng(10)
    n = 3000
    i, j = rng.integers(0, n, 20000), rng.integers(0, n, 20000)
    w = sp.coo_matrix((rng.random(20000), (i, j)), shape=(n, n))
    w = (w + w.T).tocsr()
    a = (sp.diags(np.asarray(w.sum(1)).ravel() * (1 + 1e-3)) - w).tocsr()
    b = rng.standard_normal(n)
    for threads in (1, 2):
        with host_settings(threads=threads):
            x, iterations = jacobi_cg(a, b, 1e-10, 5000)
        assert np.linalg.norm(b - a @ x) <= 1e-10 * np.linalg.norm(b) and 0 < iterations < 5000
        np.testing.assert_allclose(x, spsolve(a.tocsc(), b), rtol=0, atol=1e-6 * np.abs(x).max())


def test_a_voronoi_diagram_clipped_first_by_the_nearest_seeds():
    """From ``CellOptions.nearest_from`` seeds of equal weights, the cells are clipped first
    by each seed's nearest active seeds (the k-d tree's, equal to scipy's): the same cells
    (neighbours and volumes) as the tree alone."""
    from scipy.spatial import cKDTree

    from sdot._host.compiled import run_rows

    n = CELLS.nearest_from + 100
    x, active = np.random.default_rng(14).random((n, 3)), np.ones(n, bool)
    active[::50] = False
    nearest = cells3d._nearest(x, active, CELLS.nearest)
    chosen = np.flatnonzero(active)
    distance, _ = cKDTree(x[chosen]).query(x, k=CELLS.nearest + 1)
    assert np.all(active[nearest]) and np.all(nearest[active, 0] == np.flatnonzero(active))
    np.testing.assert_allclose(np.sqrt(((x[nearest] - x[:, None]) ** 2).sum(-1)), distance, rtol=0, atol=1e-15)
    psi = np.full(n, 0.3)
    got = cells3d.power_cells(x, psi, active, LO, HI, 48, options=CELLS)
    alone = cells3d._empty(n, 48)
    cells3d._clip(x, psi, active, LO, HI, None, False, np.arange(n), alone, run_rows)
    assert np.all(got[-1] == cells3d.FINE) and np.all(alone[6] == cells3d.FINE)
    for i in range(0, n, 37):
        assert set(got[4][i][got[4][i] > cells3d.UNUSED]) == set(alone[4][i][alone[4][i] > cells3d.UNUSED])
    volume = [integrals3d.cell_integrals(x, *c[:4], c[5], np.ones((1, 1, 1)), LO, HI, 48)[0][:, 0]
              for c in (got, alone[:6])]
    np.testing.assert_allclose(volume[0], volume[1], rtol=0, atol=1e-15)
    assert volume[0][~active].max() == 0 and volume[0].sum() == pytest.approx(1.0, abs=1e-12)


def test_two_level_conjugate_gradient_equals_scipy_in_fewer_iterations():
    """With a coarse level (groups of neighbouring rows), the compiled conjugate gradient on the
    Laplacian of a 3D neighbour graph (regularised as the Newton matrices: 1e-9 of the
    diagonal) reaches the tolerance, agrees with scipy's solve, and needs under half the
    iterations of the diagonal alone."""
    import scipy.sparse as sp
    from scipy.spatial import cKDTree
    from scipy.sparse.linalg import spsolve

    from sdot._host.compiled.linalg import grid_groups, jacobi_cg, two_level_cg

    rng = np.random.default_rng(12)
    n = 8000
    points = rng.random((n, 3))
    near = cKDTree(points).query(points, k=11)[1][:, 1:]
    w = sp.coo_matrix((rng.random(near.size) + 0.5, (np.repeat(np.arange(n), 10), near.ravel())), shape=(n, n))
    w = (w + w.T).tocsr()
    a = (sp.diags(np.asarray(w.sum(1)).ravel() * (1 + 1e-9)) - w).tocsr()
    b = rng.standard_normal(n)
    b -= b.mean()
    groups = grid_groups(points, 100)
    assert groups.max() + 1 == 64 and np.all(np.bincount(groups) > 0)
    for threads in (1, 2):
        with host_settings(threads=threads):
            x, iterations = two_level_cg(a, b, 1e-8, 5000, groups)
            _, alone = jacobi_cg(a, b, 1e-8, 5000)
        assert np.linalg.norm(b - a @ x) <= 1e-8 * np.linalg.norm(b) and 0 < iterations < alone / 2
        np.testing.assert_allclose(x, spsolve(a.tocsc(), b), rtol=0, atol=1e-5 * np.abs(x).max())


@pytest.mark.parametrize("dim", [2, 3])
def test_facet_entries_equal_the_array_route(dim):
    """The Newton matrix's entries ``facet / (2 |y_j - y_i|)`` of the facets with a seed and a
    nonzero integral (walls, unused slots and zero integrals left out), in slot order."""
    import types

    import array_api_compat.numpy as xnp

    from sdot._core import newton_matrix
    from sdot._host.compiled import laplacian

    rng = np.random.default_rng(13)
    n, cap = 500, 12
    seeds = rng.random((n, dim))
    labels = (np.arange(n)[:, None] + rng.integers(1, n, (n, cap))) % n
    labels[rng.random((n, cap)) < 0.2] = -1 - dim
    count = rng.integers(0, cap + 1, n)
    facet = rng.random((n, cap))
    facet[facet < 0.1] = 0.0
    got = laplacian.facet_entries(seeds, labels, count, facet)
    with host_settings(compiled=False):
        expected = newton_matrix._facet_entries(xnp, seeds, types.SimpleNamespace(labels=labels, count=count), facet)
    assert got[0].shape[0] > n
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-15, atol=0)


@pytest.mark.parametrize("dim", [2, 3])
def test_tree_bounds_hold_and_fit_the_weights(dim):
    """Each node's plane is the least-squares fit of its seeds' weights (numpy's lstsq), and
    its bound holds: no seed under node ``k`` has a power at ``x`` below
    ``dist(x + g_k / 2, box_k)^2 - g_k . x - K_k`` (weights varying on the domain's scale)."""
    from sdot._host.compiled import tree

    rng = np.random.default_rng(11)
    x = rng.random((3000, dim))
    psi = 0.3 * x[:, 0] - 0.2 * x[:, -1] ** 2 + 1e-3 * rng.random(3000) + 5.0
    perm, start, end, lo, hi = tree.build(x, np.arange(3000), 8)
    g, big = tree.planes(start, end, x[perm], psi[perm])
    queries = 1.4 * rng.random((40, dim)) - 0.2
    for k in range(start.shape[0]):
        seeds = perm[start[k]:end[k]]
        if seeds.shape[0] > dim + 1:
            design = np.c_[x[seeds], np.ones(seeds.shape[0])]
            fit = np.linalg.lstsq(design, psi[seeds], rcond=None)[0][:dim]
            np.testing.assert_allclose(g[k], fit, rtol=0, atol=1e-9)
        power = ((queries[:, None] - x[seeds][None]) ** 2).sum(-1) - psi[seeds][None]
        gap = np.maximum(np.maximum(lo[k] - (queries + g[k] / 2), (queries + g[k] / 2) - hi[k]), 0)
        bound = (gap ** 2).sum(-1) - queries @ g[k] - big[k]
        assert np.all(power.min(axis=1) >= bound - 1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_contradicted_cells_cover_the_ring_s_errors(seed):
    """Cells clipped only by the seeds of the previous diagram's ring, after a weight change that
    gives some cells a neighbour beyond it: the cells whose vertices a neighbour lacks include
    every wrong cell and none of the exact diagram's; and from that previous diagram the cells
    (the ring repaired by the tree) equal those built afresh."""
    from sdot._host.compiled import agreement, run_rows

    rng = np.random.default_rng(seed)
    n = 400
    x, active = rng.random((n, 3)), np.ones(n, bool)
    before = cells3d.power_cells(x, np.zeros(n), active, LO, HI, 48, options=CELLS)[:6]
    psi = 0.03 * rng.random(n)
    exact = cells3d._empty(n, 48)
    cells3d._clip(x, psi, active, LO, HI, None, False, np.arange(n), exact, run_rows)
    ring = cells3d._empty(n, 48)
    cells3d._clip(x, psi, active, LO, HI, before[4], True, np.arange(n), ring, run_rows)
    wrong = np.array([set(exact[4][i][exact[4][i] > -7]) != set(ring[4][i][ring[4][i] > -7]) for i in range(n)])
    assert wrong.any() and not cells3d.tiles(ring[7], LO, HI)
    assert not np.any(wrong & ~agreement.contradicted(ring[1], ring[3], ring[4], run_rows))
    assert not agreement.contradicted(exact[1], exact[3], exact[4], run_rows).any()
    again = cells3d.power_cells(x, psi, active, LO, HI, 48, before, options=CELLS)
    assert np.all(again[-1] == cells3d.FINE)
    volume = [integrals3d.cell_integrals(x, *c[:4], c[5], np.ones((1, 1, 1)), LO, HI, 48)[0][:, 0]
              for c in (again, exact[:6])]
    np.testing.assert_allclose(volume[0], volume[1], rtol=0, atol=1e-14)


def test_fans_equal_the_array_route():
    """The hiding step's fans in 3D: the compiled kernel gives the array kernels' numbers."""
    from sdot._core.spatial import diagram, hiding

    rng = np.random.default_rng(11)
    x = rng.random((500, 3))
    psi = 2e-3 * rng.random(500)
    active = np.ones(500, bool)
    active[::37] = False
    cells = diagram.power_cells(np, x, psi, active, LO, HI)
    got = hiding.fans(np, x, psi, active, cells)
    with host_settings(compiled=False):
        want = hiding.fans(np, x, psi, active, cells)
    assert np.isfinite(got[2]).sum() > 100
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.where(np.isfinite(want[2])[:, None] if a.ndim == 2 else True, a, 0),
                                      np.where(np.isfinite(want[2])[:, None] if b.ndim == 2 else True, b, 0))


def _planar(kind, rng):
    """2D seeds and weights: uniform, weighted (hidden cells), a lattice, a third outside the box."""
    if kind == "lattice":
        g = (np.arange(20) + 0.5) / 20
        x = np.stack(np.meshgrid(g, g, indexing="ij"), -1).reshape(-1, 2)
        return x, np.zeros(len(x))
    x = rng.random((600, 2))
    if kind == "outside":
        x = 1.6 * x - 0.3
    return x, (6e-3 * rng.random(600) if kind == "weighted" else np.zeros(600))


@pytest.mark.parametrize("kind", ["uniform", "weighted", "lattice", "outside"])
def test_planar_cells_and_integrals_equal_the_array_route(kind):
    """2D: the compiled cells (fresh, moved, reclipped) and their pixel integrals give the array
    kernels' masses, moments and edge integrals (matched by neighbour)."""
    from sdot._host.compiled import cells2d, integrals2d
    from sdot._core.planar import diagram, integrate

    rng = np.random.default_rng(12)
    x, psi = _planar(kind, rng)
    n, lo, hi = len(x), np.zeros(2), np.ones(2)
    active = np.ones(n, bool)
    values = rng.random((7, 9))
    values[2, 3] = 0.0
    fresh = cells2d.power_cells(x, psi, active, lo, hi, 16, options=CELLS)
    other = cells2d.power_cells(x, psi + 1e-3 * rng.random(n), active, lo, hi, 16, options=CELLS)[:3]
    again = cells2d.power_cells(x, psi, active, lo, hi, 16, other, options=CELLS)
    nudged = cells2d.power_cells(x, psi + 1e-12 * rng.random(n), active, lo, hi, 16, fresh[:3], options=CELLS)
    with host_settings(compiled=False):
        ref = diagram.power_cells(np, x, psi, active, lo, hi)
        ref_moments, ref_facet = integrate.cell_integrals(np, x, ref, values, lo, hi)
    for cells, atol in ((fresh, 1e-14), (again, 1e-14), (nudged, 1e-11)):     # (nudged: weights 1e-12 apart)
        assert np.all(cells[3] == cells2d.FINE)
        moments, facet = integrals2d.cell_integrals(x, *cells[:3], values, lo, hi)
        np.testing.assert_allclose(moments, ref_moments, rtol=0, atol=atol)
        for i in range(0, n, 11):
            got = {int(cells[1][i, k]): facet[i, k] for k in range(int(cells[2][i])) if facet[i, k] > 1e-15}
            want = {int(ref.labels[i, k]): ref_facet[i, k] for k in range(int(ref.count[i])) if ref_facet[i, k] > 1e-15}
            for label in set(got) | set(want):
                assert got.get(label, 0.0) == pytest.approx(want.get(label, 0.0), abs=100 * atol)


@pytest.mark.parametrize("density", ["uniform", "image", "zero region"])
def test_solves_equal_the_array_route_2d(numpy_driver, density):
    """A whole 2D solve on both routes (the compiled one renumbers its Diracs along a tree):
    W2^2 to 1e-10 relative, the same Newton steps on positive densities, the same barycentres
    and potential, in the caller's order."""
    rng = np.random.default_rng(13)
    x = rng.random((1500, 2))
    c = (np.arange(16) + 0.5) / 16
    r2 = sum(a ** 2 for a in np.meshgrid(c - 0.5, c - 0.5, indexing="ij"))
    values = {"uniform": np.ones((1, 1)), "image": 0.2 + np.exp(-r2 / 0.04),
              "zero region": ((r2 > 0.04) & (r2 < 0.16)) * 1.0}[density]
    fast, slow = _plan(x, values, True), _plan(x, values, False)
    _assert_same_solve(fast, slow, density)
    np.testing.assert_allclose(fast.brenier_potential, slow.brenier_potential, rtol=0, atol=1e-8)


@pytest.mark.parametrize("shape", [(1, 1), (7, 9)])
def test_capped_integrals_equal_the_array_route(shape):
    """Partial transport's cells cut by balls: the compiled kernel (closed forms per pixel piece)
    against the array route (edges walked through the pixels, arcs cut at the grid lines), on
    balls inside, across and around the cells, and an empty ball."""
    from sdot._core import planar
    from sdot._host.compiled import integrals2d
    from sdot._core.planar.capped import array_capped_integrals

    rng = np.random.default_rng(9)
    lo, hi = np.array([-0.5, 0.2]), np.array([0.7, 1.1])
    seeds = lo + (hi - lo) * rng.random((60, 2))
    psi = 0.03 * rng.random(60) ** 2
    psi[0] = 0.0
    psi[1] = 4.0
    img = 0.5 + rng.random(shape)
    cells = planar.power_cells(np, seeds, 0.01 * rng.random(60), np.ones(60, bool), lo, hi)
    compiled_route = integrals2d.capped_integrals(seeds, cells.vertices, cells.labels, cells.count, img, lo, hi, psi)
    array_route = array_capped_integrals(np, seeds, cells, psi, img, lo, hi)
    for a, b in zip(compiled_route, array_route):
        assert a == pytest.approx(b, rel=1e-10, abs=1e-14)
    assert compiled_route[0][0, 0] == 0.0 and abs(compiled_route[2][1]) < 1e-14     # empty; whole


@pytest.mark.parametrize("dim", [2, 3])
def test_cells_that_reappear_are_found_by_the_update(dim):
    """The images of a periodic diagram: seeds beyond the box's sides, most of their cells empty.
    From a diagram where they are, at weights where some reappear (and some empty again), the
    kinetic update certifies the cells without building them afresh (it used to: every empty
    cell counted as invalid and was clipped by the ring, which missed the reappeared ones), and
    they equal the cells built afresh."""
    from sdot._host.compiled import cells2d, run_rows

    kernels = cells2d if dim == 2 else cells3d
    rng = np.random.default_rng(5)
    inside = rng.random((300 if dim == 2 else 400, dim))
    beyond = rng.random((120, dim))
    beyond[:, 0] = 1.0 + 0.08 * beyond[:, 0]             # a slab beyond the side x = 1
    x = np.concatenate([inside, beyond])
    n, lo, hi, active = len(x), np.zeros(dim), np.ones(dim), np.ones(len(x), bool)
    psi = np.zeros(n)
    before = kernels.power_cells(x, psi, active, lo, hi, 16 if dim == 2 else 48, options=CELLS)
    previous = before[:3] if dim == 2 else before[:6]
    sizes = lambda cells: cells[2] if dim == 2 else cells[3]        # noqa: E731
    psi = psi + 2e-3 * rng.random(n)                                  # a few images reappear, a few empty again
    after = kernels._moved_or_ring(x, psi, active, lo, hi, previous, run_rows, CELLS)
    assert after is not None
    fresh = kernels.power_cells(x, psi, active, lo, hi, previous[1].shape[1] if dim == 2 else 48, options=CELLS)
    reappeared = (sizes(previous) == 0) & (sizes(after) > 0)
    assert reappeared.sum() >= 2 and np.any((sizes(previous) == 0) & (sizes(after) == 0))
    if dim == 2:
        measure = lambda c: integrals2d_masses(x, c, lo, hi)            # noqa: E731
    else:
        measure = lambda c: integrals3d.cell_integrals(x, *c[:4], c[5], np.ones((1, 1, 1)), lo, hi, 48)[0][:, 0]  # noqa: E731
    np.testing.assert_allclose(measure(after), measure(fresh), rtol=0, atol=1e-14)


def integrals2d_masses(x, cells, lo, hi):
    """The areas of the compiled 2D ``cells`` of seeds ``x`` (the unit density)."""
    from sdot._host.compiled import integrals2d

    return integrals2d.cell_integrals(x, *cells[:3], np.ones((1, 1)), lo, hi)[0][:, 0]


@pytest.mark.parametrize("dim, kind", [(2, "weighted"), (2, "lattice"), (3, "hidden"), (3, "lattice")])
def test_the_descent_finds_whether_a_new_site_owns_a_point(dim, kind):
    """Sites added to a diagram, outside the box and inside, light and heavy (a Gaussian density's
    weights): the descent says a site owns a point iff its cell is not empty in the diagram built
    afresh with it (lattices: many cells at a vertex, where the descent must look at all)."""
    from sdot._host.compiled import cells2d, descent

    rng = np.random.default_rng(7)
    x, psi = _planar(kind, rng) if dim == 2 else _seeds(kind, rng)
    n, lo, hi = len(x), np.zeros(dim), np.ones(dim)
    kernels, capacity = (cells2d, 16) if dim == 2 else (cells3d, 48)
    cells = kernels.power_cells(x, psi, np.ones(n, bool), lo, hi, capacity, options=CELLS)
    m = 60
    z = np.concatenate([rng.random((m // 2, dim)) * 1.4 - 0.2, np.round(rng.random((m // 2, dim)) * 10) / 10])
    spread = (1.0 / n) ** (2 / dim)
    w = spread * rng.choice([-3.0, 0.0, 0.2, 3.0, 30.0], m)
    count = cells[2] if dim == 2 else cells[5]
    nonempty = np.flatnonzero(count > 0)
    starts = nonempty[rng.integers(0, nonempty.shape[0], m)]            # anywhere: the descent walks
    geometry = (x, psi, cells[0], cells[2], cells[1]) if dim == 2 else (x, psi, cells[0], cells[5], cells[4], cells[3],
                                                                          cells[1])
    ends = np.empty(m, np.int64)
    got = descent.owners(z, w, starts, *geometry, ends=ends)
    # from where the descents stopped (nonempty cells), the same answers; through the periodic
    # test's memory too, with starts out of range, on empty cells or unknown (found by a cKDTree)
    assert np.all(count[ends] > 0)
    assert np.array_equal(descent.owners(z, w, ends, *geometry), got)
    from sdot._host import periodic_reach

    memory = periodic_reach.DescentMemory(m)
    memory.starts[:] = rng.choice([-1, n + 5] + list(np.flatnonzero(count == 0)[:1]), m)
    descend = lambda *a: descent.owners(*a[:3], *geometry, ends=a[3], least=a[4])      # noqa: E731
    for _ in range(2):
        assert np.array_equal(periodic_reach._descended(x, count > 0, z, w, np.arange(m), descend, memory), got)
        assert np.all(count[memory.starts] > 0)
    want = []
    for p in range(m):                              # (room for the cell of a heavy site: 4 times as many slots)
        with_it = kernels.power_cells(np.vstack([x, z[p:p + 1]]), np.append(psi, w[p]), np.ones(n + 1, bool), lo, hi,
                                      4 * capacity, options=CELLS)
        assert np.all(with_it[-1] == kernels.FINE)
        volume = (integrals2d_masses(np.vstack([x, z[p:p + 1]]), with_it, lo, hi) if dim == 2 else
                  integrals3d.cell_integrals(np.vstack([x, z[p:p + 1]]), *with_it[:4], with_it[5], np.ones((1, 1, 1)),
                                             lo, hi, 4 * capacity)[0][:, 0])
        want.append(volume[n] > 1e-13)
    want = np.array(want)
    assert 5 <= want.sum() <= m - 5
    assert np.all(got[want])                        # never says no to an owner
    assert np.sum(got & ~want) <= 2                 # yes to a non-owner only at a tie (a cell of no volume)


def _least_gaps(z, w, x, psi, cells, dim):
    """The least power gap ``|v - z|^2 - w - (|v - x_c|^2 - psi_c)`` of each site ``z`` over the
    vertices ``v`` of every nonempty cell ``c`` (brute force)."""
    vertices, live = cells[0], (np.arange(cells[0].shape[1])[None, :] < (cells[2] if dim == 2 else cells[3])[:, None])
    if dim == 3:
        live &= cells[1][..., 0] >= 0
    e = z[:, None, :] - x[None, :, :]                                              # (m, n, d)
    g = (np.sum(e * e, axis=2)[:, :, None] - 2.0 * np.einsum("nvk,mnk->mnv", vertices, e)
         - w[:, None, None] + psi[None, :, None])
    return np.min(np.where(live[None], g, np.inf), axis=(1, 2))


@pytest.mark.parametrize("dim", [2, 3])
def test_the_descent_memory_skips_only_images_that_still_own_no_point(dim):
    """The least power gap the descent reports is the brute-force least over the cells' vertices;
    lowered by the weights' drift (:meth:`DescentMemory.drifted`) it stays below the least at the
    new weights, and the images it skips own no point there (the same answers as descents from
    scratch)."""
    from sdot._host import periodic_reach
    from sdot._host.compiled import cells2d, descent

    rng = np.random.default_rng(3)
    x, psi = _planar("weighted", rng) if dim == 2 else _seeds("hidden", rng)
    n, lo, hi = len(x), np.zeros(dim), np.ones(dim)
    kernels, capacity = (cells2d, 16) if dim == 2 else (cells3d, 48)
    m = 80
    z = rng.random((m, dim)) * 1.4 - 0.2
    w = (1.0 / n) ** (2 / dim) * rng.choice([-3.0, 0.0, 3.0], m)

    def diagram(weights):
        cells = kernels.power_cells(x, weights, np.ones(n, bool), lo, hi, capacity, options=CELLS)
        geometry = ((x, weights, cells[0], cells[2], cells[1]) if dim == 2 else
                    (x, weights, cells[0], cells[5], cells[4], cells[3], cells[1]))
        count = cells[2] if dim == 2 else cells[5]
        return cells, geometry, count > 0

    memory = periodic_reach.DescentMemory(m)
    owner, seeds_active = n + np.arange(m), np.arange(n + m) < n      # the images as seeds of their own, fixed weights
    weights = psi
    for step in range(3):
        cells, geometry, used = diagram(weights)
        memory.drifted(np.concatenate([weights, w]), seeds_active, owner, np.ones(n, bool), used)
        truth = _least_gaps(z, w, x, weights, (cells[0], cells[1], cells[2]) if dim == 2 else
                            (cells[0], cells[1], None, cells[3]), dim)
        finite = np.isfinite(memory.least)
        assert np.all(memory.least[finite] <= truth[finite] + 1e-12)
        skipped = int(np.sum(memory.least > 0.0))
        descend = lambda *a, g=geometry: descent.owners(*a[:3], *g, ends=a[3], least=a[4])  # noqa: E731
        got = periodic_reach._descended(x, used, z, w, np.arange(m), descend, memory)
        fresh_least = np.empty(m)
        fresh = descent.owners(z, w, np.flatnonzero(used)[np.zeros(m, np.int64)], *geometry, least=fresh_least)
        assert np.array_equal(got, fresh)
        assert np.allclose(fresh_least[~fresh], truth[~fresh], rtol=0, atol=1e-12)
        assert np.all(fresh_least[fresh] == -np.inf)
        if step:
            assert skipped >= m // 4                # most images far from owning are not descended again
        weights = weights + (1.0 / n) ** (2 / dim) * 0.05 * rng.standard_normal(n)
