"""Convex polyhedra of fixed capacity, one per seed, and the kernel that clips them.

A cell is stored by its vertices, each the meeting point of three facets (a simple
polyhedron: a vertex where more facets meet is several vertices at one point). Per cell:

- ``labels`` (n, F): the neighbour across each facet slot, ``j >= 0``, or ``-1 - side`` for
  a side of the box (0: x = lo, 1: x = hi, 2: y = lo, 3: y = hi, 4: z = lo, 5: z = hi);
  slots ``count`` and beyond are unused; a slot whose facet was later clipped away stays,
  with no vertex on it;
- ``vertices`` (n, V, 3), relative to the seed, slots ``0 .. size - 1`` in use;
- ``corners`` (n, V, 3): the facet slots ``(p0, p1, p2)`` of the three facets at each
  vertex, counter-clockwise seen from outside the cell (``det(n_p0, n_p1, n_p2) > 0`` for
  the outward normals);
- ``adjacent`` (n, V, 3): the vertex at the other end of edge ``k``, the edge opposite
  ``p_k`` (on the facets ``p_{k+1}`` and ``p_{k+2}``).

On facet ``p_a`` the boundary leaves the vertex (counter-clockwise seen from outside)
along edge ``a + 1``: :func:`facet_triangles` fans every facet from a vertex of it.

The capacity is the number of facet slots ``F``; the vertex slots are ``3 F / 2`` (Euler's
relation for a simple polyhedron, ``V = 2 F - 4``, bounds them by twice the facets present,
but most slots of ``F`` are spare, and the box's sides unused inside: at 1e4 uniform seeds
and ``F = 48``, at most 62 vertex slots were in use). A cell that runs out of either overflows.

In seed-relative coordinates ``u = x - y_i`` the constraint of seed j on cell i is the
half-space ``u . d <= (|d|^2 + psi_i - psi_j) / 2`` with ``d = y_j - y_i``.
"""
from __future__ import annotations

from typing import NamedTuple

import array_api_compat as aac

from .. import _compat, cube

#: Facet slots per cell (grown eagerly on overflow): the 6 sides of the box and the
#: neighbours (15 on average for uniform points, up to about 50).
CAPACITY = 48

#: Cells per chunk of the eager passes over cells (the integrals of uniform densities, about
#: 80 triangles a cell; the kinetic update): the chunk's temporaries stay in the CPU caches
#: (whole arrays of 1e5 cells took 3 times as long).
CELL_CHUNK = 1024


def vertex_slots(capacity: int) -> int:
    """Vertex slots of cells of ``capacity`` facet slots (see the module docstring)."""
    return 3 * capacity // 2


class Cells(NamedTuple):
    """Clipped polyhedra (see the module docstring): ``vertices``, ``corners``, ``adjacent``
    (n, V, 3), ``size`` (n,) vertex slots in use, ``labels`` (n, F), ``count`` (n,) facet slots
    in use (0: an empty cell), ``overflow`` (n,) and ``certified`` () flags."""

    vertices: object
    corners: object
    adjacent: object
    size: object
    labels: object
    count: object
    overflow: object
    certified: object


_CUBE = cube.corners_planes_adjacent()


def box_cells(xp, seeds, lo, hi, active, capacity: int):
    """Every active cell starts as the box ``[lo, hi]``, inactive cells empty."""
    n = seeds.shape[0]
    dev = aac.device(seeds)
    v_cap = vertex_slots(capacity)
    unit, planes, adjacent = _CUBE
    t = xp.asarray(unit, dtype=seeds.dtype, device=dev)
    corners = lo[None, :] + t * (hi - lo)[None, :]                            # (8, 3)
    pad = xp.zeros((v_cap - 8, 3), dtype=seeds.dtype, device=dev)
    verts = xp.concat([corners, pad], axis=0)[None, :, :] - seeds[:, None, :]
    ipad = xp.zeros((v_cap - 8, 3), dtype=xp.int64, device=dev)
    c = xp.concat([xp.asarray(planes, dtype=xp.int64, device=dev), ipad], axis=0)
    a = xp.concat([xp.asarray(adjacent, dtype=xp.int64, device=dev), ipad], axis=0)
    side = xp.asarray([-1, -2, -3, -4, -5, -6] + [-7] * (capacity - 6), dtype=xp.int64, device=dev)
    size = 8 * xp.astype(active, xp.int64)
    zero = xp.zeros((n, 1, 1), dtype=xp.int64, device=dev)           # (n, ...) arrays of their own
    return Cells(verts, c[None, ...] + zero, a[None, ...] + zero, size, side[None, :] + zero[:, :, 0],
                 6 * xp.astype(active, xp.int64),
                 xp.zeros((n,), dtype=xp.bool, device=dev), xp.asarray(False, device=dev))


def live_vertices(xp, cells):
    """``(n, V)``: the vertex slots in use (below ``size``, not cleared by a clip)."""
    k = xp.arange(cells.vertices.shape[1], dtype=xp.int64, device=aac.device(cells.size))[None, :]
    return (k < cells.size[:, None]) & (cells.corners[..., 0] >= 0)


def _rolled(xp, x, shift: int):
    """``x[..., (k + shift) % 3]`` along a last axis of 3."""
    return xp.stack([x[..., (k + shift) % 3] for k in range(3)], axis=-1)


def clip(xp, cells, normal, offset, label, apply):
    """``cells`` clipped by the half-spaces ``u . normal <= offset`` where ``apply``: see
    :func:`_clip_all` (static shapes; JAX, where it is compiled once; torch off the host, a
    GPU's, where the listing's reads of sizes would make the device wait at every clip) and
    :func:`_clip_listed` (eagerly on the host, in place)."""
    if (_compat.static_shapes(cells.vertices, normal) or aac.is_jax_array(cells.vertices)
            or (aac.is_torch_array(cells.vertices) and _compat.host_view(cells.vertices) is None)):
        return _clip_all(xp, cells, normal, offset, label, apply)
    return _clip_listed(xp, cells, normal, offset, label, apply)


@_compat.jit_on_jax()
def _clip_all(xp, cells, normal, offset, label, apply):
    """``cells`` clipped by the half-spaces ``u . normal <= offset`` (``normal`` (n, 3),
    ``offset`` (n,)) where ``apply`` (n,); the new facet takes slot ``count`` with ``label``.

    The vertices beyond the plane go; each edge from a kept vertex ``v`` to a removed one
    ``w`` gives a new vertex, between them, on the facets of that edge and the new one.
    A new vertex made on edge ``k`` of ``v`` (facets ``A = p_{k+1}``, ``B = p_{k+2}``) has the
    facets ``(P, B, A)``: its edge 0 goes back to ``v``, its edges 1 and 2 run along the new
    facet to the new vertices with ``A`` in second place and with ``B`` in third place (a
    facet the plane crosses holds two new vertices, one of each). A cell whose vertices all
    go is empty; a cell without room for the new vertices or facet is left as it was and
    flagged ``overflow``.
    """
    n, v_cap, _ = cells.vertices.shape
    f_cap = cells.labels.shape[1]
    dev = aac.device(cells.size)
    k = xp.arange(v_cap, dtype=xp.int64, device=dev)[None, :]
    live = live_vertices(xp, cells)
    s = _compat.dot(cells.vertices, normal[:, None, :]) - offset[:, None]
    out = live & (s > 0) & apply[:, None]
    keep = live & ~out
    far = cells.adjacent                                        # (n, V, 3)
    out_far = _compat.row_gather(out, far)
    cross = keep[:, :, None] & out_far                          # edge k of v leaves the half-space
    n_keep = xp.sum(xp.astype(keep, xp.int64), axis=1)
    n_cross = xp.sum(xp.astype(xp.reshape(cross, (n, 3 * v_cap)), xp.int64), axis=1)
    fits = (n_keep + n_cross <= v_cap) & (cells.count < f_cap)
    emptied = apply & (n_keep == 0) & (cells.size > 0)
    changed = (n_cross > 0) & fits
    # new vertices on the crossing edges
    s_far = _compat.row_gather(s, far)
    t = s[:, :, None] / xp.where(cross, s[:, :, None] - s_far, 1.0)
    v = cells.vertices[:, :, None, :]
    new_pos = v + t[..., None] * (_compat.row_gather(cells.vertices, far) - v)        # (n, V, 3, 3)
    a_face = _rolled(xp, cells.corners, 1)
    b_face = _rolled(xp, cells.corners, 2)
    p_face = xp.broadcast_to(cells.count[:, None, None], a_face.shape)
    new_corners = xp.stack([p_face, b_face, a_face], axis=-1)                        # (n, V, 3, 3)
    # destinations: the kept vertices first, in order, then the new ones
    rank_keep = xp.cumulative_sum(xp.astype(keep, xp.int64), axis=1) - 1
    flat_cross = xp.reshape(cross, (n, 3 * v_cap))
    rank_new = xp.reshape(n_keep[:, None] + xp.cumulative_sum(xp.astype(flat_cross, xp.int64), axis=1) - 1,
                          (n, v_cap, 3))
    kept_adjacent = xp.where(out_far, rank_new, _compat.row_gather(rank_keep, far))
    # along the new facet: tables of the new vertex with each facet in second and third place
    base = xp.arange(n, dtype=xp.int64, device=dev)[:, None, None] * f_cap
    nowhere = n * f_cap
    second = _table(xp, xp.where(cross, base + b_face, nowhere), rank_new, nowhere)
    third = _table(xp, xp.where(cross, base + a_face, nowhere), rank_new, nowhere)
    edge1 = xp.take(second, xp.reshape(xp.where(cross, base + a_face, nowhere), (-1,)))
    edge2 = xp.take(third, xp.reshape(xp.where(cross, base + b_face, nowhere), (-1,)))
    back = xp.broadcast_to(rank_keep[:, :, None], cross.shape)
    new_adjacent = xp.stack([back, xp.reshape(edge1, cross.shape), xp.reshape(edge2, cross.shape)], axis=-1)
    # compact: every row's kept and new vertices, in order
    fresh = xp.concat([keep, flat_cross], axis=1)
    slots = xp.broadcast_to(xp.arange(4 * v_cap, dtype=xp.int64, device=dev)[None, :], fresh.shape)
    src = _compat.first_columns(xp, fresh, slots, v_cap, 0)
    pick = lambda old, new: _compat.row_gather(xp.concat([old, xp.reshape(new, (n, 3 * v_cap, 3))], axis=1), src)
    vertices = pick(cells.vertices, new_pos)
    corners = pick(cells.corners, new_corners)
    adjacent = pick(kept_adjacent, new_adjacent)
    rows = changed[:, None, None]
    labels = _set_label(xp, cells.labels, cells.count, label, changed)
    size = xp.where(emptied, 0, xp.where(changed, n_keep + n_cross, cells.size))
    count = xp.where(emptied, 0, xp.where(changed, cells.count + 1, cells.count))
    return cells._replace(vertices=xp.where(rows, vertices, cells.vertices),
                          corners=xp.where(rows, corners, cells.corners),
                          adjacent=xp.where(rows, adjacent, cells.adjacent), size=size, labels=labels, count=count,
                          overflow=cells.overflow | ((n_cross > 0) & ~fits))


def _clip_listed(xp, cells, normal, offset, label, apply):
    """:func:`_clip_all` on the lists of the cells to clip, of the vertices that go and of
    the edges that cross the plane (eagerly: a few per cell, against the ``3 V`` edge slots
    of every cell).

    ``cells`` (their own arrays, written in place on NumPy and torch) keep their kept
    vertices where they are; the new ones take the slots of the removed ones, then slots
    from ``size`` on; removed slots left over are cleared (``corners = -1``). A cell whose
    new vertices would pass the capacity is left as it was and flagged ``overflow``.
    """
    n, v_cap, _ = cells.vertices.shape
    f_cap = cells.labels.shape[1]
    dev = aac.device(cells.size)
    rows = xp.nonzero(apply & (cells.size > 0))[0]
    if rows.shape[0] == 0:
        return cells
    part = lambda a: xp.take(a, rows, axis=0)
    live = live_vertices(xp, cells._replace(size=part(cells.size), corners=part(cells.corners),
                                            vertices=part(cells.vertices)))
    s = _compat.dot(part(cells.vertices), part(normal)[:, None, :]) - part(offset)[:, None]     # (m, V)
    out = xp.reshape(live & (s > 0), (-1,))
    gone = xp.nonzero(out)[0]                                   # i V + w over the rows, by row
    if gone.shape[0] == 0:
        return cells
    m = rows.shape[0]
    flat = lambda a: xp.reshape(a, (n * v_cap,) + tuple(a.shape[2:]))
    global_of = lambda local: xp.take(rows, local // v_cap) * v_cap + local % v_cap
    row_of_gone = gone // v_cap
    ends = row_of_gone[:, None] * v_cap + xp.take(flat(cells.adjacent), global_of(gone), axis=0)   # (g, 3), local
    crossing = xp.reshape(~xp.take(out, xp.reshape(ends, (-1,))), (-1,))
    edge = xp.nonzero(crossing)[0]
    w = xp.take(gone, edge // 3)                                # removed end, local flat
    v = xp.take(xp.reshape(ends, (-1,)), edge)                  # kept end, local flat
    row = w // v_cap                                            # local row
    # counts per row: removed, new; overflow
    ones = lambda idx: _compat.segment_sum(xp, xp.ones(idx.shape, dtype=xp.int64, device=dev), idx, m)
    n_gone, n_new = ones(row_of_gone), ones(row)
    size, count = part(cells.size), part(cells.count)
    emptied = n_gone == xp.sum(xp.astype(live, xp.int64), axis=1)
    fits = (size + xp.maximum(n_new - n_gone, 0) <= v_cap) & (count < f_cap)
    changed = (n_new > 0) & fits & ~emptied
    # the new vertices
    s_flat = xp.reshape(s, (-1,))
    sv, sw = xp.take(s_flat, v), xp.take(s_flat, w)
    gv, gw = global_of(v), global_of(w)
    pv, pw = xp.take(flat(cells.vertices), gv, axis=0), xp.take(flat(cells.vertices), gw, axis=0)
    position = pv + (sv / (sv - sw))[:, None] * (pw - pv)
    adjacent_v = xp.take(flat(cells.adjacent), gv, axis=0)
    k = xp.argmax(xp.astype(adjacent_v == (w % v_cap)[:, None], xp.int8), axis=1)      # edge k of v leads to w
    corners_v = xp.take(flat(cells.corners), gv, axis=0)
    pick = lambda shift: xp.take_along_axis(corners_v, ((k + shift) % 3)[:, None], axis=1)[:, 0]
    a_face, b_face = pick(1), pick(2)
    p_face = xp.take(count, row)
    # slots: the removed ones of the row first, then from size on
    start_new = xp.cumulative_sum(n_new) - n_new
    start_gone = xp.cumulative_sum(n_gone) - n_gone
    rank = xp.arange(row.shape[0], dtype=xp.int64, device=dev) - xp.take(start_new, row)
    reuse = rank < xp.take(n_gone, row)
    from_gone = xp.take(gone, xp.minimum(xp.take(start_gone, row) + rank, gone.shape[0] - 1)) % v_cap
    slot = xp.where(reuse, from_gone, xp.take(size, row) + rank - xp.take(n_gone, row))
    # along the new facet: the new vertex with each facet in second and in third place
    nowhere = m * f_cap
    second = _table(xp, row * f_cap + b_face, slot, nowhere)
    third = _table(xp, row * f_cap + a_face, slot, nowhere)
    edge1 = xp.take(second, row * f_cap + a_face)
    edge2 = xp.take(third, row * f_cap + b_face)
    # write the rows that change
    keep_edges = xp.nonzero(xp.take(changed, row))[0]
    at = lambda x: xp.take(x, keep_edges, axis=0)
    target = at(xp.take(rows, row) * v_cap + slot)
    vertices, corners, adjacent = flat(cells.vertices), flat(cells.corners), flat(cells.adjacent)
    cleared = xp.nonzero(xp.take(changed, row_of_gone))[0]
    corners = _compat.put_rows(xp, corners, global_of(xp.take(gone, cleared)),
                               -xp.ones((cleared.shape[0], 3), dtype=xp.int64, device=dev))
    vertices = _compat.put_rows(xp, vertices, target, at(position))
    corners = _compat.put_rows(xp, corners, target, at(xp.stack([p_face, b_face, a_face], axis=1)))
    adjacent = _compat.put_rows(xp, adjacent, target, at(xp.stack([v % v_cap, edge1, edge2], axis=1)))
    adjacent = _compat.put_rows(xp, xp.reshape(adjacent, (n * v_cap * 3,)), at(gv * 3 + k), at(slot))
    new_size = xp.where(emptied, 0, xp.where(changed, size + xp.maximum(n_new - n_gone, 0), size))
    new_count = xp.where(emptied, 0, xp.where(changed, count + 1, count))
    labels = _set_label(xp, part(cells.labels), count, part(label), changed)
    return cells._replace(vertices=xp.reshape(vertices, cells.vertices.shape),
                          corners=xp.reshape(corners, cells.corners.shape),
                          adjacent=xp.reshape(adjacent, cells.adjacent.shape),
                          size=_compat.put_rows(xp, cells.size, rows, new_size),
                          count=_compat.put_rows(xp, cells.count, rows, new_count),
                          labels=_compat.put_rows(xp, cells.labels, rows, labels),
                          overflow=_compat.put_rows(xp, cells.overflow, rows,
                                                    part(cells.overflow) | ((n_new > 0) & ~fits)))


def _set_label(xp, labels, count, label, changed):
    f = xp.arange(labels.shape[1], dtype=xp.int64, device=aac.device(labels))[None, :]
    return xp.where(changed[:, None] & (f == count[:, None]), label[:, None], labels)


def _table(xp, where, values, nowhere: int):
    """A flat table of ``nowhere + 1`` entries with ``values`` at ``where`` (entries at
    ``nowhere`` dropped)."""
    out = xp.zeros((nowhere + 1,), dtype=values.dtype, device=aac.device(values))
    return _compat.put_rows(xp, out, xp.reshape(where, (-1,)), xp.reshape(values, (-1,)))


def clip_by(xp, seeds, psi, active, cells, rows, candidates):
    """``cells`` (of the seeds ``rows``) clipped by the seeds ``candidates`` (m, K), nearest
    first (-1: none); inactive candidates and the seed itself are skipped.

    Nearest first, each cell is small early and its later clips touch few vertices (at
    1e4 seeds the regular triangulation's neighbours in index order took twice as long)."""
    y = xp.take(seeds, rows, axis=0)
    w = xp.take(psi, rows)
    own = xp.take(active, rows)
    gap = _compat.flat_take(seeds, xp.where(candidates >= 0, candidates, 0)) - y[:, None, :]
    order = xp.argsort(xp.where(candidates >= 0, _compat.dot(gap, gap), xp.inf), axis=1, stable=True)
    candidates = xp.take_along_axis(candidates, order, axis=1)

    def body(c, cells):
        j = _compat.column(candidates, c)
        ok = (j >= 0) & (j != rows) & own
        safe = xp.where(ok, j, 0)
        ok = ok & xp.take(active, safe)
        d = xp.take(seeds, safe, axis=0) - y
        offset = 0.5 * (_compat.dot(d, d) + w - xp.take(psi, safe))
        return clip(xp, cells, d, offset, safe, ok)

    return _compat.fori_loop(0, candidates.shape[1], body, cells)


@_compat.jit_on_jax()
def facet_triangles(xp, cells):
    """The boundary of every cell as triangles: ``(triangles (n, 3V, 3, 3), slot (n, 3V),
    valid (n, 3V))``, seed-relative, counter-clockwise seen from outside (the normal
    ``(b - a) x (c - a)`` points out). Each vertex ``v`` and facet ``p_a`` of it give the
    triangle ``(r, v, w)``: ``r`` the facet's first vertex, ``w`` the next vertex along the
    facet (edge ``a + 1``); the two triangles at ``r`` are degenerate (zero area)."""
    n, v_cap, _ = cells.vertices.shape
    f_cap = cells.labels.shape[1]
    dev = aac.device(cells.size)
    k = xp.arange(v_cap, dtype=xp.int64, device=dev)[None, :]
    live = xp.broadcast_to(live_vertices(xp, cells)[:, :, None], cells.corners.shape)
    base = xp.arange(n, dtype=xp.int64, device=dev)[:, None, None] * f_cap
    # each facet's reference vertex: one of its vertices (whichever a scatter writes last)
    where = xp.where(live, base + cells.corners, n * f_cap)
    vertex = xp.broadcast_to(k[:, :, None], cells.corners.shape)
    ref = xp.take(_table(xp, where, vertex, n * f_cap), xp.reshape(where, (-1,)))
    ref = xp.where(live, xp.reshape(ref, cells.corners.shape), 0)
    nxt = _rolled(xp, cells.adjacent, 1)
    r = _compat.row_gather(cells.vertices, ref)
    v = xp.broadcast_to(cells.vertices[:, :, None, :], r.shape)
    w = _compat.row_gather(cells.vertices, xp.where(live, nxt, 0))
    tri = xp.stack([r, v, w], axis=-2)                                   # (n, V, 3, 3, 3)
    return (xp.reshape(tri, (n, 3 * v_cap, 3, 3)), xp.reshape(xp.where(live, cells.corners, 0), (n, 3 * v_cap)),
            xp.reshape(live, (n, 3 * v_cap)))



def listed_triangles(xp, cells):
    """:func:`facet_triangles` as a flat list of the valid triangles only (eagerly: the
    live vertices' three facets each, against ``3 V`` slots per cell): ``(a, b, c)`` each
    ``(T, 3)``, seed-relative, and the ``cell`` and facet ``slot`` of each ``(T,)``."""
    n, v_cap, _ = cells.vertices.shape
    f_cap = cells.labels.shape[1]
    at = xp.nonzero(xp.reshape(live_vertices(xp, cells), (-1,)))[0]          # i V + v
    cell = at // v_cap
    corners = xp.take(xp.reshape(cells.corners, (n * v_cap, 3)), at, axis=0)
    nxt = xp.take(xp.reshape(cells.adjacent, (n * v_cap, 3)), at, axis=0)
    where = cell[:, None] * f_cap + corners                                  # (L, 3)
    ref = xp.take(_table(xp, where, xp.broadcast_to((at % v_cap)[:, None], where.shape), n * f_cap),
                  xp.reshape(where, (-1,)))
    flat = xp.reshape(cells.vertices, (n * v_cap, 3))
    cell3 = xp.reshape(xp.broadcast_to(cell[:, None], where.shape), (-1,))
    a = xp.take(flat, cell3 * v_cap + ref, axis=0)
    b = xp.take(flat, xp.reshape(xp.broadcast_to(at[:, None], where.shape), (-1,)), axis=0)
    c = xp.take(flat, cell3 * v_cap + xp.reshape(_rolled(xp, nxt, 1), (-1,)), axis=0)
    return a, b, c, cell3, xp.reshape(corners, (-1,))

