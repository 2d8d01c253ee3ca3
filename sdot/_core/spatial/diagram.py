"""Power (Laguerre) diagrams in 3D.

Cell ``i`` of seeds ``y`` with weights ``psi`` is

    L_i = { x in box : |x - y_i|^2 - psi_i <= |x - y_j|^2 - psi_j  for all j },

stored as a convex polyhedron (:mod:`.polyhedra`) and found

1. Eagerly on a host, read off the regular triangulation (Qhull): each tetrahedron is a
   vertex of its four corners' cells (:mod:`.triangulated`); the cells that reach beyond
   the box are clipped by its sides, those of the triangulation's hull seeds (unbounded)
   clipped from the box by their neighbours. Exact: the neighbours in the regular
   triangulation are the seeds that can cut a cell.
2. From a previous diagram of the same seeds (the last Newton trial): its combinatorics
   with the vertices moved to the new weights (:mod:`.kinetic`), kept if every cell is
   still valid and the certificate holds; else (eagerly, on a host) step 1 again.
3. Without a host: the box clipped by the half-spaces of *candidates*, the ``K`` nearest
   seeds (a cell is exact when its vertices lie within the radius of security,
   :func:`insecure`; the others are clipped again with twice as many) or the previous
   diagram's neighbours. Certificate: a cell clipped by a subset of its constraints
   contains the true cell and the true cells tile the box, so ``sum_i vol(P_i) >=
   vol(box)``, with equality iff every ``P_i`` is exact; checked up to rounding.

Under tracing the shapes are static: ``K`` nearest seeds once (or the previous
neighbours), and ``certified`` reports whether the certificate holds.

The c-transform of the weights (:func:`c_transform`, the mass gradient of a Dirac of
zero mass) is a minimum over the cells' vertices.
"""
from __future__ import annotations

import array_api_compat as aac

from .. import _compat, gradients, row_blocks, seed_neighbours
from ..options import DIAGRAM
from . import integrate
from .kinetic import moved, moved_rows
from .polyhedra import CAPACITY, Cells, box_cells, clip_by, live_vertices
from .triangulated import triangulated_cells


def power_cells(xp, seeds, psi, active, lo, hi, candidates=None, capacity: int = CAPACITY,
                previous=None, stop_if_empty: bool = False, options=DIAGRAM):
    """Cells of every seed, exact up to rounding (see the module docstring).

    ``candidates`` (n, K): the seeds that clip each cell (-1: none), in place of the nearest
    ones (then certified like a previous diagram's). ``previous``: cells of the same seeds
    at other weights. Eagerly an overflowing capacity grows 1.5 times; under tracing the
    ``overflow`` flags report it. ``stop_if_empty``: eagerly, a diagram with an empty active
    cell is returned uncertified as soon as it is found (a rejected damping trial).
    """
    if candidates is None and (cells := _compiled_cells(xp, seeds, psi, active, lo, hi, capacity, previous,
                                                          stop_if_empty, options)) is not None:
        return cells
    dev = aac.device(seeds)
    same = previous is not None and candidates is None and previous.labels.shape[1] == capacity
    if same and not _compat.static_shapes(seeds) and _mostly_turned_over(xp, seeds, psi, active, lo, hi, previous,
                                                                          options):
        return _rebuilt(xp, seeds, psi, active, lo, hi, capacity, previous, stop_if_empty, options)
    if same:                                    # the previous combinatorics, moved
        cells, valid = moved(xp, seeds, psi, lo, hi, previous)
    if candidates is None and previous is not None:
        candidates = xp.where(previous.labels >= 0, previous.labels, -1)
    if _compat.static_shapes(seeds):
        fresh = lambda: first_cells(xp, seeds, psi, active, lo, hi, capacity, options)
        if candidates is None:
            return fresh()

        def reclipped():
            cells = _clipped(xp, seeds, psi, active, lo, hi, capacity, candidates)
            exact = tiles_the_box(xp, cells, lo, hi)
            return _compat.cond(exact, lambda: cells._replace(certified=exact), fresh)
        if same:
            kept = xp.all(valid | ~active) & tiles_the_box(xp, cells, lo, hi)
            return _compat.cond(kept, lambda: cells._replace(certified=kept), reclipped)
        return reclipped()
    if same and not _compat.host_any(xp, active & ~valid):
        if _compat.host_any(xp, tiles_the_box(xp, cells, lo, hi)):
            return cells._replace(certified=xp.asarray(True, device=dev))
    elif same and (local := _reclipped_locally(xp, seeds, psi, active, lo, hi, cells, valid, options)) is not None:
        if stop_if_empty and _emptied(xp, local, active):
            return _uncertified(xp, local)
        if _compat.host_any(xp, local.certified):
            return local
    if same:
        return _rebuilt(xp, seeds, psi, active, lo, hi, capacity, previous, stop_if_empty, options)
    return _from_candidates(xp, seeds, psi, active, lo, hi, capacity, candidates, previous, stop_if_empty, options)


def _compiled_cells(xp, seeds, psi, active, lo, hi, capacity, previous, stop_if_empty, options):
    """Eagerly on the host, every cell by the compiled kernel (:func:`sdot._host.compiled.cells3d.power_cells`:
    the previous cells moved or each cell clipped on its own, by a k-d tree of the seeds, exact
    whatever the weights); None where it does not run (traced or device arrays, numba missing
    or turned off) or where rounding broke a cell (the array kernels then build the diagram)."""
    fields = ("vertices", "corners", "adjacent", "size", "labels", "count")
    past = () if previous is None else tuple(getattr(previous, f) for f in fields)

    def kernel(seeds, psi, active, lo, hi, *past):
        from ..._host.compiled import cells3d

        slots = capacity
        while True:
            *arrays, status = cells3d.power_cells(seeds, psi, active, lo, hi, slots, past or None,
                                                       options=options.compiled)
            if (status == cells3d.BROKEN).any():
                return None
            overflow = status == cells3d.OVERFLOWED
            if not overflow.any() or slots >= 1024:
                return (*arrays, overflow)
            slots = (3 * slots // 2 + 3) // 4 * 4
    found = _compat.compiled_call(xp, kernel, seeds, psi, active, lo, hi, *past)
    if found is None:
        return None
    cells = Cells(*found, xp.asarray(True, device=aac.device(seeds)))
    if stop_if_empty and _emptied(xp, cells, active):
        return _uncertified(xp, cells)
    return cells


def _rebuilt(xp, seeds, psi, active, lo, hi, capacity, previous, stop_if_empty, options):
    """Eagerly, every cell read off the regular triangulation again; where there is no
    host, clipped by the previous diagram's neighbours and theirs (a Newton trial's flips
    give a cell its neighbours' neighbours: clipped by its neighbours alone, the cells of
    1,000 seeds in the cube did not tile it at 3 of 5 trials, and each was built again from
    32 to 256 nearest seeds, 6 s on the CPU)."""
    if (repaired := regular_cells(xp, seeds, psi, active, lo, hi, capacity, options)) is not None:
        if stop_if_empty and _emptied(xp, repaired, active):
            return _uncertified(xp, repaired)
        return _grown_if_overflowing(xp, repaired, seeds, psi, active, lo, hi, None, capacity, None, stop_if_empty,
                                     options)
    width = max(_compat.to_int(xp.max(previous.count)), 1)
    facets = xp.where(previous.labels[:, :width] >= 0, previous.labels[:, :width], -1)
    rows = xp.arange(seeds.shape[0], dtype=xp.int64, device=aac.device(seeds))
    candidates = _neighbours_and_theirs(xp, facets, rows, active)
    return _from_candidates(xp, seeds, psi, active, lo, hi, capacity, candidates, previous, stop_if_empty, options)


def _from_candidates(xp, seeds, psi, active, lo, hi, capacity, candidates, previous, stop_if_empty, options):
    """Eagerly, the cells clipped by ``candidates`` if they tile the box, else the first cells."""
    dev = aac.device(seeds)
    if candidates is not None:
        cells = _clipped(xp, seeds, psi, active, lo, hi, capacity, candidates)
        if stop_if_empty and _emptied(xp, cells, active):
            return _uncertified(xp, cells)
        if _compat.host_any(xp, tiles_the_box(xp, cells, lo, hi)):
            return _grown_if_overflowing(xp, cells._replace(certified=xp.asarray(True, device=dev)), seeds, psi, active,
                                         lo, hi, candidates, capacity, previous, stop_if_empty, options)
    cells = first_cells(xp, seeds, psi, active, lo, hi, capacity, options)
    return _grown_if_overflowing(xp, cells, seeds, psi, active, lo, hi, None, capacity, None, stop_if_empty, options)


#: Cells whose moved combinatorics are tested before all are moved (:func:`_mostly_turned_over`).
SAMPLED_CELLS = 1024


def _mostly_turned_over(xp, seeds, psi, active, lo, hi, previous, options):
    """Eagerly, whether the moved combinatorics of an evenly spaced sample of
    :data:`SAMPLED_CELLS` cells has three times ``options.local_share_3d`` invalid: then
    neither the moved cells (all valid) nor the local reclip (at most that share invalid)
    would be kept, and moving every cell (0.8 s at 1e5) is skipped for the rebuild. With
    1024 cells the share is known to about 1%: a wrong guess costs only time (the rebuild
    is exact)."""
    n = seeds.shape[0]
    if n < 4 * SAMPLED_CELLS or aac.is_jax_array(seeds):      # (JAX moves every cell in one jitted kernel)
        return False
    rows = xp.arange(0, n, n // SAMPLED_CELLS, dtype=xp.int64, device=aac.device(seeds))
    valid = moved_rows(xp, seeds, psi, lo, hi, previous, rows)
    live = xp.take(active, rows)
    bad = xp.sum(xp.astype(live & ~valid, xp.int64))
    return int(bad) > 3 * options.local_share_3d * max(int(xp.sum(xp.astype(live, xp.int64))), 1)


def _emptied(xp, cells, active):
    """Whether the cell of an active seed is empty (eagerly: a damping trial to reject)."""
    return _compat.host_any(xp, active & (cells.count == 0))


def _uncertified(xp, cells):
    """``cells`` marked as not certified (a rejected trial's, returned as soon as found)."""
    return cells._replace(certified=xp.asarray(False, device=aac.device(cells.count)))


def _reclipped_locally(xp, seeds, psi, active, lo, hi, moved_cells, valid, options):
    """Eagerly, the moved cells with the invalid ones and their neighbours clipped again
    from the box by their neighbours and their invalid neighbours' neighbours (the moved
    cells' facets), certified by the volume sum; None if too many cells are invalid (over
    ``options.local_share_3d``), if an active cell was empty (a cell that may reappear has
    no facet to find its neighbours by) or if a reclipped cell overflows.

    The valid moved cells and the reclipped ones are each cut by a subset of their true
    constraints, so they contain the true cells: their volumes add up to the box's only if
    every one is exact. A flip changes the cells around an edge that shrinks to zero (they
    are invalid) and gives a facet to two of their neighbours, each the other's
    neighbour's neighbour through an invalid cell."""
    n = seeds.shape[0]
    bad = active & ~valid
    n_bad = int(xp.sum(xp.astype(bad, xp.int64)))
    if n_bad == 0 or n_bad > options.local_share_3d * n or _emptied(xp, moved_cells, active):
        return None
    width = int(xp.max(moved_cells.count))
    facets = xp.where(moved_cells.labels[:, :width] >= 0, moved_cells.labels[:, :width], -1)
    bad_rows = xp.nonzero(bad)[0]
    around = xp.reshape(xp.take(facets, bad_rows, axis=0), (-1,))
    rows = xp.unique_values(xp.concat([bad_rows, around[around >= 0]]))
    candidates = _neighbours_and_theirs(xp, facets, rows, bad)
    capacity = moved_cells.labels.shape[1]
    again = _clipped_rows(xp, seeds, psi, active, lo, hi, capacity, rows, candidates)
    if _compat.host_any(xp, again.overflow):
        return None
    volume = _compat.put_rows(xp, integrate.volumes(xp, moved_cells), rows, integrate.volumes(xp, again))
    # the moved vertices were made by :func:`moved`, in place; the other fields are the previous cells'
    cells = Cells(*((_compat.put_rows if field == "vertices" else _compat.set_rows)(xp, whole, rows, part)
                    for field, whole, part in zip(Cells._fields[:-1], moved_cells[:-1], again[:-1])),
                  moved_cells.certified)
    return cells._replace(certified=_volumes_tile(xp, volume, lo, hi) & ~xp.any(cells.overflow))


def _neighbours_and_theirs(xp, facets, rows, bad):
    """For each of the seeds ``rows``: its neighbours (``facets`` (n, W), -1 padding) and
    those of its ``bad`` neighbours, each once, without itself: ``(len(rows), K)``, -1
    padding (pairs ``row * n + seed`` made unique by a sort)."""
    n, m = facets.shape[0], rows.shape[0]
    dev = aac.device(facets)
    first = xp.take(facets, rows, axis=0)
    at = xp.broadcast_to(xp.arange(m, dtype=xp.int64, device=dev)[:, None], first.shape)
    via_bad = (first >= 0) & _compat.flat_take(bad, xp.where(first >= 0, first, 0))
    second = xp.take(facets, first[via_bad], axis=0)
    at = xp.concat([xp.reshape(at, (-1,)), xp.reshape(xp.broadcast_to(at[via_bad][:, None], second.shape), (-1,))])
    seed = xp.concat([xp.reshape(first, (-1,)), xp.reshape(second, (-1,))])
    keep = (seed >= 0) & (seed != xp.take(rows, at))
    pairs = xp.unique_values(at[keep] * n + seed[keep])
    at, seed = pairs // n, pairs % n
    count = _compat.segment_sum(xp, xp.ones_like(at), at, m)
    rank = xp.arange(pairs.shape[0], dtype=xp.int64, device=dev) - xp.take(xp.cumulative_sum(count) - count, at)
    k = max(int(xp.max(count)), 1)
    flat = _compat.set_rows(xp, xp.full((m * k,), -1, dtype=xp.int64, device=dev), at * k + rank, seed)
    return xp.reshape(flat, (m, k))


def _clipped(xp, seeds, psi, active, lo, hi, capacity, candidates):
    """The box clipped by the ``candidates`` of every seed: see :func:`_clipped_rows`."""
    rows = xp.arange(seeds.shape[0], dtype=xp.int64, device=aac.device(seeds))
    return _clipped_rows(xp, seeds, psi, active, lo, hi, capacity, rows, candidates)


def _clipped_rows(xp, seeds, psi, active, lo, hi, capacity, rows, candidates):
    """The cells of the seeds ``rows``: the box clipped by their ``candidates``, in blocks of
    rows (on the host's threads, see :func:`..row_blocks.blockwise`); not certified."""

    def block(rows, candidates):
        start = box_cells(xp, xp.take(seeds, rows, axis=0), lo, hi, xp.take(active, rows), capacity)
        return tuple(clip_by(xp, seeds, psi, active, start, rows, candidates)[:-1])
    parts = row_blocks.blockwise(xp, block, rows, candidates)
    return Cells(*parts, xp.asarray(False, device=aac.device(seeds)))


def first_cells(xp, seeds, psi, active, lo, hi, capacity: int, options=DIAGRAM):
    """Cells without a previous diagram: from the regular triangulation on the host
    (:func:`regular_cells`), else from the ``options.first_candidates_3d`` nearest seeds
    (:func:`nearest_cells`)."""
    cells = regular_cells(xp, seeds, psi, active, lo, hi, capacity, options)
    if cells is None:
        return nearest_cells(xp, seeds, psi, active, lo, hi, capacity, options.first_candidates_3d)
    return cells


def regular_cells(xp, seeds, psi, active, lo, hi, capacity: int, options=DIAGRAM):
    """Every cell from the regular triangulation (Qhull on the host; Delaunay at equal
    weights, 5 times faster than the lifted hull at 1e4): eagerly read off it
    (:func:`.triangulated.triangulated_cells`), hidden seeds' cells empty; under ``jax.jit``
    through a host callback, clipped by the first ``capacity - 6`` neighbours, certified
    by the volume sum. None without a host or if Qhull fails (degenerate inputs). ``options``:
    the :class:`..options.DiagramOptions` (the slabs' threshold and depth)."""
    if _compat.static_shapes(seeds):
        table = seed_neighbours.delaunay_neighbours(xp, seeds, capacity - 6, psi, active)
        if table is None:
            return None
        cells = _clipped(xp, seeds, psi, active, lo, hi, capacity, table)
        return cells._replace(certified=tiles_the_box(xp, cells, lo, hi))
    equal = _compat.on_host(lambda w, a: bool(a.any()) and float(w[a].max() - w[a].min()) == 0.0, psi, active)
    if equal is None:
        return None
    def built(slabs=None):
        found = triangulated_cells(xp, seeds, psi, active, lo, hi, capacity, equal=equal, slabs=slabs, options=options,
                                   clipped_rows=lambda rows, t: _clipped_rows(xp, seeds, psi, active, lo, hi, capacity,
                                                                              rows, t))
        if found is None:
            return None
        cells, table, slabbed = found
        hidden = active & (table[:, 0] < 0) & (xp.sum(xp.astype(active, xp.int64)) > 1)
        cells = cells._replace(size=xp.where(hidden, 0, cells.size), count=xp.where(hidden, 0, cells.count),
                               certified=xp.asarray(True, device=aac.device(seeds)))
        # read in slabs: supersets of the true cells, exact if their volumes tile the box (cells
        # that overflow their slots are built again with more by the caller)
        if not slabbed or _compat.host_any(xp, cells.overflow | _volumes_tile(xp, integrate.volumes(xp, cells), lo, hi)):
            return cells
        return built(slabs=1)
    return built()


def _grown_if_overflowing(xp, cells, seeds, psi, active, lo, hi, candidates, capacity, previous, stop_if_empty,
                          options):
    if capacity >= 1024 or not _compat.host_any(xp, cells.overflow):
        return cells
    grown = (3 * capacity // 2 + 3) // 4 * 4
    return power_cells(xp, seeds, psi, active, lo, hi, candidates, grown, previous, stop_if_empty, options)


def nearest_cells(xp, seeds, psi, active, lo, hi, capacity: int, k: int = DIAGRAM.first_candidates_3d):
    """Every cell clipped by its ``k`` nearest seeds; eagerly, the cells outside the radius
    of security again with twice as many, until all are secure (or hold every seed)."""
    n = seeds.shape[0]
    dev = aac.device(seeds)
    k = min(k, n)
    nearest = seed_neighbours.knn(xp, seeds, k)
    rows = xp.arange(n, dtype=xp.int64, device=dev)
    cells = clip_by(xp, seeds, psi, active, box_cells(xp, seeds, lo, hi, active, capacity), rows, nearest)
    bad = insecure(xp, seeds, psi, active, cells, nearest, k == n)
    if _compat.static_shapes(seeds):
        return cells._replace(certified=~xp.any(bad))
    while _compat.host_any(xp, bad) and k < n:
        k = min(2 * k, n)
        redo, _ = _compat.true_entries(xp, bad)
        wider = seed_neighbours.knn(xp, seeds, k)
        part = clip_by(xp, seeds, psi, active, box_cells(xp, xp.take(seeds, redo, axis=0), lo, hi,
                                                             xp.take(active, redo), capacity),
                       redo, xp.take(wider, redo, axis=0))
        cells = _put(xp, cells, redo, part)
        bad = _compat.set_rows(xp, bad, redo, insecure(xp, seeds, psi, active, part, xp.take(wider, redo, axis=0),
                                                      k == n, redo))
    return cells._replace(certified=xp.asarray(True, device=dev))


def _put(xp, cells, rows, part):
    """``cells`` with the rows ``rows`` replaced by ``part``'s."""
    return cells._replace(**{f: _compat.set_rows(xp, getattr(cells, f), rows, getattr(part, f))
                             for f in cells._fields if f != "certified"})


@_compat.jit_on_jax("complete")
def insecure(xp, seeds, psi, active, cells, nearest, complete, rows=None):
    """Active cells (of the seeds ``rows``, default all) that a seed other than their
    ``nearest`` (m, K) may cut (``complete``: the rows hold every seed; nothing else cuts).

    With ``d_i`` the distance from ``y_i`` to its farthest candidate, every other seed ``j``
    has ``|y_j - y_i| >= d_i``, so at a point ``v`` with ``|v - y_i| = r`` its power
    ``|v - y_j|^2 - psi_j >= (d_i - r)^2 - M`` (``M`` the largest active weight) is at least
    cell i's ``r^2 - psi_i`` while ``r <= (d_i^2 - (M - psi_i)) / (2 d_i)``: a cell whose
    vertices all lie within that radius is exact.
    """
    m, v_cap, _ = cells.vertices.shape
    dev = aac.device(cells.size)
    if rows is None:
        rows = xp.arange(m, dtype=xp.int64, device=dev)
    y = xp.take(seeds, rows, axis=0)
    w = xp.take(psi, rows)
    safe = xp.where(nearest >= 0, nearest, 0)
    gap = _compat.flat_take(seeds, safe) - y[:, None, :]
    d = xp.sqrt(xp.max(xp.where(nearest >= 0, _compat.dot(gap, gap), 0.0), axis=1))
    top = xp.max(xp.where(active, psi, -xp.inf))
    radius = (d * d - (top - w)) / xp.where(d > 0, 2.0 * d, 1.0)
    far = xp.max(xp.where(live_vertices(xp, cells), _compat.dot(cells.vertices, cells.vertices), 0.0), axis=1)
    margin = 64.0 * xp.finfo(seeds.dtype).eps * (d * d + xp.abs(top) + xp.abs(w))
    secure = (radius >= 0) & (far <= radius * radius - margin)
    return xp.take(active, rows) & ~secure & (not complete)


def tiles_the_box(xp, cells, lo, hi):
    """Whether the cells' volumes add up to the box's, up to rounding (see the module
    docstring): then every cell is exact."""
    return _volumes_tile(xp, integrate.volumes(xp, cells), lo, hi) & ~xp.any(cells.overflow)


def _volumes_tile(xp, vol, lo, hi):
    """Whether the cells' volumes ``vol`` add up to the box's, up to rounding."""
    box = xp.prod(hi - lo)
    tol = 64.0 * xp.finfo(vol.dtype).eps * (box + xp.sum(xp.abs(vol))) * max(1.0, float(vol.shape[0]) ** 0.5)
    return xp.abs(xp.sum(vol) - box) <= tol


def c_transform(xp, seeds, cells, psi):
    """``min_x |x - y_i|^2 - phi(x)`` over the box for every Dirac i, shape (n,): see
    :func:`..gradients.c_transform_at_vertices` (the live vertices)."""
    return gradients.c_transform_at_vertices(xp, seeds, cells.vertices, live_vertices(xp, cells), psi)
