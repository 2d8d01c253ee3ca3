"""The hiding step's last part, the same in every dimension.

A geometry's ``fans`` give, per seed i, a simplex of ``d + 1`` neighbours (``corners``)
that contains ``y_i``, the barycentric coordinates ``l`` of ``y_i`` in it (``weights``) and
the height of seed i's lifted point ``(y_i, |y_i|^2 - psi_i)`` above the simplex's lifted
hyperplane (``gap < 0``: below it, as a seed with a cell is; ``inf``: no simplex). The
seed is hidden (its cell empty) once its lifted point rises above that hyperplane: the
lower hull of the other lifted seeds is below it over the simplex. Along ``psi + t d`` the
height is ``gap + t slope``, ``slope = sum_k l_k d_k - d_i`` (the coordinates do not depend
on the weights).
"""
from __future__ import annotations

import array_api_compat as aac

from . import _compat


@_compat.jit_on_jax()
def first_hidden(xp, d, active, corners, weights, gap):
    """The smallest ``t > 0`` at which a seed is certainly hidden along ``d`` (``inf`` if
    none), from its fan's ``corners`` (n, d + 1), ``weights`` (n, d + 1) and ``gap`` (n,)."""
    return xp.min(hidden_times(xp, d, active, corners, weights, gap))


@_compat.jit_on_jax()
def hidden_times(xp, d, active, corners, weights, gap):
    """Per seed, the ``t > 0`` at which it is certainly hidden along ``d`` (``inf``: none)."""
    slope = _compat.row_sum(xp, weights * _compat.flat_take(d, corners)) - d
    hits = active & (slope > 0) & (gap < 0)
    return xp.where(hits, -gap / xp.where(hits, slope, 1.0), xp.inf)


def first_hidden_of_seeds(xp, times, owner, active, count):
    """The smallest ``t`` at which a seed is certainly hidden when its cell is the union of the
    cells of its sites (on a periodic domain, the seed and its images: ``owner`` (n',) the seed
    of each site): that of its last nonempty site (``times`` per site, :func:`hidden_times`; the
    ``active`` sites of empty cells, ``count == 0``, as hidden already; a seed all of whose sites
    are, hidden before the step, bounds nothing, as in the plane). A piece of a cell across a side
    vanishing hides no seed."""
    times = xp.where(active & (count == 0), xp.full_like(times, -xp.inf), times)
    order = xp.argsort(times, stable=True)
    order = xp.take(order, xp.argsort(xp.take(owner, order), stable=True))     # by seed, each by time
    seeds = xp.take(owner, order)
    n = int(xp.max(owner)) + 1
    last = xp.searchsorted(seeds, xp.arange(n, dtype=seeds.dtype, device=aac.device(seeds)), side="right") - 1
    per_seed = xp.take(xp.take(times, order), last)
    return xp.min(xp.where(per_seed == -xp.inf, xp.inf, per_seed))
