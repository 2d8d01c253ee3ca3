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

from . import _compat


@_compat.jit_on_jax()
def first_hidden(xp, d, active, corners, weights, gap):
    """The smallest ``t > 0`` at which a seed is certainly hidden along ``d`` (``inf`` if
    none), from its fan's ``corners`` (n, d + 1), ``weights`` (n, d + 1) and ``gap`` (n,)."""
    slope = _compat.row_sum(xp, weights * _compat.flat_take(d, corners)) - d
    hits = active & (slope > 0) & (gap < 0)
    return xp.min(xp.where(hits, -gap / xp.where(hits, slope, 1.0), xp.inf))
