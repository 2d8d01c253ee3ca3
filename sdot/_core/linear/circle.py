"""The transport on the circle (a periodic line) in closed form, up to one shift.

On the circle of length ``L`` (the domain ``[lo, hi]`` with its ends glued) the optimal map
is still monotone, up to where the cells start (Delon, Salomon and Sobolevski 2010, "Fast
transport optimization for Monge costs on the circle"): sorted by position ``y_1 <= ... <=
y_m`` in ``[lo, lo + L)``, Dirac ``k`` takes the mass between the levels ``theta + C_{k-1}``
and ``theta + C_k`` of the density's cumulative distribution ``F`` lifted to the whole line
(``F(x + L) = F(x) + M``), ``C_k`` the masses of the Diracs up to ``k``. Its cell is
``[b_{k-1}, b_k]`` with ``b_k = F^{-1}(theta + C_k)`` (and ``b_m = b_0 + L``); the cost

    W(theta) = sum_k int_{b_{k-1}}^{b_k} (x - y_k)^2 rho(x) dx

is convex in ``theta``, of derivative ``g(theta) = sum_k (b_k - y_k)^2 - (b_{k-1} - y_k)^2``
(nondecreasing). The weights follow from the boundaries as on the line, ``psi_{k+1} - psi_k
= (y_{k+1} - y_k) (y_{k+1} + y_k - 2 b_k)``, and they close around the circle (``psi_{m+1} =
psi_1``, with ``y_{m+1} = y_1 + L``) iff ``g(theta) = 0``: the optimal shift is the root of
``g``, found by a safeguarded secant (Illinois; a bisection after a step that did not halve
``|g|``) until ``g`` is 0 within rounding or its bracket is. Where the root is a jump of
``g`` (a boundary at a zero-density gap) the boundaries in the gap take the point of it
where ``g``, linear there, vanishes. At the root every cell lies within ``L / 2`` of its
Dirac: the lifted cost is the circle's.

The cells are those of the sites of :mod:`..periodic` (the seeds and all their images within
half a period of the domain): site ``(k, j)``, the image ``y_k + j L``, has the interval
``[b_{k-1}, b_k] + j L`` clipped to the domain, and its neighbours are the sites before and
after it by position.
"""
from __future__ import annotations

import array_api_compat as aac

from .. import _compat, periodic
from .cells import clamp, intervals, live_order
from .cdf import cumulative_masses, inverse_cdf, prefix_sums

#: The most secant (or bisection) steps on the shift; each at least halves the bracket every
#: other step, so 2 x 64 reach the rounding of a double.
MAX_STEPS = 128


def weights_and_cells(xp, prob, active, targets):
    """``(psi, cells, sites, owner)`` on the circle of ``prob`` (``prob.period`` (1,) > 0):
    the optimal weights (0 on the inactive Diracs) of the ``active`` Diracs of masses
    ``targets``, and the cells (:class:`.cells.Intervals`) of the sites ``(sites, owner)`` of
    :func:`..periodic.sites` with every image of :func:`..periodic.table_of`. Eager."""
    seeds, values, lo, hi = prob.seeds, prob.density.values, prob.lo, prob.hi
    n = seeds.shape[0]
    dev = aac.device(seeds)
    y = seeds[:, 0]
    order, _, n_active = live_order(xp, y, active)
    m = int(n_active)
    ys, ts = xp.take(y, order[:m]), xp.take(targets, order[:m])
    levels = xp.concat([xp.zeros((1,), dtype=y.dtype, device=dev), prefix_sums(xp, ts)[:-1]])    # C_0 .. C_{m-1}
    _, cumulative = cumulative_masses(xp, values, lo, hi)
    total, period = float(cumulative[-1]), float(prob.period[0])

    def ends(theta, upper):
        """The boundaries ``b_0 .. b_m`` at the shift ``theta``: the lower inverse (``inf {x :
        F(x) >= level}``) or the ``upper`` one (``sup {x : F(x) <= level}``)."""
        u = theta + levels
        turns = xp.floor(u / total) if upper else xp.ceil(u / total) - 1.0
        rest = u - turns * total                 # in [0, M) (upper) or (0, M] (lower)
        rest = clamp(xp, rest, 0.0, total)
        side = xp.full(rest.shape, xp.inf if upper else -xp.inf, dtype=rest.dtype, device=dev)
        b = inverse_cdf(xp, rest, side, values, lo, hi) + turns * period
        return xp.concat([b, b[:1] + period])

    def slope(b):
        """``(g, scale)``: the sum over the cells of ``(b_k - y_k)^2 - (b_{k-1} - y_k)^2`` and the
        sum of their magnitudes (``g`` within a few roundings of it is 0)."""
        terms = (b[:-1] - b[1:]) * (2.0 * ys - b[1:] - b[:-1])
        return float(xp.sum(terms)), float(xp.sum(xp.abs(terms)))

    # a bracket: the cell of y_1 starts within L / 2 before it, so theta is in [-M, M]
    a, b = -total, total
    ga, gb = slope(ends(a, False))[0], slope(ends(b, False))[0]
    while ga > 0.0:
        a, ga = a - total, slope(ends(a - total, False))[0]
    while gb < 0.0:
        b, gb = b + total, slope(ends(b + total, False))[0]
    side, best, bisect = 0, min(-ga, gb), False
    for _ in range(MAX_STEPS):
        if ga == 0.0 or gb == 0.0 or b - a <= 4.0 * 2.0 ** -52 * max(abs(a), abs(b), total):
            break
        t = (a * gb - b * ga) / (gb - ga)
        if bisect or not a < t < b:         # the last secant step did not halve the least |g|
            t = 0.5 * (a + b)
        gt, scale = slope(ends(t, False))
        if abs(gt) <= 64.0 * 2.0 ** -52 * scale:     # 0 within rounding (not at a jump of g)
            a = b = t
            break
        bisect, best = abs(gt) > 0.5 * best, min(best, abs(gt))
        if gt <= 0.0:
            a, ga = t, gt
            gb = 0.5 * gb if side == -1 else gb          # Illinois: halve the value kept twice
            side = -1
        else:
            b, gb = t, gt
            ga = 0.5 * ga if side == 1 else ga
            side = 1
    # the boundaries: at a jump of g (a gap), where g is 0 between its lower and upper ends
    low, high = ends(a, False), ends(b, True)
    g_low, g_high = slope(low)[0], slope(high)[0]
    t = 0.5 if g_low == g_high else min(max(g_low / (g_low - g_high), 0.0), 1.0)
    bounds = low + t * (high - low)
    back = _compat.put_rows(xp, xp.zeros((n,), dtype=order.dtype, device=dev), order,
                            xp.arange(n, dtype=order.dtype, device=dev))       # the inverse of ``order``
    psi = _weights(xp, ys, bounds, n, back, m)
    cells, sites, owner = _cells(xp, prob, back, m, bounds)
    return psi, cells, sites, owner


def _weights(xp, ys, bounds, n, back, m):
    """The weights of the Diracs (0 on the inactive ones) from the sorted positions ``ys`` and
    the boundaries ``bounds`` (m + 1,) (``back``: each Dirac's place by position):
    ``psi_{k+1} - psi_k = (y_{k+1} - y_k) (y_{k+1} + y_k -
    2 b_k)``, ``psi_1 = 0``."""
    dev = aac.device(ys)
    steps = (ys[1:] - ys[:-1]) * ((ys[1:] - bounds[1:-1]) + (ys[:-1] - bounds[1:-1]))
    psi = xp.concat([xp.zeros((1,), dtype=ys.dtype, device=dev), prefix_sums(xp, steps)])
    psi = xp.concat([psi, xp.zeros((n - m,), dtype=ys.dtype, device=dev)])
    return xp.take(psi, back)


def _cells(xp, prob, back, m, bounds):
    """``(cells, sites, owner)``: the intervals of the sites (the seeds and every image of
    :func:`..periodic.table_of`), the image ``(k, j)`` of the ``k``-th Dirac by position
    holding ``[b_{k-1}, b_k] + j L`` clipped to the domain."""
    n = prob.seeds.shape[0]
    dev = aac.device(bounds)
    table = periodic.table_of(xp, prob)
    sites, owner = periodic.sites(xp, prob.seeds, prob.period, table, n + table.owner.shape[0])
    shift = xp.concat([xp.zeros((n,), dtype=sites.dtype, device=dev), table.shift[:, 0]])
    rank = xp.take(_ranks(xp, back, m, n), owner)                 # the Dirac's place by position, or -1
    live_dirac = rank >= 0
    safe = xp.where(live_dirac, rank, 0)
    lo, hi = prob.lo[0], prob.hi[0]
    period = prob.period[0]
    left = xp.take(bounds, safe) + shift * period
    # (the last Dirac's right end as the first's left end one turn on, rounded alike)
    right = xp.where(safe + 1 == m, bounds[0] + (shift + 1.0) * period, xp.take(bounds, safe + 1) + shift * period)
    a, b = clamp(xp, left, lo, hi), clamp(xp, right, lo, hi)
    live = live_dirac & (b > a)
    by_position, _, n_live = live_order(xp, sites[:, 0], live)
    count = sites.shape[0]
    k = xp.arange(count, dtype=xp.int64, device=dev)
    previous = xp.where(k > 0, xp.take(by_position, xp.maximum(k - 1, 0)), -1)
    following = xp.where(k < n_live - 1, xp.take(by_position, xp.minimum(k + 1, count - 1)), -2)
    take = lambda x: xp.take(x, by_position)            # noqa: E731
    cells = intervals(xp, sites, by_position, take(a), take(b), take(live),
                      xp.where(take(left) > lo, previous, -1), xp.where(take(right) < hi, following, -2))
    return cells, sites, owner


def _ranks(xp, back, m, n):
    """Each Dirac's place among the first ``m`` by position (-1 for the others), from its place
    ``back`` among all."""
    dev = aac.device(back)
    place = xp.concat([xp.arange(m, dtype=xp.int64, device=dev), xp.full((n - m,), -1, dtype=xp.int64, device=dev)])
    return xp.take(place, back)
