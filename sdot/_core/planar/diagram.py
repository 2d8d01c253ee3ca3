"""Power (Laguerre) diagrams in 2D by vectorised half-plane clipping.

Cell ``i`` of seeds ``y`` with weights ``psi`` is

    L_i = { x in box : |x - y_i|^2 - psi_i <= |x - y_j|^2 - psi_j  for all j }.

In seed-relative coordinates ``u = x - y_i`` the constraint of seed j is the
half-plane ``u . d <= (|d|^2 + psi_i - psi_j) / 2`` with ``d = y_j - y_i``.

1. Eagerly on the host, a first diagram comes from the regular
   triangulation (:func:`.kinetic.rebuild`); otherwise every cell starts as
   the box and is clipped by its *candidates*, the nearest seeds. Between
   Newton trials the previous diagram is updated instead (:mod:`.kinetic`),
   or rebuilt when the update finds too many invalid cells.
2. Certificate: a cell clipped by a subset of its constraints contains the
   true cell, and the true cells tile the box, so ``sum_i area(P_i) >= area(box)``
   with equality iff every ``P_i`` is exact. Checked up to rounding.
3. Repair (:mod:`.repair`): local regularity tests of the vertices of the
   cells that changed, and of those they touch; while the certificate fails,
   of every vertex, then exact tests (nearest lifted seed).

Cells are polygons of fixed capacity (:mod:`.polygons`). Shapes are static;
eagerly the repairs only touch the cells that need them and a capacity
overflow is retried with 1.5 times the capacity; under tracing ``overflow`` and
``certified`` report what could not be done.

The c-transform of the weights (:func:`c_transform`, the mass gradient of a Dirac of
zero mass) is a minimum over the cells' vertices.
"""
from __future__ import annotations

import array_api_compat as aac

from .. import _compat, gradients, seed_neighbours
from .kinetic import rebuild, update
from ..options import DIAGRAM
from .polygons import CAPACITY, Cells, box_cells, clip_by, neighbours, slots_for
from .repair import repair


def first_candidates(xp, seeds, k: int = DIAGRAM.first_candidates, active=None, psi=None):
    """Candidates of a first diagram, ``(n, K)``, -1 padding, and whether they are the
    nearest seeds: the Delaunay neighbours (the exact Voronoi neighbours: one clip per
    candidate, nothing to repair at zero weights; traced, through the host callback, the
    first ``k + 1`` of them: 400 Diracs on the sides of the square, whose 20 nearest lie on
    their own side, had cells no repair certified), and with ``psi`` those of the regular
    triangulation (see :func:`..seed_neighbours.delaunay_neighbours`); without a host, the ``k`` nearest
    seeds and the seed itself (all of them if there are no more). Traced or without a host,
    the inactive seeds (duplicates, zero masses) are moved out of the way first
    (:func:`_away`): 40 Diracs repeated 10 times had 9 of their 20 candidates on their own
    copies, and cells no repair round could certify."""
    n = seeds.shape[0]
    moved = seeds if active is None else _away(xp, seeds, active)
    weighted = () if psi is None or active is None or not _compat.static_shapes(seeds) else (psi, active)
    found = seed_neighbours.delaunay_neighbours(xp, moved if _compat.static_shapes(seeds) else seeds, min(k + 1, n), *weighted)
    if found is not None:
        # traced: at most k + 1 of them (a row cut short is not certified and is repaired)
        return found, False
    found = seed_neighbours.knn(xp, moved, min(k + 1, n))
    if found.shape[1] >= k + 1:
        return found, True
    pad = -xp.ones((n, k + 1 - found.shape[1]), dtype=found.dtype, device=aac.device(found))
    return xp.concat([found, pad], axis=1), True


@_compat.jit_on_jax()
def _away(xp, seeds, active):
    """``seeds`` with the inactive ones all at one point beyond the others, so that no
    active seed takes them for a neighbour."""
    span = xp.max(xp.max(seeds, axis=0) - xp.min(seeds, axis=0)) + 1.0
    return xp.where(active[:, None], seeds, xp.max(seeds, axis=0)[None, :] + span)


@_compat.jit_on_jax()
def beyond_security(xp, seeds, psi, active, cells, nearest):
    """Active cells that a seed outside their ``nearest`` seeds (n, K) may cut.

    With ``d_i`` the distance from ``y_i`` to its farthest candidate, every other seed
    ``j`` has ``|y_j - y_i| >= d_i``, so at a vertex ``v`` with ``|v - y_i| = r``, its power
    ``|v - y_j|^2 - psi_j >= (d_i - r)^2 - M`` (``M`` the largest active weight) is at least
    cell i's ``r^2 - psi_i`` while ``r <= (d_i^2 - (M - psi_i)) / (2 d_i)``: a cell whose
    vertices all lie within that radius is exact (a convex cell no half-plane cuts at a
    vertex is not cut). A row with padding holds every seed: nothing else can cut it.
    """
    n, cap = cells.labels.shape
    safe = xp.where(nearest >= 0, nearest, 0)
    gap = _compat.flat_take(seeds, safe) - seeds[:, None, :]
    d = xp.sqrt(xp.max(_compat.dot(gap, gap), axis=1))
    top = xp.max(xp.where(active, psi, -xp.inf))
    radius = (d * d - (top - psi)) / xp.where(d > 0, 2.0 * d, 1.0)
    k = xp.arange(cap, dtype=xp.int64, device=aac.device(nearest))[None, :]
    far = xp.max(xp.where(k < cells.count[:, None], _compat.dot(cells.vertices, cells.vertices), 0.0), axis=1)
    margin = 64.0 * xp.finfo(seeds.dtype).eps * (d * d + xp.abs(top) + xp.abs(psi))
    secure = (radius >= 0) & (far <= radius * radius - margin)
    return active & ~secure & xp.all(nearest >= 0, axis=1)


def power_cells(xp, seeds, psi, active, lo, hi, candidates=None, capacity: int = CAPACITY,
                previous=None, stop_if_empty: bool = False, options=DIAGRAM):
    """Cells of every seed, exact up to rounding (see the module docstring), found as the
    :class:`..options.DiagramOptions` ``options`` say.

    ``previous``: cells of the same seeds at other weights (the last Newton
    step): their combinatorics give the new vertices directly (:func:`update`).
    Otherwise, eagerly on the host, the cells come from the regular
    triangulation (:func:`rebuild`); else every cell is the box clipped by its
    ``candidates`` (n, K) (valid ones, >= 0, first in each row; default the
    nearest seeds). Eagerly an overflowing vertex capacity grows 1.5 times and
    everything is rebuilt; under tracing the flags report it. Eagerly a first diagram whose
    ``candidates`` are wider than ``capacity`` (a Delaunay degree) starts wider.

    ``stop_if_empty`` (a damping trial, which is rejected if a cell is empty):
    eagerly, once the update (or the rebuild) finds an active cell empty, the
    cells are returned as they are, supersets of the true ones, uncertified
    and not repaired.
    """
    if candidates is None and (cells := _compiled_cells(xp, seeds, psi, active, lo, hi, capacity, previous,
                                                          stop_if_empty, options)) is not None:
        return cells
    n = seeds.shape[0]
    dev = aac.device(seeds)
    rows = xp.arange(n, dtype=xp.int64, device=dev)
    if previous is not None and previous.labels.shape[1] == capacity:
        cells, dirty = update(xp, seeds, psi, active, lo, hi, previous, stop_if_empty, options)
        if stop_if_empty and _compat.host_any(xp, active & (cells.count == 0)):
            return cells._replace(certified=xp.asarray(False, device=dev))
    elif candidates is None and (found := rebuild(xp, seeds, psi, active, lo, hi, capacity, grow=True,
                                                  options=options)):
        cells, dirty = found
        capacity = cells.labels.shape[1]
    else:
        nearest = False
        if candidates is None and previous is None:
            candidates, nearest = first_candidates(xp, seeds, options.first_candidates, active, psi)
        elif candidates is None:
            candidates = neighbours(xp, previous, min(capacity, previous.labels.shape[1]))
        if previous is None and candidates.shape[1] > capacity and not _compat.static_shapes(candidates):
            capacity = slots_for(candidates.shape[1])         # a Delaunay degree above it
        cells = clip_by(xp, seeds, psi, active, box_cells(xp, seeds, lo, hi, active, capacity), rows, candidates)
        dirty = (beyond_security(xp, seeds, psi, active, cells, candidates) if nearest
                 else xp.ones((n,), dtype=xp.bool, device=dev))
    cells = repair(xp, seeds, psi, active, lo, hi, cells, dirty, options)
    if capacity >= 1024 or not _compat.host_any(xp, cells.overflow):
        return cells
    return power_cells(xp, seeds, psi, active, lo, hi, candidates, _grown(capacity), previous, options=options)


def _compiled_cells(xp, seeds, psi, active, lo, hi, capacity, previous, stop_if_empty, options):
    """Eagerly on the host, every cell by the compiled kernel (:func:`sdot._host.compiled.cells2d.power_cells`:
    the previous cells moved or each cell clipped on its own, by a k-d tree of the seeds, exact
    whatever the weights); None where it does not run (traced or device arrays, numba missing
    or turned off). ``stop_if_empty``: a cell found empty leaves the diagram uncertified."""
    past = () if previous is None else (previous.vertices, previous.labels, previous.count)

    def kernel(seeds, psi, active, lo, hi, *past):
        from ..._host.compiled import cells2d

        slots = capacity
        while True:
            *arrays, status = cells2d.power_cells(seeds, psi, active, lo, hi, slots, past or None,
                                                       options=options.compiled)
            overflow = status == cells2d.OVERFLOWED
            if not overflow.any() or slots >= 1024:
                return (*arrays, overflow)
            slots = _grown(slots)
    found = _compat.compiled_call(xp, kernel, seeds, psi, active, lo, hi, *past)
    if found is None:
        return None
    empty = stop_if_empty and _compat.host_any(xp, active & (found[2] == 0))
    return Cells(*found, xp.asarray(not empty, device=aac.device(seeds)))


def _grown(capacity: int) -> int:
    """The next capacity: 1.5 times, a multiple of 4 (every slot costs time and memory)."""
    return (3 * capacity // 2 + 3) // 4 * 4


def c_transform(xp, seeds, cells, psi):
    """``min_x |x - y_i|^2 - phi(x)`` over the box for every Dirac i, shape (n,): see
    :func:`..gradients.c_transform_at_vertices` (the vertex slots below ``count``)."""
    k = xp.arange(cells.vertices.shape[1], dtype=xp.int64, device=aac.device(seeds))[None, :]
    return gradients.c_transform_at_vertices(xp, seeds, cells.vertices, k < cells.count[:, None], psi)
