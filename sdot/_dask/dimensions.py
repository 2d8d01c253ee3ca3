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

#: The first halo width of each dimension, in mean spacings. In 3D a halo adds more Diracs to a
#: tile (its surface is larger for its volume; counted on the bench's uniform Diracs, 4 tiles:
#: at 1e5 in the unit cube, halos of 8 spacings hold 0.78 times the owned Diracs, of 4 spacings
#: 0.37 times; in the unit square at 2e5, 8 spacings 0.07 times).
HALO = {2: 8.0, 3: 4.0}

#: The side of the groups of Diracs just beyond a halo (:meth:`.tile.Tile.weights_beyond_halos`),
#: in halo widths. The weights vary by about one squared spacing per spacing in the first Newton
#: steps; a group's largest weight exceeds those of its Diracs near a cell by its side times
#: that. In 3D, with halos of 4 spacings, groups of a whole halo width failed the certificate of
#: a few cells per tile at the second Newton step (2e4 uniform Diracs, 4 tiles: every tile's halo
#: doubled), a quarter of it none.
BOX_SIDE = {2: 1.0, 3: 0.25}


def checked(dim):
    """``dim`` if the distributed solve runs in it, else a ``NotImplementedError``."""
    if dim not in SUPPORTED:
        raise NotImplementedError(f"the dask solve runs in 2D and 3D, got positions of dimension {dim}")
    return dim


def first_halo(dim, halo=None):
    """``halo``, or the first halo width of dimension ``dim`` (:data:`HALO`), in mean spacings."""
    return HALO[dim] if halo is None else float(halo)


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
