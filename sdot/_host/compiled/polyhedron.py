"""One convex polyhedron in scratch arrays, clipped by half-spaces and integrated (numba).

The layout is that of :mod:`..spatial.polyhedra` for one cell: vertices ``vx`` (V, 3) relative
to the seed, each the meeting point of three facet slots ``cn`` (V, 3), counter-clockwise seen
from outside, and ``ad`` (V, 3) the vertex at the other end of edge ``k`` (opposite ``cn[v, k]``,
on the facets ``cn[v, k + 1]`` and ``cn[v, k + 2]``); ``lab`` (F,) the label of each facet slot.
A vertex slot below ``size`` whose ``cn[v, 0] < 0`` is free. The clip is
:func:`..spatial.polyhedra._clip_listed`'s, one cell at a time: the vertices beyond the plane
go, each edge from a kept vertex to a removed one gives a new vertex on the new facet.
"""
from __future__ import annotations

import numpy as np

from ._numba import njit

#: :func:`clip` results.
UNCHANGED, CHANGED, EMPTIED, OVERFLOW, BROKEN = 0, 1, 2, 3, 4


@njit
def start_box(vx, cn, ad, lab, lo, hi, y, cube_corners, cube_planes, cube_adjacent):
    """The box ``[lo, hi]`` relative to the seed ``y``: ``(size, count) = (8, 6)``."""
    for c in range(8):
        for a in range(3):
            vx[c, a] = lo[a] + cube_corners[c, a] * (hi[a] - lo[a]) - y[a]
            cn[c, a] = cube_planes[c, a]
            ad[c, a] = cube_adjacent[c, a]
    for f in range(6):
        lab[f] = -1 - f
    return 8, 6


@njit
def clip(vx, cn, ad, lab, size, count, nx, ny, nz, off, label, margin, s, tab2, tab3, gone, work_v, work_k, work_p,
         shape):
    """Clip the polyhedron (vertex slots ``0 .. size - 1`` all live) by ``u . (nx, ny, nz) <= off``;
    the new facet gets ``label``.

    A vertex goes when ``u . n - off > margin``: a small positive ``margin`` (a rounding
    tolerance) keeps the vertices on the plane, where rounding would make the vertices that go
    a set whose boundary is not one cycle (four planes meet at every vertex of a lattice's
    cells); a negative one takes them too. Returns ``(size, count,
    status)``: :data:`UNCHANGED`, :data:`CHANGED`, :data:`EMPTIED` (every vertex went),
    :data:`OVERFLOW` (no room in the scratch arrays) or :data:`BROKEN` (rounding made the
    vertices beyond the plane a set whose boundary is not one cycle). The slots stay compact:
    the new vertices take the removed ones' slots, the last vertices fill those left over.
    ``shape``: on a change, the largest ``|u|^2`` of the vertices left and their box (see
    :func:`measure`; not if it is empty). ``s``, ``tab2``, ``tab3`` (-1 at rest), ``gone``, ``work_*``: scratch arrays.
    """
    n_out = 0
    for v in range(size):
        sv = vx[v, 0] * nx + vx[v, 1] * ny + vx[v, 2] * nz - off
        s[v] = sv
        if sv > margin:
            gone[n_out] = v
            n_out += 1
    if n_out == 0:
        return size, count, UNCHANGED
    if n_out == size:
        return 0, 0, EMPTIED
    if count >= lab.shape[0]:
        count = compact_facets(cn, lab, size, count, work_v)
        if count >= lab.shape[0]:
            return size, count, OVERFLOW
    p = count
    # the crossing edges, each from a kept vertex v (its edge k) to a removed one w
    n_new = 0
    for g in range(n_out):
        w = gone[g]
        for kw in range(3):
            v = ad[w, kw]
            if s[v] > margin:
                continue
            if n_new >= work_v.shape[0]:
                return size, count, OVERFLOW
            # the edge lies on the facets of w other than cn[w, kw]; at v it is opposite the third
            f1 = cn[w, (kw + 1) % 3]
            f2 = cn[w, (kw + 2) % 3]
            k = 0
            while k < 2 and (cn[v, k] == f1 or cn[v, k] == f2):
                k += 1
            t = min(max(s[v] / (s[v] - s[w]), 0.0), 1.0)
            p0 = vx[v, 0] + t * (vx[w, 0] - vx[v, 0])
            p1 = vx[v, 1] + t * (vx[w, 1] - vx[v, 1])
            p2 = vx[v, 2] + t * (vx[w, 2] - vx[v, 2])
            work_p[n_new, 0] = p0
            work_p[n_new, 1] = p1
            work_p[n_new, 2] = p2
            work_v[n_new] = v
            work_k[n_new] = k
            n_new += 1
    if size + n_new - n_out > vx.shape[0]:
        return size, count, OVERFLOW
    # slots: those of the removed vertices first, then from size on
    broken = False
    for e in range(n_new):
        slot = gone[e] if e < n_out else size + e - n_out
        if not _place(vx, cn, ad, slot, work_v[e], work_k[e], work_p, e, p, tab2, tab3):
            broken = True
        work_k[e] = slot
    new_size = size + max(n_new - n_out, 0)
    # along the new facet: the new vertex with each facet in second and third place
    for e in range(n_new):
        slot = work_k[e]
        b = cn[slot, 1]
        a = cn[slot, 2]
        ad[slot, 1] = tab2[a]
        ad[slot, 2] = tab3[b]
        if tab2[a] < 0 or tab3[b] < 0:
            broken = True
    for e in range(n_new):
        slot = work_k[e]
        tab2[cn[slot, 1]] = -1
        tab3[cn[slot, 2]] = -1
    if broken:
        return new_size, count + 1, BROKEN
    lab[p] = label
    # removed slots left over: filled by the last vertices
    for g in range(n_new, n_out):
        cn[gone[g], 0] = -1
    for g in range(n_new, n_out):
        hole = gone[g]
        while new_size > 0 and cn[new_size - 1, 0] < 0:
            new_size -= 1
        if hole < new_size:
            _move(vx, cn, ad, new_size - 1, hole)
            new_size -= 1
    if shape.shape[0] > 0:
        measure(vx, new_size, shape)
    return new_size, count + 1, CHANGED


@njit
def measure(vx, size, shape):
    """``shape``: the largest ``|u|^2`` over the vertices, then their box ``(lo0, hi0, lo1, hi1,
    lo2, hi2)`` (seed-relative)."""
    r2 = 0.0
    lo0 = lo1 = lo2 = np.inf
    hi0 = hi1 = hi2 = -np.inf
    for v in range(size):
        x0, x1, x2 = vx[v, 0], vx[v, 1], vx[v, 2]
        r2 = max(r2, x0 * x0 + x1 * x1 + x2 * x2)
        lo0, hi0 = min(lo0, x0), max(hi0, x0)
        lo1, hi1 = min(lo1, x1), max(hi1, x1)
        lo2, hi2 = min(lo2, x2), max(hi2, x2)
    shape[0] = r2
    shape[1], shape[2], shape[3], shape[4], shape[5], shape[6] = lo0, hi0, lo1, hi1, lo2, hi2


@njit
def _move(vx, cn, ad, last, hole):
    """Move vertex ``last`` to the free slot ``hole``, its neighbours' edges with it."""
    for a in range(3):
        vx[hole, a] = vx[last, a]
        cn[hole, a] = cn[last, a]
        ad[hole, a] = ad[last, a]
    cn[last, 0] = -1
    for a in range(3):
        w = ad[hole, a]
        for b in range(3):
            if ad[w, b] == last:
                ad[w, b] = hole


@njit
def _place(vx, cn, ad, slot, v, k, work_p, e, p, tab2, tab3):
    """The new vertex ``slot`` on edge ``k`` of the kept vertex ``v``: facets ``(p, B, A)``
    with ``A = cn[v, k + 1]``, ``B = cn[v, k + 2]``; its edge 0 back to ``v``. False if
    another new vertex has ``A`` or ``B`` in the same place (a broken cycle)."""
    a = cn[v, (k + 1) % 3]
    b = cn[v, (k + 2) % 3]
    for c in range(3):
        vx[slot, c] = work_p[e, c]
    cn[slot, 0] = p
    cn[slot, 1] = b
    cn[slot, 2] = a
    ad[slot, 0] = v
    ad[v, k] = slot
    fine = tab2[b] < 0 and tab3[a] < 0
    tab2[b] = slot
    tab3[a] = slot
    return fine


@njit
def compact_facets(cn, lab, size, count, used):
    """Drop the facet slots no live vertex is on (their labels and slots renumbered in
    order); returns the new count. ``used``: scratch of at least ``count`` entries."""
    for f in range(count):
        used[f] = 0
    for v in range(size):
        if cn[v, 0] >= 0:
            for a in range(3):
                used[cn[v, a]] = 1
    new = 0
    for f in range(count):
        if used[f]:
            used[f] = new
            lab[new] = lab[f]
            new += 1
        else:
            used[f] = -1
    for v in range(size):
        if cn[v, 0] >= 0:
            for a in range(3):
                cn[v, a] = used[cn[v, a]]
    return new


@njit
def compact_vertices(vx, cn, ad, size, where):
    """Move the live vertices to slots ``0 .. m - 1`` (in order) and renumber the edges;
    returns ``m``. ``where``: scratch of at least ``size`` entries."""
    m = 0
    for v in range(size):
        if cn[v, 0] >= 0:
            where[v] = m
            m += 1
        else:
            where[v] = -1
    for v in range(size):
        w = where[v]
        if w >= 0:
            for a in range(3):
                vx[w, a] = vx[v, a]
                cn[w, a] = cn[v, a]
                ad[w, a] = ad[v, a]
    for v in range(m):
        for a in range(3):
            ad[v, a] = where[ad[v, a]]
    return m


@njit
def copy_into(vx, cn, ad, lab, size, count, vx2, cn2, ad2, lab2):
    """Copy a polyhedron into other scratch arrays."""
    for v in range(size):
        for a in range(3):
            vx2[v, a] = vx[v, a]
            cn2[v, a] = cn[v, a]
            ad2[v, a] = ad[v, a]
    for f in range(count):
        lab2[f] = lab[f]


@njit
def integrate(vx, cn, ad, lab, size, count, value, moments, facet, ref):
    """Add ``value`` times the polyhedron's mass, first moments and second moment about the
    seed (the origin) to ``moments`` (5,), and ``value`` times each facet's area to
    ``facet[lab[f]]`` for the facet slots ``f`` with ``lab[f] >= 0``. ``ref`` (F,): scratch.

    Cones from the mean of the vertices ``c`` over the facets' fan triangles
    ``(r, v, w)`` (``r`` a vertex of the facet, ``v -> w`` an edge along it): for a
    tetrahedron ``(0, a, b, d)`` of volume ``V``, ``int x = V (a + b + d) / 4`` and
    ``int |x|^2 = V (|a|^2 + |b|^2 + |d|^2 + |a + b + d|^2) / 20``; then moved to the seed.
    """
    if size == 0:
        return
    cx = 0.0
    cy = 0.0
    cz = 0.0
    for f in range(count):
        ref[f] = -1
    for v in range(size):
        cx += vx[v, 0]
        cy += vx[v, 1]
        cz += vx[v, 2]
        for a in range(3):
            if ref[cn[v, a]] < 0:
                ref[cn[v, a]] = v
    cx /= size
    cy /= size
    cz /= size
    vol = 0.0
    m1x = 0.0
    m1y = 0.0
    m1z = 0.0
    m2 = 0.0
    for v in range(size):
        for a in range(3):
            f = cn[v, a]
            r = ref[f]
            w = ad[v, (a + 1) % 3]
            if r == v or r == w:
                continue
            ax = vx[r, 0] - cx
            ay = vx[r, 1] - cy
            az = vx[r, 2] - cz
            bx = vx[v, 0] - cx
            by = vx[v, 1] - cy
            bz = vx[v, 2] - cz
            dx = vx[w, 0] - cx
            dy = vx[w, 1] - cy
            dz = vx[w, 2] - cz
            t = (ax * (by * dz - bz * dy) - ay * (bx * dz - bz * dx) + az * (bx * dy - by * dx)) / 6.0
            sx = ax + bx + dx
            sy = ay + by + dy
            sz = az + bz + dz
            vol += t
            m1x += t * sx
            m1y += t * sy
            m1z += t * sz
            m2 += t * (ax * ax + ay * ay + az * az + bx * bx + by * by + bz * bz + dx * dx + dy * dy + dz * dz
                       + sx * sx + sy * sy + sz * sz)
            slot = lab[f]
            if slot >= 0:
                # the triangle's area: half the norm of (v - r) x (w - r)
                ux = bx - ax
                uy = by - ay
                uz = bz - az
                wx = dx - ax
                wy = dy - ay
                wz = dz - az
                qx = uy * wz - uz * wy
                qy = uz * wx - ux * wz
                qz = ux * wy - uy * wx
                facet[slot] += value * 0.5 * np.sqrt(qx * qx + qy * qy + qz * qz)
    m1x *= 0.25
    m1y *= 0.25
    m1z *= 0.25
    m2 *= 0.05
    # about the seed: u = (x - c) + c
    moments[0] += value * vol
    moments[1] += value * (m1x + vol * cx)
    moments[2] += value * (m1y + vol * cy)
    moments[3] += value * (m1z + vol * cz)
    moments[4] += value * (m2 + 2.0 * (cx * m1x + cy * m1y + cz * m1z) + vol * (cx * cx + cy * cy + cz * cz))


@njit
def volume(vx, cn, ad, size, ref):
    """The polyhedron's volume (cones from its first vertex over the facets' fan triangles).
    ``ref``: scratch of at least the facet slots."""
    if size == 0:
        return 0.0
    for v in range(size):
        for a in range(3):
            ref[cn[v, a]] = -1
    for v in range(size):
        for a in range(3):
            if ref[cn[v, a]] < 0:
                ref[cn[v, a]] = v
    c0, c1, c2 = vx[0, 0], vx[0, 1], vx[0, 2]
    total = 0.0
    for v in range(size):
        for a in range(3):
            r = ref[cn[v, a]]
            w = ad[v, (a + 1) % 3]
            if r == v or r == w:
                continue
            ax, ay, az = vx[r, 0] - c0, vx[r, 1] - c1, vx[r, 2] - c2
            bx, by, bz = vx[v, 0] - c0, vx[v, 1] - c1, vx[v, 2] - c2
            dx, dy, dz = vx[w, 0] - c0, vx[w, 1] - c1, vx[w, 2] - c2
            total += ax * (by * dz - bz * dy) - ay * (bx * dz - bz * dx) + az * (bx * dy - by * dx)
    return total / 6.0
