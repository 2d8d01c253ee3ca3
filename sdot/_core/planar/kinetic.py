"""Cells at new weights from the cells at the previous ones (the kinetic update).

Between Newton trials the combinatorics barely change: every vertex is
recomputed from the lines of its two edges, cells that stay valid keep their
combinatorics, invalid ones are clipped again, and each vanishing edge tells
which two cells gain an edge (a flip). What is left is found by the repair.
"""
from __future__ import annotations

import math

import array_api_compat as aac

from .. import _compat, row_blocks, seed_neighbours

from . import polygons as pg
from .polygons import FAR, box_cells, clip_by, slots_for
from .agreement import unmatched
from ..options import DIAGRAM
from .repair import table


def update(xp, seeds, psi, active, lo, hi, previous, stop_if_empty=False, options=DIAGRAM):
    """Cells at weights ``psi`` from those of ``previous``; returns ``(cells, dirty)``.

    Valid cells keep their combinatorics (:func:`_updated`); the invalid ones
    are clipped again by their previous neighbours (in blocks of
    :func:`.polygons.budget` rows). They and their neighbours (which may gain an edge
    from a flip) are the first cells the repair tests. Eagerly, when more than
    ``options.rebuild_share`` of the cells are invalid, the cells are rebuilt from
    the regular triangulation instead (:func:`rebuild`), if the host can compute it;
    see there for ``stop_if_empty``. ``options``: a :class:`..options.DiagramOptions`.
    """
    cells, ok, flipped = _updated(xp, seeds, psi, active, lo, hi, previous)
    if _compat.host_share(xp, ~ok) > options.rebuild_share:
        rebuilt = rebuild(xp, seeds, psi, active, lo, hi, previous.labels.shape[1],
                          stop_if_empty=stop_if_empty, options=options)
        if rebuilt is not None:
            return rebuilt
    return _completed(xp, seeds, psi, active, lo, hi, previous, cells, ok, flipped, options)


def rebuild(xp, seeds, psi, active, lo, hi, capacity: int, grow: bool = False,
            stop_if_empty: bool = False, options=DIAGRAM):
    """Cells from the regular triangulation (:func:`..seed_neighbours.regular_rings`), or None.

    The ring of dual triangles around each seed gives its cell's combinatorics:
    :func:`_updated` computes the vertices, and the cells it finds invalid (those
    the box clips, or on the hull) are the box clipped by all their neighbours in
    the triangulation, which is exact. The cells have ``capacity`` slots; with
    ``grow``, at least their largest vertex count plus 2 (the box clips the
    widest rings, of seeds near its sides). None without a host, if Qhull fails,
    or if a cell needs more than ``capacity`` slots (without ``grow``). With
    ``stop_if_empty``, if an active seed is hidden (its cell is empty) the cells are
    just the box for the other seeds: a diagram the caller rejects anyway.
    """
    rings = seed_neighbours.regular_rings(xp, seeds, psi, active, stop_if_empty, tile_points=options.tile_points)
    if rings is None:
        return None
    labels, count, closed = rings
    if stop_if_empty and _compat.host_any(xp, active & (count == 0)):
        return box_cells(xp, seeds, lo, hi, active & (count > 0), capacity), xp.zeros_like(closed)
    n, width = labels.shape
    slots = max(capacity, width)                # the ring cells, before the box clips them
    dev = aac.device(seeds)
    pad = -xp.ones((n, slots - width), dtype=labels.dtype, device=dev)
    ring = pg.Cells(xp.zeros((n, slots, 2), dtype=seeds.dtype, device=dev), xp.concat([labels, pad], axis=1),
                    count, xp.zeros((n,), dtype=xp.bool, device=dev), xp.asarray(False, device=dev))
    cells, ok, flipped = _updated(xp, seeds, psi, active, lo, hi, ring)
    ok = (ok & closed) | (count == 0)           # a hidden seed has an empty cell
    cells, dirty = _completed(xp, seeds, psi, active, lo, hi, ring, cells, ok, xp.zeros_like(flipped), options)
    largest = _compat.to_int(xp.max(cells.count))
    if grow:
        capacity = max(capacity, slots_for(largest))
    elif largest > capacity:
        return None
    return pg.take_columns(xp, cells, capacity), dirty


def _completed(xp, seeds, psi, active, lo, hi, previous, cells, ok, flipped, options):
    """:func:`update` after :func:`_updated`: clip the invalid cells again, from the box,
    and the cells that gain an edge by a flip; returns ``(cells, dirty)``."""
    n = seeds.shape[0]
    cap = previous.labels.shape[1]
    every = table(xp, previous, traced_width=options.table_traced) if _compat.static_shapes(previous.labels) else None

    def previous_neighbours(rows):
        """Neighbour table of the cells ``rows`` in ``previous`` (eagerly of those only)."""
        if every is None:
            return table(xp, pg.take_rows(xp, previous, rows), traced_width=options.table_traced)
        return xp.take(every, rows, axis=0)

    def reclip(cells, mask, candidates, from_box):
        """Clip the cells of ``mask`` (from the box, or as they are) by their ``candidates(rows)``."""
        def body(state):
            cells, left = state
            rows, valid = _compat.select(xp, left, pg.budget(xp, left))
            start = pg.take_rows(xp, cells, rows)
            if from_box:
                start = box_cells(xp, xp.take(seeds, rows, axis=0), lo, hi, xp.take(active, rows) & valid, cap)
            redone = clip_by(xp, seeds, psi, active, start, rows,
                             xp.where(valid[:, None], candidates(rows), -1))
            redone = pg.keep_rows(xp, valid, redone, pg.take_rows(xp, cells, rows))
            return pg.put_rows(xp, cells, rows, redone), left & ~pg.mask_of(xp, rows, valid, n)
        return _compat.while_loop(lambda state: pg.any_true(xp, state[1]), body, (cells, mask))[0]

    cells = reclip(cells, ~ok, previous_neighbours, True)
    gained = flip_partners(xp, previous.labels, previous.count, flipped, options.flip_width,
                           options.flip_pairs_traced)
    dirty = pg.around(xp, previous, ~ok | (cells.count != previous.count))   # with those that dropped edges
    cells = reclip(cells, xp.any(gained >= 0, axis=1), lambda rows: xp.take(gained, rows, axis=0), False)
    return cells, unmatched(xp, cells, dirty, check_from=options.agreement_from)


def _lines(xp, seeds, psi, lo, hi, rows, labels):
    """Line of the edge of every slot of the cells ``rows``: ``u . normal = offset``
    (relative to the seed), ``normal`` outward; a neighbour's bisector or a side of the box.
    Returns ``(normal_x, normal_y, offset)``, each ``(n, V)`` (per coordinate, see
    :func:`.polygons.offsets`). The sides' normals and offsets are read from tables
    (per cell, its distances to the 4 sides), a few gathers instead of a chain of
    ``where`` over every slot."""
    j = xp.where(labels >= 0, labels, 0)
    dx, dy = pg.offsets(xp, seeds, rows, j)
    own_x, own_y = xp.take(seeds[:, 0], rows), xp.take(seeds[:, 1], rows)
    offset = 0.5 * (dx * dx + dy * dy + xp.take(psi, rows)[:, None] - _compat.flat_take(psi, j))
    side = xp.clip(-1 - labels, 0, 4)     # 0: y = lo, 1: x = hi, 2: y = hi, 3: x = lo, 4: padding
    dev = aac.device(labels)
    side_x = _compat.flat_take(xp.asarray([0.0, 1.0, 0.0, -1.0, 0.0], dtype=dx.dtype, device=dev), side)
    side_y = _compat.flat_take(xp.asarray([-1.0, 0.0, 1.0, 0.0, 0.0], dtype=dx.dtype, device=dev), side)
    room = xp.stack([own_y - lo[1], hi[0] - own_x, hi[1] - own_y, own_x - lo[0], own_x - lo[0]], axis=1)
    side_offset = pg.gather(room, side)
    is_seed = labels >= 0
    return (xp.where(is_seed, dx, side_x), xp.where(is_seed, dy, side_y),
            xp.where(is_seed, offset, side_offset))


def _updated(xp, seeds, psi, active, lo, hi, previous):
    """Vertices from the combinatorics of ``previous``, and which cells stay valid:
    ``(cells, ok, flipped)``.

    Vertex k meets the lines of edges k - 1 and k. A cell is valid when
    consecutive lines turn left, every edge keeps a non-negative length along
    its line and every vertex stays in the box: then it is the intersection of
    the half-planes of its edges (a superset of the true cell, which is all the
    area certificate needs). A flip (an edge vanishing here, appearing next
    door) shows as a reversed edge (``flipped``) in the cells that lose it: they
    drop their reversed edges, and are valid if what is left is (only invalid
    cells are retried; traced, at most :func:`.polygons.budget` of them). The
    cells that gain an edge are among their neighbours (:func:`flip_partners`).
    """
    n = previous.count.shape[0]
    dev = aac.device(previous.count)
    rows = xp.arange(n, dtype=xp.int64, device=dev)
    verts, ok, flipped, reversed_ = row_blocks.slotwise(
        xp, lambda c, r, lab, v: _moved(xp, seeds, psi, active, lo, hi, r, lab, c, v),
        previous.count, (rows,), (previous.labels, previous.vertices),
        (previous.vertices, None, False, False))
    # own copies (the vertices are new): written in place here, by the update and the repair
    cells = previous._replace(vertices=verts, certified=xp.asarray(False, device=dev), **{
        f: xp.asarray(getattr(previous, f), copy=True) for f in ("labels", "count", "overflow")})
    retry = ~ok & xp.any(reversed_, axis=1)
    if _compat.known_none(xp, retry):
        return cells, ok, flipped
    rows, _ = _compat.select(xp, retry, pg.budget(xp, retry))     # padding rows: retry False
    sub = pg.take_rows(xp, cells, rows)
    verts, labels, count, fixed = row_blocks.blockwise(
        xp, lambda *a: _dropped(xp, seeds, psi, active, lo, hi, *a),
        rows, sub.labels, sub.count, sub.vertices, xp.take(reversed_, rows, axis=0))
    dropped = sub._replace(vertices=verts, labels=labels, count=count)
    fixed = fixed & xp.take(retry, rows)
    cells = pg.put_rows(xp, cells, rows, pg.keep_rows(xp, fixed, dropped, sub))
    return cells, ok | pg.mask_of(xp, rows, fixed, n), flipped


@_compat.jit_on_jax()
def _moved(xp, seeds, psi, active, lo, hi, rows, labels, count, old_vertices):
    """Kernel of :func:`_updated` for the cells ``rows``: ``(vertices, ok, flipped,
    reversed)``."""
    verts, ok, reversed_ = _polygons(xp, seeds, active, lo, hi, rows, *_lines(xp, seeds, psi, lo, hi, rows, labels),
                                     count, old_vertices)
    return verts, ok, reversed_ & (labels >= 0), reversed_


@_compat.jit_on_jax()
def _dropped(xp, seeds, psi, active, lo, hi, rows, labels, count, vertices, reversed_):
    """The cells ``rows`` (``labels, count, vertices``) without their ``reversed``
    edges (the others first, in order), and whether they are valid: ``(vertices,
    labels, count, ok)``."""
    n, cap = labels.shape
    k = xp.arange(cap, dtype=xp.int64, device=aac.device(rows))[None, :]
    kept = (k < count[:, None]) & ~reversed_
    count = xp.sum(xp.astype(kept, count.dtype), axis=1)
    labels = _compat.first_columns(xp, kept, labels, cap, -1)
    verts, ok, _ = _polygons(xp, seeds, active, lo, hi, rows, *_lines(xp, seeds, psi, lo, hi, rows, labels),
                             count, vertices)
    return verts, labels, count, ok


def _polygons(xp, seeds, active, lo, hi, rows, nx, ny, offset, count, old_vertices):
    """The cells ``rows`` whose edges lie on the lines ``u . (nx, ny) = offset``
    (relative to the seed; lines k - 1 and k meet at vertex k): ``(vertices, ok,
    reversed)``. ``ok``: valid (see :func:`_updated`) and not far from its seed (see
    :data:`FAR`); ``reversed`` (per slot): a negative edge length along its line, up to
    rounding."""
    n, cap = offset.shape
    k = xp.arange(cap, dtype=xp.int64, device=aac.device(count))[None, :]
    valid = k < count[:, None]
    ax, ay, o_a = (pg.previous_slots(xp, a, count) for a in (nx, ny, offset))
    det = ax * ny - ay * nx
    safe = xp.where(det > 0, det, 1.0)
    vx = (o_a * ny - offset * ay) / safe
    vy = (ax * offset - nx * o_a) / safe
    verts = pg.where_slots(xp, valid, xp.stack([vx, vy], axis=-1), old_vertices)
    scale = _compat.row_max(xp, xp.where(valid, xp.abs(vx) + xp.abs(vy), 0.0))[:, None]
    tol = 64.0 * xp.finfo(verts.dtype).eps * (scale + 1.0) * (scale + 1.0)
    along = (pg.next_slots(xp, vx, count) - vx) * -ny + (pg.next_slots(xp, vy, count) - vy) * nx
    own_x, own_y = xp.take(seeds[:, 0], rows)[:, None], xp.take(seeds[:, 1], rows)[:, None]
    inside = ((vx >= lo[0] - own_x - tol) & (vx <= hi[0] - own_x + tol)
              & (vy >= lo[1] - own_y - tol) & (vy <= hi[1] - own_y + tol))
    good = (det > 0) & (along >= -tol) & inside
    # far from its seed, two bisectors of nearly parallel normals meet ill-conditioned (one
    # Dirac at 1e6: a vertex 3e-3 inside the true cell): such a cell is clipped again
    ok = _compat.row_all(xp, good | ~valid) & ((count >= 3) | ~xp.take(active, rows)) & (scale[:, 0] <= FAR)
    return verts, ok, valid & (along < -tol)


def flip_partners(xp, labels, count, flipped, width: int, traced_share: float = DIAGRAM.flip_pairs_traced):
    """Seeds each cell gains by edge flips, ``(n, width)`` (-1 padding, duplicates dropped).

    When edge ``k`` of a cell (its neighbour ``j``) vanishes, its ends lie on
    the edges of ``p`` (slot ``k - 1``) and ``q`` (slot ``k + 1``): the flip
    of the dual edge ``ij`` creates the edge ``pq``, so ``p`` gains ``q`` and
    ``q`` gains ``p``. Eagerly only the flipped slots are sorted; traced, at most
    ``traced_share`` pairs per cell are kept (shapes are static).
    """
    n = labels.shape[0]
    if _compat.static_shapes(labels, flipped):     # the flips' pairs first, a static share of them
        gainer, gained, ok = _flip_pairs(xp, labels, count, flipped)
        idx, ok = _compat.select(xp, ok, min(ok.shape[0], max(1, math.ceil(traced_share * n))))
        gainer, gained = xp.where(ok, xp.take(gainer, idx), n), xp.take(gained, idx)
    else:       # the rows with a flip (a fifth at 1e5), in blocks: (m, 4 V) pairs would dominate the memory
        rows, _ = _compat.true_entries(xp, xp.any(flipped, axis=1))
        gainer, gained = row_blocks.blockwise(xp, lambda *a: _flipped_pairs(xp, n, *a),
                                           *(xp.take(a, rows, axis=0) for a in (labels, count, flipped)))
    return _pack_pairs(xp, gainer, gained, labels[:, 0], width)


def _flipped_pairs(xp, n, labels, count, flipped):
    """The ``(gainer, gained)`` pairs of the flipped slots (eager), at least one;
    gainer ``n`` on padding."""
    gainer, gained, ok = _flip_pairs(xp, labels, count, flipped)
    idx, valid = _compat.true_entries(xp, ok)
    return xp.where(valid, xp.take(gainer, idx), n), xp.take(gained, idx)


@_compat.jit_on_jax()
def _flip_pairs(xp, labels, count, flipped):
    """Flat ``(gainer, gained, ok)`` of every slot, twice (``ok`` where a flip)."""
    p, q = pg.previous_slots(xp, labels, count), pg.next_slots(xp, labels, count)
    ok = flipped & (p >= 0) & (q >= 0) & (p != q)
    ok = xp.reshape(xp.concat([ok, ok], axis=1), (-1,))
    gainer = xp.reshape(xp.concat([p, q], axis=1), (-1,))
    gained = xp.where(ok, xp.reshape(xp.concat([q, p], axis=1), (-1,)), 0)
    return gainer, gained, ok


@_compat.jit_on_jax("width")
def _pack_pairs(xp, gainer, gained, like, width: int):
    """Table ``(n, width)`` of the distinct ``gained`` of each ``gainer`` (``n = like.shape[0]``)."""
    n, dev = like.shape[0], aac.device(like)
    key = gainer * (n + 1) + gained
    order = xp.argsort(key, stable=True)
    key, gainer, gained = xp.take(key, order), xp.take(gainer, order), xp.take(gained, order)
    m = key.shape[0]
    first = xp.concat([xp.ones((1,), dtype=xp.bool, device=dev), key[1:] != key[:-1]])
    distinct = xp.cumulative_sum(xp.astype(first, xp.int64))
    rank = distinct - xp.take(distinct, xp.searchsorted(gainer, gainer))   # among the gainer's pairs
    keep = first & (gainer < n) & (rank < width)
    slot = xp.where(keep, gainer * width + rank, n * width + xp.arange(m, dtype=xp.int64, device=dev))
    out = -xp.ones((n * width + m,), dtype=xp.int64, device=dev)
    out = _compat.put_rows(xp, out, slot, xp.where(keep, gained, -1))
    return xp.reshape(out[:n * width], (n, width))
