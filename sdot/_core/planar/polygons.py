"""Convex polygons of fixed capacity, one per seed, and the kernels that clip them.

Cells are polygons of ``V`` vertex slots (counter-clockwise, relative to the
seed); each vertex carries the label of the edge that starts at it: the
neighbour ``j >= 0``, or ``-1 - side`` for a side of the box (0: y = lo,
1: x = hi, 2: y = hi, 3: x = lo). In seed-relative coordinates ``u = x - y_i``
the constraint of seed j on cell i is the half-plane
``u . d <= (|d|^2 + psi_i - psi_j) / 2`` with ``d = y_j - y_i``.
"""
from __future__ import annotations

from typing import NamedTuple

import array_api_compat as aac

from .. import _compat, moments, row_blocks

#: Vertex capacity per cell (grown eagerly on overflow).
CAPACITY = 16


#: Distance from a seed (in domain sides) beyond which a cell is "far": its integrals are
#: taken about its first vertex (:mod:`..moments`) and the kinetic update clips it again
#: rather than meet nearly parallel bisectors (a Dirac at 1e6 stalled).
FAR = moments.FAR


def slots_for(vertices: int) -> int:
    """Capacity for cells of up to ``vertices`` vertices: room for 2 more (box sides),
    a multiple of 4."""
    return (vertices + 5) // 4 * 4


class Cells(NamedTuple):
    """Clipped cells: ``vertices`` (n, V, 2) relative to the seeds, ``labels`` (n, V),
    ``count`` (n,); ``overflow`` (n,) and ``certified`` () flags."""

    vertices: object
    labels: object
    count: object
    overflow: object
    certified: object


def box_cells(xp, seeds, lo, hi, active, capacity: int):
    """Every active cell starts as the box ``[lo, hi]``, inactive cells empty."""
    n = seeds.shape[0]
    dev = aac.device(seeds)
    corners = xp.stack([
        xp.stack([lo[0], lo[1]]), xp.stack([hi[0], lo[1]]),
        xp.stack([hi[0], hi[1]]), xp.stack([lo[0], hi[1]]),
    ])                                                     # (4, 2) counter-clockwise
    pad = xp.zeros((capacity - 4, 2), dtype=seeds.dtype, device=dev)
    verts = xp.concat([corners, pad], axis=0)[None, :, :] - seeds[:, None, :]
    side = xp.asarray([-1, -2, -3, -4] + [-5] * (capacity - 4), dtype=xp.int64, device=dev)
    labels = xp.broadcast_to(side[None, :], (n, capacity))
    count = 4 * xp.astype(active, xp.int64)
    return Cells(verts, labels, count, xp.zeros((n,), dtype=xp.bool, device=dev),
                 xp.asarray(False, device=dev))


#: Row-by-row gathers (see :func:`.._compat.row_gather`).
gather = _compat.row_gather


def previous_slots(xp, x, count):
    """``x`` (n, V) or (n, V, 2) at slot ``k - 1`` of each row, cyclically within ``count``:
    slot 0 reads slot ``count - 1``. A shift and a gather of one column (on NumPy about a
    third of the time of :func:`gather` at the cyclic indices). The slots from ``count``
    on read slot ``k - 1``: for callers that ignore them."""
    last = gather(x, xp.maximum(count, 1)[:, None] - 1)
    return xp.concat([last, x[:, :-1, ...]], axis=1)


def next_slots(xp, x, count):
    """``x`` (n, V) at slot ``k + 1`` of each row, cyclically within ``count``: slot
    ``count - 1`` reads slot 0. The slots from ``count`` on read slot ``k + 1`` (the last
    one slot 0): for callers that ignore them."""
    k = xp.arange(x.shape[1], dtype=xp.int64, device=aac.device(count))[None, :]
    return xp.where(k == count[:, None] - 1, x[:, :1], xp.concat([x[:, 1:], x[:, :1]], axis=1))


def incoming_labels(xp, labels, count):
    """Label of the edge ending at each vertex slot (slot ``k - 1``, cyclically within
    ``count``; see :func:`previous_slots` beyond it), ``(n, V)``: with ``labels`` (the edge
    starting there), the two neighbours whose edges meet at the vertex."""
    return previous_slots(xp, labels, count)


def offsets(xp, seeds, rows, j):
    """``y_j - y_row`` per coordinate, ``(dx, dy)``, each of ``j``'s shape ``(m, V)``
    (``rows`` (m,)): NumPy gathers rows of 2 and broadcasts along a last axis of 2 several
    times slower (1e4 x 8 offsets: 1.1 against 0.17 ms)."""
    sx, sy = seeds[:, 0], seeds[:, 1]
    return (_compat.flat_take(sx, j) - xp.take(sx, rows)[:, None],
            _compat.flat_take(sy, j) - xp.take(sy, rows)[:, None])


def where_slots(xp, mask, a, b):
    """``where(mask, a, b)`` for vertex arrays ``(n, V, 2)`` and a mask ``(n, V)`` or
    ``(n, 1)``: the mask is stacked for both coordinates first (NumPy broadcasts a
    mask ``(n, V, 1)`` about twice slower)."""
    mask = xp.broadcast_to(mask, a.shape[:2])
    return xp.where(xp.stack([mask, mask], axis=-1), a, b)


@_compat.jit_on_jax()
def clip_polygons(xp, verts, labels, count, normal, offset, label, skip):
    """Clip each polygon by its half-plane ``u . normal <= offset``.

    Returns the new ``(verts, labels, count, overflow)``; ``skip`` rows are
    unchanged. A half-plane cuts a convex polygon along one run of vertices
    ``a, ..., b - 1`` (the first run that starts after an inside vertex):
    the new polygon is the exit point on edge ``(a - 1, a)`` (labelled
    ``label``), the entry point on edge ``(b - 1, b)``, then ``b, ..., a - 1``,
    a rotation read with one gather.
    """
    n, cap, _ = verts.shape
    dev = aac.device(verts)
    k = xp.arange(cap, dtype=xp.int64, device=dev)[None, :]
    valid = k < count[:, None]
    cnt = xp.maximum(count, 1)[:, None]
    s = _compat.dot(verts, normal[:, None, :]) - offset[:, None]
    out = valid & (s > 0) & ~skip[:, None]
    changed = _compat.row_any(xp, out)
    out_prev = previous_slots(xp, out, count)
    a = xp.argmax(xp.astype(out & ~out_prev, xp.int8), axis=1)[:, None]
    run = xp.where(valid & ~out, _compat.remainder(k - a + cnt, cnt), cap)   # distance from a of inside vertices
    length = _compat.row_min(xp, run)[:, None]
    empty = changed & (length[:, 0] >= cap)
    b = _compat.remainder(a + length, cnt)
    ends = xp.concat([_compat.remainder(a - 1 + cnt, cnt), a, _compat.remainder(b - 1 + cnt, cnt), b], axis=1)   # (n, 4)
    sv, vv = gather(s, ends), gather(verts, ends)
    den = sv[:, 0::2] - sv[:, 1::2]                    # exit < 0, entry > 0 where a run is cut
    den = xp.where((changed & ~empty)[:, None] & (den != 0), den, 1.0)
    ratio = (sv[:, 0::2] / den)[..., None]
    x1 = vv[:, 0, :] + ratio[:, 0, :] * (vv[:, 1, :] - vv[:, 0, :])
    x2 = vv[:, 2, :] + ratio[:, 1, :] * (vv[:, 3, :] - vv[:, 2, :])
    src = _compat.remainder(b + k - 2 + 2 * cnt, cnt)
    new_v = gather(verts, src)
    new_l = gather(labels, src)
    new_v = xp.concat([x1[:, None, :], x2[:, None, :], new_v[:, 2:, :]], axis=1)     # exit, entry, the rest
    new_l = xp.concat([label[:, None], gather(labels, ends[:, 2:3]), new_l[:, 2:]], axis=1)
    new_count = count - length[:, 0] + 2
    overflow = changed & ~empty & (new_count > cap)
    keep = ~changed[:, None]
    verts = where_slots(xp, keep, verts, new_v)
    labels = xp.where(keep, labels, new_l)
    count = xp.where(empty, 0, xp.where(changed, xp.minimum(new_count, cap), count))
    return verts, labels, count, overflow


@_compat.jit_on_jax()
def _half_planes(xp, seeds, psi, active, count, rows, j):
    """Half-planes ``u . normal <= offset`` of the seeds ``j`` for the cells of ``rows``,
    and which to skip (-1, the cell itself, inactive seeds, empty cells)."""
    none = j < 0
    j = xp.where(none, rows, j)
    d = xp.take(seeds, j, axis=0) - xp.take(seeds, rows, axis=0)
    offset = 0.5 * (_compat.dot(d, d) + xp.take(psi, rows) - xp.take(psi, j))
    skip = none | (j == rows) | ~xp.take(active, j) | (count == 0)
    return d, offset, j, skip


@_compat.jit_on_jax()
def _clip_column(xp, seeds, psi, active, cells, rows, j):
    """Clip the cells ``rows`` by the seeds ``j`` (one per row; -1, self or inactive: skip)."""
    d, offset, j, skip = _half_planes(xp, seeds, psi, active, cells.count, rows, j)
    verts, labels, count, over = row_blocks.blockwise(xp, lambda *a: clip_polygons(xp, *a), cells.vertices,
                                                   cells.labels, cells.count, d, offset, j, skip)
    return Cells(verts, labels, count, cells.overflow | over, cells.certified)


@_compat.jit_on_jax()
def _cut_rows(xp, seeds, psi, active, verts, count, rows, j):
    """Which cells (``verts``, ``count``) of ``rows`` the seeds ``j`` cut (a vertex strictly outside)."""
    d, offset, _, skip = _half_planes(xp, seeds, psi, active, count, rows, j)
    k = xp.arange(verts.shape[1], dtype=xp.int64, device=aac.device(rows))[None, :]
    s = verts[..., 0] * d[:, None, 0] + verts[..., 1] * d[:, None, 1] - offset[:, None]
    return _compat.row_any(xp, (s > 0) & (k < count[:, None])) & ~skip


def clip_by(xp, seeds, psi, active, cells, rows, candidates):
    """Clip the cells of seeds ``rows`` (m,) by the columns of ``candidates`` (m, K).

    Eagerly each column only clips the cells it cuts (most candidates beyond
    the first few cut nothing), in blocks of rows.
    """
    if _compat.static_shapes(cells.vertices, candidates, psi, seeds):
        return _compat.fori_loop(0, candidates.shape[1], lambda c, x: _clip_column(
            xp, seeds, psi, active, x, rows, _compat.column(candidates, c)), cells)
    fields = row_blocks.blockwise(xp, lambda *a: _clip_block(xp, seeds, psi, active, Cells(*a[:4], None), *a[4:]),
                               cells.vertices, cells.labels, cells.count, cells.overflow, rows, candidates)
    return Cells(*fields, cells.certified)


#: Rows of an eager clipping block up to which every row is clipped by every column, without
#: first finding the rows a column cuts (on torch each column cost about 1.2 ms whatever the
#: rows: 5% faster solves at 1e3, 9% on NumPy at 1e4).
FEW_ROWS = 256


def _clip_block(xp, seeds, psi, active, cells, rows, candidates):
    """Eager :func:`clip_by` of a block: ``(vertices, labels, count, overflow)``."""
    cells = take_rows(xp, cells, xp.arange(rows.shape[0], dtype=xp.int64,
                                            device=aac.device(rows)))      # own copy, written in place
    for c in range(candidates.shape[1]):
        j = candidates[:, c]
        if rows.shape[0] <= FEW_ROWS:               # clipping them all costs less than finding the cut ones
            cells = _clip_column(xp, seeds, psi, active, cells, rows, j)
            continue
        hit = row_blocks.blockwise(xp, lambda *a: _cut_rows(xp, seeds, psi, active, *a),
                                cells.vertices, cells.count, rows, j)
        if not _compat.host_any(xp, hit):
            continue
        idx, ok = _compat.true_entries(xp, hit)
        sub = _clip_column(xp, seeds, psi, active, take_rows(xp, cells, idx), xp.take(rows, idx),
                           xp.where(ok, xp.take(j, idx), -1))
        cells = put_rows(xp, cells, idx, sub)
    return cells.vertices, cells.labels, cells.count, cells.overflow


def area_excess(xp, cells, lo, hi):
    """``(sum of cell areas - box area, tolerance)``: the certificate of exactness."""
    area, square = row_blocks.slotwise(xp, lambda c, v: _area_terms(xp, v, c), cells.count, (), (cells.vertices,),
                                    (None, None))
    box = xp.prod(hi - lo)
    tol = 64.0 * xp.finfo(area.dtype).eps * (box + xp.sqrt(xp.sum(square)) * xp.sqrt(box))
    return xp.sum(area) - box, tol


@_compat.jit_on_jax()
def _area_terms(xp, v, count):
    """Per cell, its area (the fan of triangles ``(v_0, v_k, v_k+1)``, ``k < count - 1``)
    and the sum of its squared vertex norms (the rounding scale)."""
    n, cap, _ = v.shape
    k = xp.arange(cap, dtype=xp.int64, device=aac.device(v))[None, :]
    x, y = v[..., 0], v[..., 1]
    dx, dy = x - x[:, :1], y - y[:, :1]
    cross = dx[:, :-1] * dy[:, 1:] - dy[:, :-1] * dx[:, 1:]
    area = 0.5 * _compat.row_sum(xp, xp.where(k[:, :-1] < count[:, None] - 1, cross, 0.0))
    return area, _compat.row_sum(xp, xp.where(k < count[:, None], x * x + y * y, 0.0))


def neighbours(xp, cells, width: int):
    """Each cell's neighbours (its edge labels >= 0) first, ``width`` columns, -1 after.

    The candidates of the next diagram, and the table of the local test; a hint
    only: a neighbour cut off by ``width`` is found by the repair.
    """
    return row_blocks.slotwise(xp, lambda c, lab: _neighbour_columns(xp, lab, c, width), cells.count, (),
                            (cells.labels,), (None,))


@_compat.jit_on_jax("width")
def _neighbour_columns(xp, labels, count, width: int):
    """Kernel of :func:`neighbours`: ``width`` columns (-1 padded) whatever the slots."""
    k = xp.arange(labels.shape[1], dtype=xp.int64, device=aac.device(labels))[None, :]
    return _compat.first_columns(xp, (k < count[:, None]) & (labels >= 0), labels, width, -1)


def max_degree(xp, cells):
    """Largest number of neighbours of a cell (eager sizing of the candidates)."""
    return _compat.to_int(xp.max(row_blocks.slotwise(xp, lambda c, lab: _degrees(xp, lab, c), cells.count, (),
                                                  (cells.labels,), (None,))))


@_compat.jit_on_jax()
def _degrees(xp, labels, count):
    """Number of neighbours of each cell."""
    k = xp.arange(labels.shape[1], dtype=xp.int64, device=aac.device(labels))[None, :]
    return xp.sum(xp.astype((k < count[:, None]) & (labels >= 0), xp.int64), axis=1)


# ------------------------------------------------------------- rows and masks
@_compat.jit_on_jax()
def take_rows(xp, cells, rows):
    return cells._replace(**{f: _compat.flat_take(getattr(cells, f), rows)
                             for f in ("vertices", "labels", "count", "overflow")})


def take_columns(xp, cells, capacity: int):
    """``cells`` with their first ``capacity`` vertex slots (no cell may have more vertices)."""
    if cells.labels.shape[1] == capacity:
        return cells
    return cells._replace(vertices=xp.asarray(cells.vertices[:, :capacity, :], copy=True),
                          labels=xp.asarray(cells.labels[:, :capacity], copy=True))


def put_rows(xp, cells, rows, sub):
    """``cells`` with the rows ``rows`` replaced by ``sub``, in place where the framework
    allows it (NumPy, torch; :func:`.._compat.put_rows`): only for cells whose arrays
    nothing else holds."""
    return cells._replace(**{f: _compat.put_rows(xp, getattr(cells, f), rows, getattr(sub, f))
                             for f in ("vertices", "labels", "count", "overflow")})


@_compat.jit_on_jax()
def keep_rows(xp, valid, new, old):
    """``new`` cells where ``valid``, ``old`` elsewhere."""
    return new._replace(vertices=xp.where(valid[:, None, None], new.vertices, old.vertices),
                        labels=xp.where(valid[:, None], new.labels, old.labels),
                        count=xp.where(valid, new.count, old.count),
                        overflow=xp.where(valid, new.overflow, old.overflow))


def around(xp, cells, mask):
    """``mask`` and the neighbours of the cells in ``mask`` (eagerly, only their rows are read)."""
    rows, valid = _compat.rows_where(xp, mask)
    return _around(xp, mask, xp.take(cells.labels, rows, axis=0), xp.take(cells.count, rows), valid)


@_compat.jit_on_jax()
def _around(xp, mask, labels, count, rows_in):
    """``mask`` and the neighbours of the cells ``(labels, count)`` (rows of some cells)
    where ``rows_in``."""
    return mask | neighbour_mask(xp, labels, count, mask.shape[0], rows_in)


def neighbour_mask(xp, labels, count, n: int, rows_in=None):
    """Mask (n,) of the neighbours of the cells ``(labels, count)`` (rows of some cells;
    only those ``rows_in`` if given)."""
    k = xp.arange(labels.shape[1], dtype=xp.int64, device=aac.device(labels))[None, :]
    keep = (k < count[:, None]) & (labels >= 0)
    if rows_in is not None:
        keep = keep & rows_in[:, None]
    return hits(xp, xp.reshape(xp.where(keep, labels, -1), (-1,)), n)


def neighbour_cells(xp, cells, labels, count):
    """Eagerly, the neighbours of the cells ``(labels, count)`` (rows of some of ``cells``):
    ``(near, found, needed)``, their :class:`Cells` (``labels`` and ``count`` only), their
    indices (at least one, see :func:`.._compat.true_entries`) and their mask (n,)."""
    needed = neighbour_mask(xp, labels, count, cells.count.shape[0])
    found, _ = _compat.true_entries(xp, needed)
    return Cells(None, xp.take(cells.labels, found, axis=0), xp.take(cells.count, found), None, None), found, needed


#: Boolean mask (n,) of the entries ``idx`` (-1 ignored).
hits = _compat.hits


def mask_of(xp, rows, valid, n):
    """Boolean mask (n,) of the ``rows`` where ``valid``."""
    return hits(xp, xp.where(valid, rows, -1), n)


def budget(xp, mask):
    """Rows processed at once: all of ``mask`` eagerly; a fixed share of the cells traced."""
    n = mask.shape[0]
    if _compat.static_shapes(mask):
        return min(n, max(64, n // 8))
    return _compat.capacity(xp, xp.sum(xp.astype(mask, xp.int64)), mask, n)


@_compat.jit_on_jax()
def any_true(xp, mask):
    return xp.any(mask)
