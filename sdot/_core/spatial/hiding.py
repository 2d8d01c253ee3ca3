"""The hiding step in 3D: the shortest Newton step length that certainly empties a cell.

As in 2D (:mod:`..planar.hiding`): a trial beyond it is certainly rejected, so the damping
starts below it (:mod:`..newton`); the fans (:func:`fans`) do not depend on the Newton
direction and are computed while it is solved for. Each vertex of cell i is the power
centre of a tetrahedron ``(i, a, b, c)`` of the regular triangulation (its three facets'
neighbours): the link of seed i. The tetrahedra tested join the lowest lifted neighbour
``j0`` of the cell to each link triangle ``(a, b, c)``; the first that contains ``y_i``,
with seed i's lifted point below its lifted plane, is kept (:func:`..hiding.first_hidden`
finds when that point crosses it). Any four seeds whose tetrahedron contains ``y_i`` give a
certificate, whether or not their triangle is a true link triangle (a vertex where more
than three facets meet is several vertices at one point). Cells on the box's sides have
link triangles with a side instead of a seed: those are skipped, and a cell none of whose
tetrahedra contains its seed gives no bound (``gap = inf``).
"""
from __future__ import annotations

import array_api_compat as aac

from .. import _compat, row_blocks
from ..hiding import first_hidden, first_hidden_of_seeds, hidden_times

#: Vertex slots of the first pass over the cells (then all slots of the cells with more):
#: uniform seeds have 27 vertices per cell on average, 46 at the 99th percentile.
NARROW = 40


def fans(xp, seeds, psi, active, cells):
    """What :func:`hiding_step` needs besides the direction: per cell of ``cells`` (the
    diagram at ``psi``) the tetrahedron of neighbours ``(j0, a, b, c)`` that contains its seed
    ``(n, 4)``, the seed's barycentric coordinates in it ``(n, 4)`` and its lifted height
    above the tetrahedron's lifted plane, less a rounding tolerance (``gap < 0``; ``inf``
    where no tetrahedron contains the seed below its plane), ``(n,)``."""
    if (found := _compiled_fans(xp, seeds, psi, active, cells)) is not None:
        return found
    n = cells.count.shape[0]
    rows = xp.arange(n, dtype=xp.int64, device=aac.device(cells.count))
    return row_blocks.slotwise(xp, lambda size, r, lab, count, corners: _tetra_geometry(
        xp, seeds, psi, active, r, lab, count, size, corners),
        cells.size, (rows, cells.labels, cells.count), (cells.corners,), (None, None, None), slots=NARROW)


def _compiled_fans(xp, seeds, psi, active, cells):
    """Eagerly on the host, :func:`fans` by the compiled kernel (:mod:`sdot._host.compiled.hiding3d`:
    the same numbers, cell by cell); None where it does not run."""
    def kernel(*host):
        from ..._host.compiled import hiding3d

        return hiding3d.fans(*host)
    return _compat.compiled_call(xp, kernel, seeds, psi, active, cells.labels, cells.count, cells.size, cells.corners)


def hiding_step(xp, seeds, psi, d, active, cells, fans_at_psi=None, owner=None):
    """The smallest ``t > 0`` at which a seed is certainly hidden (its cell empty) at
    weights ``psi + t d``, by the tetrahedra of :func:`fans` of ``cells`` (the diagram at
    ``psi``), a 0-d array (``inf`` if none). ``fans_at_psi``: :func:`fans` of these cells
    if computed already, or a handle of :func:`..row_blocks.in_background` computing them.
    ``owner``: the seed of each site when the seeds are the sites of a periodic domain (a
    seed hidden once all its sites are, :func:`..hiding.first_hidden_of_seeds`).
    A cell may empty earlier (through other tetrahedra): this bounds from above the first
    ``t`` that empties a cell; the damping places its first trial below it."""
    if fans_at_psi is None:
        fans_at_psi = fans(xp, seeds, psi, active, cells)
    corners, weights, gap = row_blocks.background_result(fans_at_psi)
    if owner is None:
        return first_hidden(xp, d, active, corners, weights, gap)
    return first_hidden_of_seeds(xp, hidden_times(xp, d, active, corners, weights, gap), owner, active, cells.count)


def _cross(a, b):
    """``a x b`` of vectors given by their coordinates (three arrays each)."""
    return a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]


def _dot(a, b):
    return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]


@_compat.jit_on_jax()
def _tetra_geometry(xp, seeds, psi, active, rows, labels, count, size, corners):
    """Kernel of :func:`fans` for the cells ``rows`` (their ``labels`` (m, F) and ``count``,
    ``size`` vertex slots of ``corners`` (m, V, 3) in use): ``(corners, weights, gap)``."""
    dev = aac.device(labels)
    n_facets, n_vertices = labels.shape[1], corners.shape[1]
    k = xp.arange(n_facets, dtype=xp.int64, device=dev)[None, :]
    j = xp.where((k < count[:, None]) & (labels >= 0), labels, -1)
    j = xp.where((j >= 0) & _compat.flat_take(active, xp.where(j >= 0, j, 0)), j, -1)
    safe = xp.where(j >= 0, j, 0)
    p = [_compat.flat_take(seeds[:, a], safe) - xp.take(seeds[:, a], rows)[:, None] for a in range(3)]
    z = _dot(p, p) - _compat.flat_take(psi, safe)              # lifted, relative to seed i
    first = xp.argmin(xp.where(j >= 0, z, xp.inf), axis=1)[:, None]     # j0, the fans' apex
    j0 = xp.take_along_axis(j, first, axis=1)
    p0 = [xp.take_along_axis(c, first, axis=1) for c in p]
    z0 = xp.take_along_axis(z, first, axis=1)
    v = xp.arange(n_vertices, dtype=xp.int64, device=dev)[None, :]
    used = v < size[:, None]
    slot = [xp.where(used, corners[:, :, m], 0) for m in range(3)]   # the vertex's facets
    ids = [xp.where(used, xp.take_along_axis(j, s, axis=1), -1) for s in slot]
    pa, pb, pc = ([xp.take_along_axis(c, s, axis=1) for c in p] for s in slot)
    # six times the signed volumes of the tetrahedra (j0, a, b, c) with one corner moved to seed i
    bc, ca, ab = _cross(pb, pc), _cross(pc, pa), _cross(pa, pb)
    v0, va, vb, vc = _dot(pa, bc), -_dot(p0, bc), -_dot(p0, ca), -_dot(p0, ab)
    det = v0 + va + vb + vc
    inside = (det > 0) & (v0 >= 0) & (va >= 0) & (vb >= 0) & (vc >= 0) | (
        (det < 0) & (v0 <= 0) & (va <= 0) & (vb <= 0) & (vc <= 0))
    valid = inside & (j0 >= 0)
    for m in ids:
        valid = valid & (m >= 0) & (m != j0)
    kept = xp.argmax(xp.astype(valid, xp.int8), axis=1)[:, None]        # the first such tetrahedron
    at = lambda x: xp.take_along_axis(x, kept, axis=1)[:, 0]
    found = at(valid)
    divisor = xp.where(found, at(det), 1.0)
    weights = xp.stack([at(x) / divisor for x in (v0, va, vb, vc)], axis=1)    # seed i's barycentric coordinates
    corner = [xp.where(j0[:, 0] >= 0, j0[:, 0], 0)] + [xp.where(at(m) >= 0, at(m), 0) for m in ids]
    heights = [z0[:, 0]] + [xp.take_along_axis(z, at(s)[:, None], axis=1)[:, 0] for s in slot]
    zi = -xp.take(psi, rows)
    tol = 64.0 * xp.finfo(z.dtype).eps * (sum(xp.abs(h) for h in heights) + xp.abs(zi))
    gap = zi - sum(weights[:, m] * heights[m] for m in range(4)) - tol
    corners_out = xp.stack(corner, axis=1)
    return corners_out, weights, xp.where(found & (gap < 0), gap, xp.inf)
