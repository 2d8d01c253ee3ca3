"""The start of a solve (:func:`initial_weights`), and the starting weights that move the Diracs into
the support's box.

Both are weights ``psi_i = |y_i|^2 - 2 w(y_i)`` of a convex ``w``: Dirac ``i``'s cell then
contains ``z_i = grad w(y_i)`` (for every ``j``, ``w(y_j) >= w(y_i) + z_i . (y_j - y_i)``,
which is ``|z_i - y_i|^2 - psi_i <= |z_i - y_j|^2 - psi_j``), so each Dirac gets a cell
around a point of the box, even one far outside it. They differ in the map ``y -> z``:
a similarity (the Voronoi diagram of the Diracs moved into the box, for Diracs spread as
the support is), or the ranks of the coordinates (for clusters: Diracs 1e-5 apart spread
over the box as their ranks are).
"""
from __future__ import annotations

import array_api_compat as aac

from . import _compat, continuation
from .evaluation import evaluate, integrals_at, worst_ratio


def _inner_box(xp, prob, options):
    """``K``: the support's box shrunk by ``options.start_margin`` of its sides."""
    box_lo, box_hi = prob.density.support_box(xp)
    inset = options.start_margin * (box_hi - box_lo)
    return box_lo + inset, box_hi - inset


def similarity_weights(xp, prob, options):
    """Weights whose diagram takes each Dirac to a point of the density's support's box.

    With ``z_i = a y_i + b`` (the similarity, a contraction, that takes a robust box of
    the Diracs, their quantiles ``options.start_quantile`` and ``1 -`` it within
    ``options.start_spread`` interquartile ranges of the median, into the support's
    box shrunk by ``options.start_margin``, ``K``) and ``P`` the projection onto ``K``, the
    map ``y -> P(a y + b)`` is the gradient of the convex ``w(y) = h(a y + b) / a``,
    ``h(z) = (|z|^2 - d_K(z)^2) / 2``; the weights ``psi_i = |y_i|^2 - 2 w(y_i)`` give each
    Dirac a cell that contains ``P(z_i)``: inside the box, even for a Dirac far outside it.
    Without outliers, the Voronoi diagram of the Diracs moved into the support's box.
    """
    k_lo, k_hi = _inner_box(xp, prob, options)
    y = prob.seeds
    n = y.shape[0]
    ranked = xp.sort(y, axis=0)
    cut = int(options.start_quantile * (n - 1))
    mid, quarter = ranked[n // 2, :], ranked[(3 * n) // 4, :] - ranked[n // 4, :]
    y_lo = xp.maximum(ranked[cut, :], mid - options.start_spread * quarter)
    y_hi = xp.minimum(ranked[n - 1 - cut, :], mid + options.start_spread * quarter)
    span = xp.maximum(y_hi - y_lo, xp.finfo(y.dtype).smallest_normal)
    a = xp.minimum(xp.min((k_hi - k_lo) / span), 1.0)
    b = 0.5 * (k_lo + k_hi) - 0.5 * a * (y_lo + y_hi)
    z = a * y + b
    outside = z - xp.minimum(xp.maximum(z, k_lo), k_hi)
    w = 0.5 * (_compat.dot(z, z) - _compat.dot(outside, outside)) / a
    return _compat.dot(y, y) - 2.0 * w


def rank_weights(xp, prob, targets, options):
    """Weights whose diagram takes each Dirac to the point of ``K`` (:func:`_inner_box`)
    that ranks as it does, coordinate by coordinate.

    Along each axis ``k``, ``f_k`` maps a coordinate ``v`` to the share of the ``targets``
    (masses) of the Diracs below it (half of those at ``v``) scaled into the box: an
    increasing function, linear between the Diracs' coordinates, whose primitive ``W_k`` is
    convex; ``w(y) = sum_k W_k(y_k)`` and ``z = (f_1(y_1), ..., f_d(y_d))``. A cluster of
    Diracs 1e-6 apart is spread over a block of the box as wide as its share of the mass
    (the similarity keeps it 1e-6 wide), a Dirac far out goes to the box's edge. ``W_k`` is
    summed outward from the median, so that a far Dirac's term does not round the others'.
    """
    k_lo, k_hi = _inner_box(xp, prob, options)
    y = prob.seeds
    n = y.shape[0]
    mid = n // 2
    zero = xp.zeros((1,), dtype=y.dtype, device=aac.device(y))
    total = xp.sum(targets)
    w = xp.zeros_like(y[:, 0])
    for k in range(y.shape[1]):
        order = xp.argsort(y[:, k])
        s = xp.take(y[:, k], order)
        back = xp.argsort(order)                # each Dirac's place among the sorted
        below = xp.concat([zero, xp.cumulative_sum(xp.take(targets, order))])
        share = 0.5 * (xp.take(below, xp.searchsorted(s, s, side="left"))
                       + xp.take(below, xp.searchsorted(s, s, side="right"))) / total
        f = k_lo[k] + (k_hi[k] - k_lo[k]) * share
        step = (s[1:] - s[:-1]) * 0.5 * (f[:-1] + f[1:])      # W between consecutive coordinates
        down = xp.flip(xp.cumulative_sum(xp.flip(step[:mid], axis=0)), axis=0)
        primitive = xp.concat([-down, zero, xp.cumulative_sum(step[mid:])])
        w = w + xp.take(primitive, back)
    return _compat.dot(y, y) - 2.0 * w


def initial_weights(xp, prob, active, targets, options, capacity=None):
    """The start: ``(psi, evaluation, width)``, the evaluation against the density blurred
    to ``width`` (0: the density itself).

    The Voronoi diagram (psi = 0) if every cell holds ``options.start_admissible`` of its
    target; else the best of it and the starts of :mod:`.starts` (the similarity and the
    ranks, which move the Diracs into the support's box): one that is admissible against
    the density itself, else the one whose poorest cell holds the largest share against the
    widest blur (a cell that misses the domain holds nothing; a cluster of Diracs 1e-5
    wide keeps its cells 1e-10 of their targets under a similarity, a few thousandths
    under the ranks). Unless that start is admissible, the continuation starts at the
    narrowest of the widths ``options.widest / 4^k`` (of the domain's size) at which every
    cell holds ``options.admissible`` of its target, and every wider one too (the widest if none).
    """
    zero = xp.zeros(prob.seeds.shape[:1], dtype=prob.seeds.dtype, device=aac.device(prob.seeds))
    ev = evaluate(xp, prob, zero, active, capacity=capacity, diagram=options.diagram)
    fair = worst_ratio(xp, ev.moments, targets, active) >= options.start_admissible
    side = xp.max(prob.hi - prob.lo)
    widest = options.widest * side

    def score(ev):
        now = worst_ratio(xp, ev.moments, targets, active)
        wide = worst_ratio(xp, integrals_at(xp, prob, ev.cells, widest).moments, targets, active)
        return xp.where(now >= options.start_admissible, 2.0 + now, wide)

    def candidate(k):
        """The Voronoi start's evaluation (k = 0), or the similarity's (1), or the ranks' (2)."""
        psi1 = _compat.cond(k == 1, lambda: similarity_weights(xp, prob, options),
                            lambda: rank_weights(xp, prob, targets, options))
        return psi1, evaluate(xp, prob, psi1, active, capacity=ev.cells.labels.shape[1], diagram=options.diagram)

    def try_start(k, best):             # a loop, not three calls: one diagram, one score in the traced program
        psi1, ev1 = _compat.cond(k == 0, lambda: (zero, ev), lambda: candidate(k))
        s1 = score(ev1)
        return _compat.cond((k == 0) | (s1 > best[2]), lambda: (psi1, ev1, s1), lambda: best)

    def moved():
        return _compat.fori_loop(0, 3, try_start, (zero, ev, xp.full_like(side, -xp.inf)))[:2]
    # (on a torus no map into the support's box makes each cell hold it: the Voronoi diagram and
    # the blur over the whole box, :func:`.evaluation.at_width`)
    psi, ev = _compat.cond(fair | (prob.period is not None), lambda: (zero, ev), moved)
    fair = worst_ratio(xp, ev.moments, targets, active) >= options.start_admissible
    width, ev = _compat.cond(fair, lambda: (xp.zeros_like(widest), ev),
                             lambda: continuation.first_width(xp, prob, ev.cells, active, targets, options))
    return psi, ev, width
