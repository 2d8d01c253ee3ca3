"""The repair of clipped cells (``sdot._core.planar.repair``) on every backend.

Ground truth: scipy's half-space intersections (``reference_cell`` of
test_power_diagram), computed without sdot.
"""
import array_api_compat as aac
import numpy as np
import pytest
from scipy.optimize import linprog
from scipy.spatial import ConvexHull, HalfspaceIntersection

from sdot._core import planar
from sdot._core.planar import polygons, repair
from sdot._core.options import DIAGRAM
from test_power_diagram import N, constraints, reference_cell

LO, HI = np.zeros(2), np.ones(2)


def area_without(seeds, i, j):
    """scipy's area of cell i (zero weights, unit box) without the constraint of seed j."""
    h, labels = constraints(seeds, np.zeros(len(seeds)), i, (0.0, 0.0), (1.0, 1.0))
    h = h[labels != j]
    norm = np.linalg.norm(h[:, :2], axis=1)
    lp = linprog([0.0, 0.0, -1.0], A_ub=np.column_stack([h[:, :2], norm]), b_ub=-h[:, 2],
                 bounds=[(None, None), (None, None), (0.0, None)], method="highs")
    return ConvexHull(HalfspaceIntersection(h, lp.x[:2]).intersections).volume


def without_one_edge(xp, y, lo, hi, i, others, options=DIAGRAM):
    """``(psi, active, cells)``: the diagram of ``y`` at zero weights (with the diagram
    ``options``), with cell ``i`` the box clipped by the seeds ``others`` only (a superset
    of the true cell)."""
    n, dev = y.shape[0], aac.device(y)
    psi = xp.zeros((n,), dtype=y.dtype, device=dev)
    active = xp.ones((n,), dtype=xp.bool, device=dev)
    cells = planar.power_cells(xp, y, psi, active, lo, hi, options=options)
    row = xp.asarray([i], device=dev)
    start = polygons.box_cells(xp, y[i:i + 1, :], lo, hi, active[i:i + 1], cells.labels.shape[1])
    return psi, active, polygons.put_rows(xp, cells, row, polygons.clip_by(xp, y, psi, active, start, row,
                                                                           xp.asarray([others], device=dev)))


def test_repair_finds_a_sliver_the_fp32_certificate_cannot_see(backend, array_kernels):
    """Cell 33 of these 40 seeds, clipped by all its neighbours but 36 (an edge of
    length 2.8e-3), exceeds its true area by 1.3e-6 (scipy): within the FP32 area
    certificate's rounding tolerance (about 2e-5). Given as dirty, it is tested
    and clipped all the same."""
    seeds = np.random.default_rng(0).random((N, 2))
    i, j = 33, 36
    ref = reference_cell(seeds, np.zeros(N), i)
    assert j in ref["facets"] and ref["facets"][j] < 3e-3
    xp = backend.xp
    others = [int(k) for k in ref["facets"] if k >= 0 and k != j]

    def run(y, lo, hi):
        psi, active, wrong = without_one_edge(xp, y, lo, hi, i, others)
        excess, tol = polygons.area_excess(xp, wrong, lo, hi)
        missing = ~xp.any(wrong.labels[i, :] == j)
        dirty = xp.arange(N, device=aac.device(y)) == i
        return missing, excess, tol, repair.repair(xp, y, psi, active, lo, hi, wrong, dirty)   # in place

    missing, excess, tol, fixed = backend.run(run, *(backend.asarray(a, np.float32) for a in (seeds, LO, HI)))
    sliver = area_without(seeds, i, j) - ref["area"]
    assert 1e-6 < sliver < 2e-6
    assert float(excess) == pytest.approx(sliver, abs=3e-7)        # the FP32 sum of the areas
    assert bool(missing) and float(excess) <= float(tol), "the certificate must not see the missing edge"
    labels = backend.to_numpy(fixed.labels)[i, :int(backend.to_numpy(fixed.count)[i])]
    assert sorted(int(k) for k in labels) == sorted(ref["facets"])
    verts = backend.to_numpy(fixed.vertices)[i, :len(labels)].astype(np.float64)
    p, q = verts, np.roll(verts, -1, axis=0)
    area = 0.5 * np.sum(p[:, 0] * q[:, 1] - p[:, 1] * q[:, 0])
    assert abs(area - ref["area"]) < 1e-7           # the sliver is 1.3e-6
    assert bool(fixed.certified)


def test_repair_with_nothing_marked_dirty_tests_every_cell(backend):
    """Cell 33 lacks its edge with seed 36 (a superset, the certificate fails in FP64)
    but no cell is marked dirty: the repair finds nothing to test, so it tests every
    cell, and ends with scipy's cell, certified. (An empty selection of rows once
    divided by zero in the blocks.)"""
    seeds = np.random.default_rng(0).random((N, 2))
    i, j = 33, 36
    ref = reference_cell(seeds, np.zeros(N), i)
    others = [int(k) for k in ref["facets"] if k >= 0 and k != j]
    xp = backend.xp

    def run(y, lo, hi):
        psi, active, wrong = without_one_edge(xp, y, lo, hi, i, others)
        excess, tol = polygons.area_excess(xp, wrong, lo, hi)
        clean = xp.zeros((N,), dtype=xp.bool, device=aac.device(y))
        return excess, tol, repair.repair(xp, y, psi, active, lo, hi, wrong, clean)

    excess, tol, fixed = backend.run(run, *(backend.asarray(a) for a in (seeds, LO, HI)))
    assert float(excess) > float(tol), "the certificate sees the missing edge in FP64"
    labels = backend.to_numpy(fixed.labels)[i, :int(backend.to_numpy(fixed.count)[i])]
    assert sorted(int(k) for k in labels) == sorted(ref["facets"])
    assert bool(fixed.certified)
