"""Power cells on a line: intervals, from the weights or from the closed form.

Cell ``i`` of seeds ``y`` (n, 1) with weights ``psi`` is the interval of the domain
``[lo, hi]`` where ``(x - y_i)^2 - psi_i`` is the smallest. The power functions are
``x^2 - 2 x y_i + (y_i^2 - psi_i)``: up to ``x^2``, lines of slopes ``-2 y_i``, so sorted
by position the cells come in the same order, and consecutive seeds ``j < k`` of the lower
envelope meet at

    x_jk = (y_j + y_k) / 2 - (psi_k - psi_j) / (2 (y_k - y_j)).

A seed is hidden (its cell empty) when ``x_jk >= x_kl`` for its neighbours ``j, l`` on
the envelope: :func:`power_cells` removes such seeds round after round (all of a round
at once, which is safe: each is above the chord of two others), a sort per round, until
none is left; usually one or two rounds (at most n).
"""
from __future__ import annotations

from typing import NamedTuple

import array_api_compat as aac

from .. import _compat

#: The slots of a cell: its two ends.
CAPACITY = 2


class Intervals(NamedTuple):
    """Cells on a line: ``vertices`` (n, 2, 1) the left and right ends relative to the
    seeds, ``labels`` (n, 2) the neighbour across each end (-1: the domain's lower end,
    -2: its upper end), ``count`` (n,) 2 (0: an empty cell), ``overflow`` (n,) and
    ``certified`` () flags (never overflowing, always certified)."""

    vertices: object
    labels: object
    count: object
    overflow: object
    certified: object


def live_order(xp, y, live):
    """``(order, keys, n_live)``: the indices of the ``live`` entries of ``y`` (n,) by
    position (stable), then the others; ``keys`` the positions in that order (``inf``
    for the others); ``n_live`` how many are live (0-d int64)."""
    key = xp.where(live, y, xp.inf)
    order = xp.argsort(key, stable=True)
    return order, xp.take(key, order), xp.sum(xp.astype(live, xp.int64))


def clamp(xp, x, low, high):
    return xp.minimum(xp.maximum(x, low), high)


def inverse_permutation(xp, order):
    """The permutation that undoes ``order``."""
    return xp.argsort(order, stable=True)


def intervals(xp, seeds, order, left, right, live, previous, following):
    """:class:`Intervals` from per-position arrays in ``order`` (n,): the ends ``left`` and
    ``right`` (absolute), which positions hold a ``live`` cell, and the labels across
    each end (``previous``, ``following``), brought back to the seeds' order."""
    n = seeds.shape[0]
    dev = aac.device(seeds)
    back = inverse_permutation(xp, order)
    ys = xp.take(seeds[:, 0], order)
    ends = xp.stack([xp.where(live, left - ys, 0.0), xp.where(live, right - ys, 0.0)], axis=1)
    labels = xp.stack([xp.where(live, previous, -1), xp.where(live, following, -2)], axis=1)
    count = xp.where(live, xp.asarray(2, dtype=xp.int64, device=dev), xp.asarray(0, dtype=xp.int64, device=dev))
    return Intervals(xp.take(ends, back, axis=0)[:, :, None], xp.take(labels, back, axis=0), xp.take(count, back),
                     xp.zeros((n,), dtype=xp.bool, device=dev), xp.asarray(True, device=dev))


def power_cells(xp, seeds, psi, active, lo, hi, candidates=None, capacity: int = CAPACITY,
                previous=None, stop_if_empty: bool = False, options=None):
    """The cells of the ``active`` seeds (distinct positions: exact duplicates are grouped
    by the caller) at weights ``psi`` in ``[lo, hi]``; inactive seeds get empty cells.
    The other arguments are the planar geometry's (candidates, capacities, updates), which
    a line does not need."""
    return _power_cells(xp, seeds, psi, active, lo, hi)


def _breaks(xp, y, psi, perm, alive):
    """The ends of the cells of the ``alive`` seeds (a prefix of ``perm``, by position):
    ``(left, right)`` (n,) in ``perm``'s order, -inf and inf at the outer ends."""
    yp, pp = xp.take(y, perm), xp.take(psi, perm)
    both = alive[1:]                        # alive is a prefix: then so is the one before
    dy = yp[1:] - yp[:-1]
    x = 0.5 * (yp[:-1] + yp[1:]) - (pp[1:] - pp[:-1]) / (2.0 * xp.where(both, dy, 1.0))
    x = xp.where(both, x, xp.inf)
    outer = xp.full((1,), xp.inf, dtype=y.dtype, device=aac.device(y))
    return xp.concat([-outer, x]), xp.concat([x, outer])


@_compat.jit_on_jax()
def _power_cells(xp, seeds, psi, active, lo, hi):
    n = seeds.shape[0]
    dev = aac.device(seeds)
    y = seeds[:, 0]
    order, _, n_active = live_order(xp, y, active)
    k = xp.arange(n, dtype=xp.int64, device=dev)

    def hidden(perm, alive):
        left, right = _breaks(xp, y, psi, perm, alive)
        return alive & (left >= right)

    def body(state):
        perm, alive, _ = state
        gone = hidden(perm, alive)
        keep = alive & ~gone
        again = xp.argsort(xp.astype(~keep, xp.int8), stable=True)    # the kept first, in order
        return xp.take(perm, again), xp.take(keep, again), xp.any(gone)

    start = (order, k < n_active, xp.asarray(True, device=dev))
    perm, alive, _ = _compat.while_loop(lambda state: state[2], body, start)
    left, right = _breaks(xp, y, psi, perm, alive)
    a, b = clamp(xp, left, lo[0], hi[0]), clamp(xp, right, lo[0], hi[0])
    live = alive & (b > a)
    previous = xp.take(perm, xp.maximum(k - 1, 0))
    following = xp.take(perm, xp.minimum(k + 1, n - 1))
    return intervals(xp, seeds, perm, a, b, live, xp.where(left > lo[0], previous, -1),
                     xp.where(right < hi[0], following, -2))


def fans(xp, seeds, psi, active, cells):
    """Nothing: the closed form takes no Newton step (see :func:`..planar.fans`)."""
    return None


def hiding_step(xp, seeds, psi, d, active, cells, fans_at_psi=None):
    """``inf``: the closed form takes no Newton step (see :func:`..planar.hiding_step`)."""
    return xp.asarray(xp.inf, dtype=psi.dtype, device=aac.device(psi))


@_compat.jit_on_jax()
def c_transform(xp, seeds, cells, psi):
    """``min_x (x - y_i)^2 - phi(x)`` over the domain for every Dirac i, shape (n,).

    On cell j, ``(x - y_i)^2 - phi(x) = (x - y_i)^2 - (x - y_j)^2 + psi_j`` is affine of slope
    ``2 (y_j - y_i)``; the cells come in the order of their seeds, so the function is convex
    and smallest at the left end of the first cell whose seed is not left of ``y_i`` (the
    domain's upper end if there is none).
    """
    n = seeds.shape[0]
    y = seeds[:, 0]
    order, keys, n_live = live_order(xp, y, cells.count > 0)
    first = xp.searchsorted(keys, y)                         # in 0 .. n_live
    at_left = first < n_live
    j = xp.where(at_left, xp.take(order, xp.minimum(first, n - 1)), xp.take(order, xp.maximum(n_live - 1, 0)))
    ends = cells.vertices[:, :, 0]
    offset = xp.where(at_left, xp.take(ends[:, 0], j), xp.take(ends[:, 1], j))      # x - y_j
    phi = offset * offset - xp.take(psi, j)
    gap = (xp.take(y, j) - y) + offset                                               # x - y_i
    return gap * gap - phi
