"""The hiding step: the shortest Newton step length that certainly empties a cell.

A trial beyond it is certainly rejected (a Dirac with an empty cell), so the damping
starts below it (:mod:`..newton`). One pass over the cells of the current diagram, on
every backend and under ``jax.jit``, in two parts: the fan triangles and their gaps
(:func:`fans`, which do not depend on the Newton direction: :mod:`..newton` computes them
while the direction is solved for on the host), then the ``t`` of each
(:func:`hiding_step`).
"""
from __future__ import annotations

import array_api_compat as aac

from .. import _compat, row_blocks
from ..hiding import first_hidden, first_hidden_of_seeds, hidden_times
from .polygons import offsets


def fans(xp, seeds, psi, active, cells):
    """What :func:`hiding_step` needs besides the direction: per cell of ``cells`` (the
    diagram at ``psi``), the fan triangle ``a, b, c`` of neighbours that contains its seed
    (the seeds ``(n, 3)``), the seed's barycentric coordinates in it ``(n, 3)`` and its
    lifted height above the triangle's plane, less a rounding tolerance (``gap < 0``;
    ``inf`` where no fan triangle contains the seed below its plane), ``(n,)``."""
    n = cells.count.shape[0]
    rows = xp.arange(n, dtype=xp.int64, device=aac.device(cells.count))
    return row_blocks.slotwise(xp, lambda c, r, lab: _fan_geometry(xp, seeds, psi, active, r, lab, c),
                            cells.count, (rows,), (cells.labels,), (None, None, None))


def hiding_step(xp, seeds, psi, d, active, cells, fans_at_psi=None, owner=None):
    """The smallest ``t > 0`` at which a seed is certainly hidden (its cell empty) at
    weights ``psi + t d``, by a test on the neighbours in ``cells`` (the diagram at
    ``psi``), a 0-d array (``inf`` if none). ``fans_at_psi``: :func:`fans` of these
    cells if computed already, or a handle of :func:`..row_blocks.in_background` computing them.
    ``owner``: the seed of each site when the seeds are the sites of a periodic domain (a
    seed hidden once all its sites are, :func:`..hiding.first_hidden_of_seeds`).

    Seed i is hidden when its lifted point ``(y_i, |y_i|^2 - psi_i)`` lies above the
    plane of three other lifted seeds over a triangle that contains ``y_i`` (the lower
    hull is below that plane there). The triangles tested fan out from the lowest lifted
    neighbour of each cell through its consecutive pairs; the first that contains ``y_i``
    is kept (it is the only one, up to ties on an edge: measured on every cell of box and
    Gaussian solves at 1e4). Over it, the height of the lifted seed i above the plane is
    affine in ``t`` (the barycentric coordinates do not depend on the weights): it
    crosses zero at ``t = -gap / slope``. A cell may empty earlier (through triangles of
    other seeds): this bounds from above the first ``t`` that empties a cell; the damping
    places its first trial below it.
    """
    if fans_at_psi is None:
        fans_at_psi = fans(xp, seeds, psi, active, cells)
    corners, weights, gap = row_blocks.background_result(fans_at_psi)
    if owner is None:
        return first_hidden(xp, d, active, corners, weights, gap)
    return first_hidden_of_seeds(xp, hidden_times(xp, d, active, corners, weights, gap), owner, active, cells.count)


@_compat.jit_on_jax()
def _fan_geometry(xp, seeds, psi, active, rows, labels, count):
    """Kernel of :func:`fans` for the cells ``rows``: ``(corners, weights, gap)``."""
    n, cap = labels.shape
    k = xp.arange(cap, dtype=xp.int64, device=aac.device(labels))[None, :]
    j = xp.where((k < count[:, None]) & (labels >= 0), labels, -1)
    j = xp.where((j >= 0) & _compat.flat_take(active, xp.where(j >= 0, j, 0)), j, -1)
    safe = xp.where(j >= 0, j, 0)
    x, y = offsets(xp, seeds, rows, safe)
    z = x * x + y * y - _compat.flat_take(psi, safe)         # lifted, relative to seed i
    first = xp.argmin(xp.where(j >= 0, z, xp.inf), axis=1)[:, None]    # the fan's origin
    ax, ay, za = (xp.take_along_axis(v, first, axis=1) for v in (x, y, z))
    bx, by, cx, cy = x[:, :-1], y[:, :-1], x[:, 1:], y[:, 1:]
    # barycentric coordinates of the origin (seed i) in the triangle a, b, c, as the areas of
    # its triangles with two corners over their sum: no products of a far corner's
    # coordinates that cancel (a Dirac 1e6 away: the differences' form lost 8 digits, and
    # its rounding, as large as the gap of a seed next to the far cell, halted the steps)
    cbc, cca, cab = bx * cy - by * cx, cx * ay - cy * ax, ax * by - ay * bx
    det = cbc + cca + cab
    divisor = xp.where(det != 0, det, 1.0)
    la, lb, lc = cbc / divisor, cca / divisor, cab / divisor
    valid = (xp.take_along_axis(j, first, axis=1) >= 0) & (j[:, :-1] >= 0) & (j[:, 1:] >= 0) & (det != 0)
    zb, zc = z[:, :-1], z[:, 1:]
    zi = -xp.take(psi, rows)[:, None]
    tol = 64.0 * xp.finfo(z.dtype).eps * (xp.abs(za) + xp.abs(zb) + xp.abs(zc) + xp.abs(zi))
    gap = zi - (la * za + lb * zb + lc * zc) - tol
    below = valid & (la >= 0) & (lb >= 0) & (lc >= 0) & (gap < 0)
    kept = xp.argmax(xp.astype(below, xp.int8), axis=1)[:, None]        # the first such triangle
    la, lb, lc, gap = (xp.take_along_axis(v, kept, axis=1)[:, 0] for v in (la, lb, lc, xp.where(below, gap, xp.inf)))
    corners = xp.concat([xp.take_along_axis(safe, first, axis=1),
                         xp.take_along_axis(safe, xp.concat([kept, kept + 1], axis=1), axis=1)], axis=1)
    return corners, xp.stack([la, lb, lc], axis=1), gap
