"""Power cells in 3D and the integrals of a voxel density over them, the slow way with
scipy (independent of sdot): the ground truth of tests/test_spatial_integrals.py.

Each cell is the ``HalfspaceIntersection`` of its bisector half-spaces and the box; its
boundary is the ``ConvexHull`` of its vertices, triangulated, oriented outward, each
triangle labelled by the half-space it lies on (coplanar triangles share a facet slot).
The integrals over a voxel density clip each cell by each voxel (a
``HalfspaceIntersection`` with the voxel's six planes) and sum the tetrahedra of the
pieces; the facet integrals clip each facet polygon by the voxels.
"""
from __future__ import annotations

import numpy as np
from scipy.optimize import linprog
from scipy.spatial import ConvexHull, HalfspaceIntersection


def box_halfspaces(lo, hi):
    """The box ``[lo, hi]`` as rows ``(A, b)``, ``A x + b <= 0``."""
    rows = []
    for a in range(3):
        e = np.zeros(3)
        e[a] = 1.0
        rows.append(np.concatenate([-e, [lo[a]]]))
        rows.append(np.concatenate([e, [-hi[a]]]))
    return np.array(rows)


def cell_halfspaces(seeds, psi, i, lo, hi):
    """Power cell ``i``: ``|x - y_i|^2 - psi_i <= |x - y_j|^2 - psi_j`` for all j, in the box.
    Rows ``(A, b)`` and their labels (j, or ``-1 - side`` for the box)."""
    others = np.array([j for j in range(len(seeds)) if j != i], dtype=int)
    d = seeds[others] - seeds[i]
    rhs = (seeds[others] ** 2).sum(1) - (seeds[i] ** 2).sum() - psi[others] + psi[i]
    rows = np.concatenate([2.0 * d, -rhs[:, None]], axis=1)
    return np.concatenate([rows, box_halfspaces(lo, hi)]), np.concatenate([others, -1 - np.arange(6)])


def interior_point(halfspaces):
    """The Chebyshev centre and radius of ``A x + b <= 0`` (radius <= 0: empty or flat)."""
    A, b = halfspaces[:, :3], halfspaces[:, 3]
    norm = np.linalg.norm(A, axis=1)
    res = linprog(np.array([0.0, 0.0, 0.0, -1.0]), A_ub=np.concatenate([A, norm[:, None]], axis=1), b_ub=-b,
                  bounds=[(None, None)] * 3 + [(0, None)], method="highs")
    if res.status != 0:
        return None, 0.0
    return res.x[:3], res.x[3]


def polytope(halfspaces, min_radius=1e-9):
    """The vertices of ``A x + b <= 0`` (None if empty or flat)."""
    centre, radius = interior_point(halfspaces)
    if centre is None or radius <= min_radius:
        return None
    return HalfspaceIntersection(halfspaces, centre).intersections


def tetra_moments(points, about, axes=False):
    """Volume, first moments and second moment about ``about`` of the convex hull of
    ``points`` (its tetrahedra from an inside point): for a tetrahedron of vertices
    ``v_k`` relative to ``about``, ``int u = vol mean(v)``,
    ``int |u|^2 = vol / 20 (sum |v_k|^2 + |sum v_k|^2)``; with ``axes``, then the second
    moments along each axis, ``int u_a^2`` (8 entries)."""
    hull = ConvexHull(points)
    p = points - about
    inside = p[hull.vertices].mean(0)
    out = np.zeros(8 if axes else 5)
    for s in hull.simplices:
        a, b, c = p[s]
        vol = abs(np.dot(a - inside, np.cross(b - inside, c - inside))) / 6.0
        v = np.array([inside, a, b, c])
        total = v.sum(0)
        out[0] += vol
        out[1:4] += vol * total / 4.0
        out[4] += vol / 20.0 * ((v ** 2).sum() + total @ total)
        if axes:
            out[5:] += vol / 20.0 * ((v ** 2).sum(0) + total ** 2)
    return out


def power_cells(seeds, psi, lo, hi, T=None):
    """The cells as a triangle soup: ``triangles`` (n, T, 3, 3) relative to the seeds,
    ``slot`` (n, T), ``valid`` (n, T), the number of facet slots ``F``, and per cell its
    half-spaces, the label and the polygon (ordered vertices) of each facet slot."""
    n = len(seeds)
    cells = []
    for i in range(n):
        hs, labels = cell_halfspaces(seeds, psi, i, lo, hi)
        verts = polytope(hs)
        tris, facets = [], {}
        if verts is not None:
            hull = ConvexHull(verts)
            A, b = hs[:, :3], hs[:, 3]
            dist = np.abs(verts @ A.T + b) / np.linalg.norm(A, axis=1)        # (V, H)
            for simplex, eq in zip(hull.simplices, hull.equations):
                t = verts[simplex]
                if np.dot(np.cross(t[1] - t[0], t[2] - t[0]), eq[:3]) < 0:
                    t = t[[0, 2, 1]]
                h = int(np.argmin(dist[simplex].max(0)))           # the half-space it lies on
                if h not in facets:
                    facets[h] = len(facets)
                tris.append((t, facets[h]))
            polygons = {}
            for h, k in facets.items():
                on = verts[dist[:, h] < 1e-9 * max(1.0, np.abs(verts).max())]
                polygons[k] = order_polygon(on, A[h])
        cells.append((tris, facets, hs, labels, polygons if verts is not None else {}))
    T = T or max(max(len(c[0]) for c in cells), 1)
    F = max(max(len(c[1]) for c in cells), 1)
    triangles = np.zeros((n, T, 3, 3))
    slot = np.zeros((n, T), dtype=np.int64)
    valid = np.zeros((n, T), dtype=bool)
    for i, (tris, _, _, _, _) in enumerate(cells):
        for t, (tri, k) in enumerate(tris):
            triangles[i, t] = tri - seeds[i]
            slot[i, t] = k
            valid[i, t] = True
    info = [dict(halfspaces=c[2], labels={k: c[3][h] for h, k in c[1].items()}, polygons=c[4]) for c in cells]
    return triangles, slot, valid, F, info


def order_polygon(points, normal):
    """The points of a convex planar polygon, counter-clockwise about ``normal``."""
    points = np.unique(points, axis=0)
    c = points.mean(0)
    e1 = points[0] - c
    e1 /= np.linalg.norm(e1)
    e2 = np.cross(normal / np.linalg.norm(normal), e1)
    angle = np.arctan2((points - c) @ e2, (points - c) @ e1)
    return points[np.argsort(angle)]


def voxels(values, lo, hi):
    """Every voxel: its index and its box."""
    shape = values.shape
    h = (hi - lo) / np.array(shape)
    for idx in np.ndindex(*shape):
        a = lo + h * np.array(idx)
        yield idx, a, a + h


def piece_moments(seeds, info, shape, lo, hi, axes=False):
    """Per cell and voxel ``(volume, int u, int v, int w, int |u|^2)`` of the cell clipped
    by the voxel (unit density, about the seed): ``(n, n0, n1, n2, 5)``; with ``axes``, then
    ``int u^2, int v^2, int w^2`` (8 entries)."""
    out = np.zeros((len(seeds),) + tuple(shape) + (8 if axes else 5,))
    ones = np.ones(shape)
    for i, cell in enumerate(info):
        if not cell["polygons"]:
            continue
        verts = polytope(cell["halfspaces"])
        cmin, cmax = verts.min(0), verts.max(0)
        for idx, a, b in voxels(ones, lo, hi):
            if np.any(a > cmax) or np.any(b < cmin):
                continue
            piece = polytope(np.concatenate([cell["halfspaces"], box_halfspaces(a, b)]), 1e-12)
            if piece is not None:
                out[(i,) + idx] = tetra_moments(piece, seeds[i], axes)
    return out


def cell_moments(seeds, info, values, lo, hi):
    """Per cell ``(mass, M_u, M_v, M_w, M_2)`` about the seed, by clipping with every voxel."""
    return np.einsum("ijklm,jkl->im", piece_moments(seeds, info, values.shape, lo, hi), values)


def clip_polygon(poly, axis, value, keep_below):
    """Sutherland-Hodgman: the polygon (list of points) cut to ``x[axis] <= value``
    (``keep_below``) or ``>= value``."""
    out = []
    sign = 1.0 if keep_below else -1.0
    for k in range(len(poly)):
        p, q = poly[k], poly[(k + 1) % len(poly)]
        dp, dq = sign * (p[axis] - value), sign * (q[axis] - value)
        if dp <= 0:
            out.append(p)
        if (dp < 0 < dq) or (dq < 0 < dp):
            out.append(p + dp / (dp - dq) * (q - p))
    return out


def polygon_area(poly):
    if len(poly) < 3:
        return 0.0
    p = np.asarray(poly)
    return 0.5 * np.linalg.norm(sum(np.cross(p[k] - p[0], p[k + 1] - p[0]) for k in range(1, len(p) - 1)))


def voxel_index(x, lo, hi, n):
    """The voxel of ``x`` along an axis of ``n`` voxels on ``[lo, hi]``: on a grid plane
    (within 1e-9 voxel), the voxel above it (the last one at ``hi``)."""
    g = (x - lo) / (hi - lo) * n
    if abs(g - round(g)) < 1e-9:
        g = round(g)
    return min(max(int(np.floor(g)), 0), n - 1)


def polygon_moments(poly, about):
    """Area, first moments (3,) and second moments (3, 3) about ``about`` of a convex planar
    polygon (its triangles from the first vertex): for a triangle of vertices ``p_k``
    relative to ``about``, ``int u = A mean(p)``, ``int u u^T = A / 12 (sum p_k p_k^T + s s^T)``,
    ``s = sum p_k``."""
    area, first, second = 0.0, np.zeros(3), np.zeros((3, 3))
    p = np.asarray(poly) - about
    for k in range(1, len(p) - 1):
        t = p[[0, k, k + 1]]
        a = 0.5 * np.linalg.norm(np.cross(t[1] - t[0], t[2] - t[0]))
        s = t.sum(0)
        area += a
        first += a * s / 3.0
        second += a / 12.0 * (t.T @ t + np.outer(s, s))
    return area, first, second


def facet_moments(seeds, info, values, lo, hi, F):
    """Per cell and facet slot, ``int rho dS`` (n, F), ``int rho u dS`` (n, F, 3) and
    ``int rho u u^T dS`` (n, F, 3, 3) over the facet polygon (clipped by each voxel),
    ``u = x - y_i``; a facet on a voxel plane counts the voxel above it."""
    n = len(info)
    f0, f1, f2 = np.zeros((n, F)), np.zeros((n, F, 3)), np.zeros((n, F, 3, 3))
    for i, k, idx, piece in facet_pieces(info, values, lo, hi):
        if len(piece) >= 3:
            a, m1, m2 = polygon_moments(piece, seeds[i])
            f0[i, k] += values[idx] * a
            f1[i, k] += values[idx] * m1
            f2[i, k] += values[idx] * m2
    return f0, f1, f2


def facet_integrals(info, values, lo, hi, F):
    """Per cell and facet slot, the density integrated over the facet polygon (clipped by
    each voxel); a facet on a voxel plane counts the voxel above it."""
    out = np.zeros((len(info), F))
    for i, k, idx, piece in facet_pieces(info, values, lo, hi):
        out[i, k] += values[idx] * polygon_area(piece)
    return out


def facet_pieces(info, values, lo, hi):
    """Every facet polygon clipped by every voxel: ``(cell, slot, voxel index, polygon)``; a
    facet on a voxel plane goes to the voxel above it."""
    for i, cell in enumerate(info):
        for k, poly in cell["polygons"].items():
            for idx, a, b in voxels(values, lo, hi):
                if np.any(a > poly.max(0) + 1e-12) or np.any(b < poly.min(0) - 1e-12):
                    continue
                piece = list(poly)
                for axis in range(3):
                    flat = np.ptp(poly[:, axis]) < 1e-12
                    if flat:            # the facet on a plane of this axis: the voxel above it
                        if voxel_index(poly[0, axis], lo[axis], hi[axis], values.shape[axis]) != idx[axis]:
                            piece = []
                        continue
                    piece = clip_polygon(piece, axis, a[axis], False) if piece else piece
                    piece = clip_polygon(piece, axis, b[axis], True) if piece else piece
                yield i, k, idx, piece


# --------------------------------------------------------------------- boxes, in closed form

#: The 12 triangles of a box ``[p, q]`` (corner ``k`` has coordinate ``q`` along the axes of
#: its bits), outward, and their faces (0: x = p, 1: x = q, 2: y = p, ...).
BOX_TRIANGLES = np.array([[0, 4, 6], [0, 6, 2], [1, 3, 7], [1, 7, 5], [0, 1, 5], [0, 5, 4],
                          [2, 6, 7], [2, 7, 3], [0, 2, 3], [0, 3, 1], [4, 5, 7], [4, 7, 6]])
BOX_FACES = np.repeat(np.arange(6), 2)


def box_triangles(p, q, seed):
    """The boundary triangles of the box ``[p, q]`` relative to ``seed`` (12, 3, 3), each
    coordinate rounded once (``p - seed``), and their facet slots (12,)."""
    rel = np.stack([p - seed, q - seed])                       # (2, 3)
    corners = np.array([[rel[(k >> a) & 1, a] for a in range(3)] for k in range(8)])
    return corners[BOX_TRIANGLES], BOX_FACES.copy()


def axis_integrals(a, b, edges):
    """Per voxel along one axis (its sides ``edges``), ``int 1, int x, int x^2`` over
    ``[a, b]`` and the voxel (3, n)."""
    a, b = np.maximum(edges[:-1], a), np.minimum(edges[1:], b)
    b = np.maximum(a, b)
    return np.stack([b - a, (b * b - a * a) / 2, (b ** 3 - a ** 3) / 3])


def box_truth(p, q, seed, values, lo, hi):
    """The moments (5,) about ``seed`` of the density on the box ``[p, q]``, its facet
    integrals (6,) (a face on a voxel plane: the voxel above it), and its unit-density
    moments per voxel ``(n0, n1, n2, 5)``; in coordinates relative to the seed, the box's
    corners rounded there as by :func:`box_triangles`."""
    shape = values.shape
    P, Q = p - seed, q - seed
    edges = [(lo[a] - seed[a]) + (hi[a] - lo[a]) * np.arange(shape[a] + 1) / shape[a] for a in range(3)]
    I = [axis_integrals(P[a], Q[a], edges[a]) for a in range(3)]
    L = [I[a][0] for a in range(3)]
    per_voxel = np.zeros(shape + (5,))
    per_voxel[..., 0] = np.einsum("i,j,k->ijk", *L)
    for a in range(3):
        f = [I[b][1] if b == a else L[b] for b in range(3)]
        per_voxel[..., 1 + a] = np.einsum("i,j,k->ijk", *f)
        g = [I[b][2] if b == a else L[b] for b in range(3)]
        per_voxel[..., 4] += np.einsum("i,j,k->ijk", *g)
    facets = np.zeros(6)
    for a in range(3):
        others = [b for b in range(3) if b != a]
        for side, x in enumerate((p[a], q[a])):
            at = voxel_index(x, lo[a], hi[a], shape[a])
            face = np.take(values, at, axis=a)                       # (n_b, n_c)
            facets[2 * a + side] = np.einsum("jk,j,k->", face, L[others[0]], L[others[1]])
    return np.einsum("ijkm,ijk->m", per_voxel, values), facets, per_voxel
