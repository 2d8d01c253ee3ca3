"""Tiles of the plane (or of space) by balanced k-d cuts, and the halo test of a tile.

A tile is a box ``[lo, hi)`` (a rectangle in 2D; bounds may be infinite) of a k-d tree whose cuts
split the Diracs into halves: a node is cut along its longest axis at the median of its
Diracs, ``levels`` times, which gives ``2**levels`` tiles of equal counts (up to one) on
any point set, clustered ones included. Every Dirac lies in exactly one tile (half-open
intervals), so exact duplicates share a tile.

A tile's *halo* of width ``h`` is every Dirac of the other tiles at distance at most
``h`` from its box. The owned cells computed from the owned and halo Diracs alone
are the true cells if no Dirac outside can cut them (:func:`halo_certified`).

Everything here holds in any dimension ``d`` (points ``(m, d)``, boxes ``lo``, ``hi`` of
length ``d``); the cells' vertices in use come as counts (2D: the first ``count``) or as a
mask (3D, :func:`.dimensions.vertices_in_use`).
"""
from __future__ import annotations

import numpy as np


def kd_tiles(points, levels: int):
    """The boxes ``(lo, hi)`` ``(2**levels, d)`` of a balanced k-d tree of ``points``
    (m, d) (all Diracs or a sample of them), and the tile of each point ``(m,)``: each node
    cut along its longest extent (of its points) at their median. Outer bounds are infinite."""
    m, dim = points.shape
    lo = np.full((1, dim), -np.inf)
    hi = np.full((1, dim), np.inf)
    owner = np.zeros(m, dtype=np.int64)
    for _ in range(levels):                      # one vectorised pass per level of the tree
        count = lo.shape[0]
        size = np.bincount(owner, minlength=count)
        first = np.concatenate([[0], np.cumsum(size)[:-1]])
        by_node = np.argsort(owner, kind="stable")
        filled = size > 0
        span = np.zeros((count, dim))
        if m:
            starts = first[filled]
            span[filled] = (np.maximum.reduceat(points[by_node], starts, axis=0)
                            - np.minimum.reduceat(points[by_node], starts, axis=0))
        axis = np.argmax(span, axis=1)
        along = points[np.arange(m), axis[owner]]
        order = np.lexsort((along, owner))
        rows = np.arange(count)
        cut = np.where(filled, along[order][np.minimum(first + size // 2, max(m - 1, 0))] if m else 0.0, 0.0)
        cut = np.clip(cut, lo[rows, axis], hi[rows, axis])      # an empty node's cut stays inside it
        left_hi, right_lo = hi.copy(), lo.copy()
        left_hi[rows, axis] = cut
        right_lo[rows, axis] = cut
        lo = np.stack([lo, right_lo], axis=1).reshape(-1, dim)
        hi = np.stack([left_hi, hi], axis=1).reshape(-1, dim)
        owner = 2 * owner + (along >= cut[owner])
    return lo, hi, owner


def boxes_certified(seeds, psi, vertices, count, box_lo, box_hi, box_tops, locality=None):
    """Whether each of the cells ``(vertices, count)`` of ``seeds`` (m, d) at weights ``psi`` is
    cut by no Dirac of the boxes ``[box_lo, box_hi]`` (k, d) whose weights are at most
    ``box_tops`` (k,) (``count``: see :func:`_in_use`).

    The local form of :func:`halo_certified` for the Diracs just beyond the halo: at a vertex
    of the cell's bounding box ``C`` a Dirac ``j`` of box ``B`` has power at least
    ``dist(C, B)^2 - top_B``; the cell holds if its largest own power ``|v - y_i|^2 - psi_i``
    is below the least such bound. Returns a boolean per cell. ``locality``: a key that
    orders the cells by place (e.g. their aggregates): blocks of nearby cells test only the
    boxes that may cut one of them (by the block's bounding box).
    """
    if not box_lo.shape[0] or not seeds.shape[0]:
        return np.ones(seeds.shape[0], bool)
    used = _in_use(vertices, count)
    points = seeds[:, None, :] + vertices
    low = np.min(np.where(used[:, :, None], points, np.inf), axis=1)
    high = np.max(np.where(used[:, :, None], points, -np.inf), axis=1)
    own = np.max(np.where(used, np.sum(vertices * vertices, axis=2) - psi[:, None], -np.inf), axis=1)
    ok = np.ones(seeds.shape[0], bool)
    order = np.argsort(locality, kind="stable") if locality is not None else np.arange(seeds.shape[0])
    scale = np.max(np.abs(box_tops))
    for start in range(0, order.size, 256):               # blocks of nearby cells
        block = order[start:start + 256]
        block = block[own[block] > -np.inf]
        if not block.size:
            continue
        # the boxes that may cut a cell of the block: within reach of its bounding box
        gap = np.maximum(np.maximum(box_lo - np.max(high[block], axis=0), np.min(low[block], axis=0) - box_hi), 0.0)
        near = np.sum(gap * gap, axis=1) - box_tops <= np.max(own[block]) + 1e-9 * (scale + 1.0)
        if not np.any(near):
            continue
        gap = np.maximum(np.maximum(box_lo[near][None] - high[block, None], low[block, None] - box_hi[near][None]), 0.0)
        reach = np.sum(gap * gap, axis=2)
        bound = np.min(reach - box_tops[near][None, :], axis=1)
        margin = 64.0 * np.finfo(seeds.dtype).eps * (np.max(reach, axis=1) + scale + np.abs(own[block]) + 1.0)
        ok[block] = ~(own[block] > bound - margin)
    return ok


def _in_use(vertices, count):
    """The vertex slots in use ``(m, V)`` of cells of ``vertices`` (m, V, d): ``count`` (m,)
    the first ones of each cell (2D), or ``count`` that mask itself (m, V) (3D)."""
    if count.ndim == 2:
        return count
    return np.arange(vertices.shape[1])[None, :] < count[:, None]


def box_maxima(points, values, side):
    """``(lo, hi, top)``: per square (cube in 3D) of ``side`` that holds some of ``points``, the bounding
    box of those points and the largest of their ``values``."""
    keys = np.floor(points / side).astype(np.int64)
    keys, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    lo = np.full(keys.shape, np.inf)
    hi = np.full(keys.shape, -np.inf)
    top = np.full(keys.shape[0], -np.inf)
    np.minimum.at(lo, inverse, points)
    np.maximum.at(hi, inverse, points)
    np.maximum.at(top, inverse, values)
    return lo, hi, top


#: Distance bands of the halo test: a halo's width doubles from band to band (the last band
#: holds every farther Dirac).
BANDS = 12


def tile_of(points, lo, hi):
    """The tile ``(m,)`` of each of ``points`` (m, d): the box ``lo <= x < hi``
    that holds it (a loop over the few tiles)."""
    owner = np.zeros(points.shape[0], dtype=np.int64)
    for t in range(lo.shape[0]):
        inside = np.all((points >= lo[t]) & (points < hi[t]), axis=1)
        owner[inside] = t
    return owner


def distance_to_box(points, lo, hi):
    """Euclidean distance ``(m,)`` from ``points`` (m, d) to the box ``[lo, hi]``
    (0 inside; infinite bounds allowed)."""
    gap = np.maximum(np.maximum(lo - points, points - hi), 0.0)
    return np.sqrt(np.sum(gap * gap, axis=1))


def box_gap(lo_a, hi_a, lo_b, hi_b):
    """Distance between the boxes ``[lo_a, hi_a]`` and ``[lo_b, hi_b]``."""
    gap = np.maximum(np.maximum(lo_a - hi_b, lo_b - hi_a), 0.0)
    return float(np.sqrt(np.sum(gap * gap)))


def halo_certified(seeds, psi, vertices, count, active, lo, hi, distances, tops):
    """Whether each of the cells ``(vertices, count)`` of ``seeds`` (m, d) at weights ``psi``,
    computed from the tile ``[lo, hi]``'s Diracs and its halo, is a true cell.

    The Diracs outside the halo come in bands: those of band ``b`` are farther than
    ``distances[b]`` from the tile and have weights at most ``tops[b]`` (``-inf``: none). At
    a vertex ``v`` such a Dirac ``j`` has ``|v - y_j| > distances[b] - dist(v, tile)``, so
    its power ``|v - y_j|^2 - psi_j`` exceeds ``max(distances[b] - dist(v, tile), 0)^2 -
    tops[b]``. A convex cell whose vertices all have a smaller power for their own Dirac is
    cut by no Dirac outside: the cell is exact. Bands by distance make the test local: the
    weights vary across a tile by far more than between neighbours (uniform Diracs, 2e5:
    a range of about 400 squared spacings, which one band would need a halo of 25 spacings
    to cover). ``count``: see :func:`_in_use`. Returns a boolean per cell (inactive cells: True).
    """
    used = _in_use(vertices, count)
    squares = np.sum(np.where(used[:, :, None], vertices, 0.0) ** 2, axis=2)
    bands = [(reach_s, top) for reach_s, top in zip(distances, tops) if top != -np.inf]
    # per cell first: its vertices are within sqrt(r2) of its Dirac, so at most ``far`` from
    # the tile, with own powers at most ``r2 - psi``: a bound below every vertex's (and a
    # larger margin), which most cells pass; the others are tested vertex by vertex
    r2 = np.max(np.where(used, squares, -np.inf), axis=1)
    far = distance_to_box(seeds, lo, hi) + np.sqrt(np.maximum(r2, 0.0))
    bound = np.full(seeds.shape[0], np.inf)
    scale = np.zeros(seeds.shape[0])
    for reach_s, top in bands:                             # a loop over the bands
        reach = np.maximum(reach_s - far, 0.0)
        bound = np.minimum(bound, reach * reach - top)
        scale = np.maximum(scale, reach_s * reach_s + abs(top))
    ok = r2 - psi <= bound - 64.0 * np.finfo(seeds.dtype).eps * (scale + np.abs(psi) + 1.0)
    rows = np.flatnonzero(~ok & active)
    if rows.size:
        points = seeds[rows][:, None, :] + vertices[rows]
        gap = np.maximum(np.maximum(lo - points, points - hi), 0.0)
        ok[rows] = _vertices_certified(np.sqrt(np.sum(gap * gap, axis=2)), squares[rows] - psi[rows][:, None],
                                       used[rows], psi[rows], bands, seeds.dtype)
    return ~active | ok


def _vertices_certified(outside, own, used, psi, bands, dtype):
    """:func:`halo_certified` vertex by vertex: ``outside`` and ``own`` ``(m, cap)`` the
    vertices' distances to the tile and own powers, ``bands`` the ``(distance, top)`` pairs."""
    bound = np.full(own.shape, np.inf)
    scale = np.zeros(own.shape)
    for reach_s, top in bands:                             # a loop over the bands
        reach = np.maximum(reach_s - outside, 0.0)
        bound = np.minimum(bound, reach * reach - top)
        scale = np.maximum(scale, reach * reach + abs(top))
    margin = 64.0 * np.finfo(dtype).eps * (scale + np.abs(psi)[:, None] + 1.0)
    return np.all(~used | (own <= bound - margin), axis=1)
