"""The hiding step: the shortest Newton step length that certainly empties a cell.

A trial beyond it is certainly rejected (a Dirac with an empty cell), so the damping
starts below it (:mod:`.newton`). One pass over the cells of the current diagram, on
every backend and under ``jax.jit``.
"""
from __future__ import annotations

import array_api_compat as aac

from . import _compat
from .polygons import offsets


def hiding_step(xp, seeds, psi, d, active, cells):
    """The smallest ``t > 0`` at which a seed is certainly hidden (its cell empty) at
    weights ``psi + t d``, by a test on the neighbours in ``cells`` (the diagram at
    ``psi``), a 0-d array (``inf`` if none).

    Seed i is hidden when its lifted point ``(y_i, |y_i|^2 - psi_i)`` lies above the
    plane of three other lifted seeds over a triangle that contains ``y_i`` (the lower
    hull is below that plane there). The triangles tested fan out from the lowest lifted
    neighbour of each cell through its consecutive pairs. Over a triangle, the height of
    the lifted seed i above the plane is affine in ``t`` (the barycentric coordinates do
    not depend on the weights): it crosses zero at ``t = -gap / slope``. A cell may
    empty earlier (through triangles of other seeds): this bounds from above the first
    ``t`` that empties a cell; the damping places its first trial below it.
    """
    n = cells.count.shape[0]
    rows = xp.arange(n, dtype=xp.int64, device=aac.device(cells.count))
    per_cell = _compat.slotwise(xp, lambda c, r, lab: _fan_step(xp, seeds, psi, d, active, r, lab, c),
                                cells.count, (rows,), (cells.labels,), (None,))
    return xp.min(per_cell)


@_compat.jit_on_jax()
def _fan_step(xp, seeds, psi, d, active, rows, labels, count):
    """Kernel of :func:`hiding_step` for the cells ``rows``: the ``t`` of each, (n,).

    Over the fan triangles ``a, b, c`` of cell i (``l``: the barycentric coordinates of
    ``y_i``), the height of the lifted seed i above their plane, less a rounding
    tolerance, is ``gap + t slope`` with ``slope = l_a d_a + l_b d_b + l_c d_c - d_i``.
    """
    n, cap = labels.shape
    k = xp.arange(cap, dtype=xp.int64, device=aac.device(labels))[None, :]
    j = xp.where((k < count[:, None]) & (labels >= 0), labels, -1)
    j = xp.where((j >= 0) & _compat.flat_take(active, xp.where(j >= 0, j, 0)), j, -1)
    safe = xp.where(j >= 0, j, 0)
    x, y = offsets(xp, seeds, rows, safe)
    z = x * x + y * y - _compat.flat_take(psi, safe)         # lifted, relative to seed i
    dz = _compat.flat_take(d, safe)
    first = xp.argmin(xp.where(j >= 0, z, xp.inf), axis=1)[:, None]    # the fan's origin
    ax, ay, za, dza = (xp.take_along_axis(v, first, axis=1) for v in (x, y, z, dz))
    bx, by, cx, cy = x[:, :-1], y[:, :-1], x[:, 1:], y[:, 1:]
    # barycentric coordinates of the origin (seed i) in the triangle a, b, c
    det = (bx - ax) * (cy - ay) - (by - ay) * (cx - ax)
    divisor = xp.where(det != 0, det, 1.0)
    lb = ((cx - ax) * ay - (cy - ay) * ax) / divisor
    lc = ((by - ay) * ax - (bx - ax) * ay) / divisor
    la = 1.0 - lb - lc
    valid = (xp.take_along_axis(j, first, axis=1) >= 0) & (j[:, :-1] >= 0) & (j[:, 1:] >= 0) & (det != 0)
    inside = valid & (la >= 0) & (lb >= 0) & (lc >= 0)
    zb, zc = z[:, :-1], z[:, 1:]
    zi = -xp.take(psi, rows)[:, None]
    tol = 64.0 * xp.finfo(z.dtype).eps * (xp.abs(za) + xp.abs(zb) + xp.abs(zc) + xp.abs(zi))
    gap = zi - (la * za + lb * zb + lc * zc) - tol
    slope = la * dza + lb * dz[:, :-1] + lc * dz[:, 1:] - xp.take(d, rows)[:, None]
    hits = inside & (slope > 0) & (gap < 0)
    t = xp.where(hits, -gap / xp.where(hits, slope, 1.0), xp.inf)
    return xp.where(xp.take(active, rows), _compat.row_min(xp, t), xp.inf)
