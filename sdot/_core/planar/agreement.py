"""Which cells disagree with their neighbours about the vertices they share.

Vertex k of cell i is the dual triangle of i, its incoming neighbour ``a`` (the label
of edge k - 1) and its outgoing one ``b`` (edge k); cell ``b`` has the same vertex,
between its edges with ``i`` (incoming) and ``a`` (outgoing); a side of the box stands
for itself. Cells that agree so everywhere, and are valid polygons, have no local
cutter: a dual edge that is not locally regular is a reversed edge of a polygon, which
the kinetic update drops and clipping never makes. So after an update only the cells
that disagree with a neighbour need the local test of the repair (measured at 1e4
seeds, first damped trial of a box solve: 1469 of the 9315 cells around the changed
ones; the same 739 cells with a cutter found). Correctness never rests on this: the
repair's area certificate and its sweeps find any cell it misses.
"""
from __future__ import annotations

import array_api_compat as aac

from .. import _compat, row_blocks
from . import polygons as pg
from ..options import DIAGRAM

#: Keys are reduced modulo this prime to fit int32 (half the gathers' memory traffic):
#: exact below 46336 seeds; above, two vertices of a cell share a key with a chance of
#: about 1e-9, which at worst hides a disagreement from the test.
KEY_MODULUS = 2_147_483_647


def unmatched(xp, cells, mask, size=None, check_from: int = DIAGRAM.agreement_from):
    """The cells of ``mask`` that have a vertex their outgoing neighbour lacks, and those
    neighbours: a mask (n,).

    A vertex that one cell has and another lacks is found if a cell that has it is in
    ``mask`` (its check goes round the triangle's cells: i checks b, b checks a, a
    checks i): after an update, the cells around the changed ones. Under static shapes, with ``size``,
    only that many cells of ``mask`` are checked and the others stay in the mask; eagerly
    a mask of fewer than ``check_from`` cells is returned as it is (the check would cost
    more than the local tests it saves).
    """
    n = mask.shape[0]
    every = xp.arange(n, dtype=xp.int64, device=aac.device(mask))
    static = _compat.static_shapes(mask, cells.labels)
    rows, valid = _compat.rows_where(xp, mask, size)
    if not static and rows.shape[0] < check_from:       # testing them costs less than the check
        return mask
    unchecked = (mask & ~pg.mask_of(xp, rows, valid, n) if static and rows.shape[0] < n
                 else xp.zeros_like(mask))
    labels, count = xp.take(cells.labels, rows, axis=0), xp.take(cells.count, rows)
    keys, where = (_keys(xp, cells, n), every) if static else _neighbour_keys(xp, cells, labels, count, n, every)
    missing = row_blocks.slotwise(xp, lambda c, r, lab: _disagreements(xp, keys, where, r, lab, c, n), count,
                               (rows,), (labels,), (False,)) & valid[:, None]
    other = xp.reshape(xp.where(missing, labels, -1), (-1,))
    return unchecked | pg.mask_of(xp, rows, _compat.row_any(xp, missing), n) | pg.hits(xp, other, n)


def _neighbour_keys(xp, cells, labels, count, n, every):
    """Eagerly, the vertex keys of the neighbours of the cells ``(labels, count)`` (rows of
    some cells; all cells if they are not few) as ``(keys, where)``: the keys of cell j are
    ``keys[where[j]]``, as many columns as the most vertices among those cells."""
    if 8 * labels.shape[0] > n:
        near, where = cells, every
    else:
        near, _, needed = pg.neighbour_cells(xp, cells, labels, count)
        where = xp.cumulative_sum(xp.astype(needed, xp.int64)) - 1
    return _keys(xp, near, n)[:, :max(_compat.to_int(xp.max(near.count)), 1)], where


def _keys(xp, cells, n):
    """:func:`_vertex_keys` of ``cells`` (only their ``labels`` and ``count`` are read)."""
    return row_blocks.slotwise(xp, lambda c, lab: _vertex_keys(xp, lab, c, n), cells.count, (), (cells.labels,), (-1,))


@_compat.jit_on_jax("n")
def _vertex_keys(xp, labels, count, n: int):
    """Key of each vertex of the cells ``(labels, count)`` (int32): ``(a + 5) (n + 5) + b + 5``
    modulo :data:`KEY_MODULUS` for its incoming and outgoing neighbours ``a, b``; -1
    beyond ``count``."""
    k = xp.arange(labels.shape[1], dtype=xp.int64, device=aac.device(labels))[None, :]
    incoming = pg.incoming_labels(xp, labels, count)
    return xp.astype(xp.where(k < count[:, None], ((incoming + 5) * (n + 5) + labels + 5) % KEY_MODULUS, -1),
                     xp.int32)


@_compat.jit_on_jax("n")
def _disagreements(xp, keys, where, rows, labels, count, n: int):
    """Kernel of :func:`unmatched` for the cells ``rows``: the vertices (m, V) whose
    outgoing neighbour lacks them; ``keys[where[j]]`` are the vertex keys of cell ``j``."""
    k = xp.arange(labels.shape[1], dtype=xp.int64, device=aac.device(labels))[None, :]
    incoming = pg.incoming_labels(xp, labels, count)
    check = (k < count[:, None]) & (labels >= 0)
    want = xp.astype(((rows[:, None] + 5) * (n + 5) + incoming + 5) % KEY_MODULUS, xp.int32)   # in b: i, then a
    at = xp.where(check, _compat.flat_take(where, xp.where(check, labels, 0)), 0)
    m, cap = labels.shape
    same = xp.reshape(_compat.flat_take(keys, at), (m * cap, keys.shape[1])) == xp.reshape(want, (-1,))[:, None]
    found = xp.reshape(_compat.row_any(xp, same), (m, cap))
    return check & ~found
