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
distance ``>= b`` of the box, cannot own a point of the cell of site ``c`` if ``(b + g_c)^2 -
psi_z >= R_c^2 - psi_c`` (``R_c``: the cell's farthest vertex from its site, ``g_c``: the
cell's distance to the sides), :func:`margin_needed`; :func:`evaluate` grows the sites until
it holds. Eager only (the number of sites depends on the data).
"""
from __future__ import annotations

import itertools
from typing import NamedTuple

import array_api_compat as aac

from . import _compat
from .options import DIAGRAM


class ImageTable(NamedTuple):
    """The images of the seeds that may own a point of the box, nearest first: their seed
    ``owner`` (m,), their ``shift`` (m, d) in periods and their distance ``beyond`` (m,) the
    box."""

    owner: object
    shift: object
    beyond: object


def wrapping(prob):
    """Per axis whether the domain of ``prob`` wraps around it (a tuple of booleans), None in
    the plane."""
    return None if prob.period is None else tuple(float(p) > 0 for p in prob.period)


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
    _NEEDED.clear()
    return table


#: The most sites an evaluation of the last problem needed (by the id of its table): the next
#: evaluations start there, instead of finding again that fewer do not do.
_NEEDED = {}


def sites_needed(table, count=None):
    """The most sites an evaluation with ``table`` needed so far (``count``: one more did)."""
    if count is not None:
        _NEEDED[id(table)] = max(count, _NEEDED.get(id(table), 0))
    return _NEEDED.get(id(table), 0)


def sites_of(xp, prob, cells, units=None):
    """``(sites, owner)`` of ``cells``, a diagram of ``prob`` on its periodic domain (its rows:
    the seeds, then the first images of :func:`table_of`); ``units``: the problem whose
    diagram it was, in other coordinates (its table's images, ``prob``'s positions)."""
    table = table_of(xp, prob if units is None else units)
    return sites(xp, prob.seeds, prob.period, table, cells.labels.shape[0])


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


def margin_needed(xp, cells, sites, psi_sites, active_sites, n, lo, hi, period, table, diagram=None):
    """``(margin, exact)``: the distance beyond the box from which no image left out of the
    diagram (the rows of ``table`` after the sites', the ``n`` seeds and the first ``len(sites)
    - n`` rows) can own a point of its cells (the diagram is exact if the first image left out is
    that far), and whether it is that of an image that may (else a bound).

    Cell ``c`` gives its points a power at most ``R_c^2 - psi_c`` (``R_c``: its farthest vertex
    from its site); an image ``z`` at ``b`` beyond the box is at least ``b + g_c`` from every
    point of the cell, ``g_c >= s_c - R_c`` (``s_c``: the site's distance to the periodic sides),
    and beats none of them if ``(b + g_c)^2 - psi_z >= R_c^2 - psi_c``: the bound is the largest
    ``sqrt(R_c^2 - psi_c + max psi) - g_c`` over the nonempty active cells. Where it is not met,
    on the host, each cell is tested against the images left out near it, with their own
    weights, at its vertices (:mod:`sdot._host.periodic_reach`), or where weights vary too much
    for that, each image by a descent over the cells (:mod:`sdot._host.compiled.descent`): the
    margin is then that of the farthest image that may own a point (0 if none). ``diagram``: the
    :class:`.options.DiagramOptions` (the default's if None)."""
    diagram = DIAGRAM if diagram is None else diagram
    dev = aac.device(sites)
    r2 = radii2(xp, cells)
    side = xp.full(sites.shape[:1], xp.inf, dtype=sites.dtype, device=dev)
    for a in range(sites.shape[1]):     # by axis: a reduction over a short last axis is slow in NumPy
        if float(period[a]) > 0:
            side = xp.minimum(side, xp.minimum(sites[:, a] - lo[a], hi[a] - sites[:, a]))
    used = active_sites & (cells.count > 0)
    top = xp.max(xp.where(active_sites, psi_sites, -xp.inf))
    reach = xp.sqrt(xp.maximum(r2 - psi_sites + top, 0.0)) - xp.maximum(side - xp.sqrt(r2), 0.0)
    bound = float(xp.maximum(xp.max(xp.where(used, reach, -xp.inf)), 0.0))
    k, m = sites.shape[0] - n, table.beyond.shape[0]
    within = images_within(xp, table, bound)            # the images left out that may own a point
    if within <= k:
        return bound, False
    rows = xp.arange(k, within, dtype=xp.int64, device=dev)
    owner = table.owner[k:within]
    images = xp.take(sites[:n, :], owner, axis=0) + table.shift[k:within, :] * period
    from .._host import periodic_reach

    def test(sites, r2, psi_sites, used, side, images, psi_images, beyond, rows, active_sites, table_owner):
        memory = periodic_reach.descent_memory(id(table), m, table)
        memory.drifted(psi_sites[:n], active_sites[:n], table_owner, active_sites, used)
        return periodic_reach.left_out_owners(sites, r2, psi_sites, used, side, images, psi_images, beyond,
                                              support=_support_function(cells),
                                              descend=_descent_function(cells, sites, psi_sites), memory=memory,
                                              groups=diagram.periodic_groups, pairs=diagram.periodic_pairs, rows=rows)

    owning = _compat.on_host(test, sites, r2, psi_sites, used, side, images, xp.take(psi_sites[:n], owner),
                             table.beyond[k:within], rows, active_sites, table.owner)
    if owning is None:                  # not on the host, or a search too wide: the bound
        return bound, False
    beyond = xp.where(xp.asarray(owning, device=dev), table.beyond[k:within], 0.0)
    return float(xp.max(beyond)), True


def evaluate(xp, prob, psi, active, capacity, previous, diagram, trial):
    """``(cells, moments, facet)`` of :func:`.evaluation.evaluate` on a periodic domain: the
    diagram of the sites (:func:`diagram_of_sites`), its moments folded onto the seeds, its
    cells and facet integrals the sites'."""
    cells, site_positions, owner = diagram_of_sites(xp, prob, psi, active, capacity, previous, diagram, trial)
    moments, facet = prob.density.integrals(xp, site_positions, cells)
    return cells, folded_rows(xp, moments, owner, prob.seeds.shape[0]), facet


def diagram_of_sites(xp, prob, psi, active, capacity=None, previous=None, diagram=None, trial=False):
    """``(cells, sites, owner)``: the power diagram in the box of the seeds and as many of their
    images as the cells need at weights ``psi``, the sites and the seed of each.

    The images: as many as ``previous`` had or an earlier evaluation of the problem needed
    (:func:`sites_needed`), at least those within ``diagram.periodic_margin`` mean spacings of
    the box (``diagram``: the :class:`.options.DiagramOptions`, the default's if None); on the
    circle (1D) every image within half a period. If :func:`margin_needed` finds
    that an image left out may own a point, the images within ``diagram.periodic_growth``
    times its distance (within its bound, if only bounded) are taken and the diagram built again. A ``trial``'s
    sites are not remembered for the next evaluations (an accepted trial's are, as their
    ``previous``)."""
    from . import geometry

    diagram = DIAGRAM if diagram is None else diagram
    n, dim = prob.seeds.shape
    geom = geometry.of(dim)
    capacity = geom.CAPACITY if capacity is None else capacity
    table = table_of(xp, prob)
    if dim == 1:                        # the circle: every image within half a period (at most 2 n)
        site_positions, owner = sites(xp, prob.seeds, prob.period, table, n + table.owner.shape[0])
        cells = geom.power_cells(xp, site_positions, xp.take(psi, owner), xp.take(active, owner), prob.lo, prob.hi)
        return cells, site_positions, owner
    if previous is not None:
        count = previous.labels.shape[0]
    else:
        spacing = float(xp.prod(prob.hi - prob.lo) / n) ** (1.0 / dim)
        count = n + images_within(xp, table, diagram.periodic_margin[dim - 2] * spacing)
    count = max(count, sites_needed(table))
    while True:
        site_positions, owner = sites(xp, prob.seeds, prob.period, table, count)
        psi_sites, active_sites = xp.take(psi, owner), xp.take(active, owner)
        same = previous is not None and previous.labels.shape[0] == count
        cells = geom.power_cells(xp, site_positions, psi_sites, active_sites, prob.lo, prob.hi, None, capacity,
                                 previous=previous if same else None, options=diagram)
        need, exact = margin_needed(xp, cells, site_positions, psi_sites, active_sites, n, prob.lo, prob.hi,
                                    prob.period, table, diagram)
        if margin_of(table, count, n) >= need:
            break
        count = max(n + images_within(xp, table, (diagram.periodic_growth if exact else 1.0) * need), count + 1)
        if not trial:
            sites_needed(table, count)
    return cells, site_positions, owner


def _support_function(cells):
    """``support(cells, directions)`` of :func:`sdot._host.periodic_reach.reach_of_left_out` by the
    compiled kernel (:mod:`sdot._host.compiled.radii`) on the host's copies of ``cells``, or None
    where it does not run."""
    from .._host import compiled
    from .._host.compiled import radii

    arrays = (cells.vertices, cells.count) + ((cells.size, cells.corners) if cells.vertices.shape[-1] == 3 else ())
    host = [_compat.host_view(a) for a in arrays]
    if any(h is None for h in host) or not compiled.enabled():
        return None
    vertices, count, *spatial = host
    size, corners = spatial if spatial else (None, None)
    return lambda c, e: radii.support(vertices, count, size, corners, c, e)


def _descent_function(cells, sites, psi_sites):
    """``descend(images, weights, starts, ends, least)`` of :func:`sdot._host.periodic_reach.left_out_owners` by
    the compiled descent (:mod:`sdot._host.compiled.descent`) over the host's copies of ``cells``
    (of ``sites``, weights ``psi_sites``), or None where it does not run."""
    from .._host import compiled
    from .._host.compiled import descent

    spatial = cells.vertices.shape[-1] == 3
    arrays = (sites, psi_sites, cells.vertices, cells.count, cells.labels) + ((cells.size, cells.corners) if spatial
                                                                             else ())
    host = [_compat.host_view(a) for a in arrays]
    if any(h is None for h in host) or not compiled.enabled():
        return None
    return lambda images, weights, starts, ends, least: descent.owners(images, weights, starts, *host, ends=ends,
                                                                       least=least)


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


def radii2(xp, cells):
    """The squared distance from each cell's site to its farthest vertex, (n,): by the compiled
    kernel (:mod:`sdot._host.compiled.radii`) where it runs, else by array operations."""
    from .._host.compiled import radii

    if cells.vertices.shape[-1] == 3:
        found = _compat.compiled_call(xp, lambda *a: (radii.spatial(*a),), cells.vertices, cells.size, cells.corners)
    else:
        found = _compat.compiled_call(xp, lambda *a: (radii.planar(*a),), cells.vertices, cells.count)
    if found is not None:
        return found[0]
    live = _live_vertices(xp, cells)
    v = cells.vertices
    return xp.max(xp.where(live, v[..., 0] * v[..., 0] + v[..., 1] * v[..., 1]
                           + (v[..., 2] * v[..., 2] if v.shape[-1] == 3 else 0.0), 0.0), axis=1)


def _live_vertices(xp, cells):
    """The vertex slots in use (n, V) of 2D or 3D ``cells``."""
    if cells.vertices.shape[-1] == 3:
        from .spatial.diagram import live_vertices

        return live_vertices(xp, cells)
    k = xp.arange(cells.vertices.shape[1], dtype=xp.int64, device=aac.device(cells.count))[None, :]
    return k < cells.count[:, None]
