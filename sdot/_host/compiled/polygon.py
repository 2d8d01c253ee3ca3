"""One convex polygon in scratch arrays, clipped by half-planes and integrated (numba).

The layout is that of :mod:`..planar.polygons` for one cell: ``m`` vertices counter-clockwise
``(px, py)`` relative to the seed, ``lab[k]`` the label of the edge from vertex ``k`` to vertex
``k + 1``. A clip writes the clipped polygon into a second set of arrays (Sutherland and
Hodgman: in 2D no rounding can break the result's structure, only make an edge of zero length).
"""
from __future__ import annotations

import numpy as np

from ._numba import njit

#: :func:`clip` results, as :mod:`.polyhedron`'s.
UNCHANGED, CHANGED, EMPTIED, OVERFLOW = 0, 1, 2, 3


@njit
def start_box(px, py, lab, lo, hi, y0, y1):
    """The box ``[lo, hi]`` relative to the seed ``(y0, y1)``, counter-clockwise from its lower
    left corner, the sides labelled ``-1 - side`` (0: y = lo, 1: x = hi, 2: y = hi, 3: x = lo);
    returns 4."""
    px[0], py[0], lab[0] = lo[0] - y0, lo[1] - y1, -1
    px[1], py[1], lab[1] = hi[0] - y0, lo[1] - y1, -2
    px[2], py[2], lab[2] = hi[0] - y0, hi[1] - y1, -3
    px[3], py[3], lab[3] = lo[0] - y0, hi[1] - y1, -4
    return 4


@njit
def clip(px, py, lab, m, nx, ny, off, label, margin, qx, qy, qlab, s):
    """The polygon ``(px, py, lab)`` of ``m`` vertices clipped by ``u . (nx, ny) <= off`` into
    ``(qx, qy, qlab)``; the new edge gets ``label``. A vertex goes when ``u . n - off > margin``
    (see :func:`.polyhedron.clip`). Returns ``(count, status)``: the new polygon's vertices
    (``m`` and :data:`UNCHANGED`: nothing written), :data:`CHANGED`, :data:`EMPTIED` or
    :data:`OVERFLOW`. ``s``: scratch."""
    n_out = 0
    for k in range(m):
        sk = px[k] * nx + py[k] * ny - off
        s[k] = sk
        if sk > margin:
            n_out += 1
    if n_out == 0:
        return m, UNCHANGED
    if n_out == m:
        return 0, EMPTIED
    cap = qx.shape[0]
    out = 0
    for k in range(m):
        kn = k + 1 if k + 1 < m else 0
        here = s[k] <= margin
        there = s[kn] <= margin
        if here:
            if out >= cap:
                return 0, OVERFLOW
            qx[out], qy[out], qlab[out] = px[k], py[k], lab[k]
            out += 1
        if here != there:
            if out >= cap:
                return 0, OVERFLOW
            t = min(max(s[k] / (s[k] - s[kn]), 0.0), 1.0)
            qx[out] = px[k] + t * (px[kn] - px[k])
            qy[out] = py[k] + t * (py[kn] - py[k])
            qlab[out] = label if here else lab[k]
            out += 1
    return out, CHANGED


@njit
def measure(px, py, m, shape):
    """``shape``: the largest ``|u|^2`` over the vertices, then their box ``(lo0, hi0, lo1, hi1)``."""
    r2 = 0.0
    lo0 = lo1 = np.inf
    hi0 = hi1 = -np.inf
    for k in range(m):
        x, y = px[k], py[k]
        r2 = max(r2, x * x + y * y)
        lo0, hi0 = min(lo0, x), max(hi0, x)
        lo1, hi1 = min(lo1, y), max(hi1, y)
    shape[0], shape[1], shape[2], shape[3], shape[4] = r2, lo0, hi0, lo1, hi1


@njit
def area(px, py, m):
    """The polygon's signed area (positive counter-clockwise), about its first vertex."""
    total = 0.0
    for k in range(1, m - 1):
        total += (px[k] - px[0]) * (py[k + 1] - py[0]) - (py[k] - py[0]) * (px[k + 1] - px[0])
    return 0.5 * total


@njit
def integrate(px, py, lab, m, value, moments, facet):
    """Add ``value`` times the polygon's mass, first moments and second moment about the seed
    (the origin) to ``moments`` (4,), and ``value`` times each edge's length to
    ``facet[lab[k]]`` for the edges with ``lab[k] >= 0``. Triangles from the mean of the
    vertices ``c``: for ``(0, a, b)`` of area ``A``, ``int x = A (a + b) / 3`` and ``int |x|^2 =
    A (|a|^2 + a . b + |b|^2) / 6``; then moved to the seed."""
    if m < 3:
        return
    cx = 0.0
    cy = 0.0
    for k in range(m):
        cx += px[k]
        cy += py[k]
    cx /= m
    cy /= m
    a0 = 0.0
    m1x = 0.0
    m1y = 0.0
    m2 = 0.0
    for k in range(m):
        kn = k + 1 if k + 1 < m else 0
        ax, ay = px[k] - cx, py[k] - cy
        bx, by = px[kn] - cx, py[kn] - cy
        t = 0.5 * (ax * by - ay * bx)
        a0 += t
        m1x += t * (ax + bx)
        m1y += t * (ay + by)
        m2 += t * (ax * ax + ay * ay + ax * bx + ay * by + bx * bx + by * by)
        slot = lab[k]
        if slot >= 0:
            facet[slot] += value * np.sqrt((bx - ax) * (bx - ax) + (by - ay) * (by - ay))
    m1x /= 3.0
    m1y /= 3.0
    m2 /= 6.0
    moments[0] += value * a0
    moments[1] += value * (m1x + a0 * cx)
    moments[2] += value * (m1y + a0 * cy)
    moments[3] += value * (m2 + 2.0 * (cx * m1x + cy * m1y) + a0 * (cx * cx + cy * cy))
