"""What the distributed solve reads differently in 2D and 3D: the supported dimensions, the
mean spacing of the Diracs (the unit of the halo widths) and the vertices of a cell.

The rest of :mod:`sdot._dask` is written for any dimension ``d`` (boxes ``lo``, ``hi`` of
length ``d``); the cells come from the geometry of the dimension (:mod:`sdot._core.geometry`:
polygons in 2D, polyhedra in 3D).
"""
from __future__ import annotations

import numpy as np

#: The dimensions of the distributed solve (1D has the single process's closed form).
SUPPORTED = (2, 3)


def checked(dim):
    """``dim`` if the distributed solve runs in it, else a ``NotImplementedError``."""
    if dim not in SUPPORTED:
        raise NotImplementedError(f"the dask solve runs in 2D and 3D, got positions of dimension {dim}")
    return dim


def mean_spacing(lo, hi, n):
    """``(volume of the box [lo, hi] / n)^(1/d)``: the mean spacing of ``n`` Diracs in it."""
    return float(np.prod(hi - lo) / n) ** (1.0 / lo.shape[0])


def vertices_in_use(cells, n):
    """``(vertices, used)`` of the first ``n`` cells: their vertices ``(n, V, d)`` relative to
    the seeds and which slots hold one, as :func:`.tiling.halo_certified` takes them: in 2D the
    count ``(n,)`` of the first slots (a polygon's vertices), in 3D a mask ``(n, V)`` (a
    polyhedron's live vertex slots, :func:`sdot._core.spatial.polyhedra.live_vertices`)."""
    if cells.vertices.shape[2] == 3:
        from .._core.spatial.polyhedra import live_vertices

        return cells.vertices[:n], live_vertices(np, cells)[:n]
    return cells.vertices[:n], cells.count[:n]
