"""The 3D side of :class:`sdot.PowerDiagram`: cells as polyhedra for inspection, and plots
(the cells' edges in a 3D axes, or the section of the diagram by a plane)."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Facet(NamedTuple):
    """A facet of a 3D cell: the ``neighbour`` across it (``-1 - side`` for a side of the
    box: 0: x = lo, 1: x = hi, 2: y = lo, 3: y = hi, 4: z = lo, 5: z = hi), its polygon
    ``vertices`` ``(k, 3)`` (counter-clockwise seen from outside the cell) and its ``area``."""

    neighbour: int
    vertices: np.ndarray
    area: float


def polyhedron(vertices, corners, adjacent, live, labels):
    """``(vertices (k, 3), facets)`` of one cell of :mod:`sdot._core.spatial.polyhedra`, in
    the cell's own coordinates (NumPy arrays of that cell: ``vertices``, ``corners``,
    ``adjacent`` (V, 3), ``live`` (V,), ``labels`` (F,)). Each facet is walked from a vertex
    on it along the edge that leaves it counter-clockwise (edge ``a + 1`` on facet ``p_a``)."""
    slots = np.flatnonzero(live)
    new_index = -np.ones(len(live), dtype=np.int64)
    new_index[slots] = np.arange(len(slots))
    facets = []
    for face in np.unique(corners[slots]):
        on = [(v, int(np.flatnonzero(corners[v] == face)[0])) for v in slots if face in corners[v]]
        start = on[0][0]
        ring, v = [], start
        for _ in range(len(on) + 1):
            ring.append(v)
            a = int(np.flatnonzero(corners[v] == face)[0])
            v = int(adjacent[v, (a + 1) % 3])
            if v == start:
                break
        poly = vertices[ring]
        # drop repeated points (a vertex where more than three facets meet)
        keep = np.r_[True, np.any(np.abs(np.diff(poly, axis=0)) > 0, axis=1)]
        poly = poly[keep]
        normal = np.cross(poly - poly[0], np.roll(poly, -1, axis=0) - poly[0]).sum(axis=0)
        area = 0.5 * float(np.linalg.norm(normal))
        if area > 0:
            facets.append(Facet(int(labels[face]), poly, area))
    return vertices[slots], facets


def plot_edges(ax, seeds, polys, points, style):
    """The edges of every cell (``polys``: per cell its facets) in a 3D axes."""
    from mpl_toolkits.mplot3d.art3d import Line3DCollection

    segments = [np.stack([f.vertices, np.roll(f.vertices, -1, axis=0)], axis=1) for facets in polys for f in facets]
    if segments:
        ax.add_collection3d(Line3DCollection(np.concatenate(segments), **({"colors": "k", "linewidths": 0.3} | style)))
    if points:
        ax.scatter(seeds[:, 0], seeds[:, 1], seeds[:, 2], s=2, color="C3")
    lo, hi = seeds.min(axis=0), seeds.max(axis=0)
    for f in [f for facets in polys for f in facets]:
        lo, hi = np.minimum(lo, f.vertices.min(axis=0)), np.maximum(hi, f.vertices.max(axis=0))
    ax.set_xlim(lo[0], hi[0])
    ax.set_ylim(lo[1], hi[1])
    ax.set_zlim(lo[2], hi[2])
    return ax


def section(facets, axis: int, at: float):
    """The polygon ``(k, 2)`` where the plane ``x_axis = at`` cuts a cell (given by its
    ``facets``), in the other two coordinates, ordered around its centre (empty if none)."""
    others = [a for a in range(3) if a != axis]
    points = []
    for f in facets:
        p, q = f.vertices, np.roll(f.vertices, -1, axis=0)
        sp, sq = p[:, axis] - at, q[:, axis] - at
        cut = (sp < 0) != (sq < 0)
        t = sp[cut] / (sp[cut] - sq[cut])
        points.append(p[cut] + t[:, None] * (q[cut] - p[cut]))
    points = np.concatenate(points)[:, others] if points else np.zeros((0, 2))
    if len(points) < 3:
        return np.zeros((0, 2))
    centre = points.mean(axis=0)
    order = np.argsort(np.arctan2(points[:, 1] - centre[1], points[:, 0] - centre[0]))
    return points[order]


def plot_section(ax, seeds, polys, axis: int, at: float, points, style):
    """The section of the diagram by the plane ``x_axis = at`` in a 2D axes."""
    from matplotlib.collections import PolyCollection

    rings = [r for r in (section(facets, axis, at) for facets in polys) if len(r)]
    ax.add_collection(PolyCollection(rings, **({"facecolors": "none", "edgecolors": "k", "linewidths": 0.5} | style)))
    if points:
        others = [a for a in range(3) if a != axis]
        near = np.abs(seeds[:, axis] - at) <= np.ptp(seeds[:, axis]) / max(len(seeds) ** (1 / 3), 1.0)
        ax.plot(seeds[near, others[0]], seeds[near, others[1]], ".", ms=2, color="C3")
    ax.set_aspect("equal")
    ax.autoscale_view()
    return ax
