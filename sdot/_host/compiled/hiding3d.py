"""The fans of the hiding step in 3D (numba): per cell, the tetrahedron of neighbours that
contains its seed, as :func:`..spatial.hiding.fans` computes them with the array kernels (the
same operations in the same order, hence the same numbers).

Per cell ``i``: ``j0``, the neighbour of lowest lifted height ``|y_j - y_i|^2 - psi_j``; then,
vertex by vertex, the first tetrahedron ``(j0, a, b, c)`` of ``j0`` and the vertex's three
facets' neighbours that contains ``y_i``: its corners, the barycentric coordinates of ``y_i``
in it and the height of seed i's lifted point above its lifted plane, less a rounding
tolerance (``gap``; ``inf`` where no such tetrahedron holds the seed below its plane).
"""
from __future__ import annotations

import numpy as np

from ._numba import njit


@njit
def fans_rows(first, last, seeds, psi, active, labels, count, size, corners, out_corners, out_weights, out_gap):
    """The fans of the cells ``first .. last - 1`` into the rows of ``out_*``."""
    eps = 2.0 ** -52
    for i in range(first, last):
        out_gap[i] = np.inf
        for m in range(4):
            out_corners[i, m] = 0
            out_weights[i, m] = 0.0
        y0, y1, y2 = seeds[i, 0], seeds[i, 1], seeds[i, 2]
        j0 = -1
        z0 = np.inf
        for k in range(count[i]):
            j = labels[i, k]
            if j < 0 or not active[j]:
                continue
            q0, q1, q2 = seeds[j, 0] - y0, seeds[j, 1] - y1, seeds[j, 2] - y2
            z = q0 * q0 + q1 * q1 + q2 * q2 - psi[j]
            if z < z0:
                z0, j0 = z, j
        if j0 < 0:
            continue
        p00, p01, p02 = seeds[j0, 0] - y0, seeds[j0, 1] - y1, seeds[j0, 2] - y2
        for v in range(size[i]):
            s0, s1, s2 = corners[i, v, 0], corners[i, v, 1], corners[i, v, 2]
            a, b, c = _neighbour(labels, count, active, i, s0), _neighbour(labels, count, active, i, s1), \
                _neighbour(labels, count, active, i, s2)
            if a < 0 or b < 0 or c < 0 or a == j0 or b == j0 or c == j0:
                continue
            a0, a1, a2 = seeds[a, 0] - y0, seeds[a, 1] - y1, seeds[a, 2] - y2
            b0, b1, b2 = seeds[b, 0] - y0, seeds[b, 1] - y1, seeds[b, 2] - y2
            c0, c1, c2 = seeds[c, 0] - y0, seeds[c, 1] - y1, seeds[c, 2] - y2
            bc0, bc1, bc2 = b1 * c2 - b2 * c1, b2 * c0 - b0 * c2, b0 * c1 - b1 * c0
            ca0, ca1, ca2 = c1 * a2 - c2 * a1, c2 * a0 - c0 * a2, c0 * a1 - c1 * a0
            ab0, ab1, ab2 = a1 * b2 - a2 * b1, a2 * b0 - a0 * b2, a0 * b1 - a1 * b0
            v0 = a0 * bc0 + a1 * bc1 + a2 * bc2
            va = -(p00 * bc0 + p01 * bc1 + p02 * bc2)
            vb = -(p00 * ca0 + p01 * ca1 + p02 * ca2)
            vc = -(p00 * ab0 + p01 * ab1 + p02 * ab2)
            det = v0 + va + vb + vc
            if not ((det > 0 and v0 >= 0 and va >= 0 and vb >= 0 and vc >= 0)
                    or (det < 0 and v0 <= 0 and va <= 0 and vb <= 0 and vc <= 0)):
                continue
            w0, wa, wb, wc = v0 / det, va / det, vb / det, vc / det
            za = a0 * a0 + a1 * a1 + a2 * a2 - psi[a]
            zb = b0 * b0 + b1 * b1 + b2 * b2 - psi[b]
            zc = c0 * c0 + c1 * c1 + c2 * c2 - psi[c]
            zi = -psi[i]
            tol = 64.0 * eps * (((abs(z0) + abs(za)) + abs(zb)) + abs(zc) + abs(zi))
            gap = zi - (((w0 * z0 + wa * za) + wb * zb) + wc * zc) - tol
            out_corners[i, 0], out_corners[i, 1], out_corners[i, 2], out_corners[i, 3] = j0, a, b, c
            out_weights[i, 0], out_weights[i, 1], out_weights[i, 2], out_weights[i, 3] = w0, wa, wb, wc
            if gap < 0:
                out_gap[i] = gap
            break


@njit
def _neighbour(labels, count, active, i, slot):
    """The active neighbour across facet ``slot`` of cell ``i``, else -1."""
    if slot >= count[i]:
        return -1
    j = labels[i, slot]
    return j if j >= 0 and active[j] else -1


def fans(seeds, psi, active, labels, count, size, corners):
    """``(corners (n, 4), weights (n, 4), gap (n,))`` of the module docstring (NumPy in and out)."""
    from . import run_rows

    n = seeds.shape[0]
    c = np.ascontiguousarray
    out = (np.empty((n, 4), np.int64), np.empty((n, 4)), np.empty(n))
    args = (c(seeds, dtype=np.float64), c(psi, dtype=np.float64), c(active, dtype=np.bool_), c(labels, dtype=np.int64),
            c(count, dtype=np.int64), c(size, dtype=np.int64), c(corners, dtype=np.int64))
    run_rows(lambda first, last: fans_rows(first, last, *args, *out), n)
    return out
