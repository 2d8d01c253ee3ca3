"""Power cells read off the regular triangulation instead of clipped (eagerly, on a host).

The combinatorics come from Qhull (:func:`sdot._host.cells_3d.cell_combinatorics`):
each tetrahedron is a vertex of the cells of its four corners, with its three facets and
edges. The vertices are then the meeting points of their three facets' planes (Cramer's
rule) of each tetrahedron, seen from each of its corners, in the caller's arrays. What is left to clip:

- cells that reach beyond the box: clipped by its six sides (:func:`.polyhedra.clip`);
- cells the triangulation leaves open (seeds on its hull: unbounded cells), cells with
  more neighbours or vertices than the slots, and cells with an ill-defined vertex (a flat
  tetrahedron): clipped from the box by their neighbours in the triangulation, as
  :func:`.diagram.regular_cells` did for every cell.

The result is exact like theirs: each cell is the box cut by the half-spaces of all its
neighbours in the regular triangulation (the seeds that can cut it).
"""
from __future__ import annotations

import array_api_compat as aac

from .. import _compat, seed_neighbours
from ..options import DIAGRAM
from .kinetic import cramer
from .polyhedra import Cells, clip, live_vertices, vertex_slots


def triangulated_cells(xp, seeds, psi, active, lo, hi, capacity: int, clipped_rows, equal: bool = False,
                       slabs: int | None = None, options=DIAGRAM):
    """Every cell from the regular triangulation (see the module docstring), or None if
    there is no host or Qhull fails. ``equal``: the active weights are equal (Delaunay).
    ``clipped_rows(rows, table_rows)``: the cells of the seeds ``rows`` clipped from the box
    by ``table_rows``, for the cells that cannot be read off. ``slabs``: the triangulation is
    read in that many slabs (default: one per thread from ``options.slabs_from_3d`` seeds, each
    ``options.slab_overlap`` mean spacings deep beyond its sides; 1: at once). Returns ``(cells,
    table, slabbed)``, ``table`` (n, W) the neighbours of every seed (-1 padding),
    uncertified cells, ``slabbed`` whether they were read in slabs (then supersets of the
    true cells, certified by the volume sum)."""
    part = seed_neighbours.regular_cell_combinatorics(xp, seeds, None if equal else psi, active, capacity,
                                                      vertex_slots(capacity), slabs, slabs_from=options.slabs_from_3d,
                                                      overlap=options.slab_overlap)
    if part is None:
        return None
    dev = aac.device(seeds)
    n, v_cap = seeds.shape[0], vertex_slots(capacity)
    centre, ok = power_centres(xp, seeds, psi, part["tetrahedra"])
    tets, where = part["tetrahedra"], part["vertex"]
    corner0 = xp.take(seeds, tets[:, 0], axis=0)
    rel = centre[:, None, :] + corner0[:, None, :] - _compat.flat_take(seeds, tets)     # (m, 4, 3): from each corner
    put = xp.nonzero(xp.reshape(where >= 0, (-1,)))[0]
    flat = xp.zeros((n * v_cap, 3), dtype=seeds.dtype, device=dev)
    flat = _compat.put_rows(xp, flat, xp.take(xp.reshape(where, (-1,)), put), xp.take(xp.reshape(rel, (-1, 3)), put, axis=0))
    bad = _compat.segment_sum(xp, xp.astype(xp.reshape(xp.broadcast_to(~ok[:, None], tets.shape), (-1,)), xp.int64),
                              xp.reshape(tets, (-1,)), n) > 0
    cells = Cells(xp.reshape(flat, (n, v_cap, 3)), part["corners"], part["adjacent"], part["size"], part["labels"],
                  part["count"], xp.zeros((n,), dtype=xp.bool, device=dev), xp.asarray(False, device=dev))
    cells = _inside_the_box(xp, seeds, lo, hi, cells)
    redo = xp.nonzero(part["open"] | bad)[0]
    if redo.shape[0]:
        fixed = clipped_rows(redo, xp.take(part["table"], redo, axis=0))
        cells = cells._replace(**{f: _compat.put_rows(xp, getattr(cells, f), redo, getattr(fixed, f))
                                  for f in cells._fields if f != "certified"})    # arrays made here: in place
    return cells, part["table"], bool(part["slabs"])


def _inside_the_box(xp, seeds, lo, hi, cells):
    """``cells`` clipped by the sides of the box ``[lo, hi]`` (only the cells with a vertex
    beyond a side). Which cells reach beyond each side is read once: a clip only removes
    volume, and one by a plane a cell does not cross leaves it as it was."""
    dev = aac.device(seeds)
    n = seeds.shape[0]
    live = live_vertices(xp, cells)
    beyond = []
    for axis in range(3):
        x = cells.vertices[..., axis]
        beyond += [xp.any(live & (x < (lo[axis] - seeds[:, axis])[:, None]), axis=1),
                   xp.any(live & (x > (hi[axis] - seeds[:, axis])[:, None]), axis=1)]
    for side in range(6):
        axis, upper = side // 2, side % 2 == 1
        if not _compat.host_any(xp, beyond[side]):
            continue
        bound = (hi if upper else lo)[axis] - seeds[:, axis]
        sign = 1.0 if upper else -1.0
        normal = xp.zeros((n, 3), dtype=seeds.dtype, device=dev)
        normal = normal + xp.astype(xp.arange(3, device=dev) == axis, seeds.dtype)[None, :] * sign
        label = xp.full((n,), -1 - side, dtype=xp.int64, device=dev)
        cells = clip(xp, cells, normal, sign * bound, label, beyond[side])
    return cells


def power_centres(xp, seeds, psi, tets):
    """The power centre of each tetrahedron ``tets`` (m, 4) relative to its corner 0, (m, 3):
    the point of equal power ``|x - y_k|^2 - psi_k`` from its four corners (Cramer's rule, see
    :func:`.kinetic.cramer`), and whether it is well defined (the tetrahedron is not flat)."""
    y = _compat.flat_take(seeds, tets)                                      # (m, 4, 3)
    w = _compat.flat_take(psi, tets)                                        # (m, 4)
    d = y[:, 1:, :] - y[:, :1, :]
    b = 0.5 * (_compat.dot(d, d) + w[:, :1] - w[:, 1:])
    return cramer(xp, d, b)
