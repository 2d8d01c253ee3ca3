"""Periodic domains: the torus (and the cylinder) as the box with images of the seeds.

With a period ``L_a`` on axis ``a`` (0: not periodic) equal to the box's side, the cost is
``min over integer k of |x - y - k L|^2``. A seed's images ``y + k L`` share its weight, so
the point ``x`` of the box belongs on the torus to the seed ``i`` whose nearest image beats
every other seed's nearest image: the torus cell of ``i`` is the union, over the images of
``i``, of their cells in the power diagram of the seeds *and their images*, in the box. That
diagram is an ordinary one (:mod:`.geometry`) of ``n' >= n`` sites; its cell masses, moments
(about each site, so about the Dirac) and facets fold onto the seeds:

- ``m_i = sum of the masses of i's sites`` (:func:`folded_rows`);
- the Newton matrix ``P^T (D' - W') P`` with ``P`` (n', n) the site-to-seed map: the
  facet between sites of seeds ``i`` and ``j`` is an entry ``(i, j)``; between two sites of
  the same seed it cancels (their weights move together).

Which images: the nearest image of a seed to a point of the box is within half a period of
it, so images more than ``L_a / 2`` beyond the box on a shifted axis never own a point of it.
Of the others, the sites are the seeds and the images nearest the box (:func:`image_table`,
sorted by their distance beyond it), as many as the cells need: an image left out, at
distance ``>= b`` of the box, cannot own a point ``x`` of the cell of site ``c`` if
``b^2 - max(psi) >= R_c^2 - psi_c`` (``R_c``: the cell's farthest vertex from its site):
:func:`required_margin`. :func:`.evaluation.evaluate` grows the sites until it holds.
Eager only (the number of sites depends on the data).
"""
from __future__ import annotations

import itertools
from typing import NamedTuple

import array_api_compat as aac

from . import _compat


class ImageTable(NamedTuple):
    """The images of the seeds that may own a point of the box, nearest first: their seed
    ``owner`` (m,), their ``shift`` (m, d) in periods and their distance ``beyond`` (m,) the
    box."""

    owner: object
    shift: object
    beyond: object


def fold_onto(xp, seeds, lo, period):
    """``seeds`` moved by whole periods into ``[lo, lo + period)`` on the periodic axes
    (``period > 0``)."""
    periodic = period > 0
    safe = xp.where(periodic, period, 1.0)
    folded = seeds - xp.floor((seeds - lo) / safe) * safe
    folded = xp.where(folded >= lo + safe, folded - safe, folded)        # rounding of the quotient
    return xp.where(periodic, folded, seeds)


_LAST = []


def table_of(xp, prob):
    """The :class:`ImageTable` of ``prob`` (kept for the last problem: one solve asks often)."""
    if _LAST and _LAST[0][0] is prob.seeds and _LAST[0][1] is prob.period:
        return _LAST[0][2]
    table = image_table(xp, prob.seeds, prob.period, prob.lo, prob.hi)
    _LAST[:] = [(prob.seeds, prob.period, table)]
    return table


def image_table(xp, seeds, period, lo, hi):
    """The :class:`ImageTable` of ``seeds`` (in the box on the periodic axes)."""
    n, d = seeds.shape
    dev = aac.device(seeds)
    axes = [(-1, 0, 1) if float(period[a]) > 0 else (0,) for a in range(d)]
    owners, shifts, beyonds = [], [], []
    seed_ids = xp.arange(n, dtype=xp.int64, device=dev)
    for s in itertools.product(*axes):
        if not any(s):
            continue
        shift = xp.asarray(s, dtype=seeds.dtype, device=dev)
        z = seeds + shift * period
        moved = xp.asarray([k != 0 for k in s], device=dev)
        near = xp.all(~moved | ((z >= lo - 0.5 * period) & (z <= hi + 0.5 * period)), axis=1)
        keep = xp.nonzero(near)[0]
        zk = xp.take(z, keep, axis=0)
        out = zk - xp.minimum(xp.maximum(zk, lo), hi)
        owners.append(xp.take(seed_ids, keep))
        shifts.append(xp.broadcast_to(shift[None, :], (keep.shape[0], d)))
        beyonds.append(xp.sqrt(xp.sum(out * out, axis=1)))
    owner, shift, beyond = xp.concat(owners), xp.concat(shifts), xp.concat(beyonds)
    order = xp.argsort(beyond, stable=True)
    return ImageTable(xp.take(owner, order), xp.take(shift, order, axis=0), xp.take(beyond, order))


def images_within(xp, table, margin):
    """How many images of ``table`` lie within ``margin`` of the box."""
    return int(xp.searchsorted(table.beyond, xp.asarray(margin, dtype=table.beyond.dtype,
                                                        device=aac.device(table.beyond)), side="right"))


def sites(xp, seeds, period, table, count):
    """``(sites, owner)``: the ``seeds`` (n) and the first ``count - n`` images of ``table``
    (``count`` sites in all) and the seed of each site."""
    n = seeds.shape[0]
    k = count - n
    owner = table.owner[:k]
    images = xp.take(seeds, owner, axis=0) + table.shift[:k, :] * period
    ids = xp.arange(n, dtype=owner.dtype, device=aac.device(seeds))
    return xp.concat([seeds, images], axis=0), xp.concat([ids, owner])


def required_margin(xp, cells, psi_sites, active_sites):
    """The distance beyond the box from which no image can own a point of these cells:
    ``sqrt(max_c (R_c^2 - psi_c) + max psi)`` over the nonempty active cells ``c``."""
    live = _live_vertices(xp, cells)
    r2 = xp.max(xp.where(live, xp.sum(cells.vertices * cells.vertices, axis=-1), 0.0), axis=1)
    used = active_sites & (cells.count > 0)
    top = xp.max(xp.where(used, r2 - psi_sites, -xp.inf))
    return float(xp.sqrt(xp.maximum(top + xp.max(xp.where(active_sites, psi_sites, -xp.inf)), 0.0)))


def margin_of(table, count, n):
    """The distance beyond the box of the first image left out with ``count`` sites (inf: none)."""
    k = count - n
    return float(table.beyond[k]) if k < table.beyond.shape[0] else float("inf")


def folded_rows(xp, a, owner, n):
    """``a`` (n', ...) summed over the sites of each seed: (n, ...)."""
    if a.ndim == 1:
        return _compat.segment_sum(xp, a, owner, n)
    return xp.stack([_compat.segment_sum(xp, a[:, k], owner, n) for k in range(a.shape[1])], axis=1)


def folded_entries(xp, rows, cols, w, owner):
    """Entries ``(rows, cols, w)`` of the sites' ``W'`` as the seeds' ``P^T W' P``, without the
    facets between two sites of one seed (they cancel in ``D - W``)."""
    r, c = xp.take(owner, rows), xp.take(owner, cols)
    keep = xp.nonzero(r != c)[0]
    return xp.take(r, keep), xp.take(c, keep), xp.take(w, keep)


def _live_vertices(xp, cells):
    """The vertex slots in use (n, V) of 2D or 3D ``cells``."""
    if cells.vertices.shape[-1] == 3:
        from .spatial.diagram import live_vertices

        return live_vertices(xp, cells)
    k = xp.arange(cells.vertices.shape[1], dtype=xp.int64, device=aac.device(cells.count))[None, :]
    return k < cells.count[:, None]
