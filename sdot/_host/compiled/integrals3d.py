"""Exact integrals of a voxel density over 3D cells (numba, rows on the host's threads).

Each cell (the layout of :class:`..spatial.polyhedra.Cells`) is cut by the voxel planes that
cross it, slab by slab along x, then y, then z (:func:`.polyhedron.clip`): every piece lies in
one voxel, where the density is a constant, and is integrated in closed form
(:func:`.polyhedron.integrate`). A piece keeps the facet slots of the cell it came from (the
voxel planes' facets are labelled -1), so the density's integral over each facet of the cell
is summed piece by piece. A facet on a voxel plane goes with the voxel below it (the rest of a
slab keeps only what lies strictly above its plane).

The result is that of :func:`..spatial.integrate.cell_integrals`: per cell the mass, the
first moments and the second moment about the seed ``(n, 5)``, per facet slot the density
integrated over the facet ``(n, F)``.
"""
from __future__ import annotations

import numpy as np

from . import polyhedron as ph
from ._numba import njit

#: Scratch facet slots of a piece (the cell's facets and the voxel planes cut so far).
SCRATCH_FACETS = 320


@njit
def integrals_rows(first, last, seeds, vertices, corners, adjacent, size, count, values, lo, hi, moments, facet,
                   vx, cn, ad, lab, s, tab2, tab3, gone, work_v, work_k, work_p, shape, ref):
    """The integrals of the cells ``first .. last - 1`` written into the rows of ``moments``
    and ``facet``. ``vx`` ... ``ref``: :func:`scratch` (four polyhedra: the rest of the cell
    along x, of a slab along y, of a column along z, and a voxel's piece)."""
    n0, n1, n2 = values.shape
    h0 = (hi[0] - lo[0]) / n0
    h1 = (hi[1] - lo[1]) / n1
    h2 = (hi[2] - lo[2]) / n2
    for i in range(first, last):
        for k in range(5):
            moments[i, k] = 0.0
        for f in range(facet.shape[1]):
            facet[i, f] = 0.0
        m = size[i]
        if m == 0:
            continue
        c = count[i]
        # the cell into polyhedron 0 (its live vertices: the array kernels leave free slots,
        # ``corners < 0``), its facets labelled by their slots
        low0 = low1 = low2 = np.inf
        high0 = high1 = high2 = -np.inf
        live = 0
        for v in range(m):
            if corners[i, v, 0] >= 0:
                work_k[v] = live
                live += 1
        for v in range(m):
            if corners[i, v, 0] < 0:
                continue
            t = work_k[v]
            for a in range(3):
                vx[0, t, a] = vertices[i, v, a]
                cn[0, t, a] = corners[i, v, a]
                ad[0, t, a] = work_k[adjacent[i, v, a]]
            low0, high0 = min(low0, vertices[i, v, 0]), max(high0, vertices[i, v, 0])
            low1, high1 = min(low1, vertices[i, v, 1]), max(high1, vertices[i, v, 1])
            low2, high2 = min(low2, vertices[i, v, 2]), max(high2, vertices[i, v, 2])
        m = live
        if m == 0:
            continue
        ph.measure(vx[0], m, shape)
        for f in range(c):
            lab[0, f] = f
        y0, y1, y2 = seeds[i, 0], seeds[i, 1], seeds[i, 2]
        if n0 == 1 and n1 == 1 and n2 == 1:
            ph.integrate(vx[0], cn[0], ad[0], lab[0], m, c, values[0, 0, 0], moments[i], facet[i], ref)
            continue
        a0, b0 = _voxel_range(y0 + low0, y0 + high0, lo[0], h0, n0)
        a1, b1 = _voxel_range(y1 + low1, y1 + high1, lo[1], h1, n1)
        a2, b2 = _voxel_range(y2 + low2, y2 + high2, lo[2], h2, n2)
        m0, c0 = m, c
        for j0 in range(a0, b0 + 1):
            k1, m1, c1, m0, c0 = _cut(vx, cn, ad, lab, 0, m0, c0, 0, lo[0] + (j0 + 1) * h0 - y0, j0 == b0, 1,
                                      s, tab2, tab3, gone, work_v, work_k, work_p, shape)
            for j1 in range(a1, b1 + 1):
                if m1 == 0:
                    break
                k2, m2, c2, m1, c1 = _cut(vx, cn, ad, lab, k1, m1, c1, 1, lo[1] + (j1 + 1) * h1 - y1, j1 == b1, 2,
                                          s, tab2, tab3, gone, work_v, work_k, work_p, shape)
                for j2 in range(a2, b2 + 1):
                    if m2 == 0:
                        break
                    k3, m3, c3, m2, c2 = _cut(vx, cn, ad, lab, k2, m2, c2, 2, lo[2] + (j2 + 1) * h2 - y2, j2 == b2,
                                              3, s, tab2, tab3, gone, work_v, work_k, work_p, shape)
                    if min(m1, m2, m3) < 0:
                        for k in range(5):
                            moments[i, k] = np.nan
                        break
                    value = values[j0, j1, j2]
                    if m3 > 0 and value != 0.0:
                        ph.integrate(vx[k3], cn[k3], ad[k3], lab[k3], m3, c3, value, moments[i], facet[i], ref)
            if m0 == 0:
                break


@njit
def _voxel_range(low, high, start, step, n):
    """The first and last voxel (of ``n`` from ``start``, each ``step`` wide) that ``[low, high]``
    meets."""
    a = int(np.floor((low - start) / step))
    b = int(np.floor((high - start) / step))
    return min(max(a, 0), n - 1), min(max(b, 0), n - 1)


@njit
def _cut(vx, cn, ad, lab, src, m, c, axis, plane, last, dst, s, tab2, tab3, gone, work_v, work_k, work_p, shape):
    """The part of polyhedron ``src`` in the current slab along ``axis`` (``u[axis] <= plane``,
    seed-relative): ``(k, size, count, rest_size, rest_count)``, the piece in polyhedron ``k``
    and what is left of ``src`` beyond the slab. The ``last`` slab is ``src`` itself (no copy);
    otherwise ``src`` is copied into ``dst`` and both are clipped. Sizes 0: empty; -1: a clip
    overflowed its scratch or broke (the cell's integrals are then NaN, never silently wrong)."""
    if last:
        return src, m, c, 0, 0
    ph.copy_into(vx[src], cn[src], ad[src], lab[src], m, c, vx[dst], cn[dst], ad[dst], lab[dst])
    margin = _margin(plane, shape)
    up = 1.0 if axis == 0 else 0.0
    vy = 1.0 if axis == 1 else 0.0
    wz = 1.0 if axis == 2 else 0.0
    pm, pc, status = ph.clip(vx[dst], cn[dst], ad[dst], lab[dst], m, c, up, vy, wz, plane, -1, margin,
                             s, tab2, tab3, gone, work_v, work_k, work_p, shape)
    if status == ph.EMPTIED:
        pm, pc = 0, 0
    elif status > ph.EMPTIED:
        return dst, -1, 0, 0, 0
    rm, rc, status = ph.clip(vx[src], cn[src], ad[src], lab[src], m, c, -up, -vy, -wz, -plane, -1, -margin,
                             s, tab2, tab3, gone, work_v, work_k, work_p, shape)
    if status == ph.EMPTIED:
        rm, rc = 0, 0
    elif status > ph.EMPTIED:
        return dst, -1, 0, 0, 0
    return dst, pm, pc, rm, rc


@njit
def _margin(plane, shape):
    """The rounding tolerance of a clip by a voxel plane at ``plane`` (seed-relative) of a
    piece within ``sqrt(shape[0])`` of the seed (see :func:`.polyhedron.clip`)."""
    return 64.0 * 2.0 ** -52 * (abs(plane) + np.sqrt(shape[0]))


def scratch():
    """The scratch arrays of :func:`integrals_rows` (one set per thread)."""
    f = SCRATCH_FACETS
    v = 2 * f
    return (np.empty((4, v, 3)), np.empty((4, v, 3), np.int64), np.empty((4, v, 3), np.int64), np.empty((4, f), np.int64),
            np.empty(v), np.full(f + 1, -1, np.int64), np.full(f + 1, -1, np.int64), np.empty(v, np.int64),
            np.empty(3 * v, np.int64), np.empty(3 * v, np.int64), np.empty((3 * v, 3)), np.empty(7), np.empty(f, np.int64))


def cell_integrals(seeds, vertices, corners, adjacent, size, count, values, lo, hi, facets):
    """``(moments (n, 5), facet (n, facets))`` of the voxel density ``values`` on the box
    ``[lo, hi]`` over the cells ``vertices`` ... ``count`` (:class:`..spatial.polyhedra.Cells`,
    NumPy): see the module docstring."""
    from . import run_rows

    n = seeds.shape[0]
    moments = np.empty((n, 5))
    facet = np.empty((n, facets))
    c = np.ascontiguousarray
    args = (c(seeds, dtype=np.float64), c(vertices, dtype=np.float64), c(corners, dtype=np.int64),
            c(adjacent, dtype=np.int64), c(size, dtype=np.int64), c(count, dtype=np.int64),
            c(values, dtype=np.float64), c(lo, dtype=np.float64), c(hi, dtype=np.float64), moments, facet)
    run_rows(lambda first, last: integrals_rows(first, last, *args, *scratch()), n)
    return moments, facet
