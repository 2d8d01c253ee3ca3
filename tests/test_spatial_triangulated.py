"""3D power cells read off the regular triangulation (sdot/_core/spatial/triangulated.py).

Ground truth: scipy's half-space intersection cell by cell (``scipy_cells`` of
test_spatial.py), and the cells' combinatorics against the conventions of
sdot/_core/spatial/polyhedra.py checked from the positions alone.
"""
import numpy as np
import pytest

from test_spatial import scipy_cells


def _cells(backend, seeds, psi, lo, hi):
    import array_api_compat as aac

    from sdot._core.spatial import diagram, integrate

    def run(y, w, lo, hi):
        xp = aac.array_namespace(y)
        active = xp.ones((y.shape[0],), dtype=xp.bool, device=aac.device(y))
        cells = diagram.regular_cells(xp, y, w, active, lo, hi, 48)
        moments, facet = integrate.cell_integrals(xp, y, cells, xp.ones((1, 1, 1), dtype=y.dtype), lo, hi)
        return moments, facet, cells.labels, cells.count, cells.vertices, cells.corners, cells.size
    out = backend.run(run, *(backend.asarray(a) for a in (seeds, psi, lo, hi)))
    return [backend.to_numpy(a) for a in out]


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.only_backends("numpy", "torch", reason="eagerly on the host; JAX's eager run is the same path (its "
                           "compiles cost seconds)")
def test_triangulated_cells_match_qhull(backend, weighted):
    """Volumes, first moments and facet areas of 100 cells (weights that empty some) against
    scipy, cell by cell; most cells are read off the triangulation (not clipped)."""
    from sdot._host import cells_3d

    rng = np.random.default_rng(7)
    n = 100
    lo, hi = np.array([0.0, -0.5, 0.0]), np.array([1.0, 1.0, 0.8])
    seeds = lo + rng.random((n, 3)) * (hi - lo)
    psi = 0.05 * rng.random(n) if weighted else np.zeros(n)
    found = cells_3d.cell_combinatorics(seeds, None if not weighted else psi, np.ones(n, bool), 48, 72)
    assert found["open"].sum() < n // 2                   # the hull's seeds only (31 here)
    moments, facet, labels, count, *_ = _cells(backend, seeds, psi, lo, hi)
    ref = scipy_cells(seeds, psi, lo, hi)
    assert weighted is False or any(r[0] == 0 for r in ref)
    np.testing.assert_allclose(moments[:, 0], [r[0] for r in ref], rtol=0, atol=1e-13)
    np.testing.assert_allclose(moments[:, 1:4], np.array([r[1] for r in ref]), rtol=0, atol=1e-13)
    for i, (_, _, areas) in enumerate(ref):
        got = {}
        for k in range(int(count[i])):
            if facet[i, k] > 1e-15:
                got[int(labels[i, k])] = got.get(int(labels[i, k]), 0.0) + facet[i, k]
        assert set(got) == set(areas), i
        np.testing.assert_allclose([got[k] for k in sorted(areas)], [areas[k] for k in sorted(areas)],
                                   rtol=1e-11, atol=1e-14)


def test_combinatorics_conventions():
    """Each vertex of a read-off cell: its three facets' seeds counter-clockwise seen from
    outside (``det(y_a - y_i, y_b - y_i, y_c - y_i) > 0``), and edge ``k`` leads to a vertex
    that shares the two facets other than ``p_k``."""
    from sdot._host import cells_3d

    rng = np.random.default_rng(3)
    n = 400
    seeds = rng.random((n, 3))
    found = cells_3d.cell_combinatorics(seeds, None, np.ones(n, bool), 48, 72)
    labels, corners, adjacent, size = found["labels"], found["corners"], found["adjacent"], found["size"]
    checked = 0
    for i in np.flatnonzero(size > 0):
        for v in range(size[i]):
            seeds_of = labels[i, corners[i, v]]
            d = seeds[seeds_of] - seeds[i]
            assert np.linalg.det(d) > 0
            for k in range(3):
                w = adjacent[i, v, k]
                shared = {int(corners[i, v, (k + 1) % 3]), int(corners[i, v, (k + 2) % 3])}
                assert shared <= set(int(c) for c in corners[i, w])
                assert int(corners[i, v, k]) not in set(int(c) for c in corners[i, w])
            checked += 1
    assert checked > 20 * n
