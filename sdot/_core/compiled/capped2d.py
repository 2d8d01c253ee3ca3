"""Exact integrals of a pixel density over 2D cells cut by balls (numba, rows on the host's
threads): partial transport (:mod:`..partial`).

As :mod:`.integrals2d`, each cell is cut into its pieces in the pixels (only those that meet
the ball ``|u| <= R`` of its seed), and each piece ``P`` (a convex polygon about the seed, where
the density is a constant) is cut by the ball in closed form: in the fan of ``P`` from the seed
(signed triangles ``(0, a, b)``, exact for any polygon), an edge ``(a, b)`` crossing the circle
at ``a + s (b - a)``, ``s_1 <= s <= s_2``, contributes the triangle ``(0, a + s_1 d, a + s_2 d)``
and the two sectors of radius ``R`` from the direction of ``a`` to that of ``a + s_1 d`` and
from ``a + s_2 d`` to ``b``: a sector of signed angle ``t_1 .. t_2`` has mass ``R^2 (t_2 - t_1)
/ 2``, first moments ``R^3 / 3 (sin t_2 - sin t_1, cos t_1 - cos t_2)`` and second moment
``R^4 (t_2 - t_1) / 4``, and its arc carries ``R (t_2 - t_1)`` of the density's line integral.

The result is that of :func:`..planar.capped.capped_integrals`.
"""
from __future__ import annotations

import numpy as np

from ._numba import njit
from .integrals2d import SCRATCH, _cut, _range, load_cell


@njit
def integrate_capped(px, py, lab, m, value, radius, moments, facet):
    """Add ``value`` times the moments of the polygon ``(px, py)`` (about the origin, the seed)
    cut by the disc of ``radius`` about it to ``moments`` (4,), ``value`` times the length of
    each edge's part inside the disc to ``facet[lab[k]]`` (``lab[k] >= 0``); returns ``value``
    times the length of the arcs."""
    if m < 3:
        return 0.0
    r2 = radius * radius
    r3 = r2 * radius
    area = m1x = m1y = m2 = arc = 0.0
    for k in range(m):
        kn = k + 1 if k + 1 < m else 0
        ax, ay, bx, by = px[k], py[k], px[kn], py[kn]
        dx, dy = bx - ax, by - ay
        dd = dx * dx + dy * dy
        if dd == 0.0:
            continue
        b_ = ax * dx + ay * dy
        disc = b_ * b_ - dd * (ax * ax + ay * ay - r2)
        s1 = s2 = 1.0
        if disc > 0.0:
            root = np.sqrt(disc)
            s1 = min(max((-b_ - root) / dd, 0.0), 1.0)
            s2 = min(max((-b_ + root) / dd, s1), 1.0)
        p1x, p1y = ax + s1 * dx, ay + s1 * dy
        p2x, p2y = ax + s2 * dx, ay + s2 * dy
        w = p1x * p2y - p1y * p2x
        area += 0.5 * w
        m1x += w * (p1x + p2x) / 6.0
        m1y += w * (p1y + p2y) / 6.0
        m2 += w * (p1x * p1x + p1y * p1y + p1x * p2x + p1y * p2y + p2x * p2x + p2y * p2y) / 12.0
        slot = lab[k]
        if slot >= 0 and s2 > s1:
            facet[slot] += value * (s2 - s1) * np.sqrt(dd)
        for ux, uy, vx, vy in ((ax, ay, p1x, p1y), (p2x, p2y, bx, by)):
            sweep = np.arctan2(ux * vy - uy * vx, ux * vx + uy * vy)
            if sweep != 0.0:
                t1 = np.arctan2(uy, ux)
                t2 = t1 + sweep
                area += 0.5 * r2 * sweep
                m1x += r3 / 3.0 * (np.sin(t2) - np.sin(t1))
                m1y += r3 / 3.0 * (np.cos(t1) - np.cos(t2))
                m2 += 0.25 * r2 * r2 * sweep
                arc += radius * sweep
    moments[0] += value * area
    moments[1] += value * m1x
    moments[2] += value * m1y
    moments[3] += value * m2
    return value * arc


@njit
def capped_rows(first, last, seeds, vertices, count, values, lo, hi, psi, moments, facet, arc, px, py, plab, s):
    """The integrals of the cells ``first .. last - 1`` cut by their balls, written into the rows
    of ``moments``, ``facet`` and ``arc`` (scratch as :func:`.integrals2d.integrals_rows`)."""
    n0, n1 = values.shape
    h0 = (hi[0] - lo[0]) / n0
    h1 = (hi[1] - lo[1]) / n1
    for i in range(first, last):
        for k in range(4):
            moments[i, k] = 0.0
        for k in range(facet.shape[1]):
            facet[i, k] = 0.0
        arc[i] = 0.0
        m = count[i]
        if m == 0 or psi[i] <= 0.0:
            continue
        radius = np.sqrt(psi[i])
        low0, high0, low1, high1, r2 = load_cell(vertices[i], m, px[0], py[0], plab[0])
        y0, y1 = seeds[i, 0], seeds[i, 1]
        if n0 == 1 and n1 == 1:
            arc[i] += integrate_capped(px[0], py[0], plab[0], m, values[0, 0], radius, moments[i], facet[i])
            continue
        # the pixels that meet the ball: the parts of the cell beyond them are outside it
        a0, b0 = _range(y0 + max(low0, -radius), y0 + min(high0, radius), lo[0], h0, n0)
        a1, b1 = _range(y1 + max(low1, -radius), y1 + min(high1, radius), lo[1], h1, n1)
        reach = np.sqrt(r2)
        m0 = m
        for j0 in range(a0, b0 + 1):
            k1, m1, m0 = _cut(px, py, plab, 0, m0, 1.0, 0.0, lo[0] + (j0 + 1) * h0 - y0, j0 == b0, 1, s, reach)
            for j1 in range(a1, b1 + 1):
                if m1 <= 0:
                    break
                k2, m2, m1 = _cut(px, py, plab, k1, m1, 0.0, 1.0, lo[1] + (j1 + 1) * h1 - y1, j1 == b1, 2, s, reach)
                value = values[j0, j1]
                if m2 > 0 and value != 0.0:
                    arc[i] += integrate_capped(px[k2], py[k2], plab[k2], m2, value, radius, moments[i], facet[i])
            if m0 <= 0:
                break


def capped_integrals(seeds, vertices, labels, count, values, lo, hi, psi):
    """``(moments (n, 4), facet (n, V), arc (n,))`` of the pixel density ``values`` on the box
    ``[lo, hi]`` over the cells cut by the balls ``|u|^2 <= psi`` (NumPy): see the module
    docstring."""
    from . import run_rows

    n, v_cap = labels.shape
    moments, facet, arc = np.empty((n, 4)), np.empty((n, v_cap)), np.empty(n)
    c = np.ascontiguousarray
    args = (c(seeds, dtype=np.float64), c(vertices, dtype=np.float64), c(count, dtype=np.int64),
            c(values, dtype=np.float64), c(lo, dtype=np.float64), c(hi, dtype=np.float64), c(psi, dtype=np.float64),
            moments, facet, arc)
    run_rows(lambda first, last: capped_rows(first, last, *args, np.empty((4, SCRATCH)), np.empty((4, SCRATCH)),
                                             np.empty((4, SCRATCH), np.int64), np.empty(SCRATCH)), n)
    return moments, facet, arc
