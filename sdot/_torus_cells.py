"""The cells of a diagram on a periodic domain as :class:`._diagram.Cell` objects.

On the torus the cell of Dirac ``i`` is the union of the pieces of its sites (the Dirac and its
images ``y_i + k L`` near the domain, :mod:`._core.periodic`), each piece the cell of its site in
the domain. Moved back by its site's whole periods, every piece lies next to the Dirac, and
together they make the Laguerre cell of ``y_i`` among all the images of the others: convex,
about the Dirac (as :attr:`sdot.OtPlan.barycenters` are). Its facets are the pieces' facets
grouped by the image across them (Dirac ``j`` moved by ``k - k_i`` periods), merged (in 2D the
collinear segments, in 3D the coplanar polygons); the pieces' edges along the domain's sides of
a periodic axis are cuts inside the cell, not facets (the sides of a non-periodic axis, on a
cylinder, are).
"""
from __future__ import annotations

import numpy as np

from ._diagram3d import Facet, polyhedron


def torus_cells(cell_type, positions, sites, owner, cells, moments, period):
    """The list of ``cell_type`` (:class:`._diagram.Cell`) of the Diracs at ``positions`` (n, d),
    given the ``cells`` of the ``sites`` (m, d) and the Dirac ``owner`` of each (host arrays),
    the cell ``moments`` (n, d + 2) folded onto the Diracs and the ``period`` (d,) (0 on an axis
    that is not periodic)."""
    n, d = positions.shape
    periodic = period > 0
    safe = np.where(periodic, period, 1.0)
    shifts = np.where(periodic, np.rint((sites - positions[owner]) / safe), 0.0).astype(np.int64)
    count = np.asarray(cells.size if d == 3 else cells.count)
    by_dirac = [[] for _ in range(n)]
    for s in np.flatnonzero(count > 0):
        by_dirac[owner[s]].append(s)

    def key(s, label):
        """The facet's key: ``(Dirac, offset in periods)`` across it, ``(side label, None)`` for a
        side of a non-periodic axis, None for a cut along a periodic side."""
        if label >= 0:
            return int(owner[label]), tuple(shifts[label] - shifts[s])
        side = -1 - int(label)
        axis = (1, 0, 1, 0)[side] if d == 2 else side // 2
        return None if periodic[axis] else (int(label), None)

    out = []
    for i in range(n):
        m = moments[i, 0]
        bary = positions[i] + (moments[i, 1:-1] / m if m > 0 else 0.0)
        pieces = by_dirac[i]
        if d == 1:
            out.append(_interval(cell_type, i, m, bary, positions[i], pieces, cells, key))
        elif d == 2:
            out.append(_polygon(cell_type, i, m, bary, positions[i], pieces, cells, key))
        else:
            out.append(_polyhedron(cell_type, i, m, bary, positions[i], pieces, cells, key))
    return out


def _interval(cell_type, i, m, bary, y, pieces, cells, key):
    ends = [(y + cells.vertices[s, e, 0], key(s, cells.labels[s, e])) for s in pieces for e in (0, 1)]
    if not ends:
        return cell_type(i, m, bary, np.zeros((0, 1)), np.zeros(0, np.int64))
    left, right = min(ends, key=lambda e: e[0][0]), max(ends, key=lambda e: e[0][0])
    labels = np.array([_neighbour(left[1]), _neighbour(right[1])])
    return cell_type(i, m, bary, np.stack([left[0], right[0]]), labels)


def _neighbour(k):
    """The ``neighbour`` of :class:`._diagram.Cell` for a facet key (a Dirac, or ``-1 - side``)."""
    return -1 if k is None else k[0]


def _polygon(cell_type, i, m, bary, y, pieces, cells, key):
    """The union of the pieces: per facet key its collinear segments merged, the edges in the
    order of their outward normals (counter-clockwise)."""
    segments = {}
    for s in pieces:
        k = int(cells.count[s])
        v = y + cells.vertices[s, :k]
        for a in range(k):
            f = key(s, cells.labels[s, a])
            if f is not None:
                segments.setdefault(f, []).append((v[a], v[(a + 1) % k]))
    if not segments:
        return cell_type(i, m, bary, np.zeros((0, 2)), np.zeros(0, np.int64))
    edges = []
    scale = max(float(np.abs(cells.vertices[pieces]).max()), 1e-300)
    for f, parts in segments.items():
        direction = max((seg[1] - seg[0] for seg in parts), key=lambda e: float(e @ e))
        points = np.array([p for seg in parts for p in seg])
        along = points @ direction
        start, end = points[np.argmin(along)], points[np.argmax(along)]
        if np.abs(end - start).max() > 1e-12 * scale:      # (not a corner where 4 cells meet)
            edges.append((np.arctan2(-direction[0], direction[1]), start, _neighbour(f)))
    edges.sort(key=lambda e: e[0])
    return cell_type(i, m, bary, np.array([e[1] for e in edges]), np.array([e[2] for e in edges]))


def _polyhedron(cell_type, i, m, bary, y, pieces, cells, key):
    """The union of the pieces: per facet key its coplanar polygons merged (their convex hull in
    the plane, counter-clockwise seen from outside), the vertices those of the facets."""
    live = (np.arange(cells.vertices.shape[1])[None, :] < np.asarray(cells.size)[:, None]) & (cells.corners[..., 0] >= 0)
    groups = {}
    for s in pieces:
        _, facets = polyhedron(y + cells.vertices[s], cells.corners[s], cells.adjacent[s], live[s], cells.labels[s])
        for facet in facets:
            f = key(s, facet.neighbour)
            if f is not None:
                groups.setdefault(f, []).append(facet)
    if not groups:
        return cell_type(i, m, bary, np.zeros((0, 3)), None, [])
    facets = []
    for f, parts in groups.items():
        normal = sum(np.cross(p.vertices[1] - p.vertices[0], p.vertices[2] - p.vertices[0]) for p in parts)
        facets.append(Facet(_neighbour(f), _planar_hull(np.concatenate([p.vertices for p in parts]), normal),
                            float(sum(p.area for p in parts))))
    vertices = np.unique(np.concatenate([f.vertices for f in facets]).round(12), axis=0)
    return cell_type(i, m, bary, vertices, None, facets)


def _planar_hull(points, normal):
    """The convex hull of coplanar ``points`` (k, 3), counter-clockwise about ``normal``, without
    collinear points (Andrew's monotone chain in the plane)."""
    normal = normal / np.linalg.norm(normal)
    e1 = points[np.argmax(np.linalg.norm(points - points[0], axis=1))] - points[0]
    e1 = e1 / np.linalg.norm(e1)
    e2 = np.cross(normal, e1)
    uv = np.stack([(points - points[0]) @ e1, (points - points[0]) @ e2], axis=1)
    order = np.lexsort((uv[:, 1], uv[:, 0]))
    tol = 1e-12 * max(float(np.abs(uv).max()), 1e-300) ** 2

    def half(idx):
        chain = []
        for p in idx:
            while len(chain) >= 2:
                a, b = uv[chain[-2]], uv[chain[-1]]
                if (b[0] - a[0]) * (uv[p, 1] - a[1]) - (b[1] - a[1]) * (uv[p, 0] - a[0]) > tol:
                    break
                chain.pop()
            chain.append(p)
        return chain[:-1]
    ring = half(order) + half(order[::-1])
    return points[ring]
