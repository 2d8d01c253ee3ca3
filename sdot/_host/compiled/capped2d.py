"""A convex polygon cut by a disc about the origin, integrated in closed form (numba): the pieces
of the cells of partial transport (:mod:`..partial`) in the pixels, cut by their seeds' balls
``|u| <= R`` (:func:`.integrals2d.capped_integrals` walks the pixels).

Each piece ``P`` (a convex polygon about the seed, where the density is a constant) is cut by
the ball in closed form: in the fan of ``P`` from the seed
(signed triangles ``(0, a, b)``, exact for any polygon), an edge ``(a, b)`` crossing the circle
at ``a + s (b - a)``, ``s_1 <= s <= s_2``, contributes the triangle ``(0, a + s_1 d, a + s_2 d)``
and the two sectors of radius ``R`` from the direction of ``a`` to that of ``a + s_1 d`` and
from ``a + s_2 d`` to ``b``: a sector of signed angle ``t_1 .. t_2`` has mass ``R^2 (t_2 - t_1)
/ 2``, first moments ``R^3 / 3 (sin t_2 - sin t_1, cos t_1 - cos t_2)`` and second moment
``R^4 (t_2 - t_1) / 4``, and its arc carries ``R (t_2 - t_1)`` of the density's line integral.
"""
from __future__ import annotations

import numpy as np

from ._numba import njit


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
