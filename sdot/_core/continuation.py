"""Densities blurred to a width ``s``: the path the solver follows on hard densities.

Where the density vanishes (a shape on a black background, holes, separate blobs), or
varies by orders of magnitude, the damped Newton method stalls: a cell without mass has
no row in the Newton matrix, and a cell of low density next to a dense region is moved
by its linearisation far into it. The solver then first solves for the density blurred
to a width ``s`` (positive in the support's box, smooth at the scale ``s``), and narrows ``s``
stage after stage down to the density itself (:mod:`.newton`). Here too the stages' rules: the
first width (:func:`first_width`), the next one (:func:`next_ratio`), the targets of a stage
(:func:`stage_targets`) and the lift of the cells left outside the support (:func:`lifted`).

The blur of a piecewise-constant density is again piecewise constant on the same grid
(so its integrals stay exact): each pixel's mass is spread by the logistic kernel
``k_s(u) = sech(u / 2s)^2 / 4s`` along each axis, averaged over the receiving pixels,
within the support's box (the smallest box of pixels that holds every positive one), and
the mass that would leave it is given back to the pixels inside in proportion (each
column of the blur matrix sums to one: the total mass is kept). The starts that move
the Diracs into that box (:mod:`.starts`) give every cell a point of it; blurred over
the whole domain, a small support lost most of its mass to the cells around it (1% of
the Diracs far away held 77 to 458 times their targets, and the solve crawled). The
kernel's cumulative distribution is the logistic function and its integral the
softplus ``s log(1 + exp(u / s))``, so every entry of the matrix is four softplus
values: elementary operations of every array library.
"""
from __future__ import annotations

import math

import array_api_compat as aac

from . import _compat
from .evaluation import evaluate, integrals_at, without_integrals, worst_ratio


def _softplus(xp, u, s):
    """``s log(1 + exp(u / s))``, without overflow."""
    z = u / s
    return s * (xp.maximum(z, 0.0) + xp.log1p(xp.exp(-xp.abs(z))))


def blur_matrix(xp, n: int, width, like, inside=None):
    """``B[i, j]``: the share of pixel j's mass that the blur of ``width`` (in pixels, a
    0-d array > 0) puts in pixel i, for a row of ``n`` pixels; columns sum to one. With
    ``inside`` (n,) (a run of pixels), only those receive."""
    edges = xp.arange(n + 1, dtype=like.dtype, device=aac.device(like))
    lo, hi = edges[:-1], edges[1:]
    c, d = lo[:, None], hi[:, None]             # receiving pixel i = [c, d]
    a, b = lo[None, :], hi[None, :]             # sending pixel j = [a, b]
    share = (_softplus(xp, d - a, width) - _softplus(xp, c - a, width)
             - _softplus(xp, d - b, width) + _softplus(xp, c - b, width))
    share = xp.maximum(share, 0.0)              # rounding, where the kernel is negligible
    if inside is not None:
        share = xp.where(inside[:, None], share, 0.0)
    total = xp.sum(share, axis=0, keepdims=True)
    return share / xp.where(total > 0, total, 1.0)


def blurred(xp, density, width, lo, hi, periodic=None):
    """``density`` (n_0, ..., n_{d-1}) on the box ``[lo, hi]`` blurred to ``width`` (a 0-d
    array > 0, in units of the domain): the same grid, the same total mass, positive
    everywhere in the support's box, 0 outside it. ``periodic``: on a periodic domain, per
    axis whether it wraps (the torus: every axis; a cylinder: some); the density is then
    positive in the whole box (no start moves the Diracs into the support's box there), and
    blurred around the wrapping axes (:func:`wrapped_blur_matrix`)."""
    return blurred_in_pixels(xp, density, *(width * n / (hi[a] - lo[a]) for a, n in enumerate(density.shape)),
                             periodic=periodic)


def blurred_in_pixels(xp, density, *widths, periodic=None):
    """:func:`blurred` with the width in pixels along each axis: the blur matrix of each
    axis applied along it (the kernel is separable), within the support's box (the
    smallest box of pixels that holds every positive one), or with ``periodic`` in the whole
    box, around the axes that wrap."""
    out = density
    positive = density > 0
    for axis, width in enumerate(widths):
        if periodic is not None and periodic[axis]:
            b = wrapped_blur_matrix(xp, density.shape[axis], width, density)
        else:
            others = tuple(a for a in range(density.ndim) if a != axis)
            hit = xp.astype(xp.any(positive, axis=others) if others else positive, xp.int64)
            inside = (xp.cumulative_sum(hit) > 0) & (xp.flip(xp.cumulative_sum(xp.flip(hit, axis=0)), axis=0) > 0)
            b = blur_matrix(xp, density.shape[axis], width, density, None if periodic is not None else inside)
        out = xp.moveaxis(xp.tensordot(b, out, axes=([1], [axis])), 0, axis)
    return out


def wrapped_blur_matrix(xp, n: int, width, like):
    """:func:`blur_matrix` around a circle of ``n`` pixels (an axis of a periodic domain): the
    kernel summed over its turns, ``B[i, j]`` a function of ``(i - j) mod n``, so that the
    blurred density is as smooth across the domain's sides as inside it (the plane's blur,
    its mass kept inside the box, made a jump there: on the torus a Gaussian near a side took
    300 steps unsolved, 25 in the plane). Eager (the number of turns follows ``width``)."""
    dev = aac.device(like)
    k = xp.arange(n, dtype=like.dtype, device=dev)
    offset = xp.where(k > n // 2, k - n, k)                     # i - j, within half a turn
    turns = min(int(math.ceil(40.0 * float(width) / n)) + 1, 64)       # the kernel's tail: exp(-40)
    shifts = xp.arange(-turns, turns + 1, dtype=like.dtype, device=dev) * n
    u = offset[None, :] + shifts[:, None]
    kernel = xp.sum(_softplus(xp, u + 1.0, width) - 2.0 * _softplus(xp, u, width) + _softplus(xp, u - 1.0, width),
                    axis=0)
    kernel = xp.maximum(kernel, 0.0)
    kernel = kernel / xp.sum(kernel)
    i = xp.arange(n, dtype=xp.int64, device=dev)
    return xp.reshape(xp.take(kernel, xp.reshape(_compat.remainder(i[:, None] - i[None, :], n), (-1,))), (n, n))


def next_ratio(xp, ratio, worst, now, options):
    """The next narrowing factor to try after ``ratio`` left a cell with only ``worst`` of
    its target (below ``options.admissible``; ``now``, the poorest share at the current
    width).

    A cell beyond the support's edge, ``d`` from it, holds the blur's tail, about
    ``exp(-d / s)``: narrowing ``s`` by ``r`` divides its share by ``exp((r - 1) d / s)``,
    so ``log(share)`` falls linearly in ``r``. The line through ``(1, now)`` and ``(ratio,
    worst)`` gives the ``r`` at which the poorest cell would hold ``options.aim`` times the
    admissible share; it is kept between ``options.min_ratio`` and ``ratio^0.9``.
    """
    tiny = xp.finfo(worst.dtype).smallest_normal
    fall = xp.log(xp.maximum(now, tiny)) - xp.log(xp.maximum(worst, tiny))
    slope = xp.maximum(fall, 1e-6) / xp.maximum(ratio - 1.0, 1e-6)
    room = xp.log(xp.maximum(now, tiny)) - math.log(options.aim * options.admissible)
    guess = 1.0 + xp.maximum(room, 0.0) / slope
    return xp.maximum(xp.minimum(guess, ratio ** 0.9), options.min_ratio)


def first_width(xp, prob, cells, active, targets, options):
    """``(width, evaluation)``: the continuation's first width for the diagram ``cells``, the
    narrowest of ``options.widest / 4^k`` (of the domain's size) at which every cell holds
    ``options.admissible`` of its target, and every wider one too (the widest if none),
    and the evaluation there."""
    side = xp.max(prob.hi - prob.lo)
    dev = aac.device(cells.count)

    def narrower(state):            # the widest first, kept whatever; then each narrower one while admissible
        width, _, ev, k = state
        trial = xp.where(k == 0, width, width / 4.0)
        ev_trial = integrals_at(xp, prob, cells, trial)
        ratio = worst_ratio(xp, ev_trial.moments, targets, active)
        ok = (k == 0) | ((trial > options.min_width * side) & (ratio >= options.admissible))
        width, ev = _compat.cond(ok, lambda: (trial, ev_trial), lambda: (width, ev))
        return width, ok, ev, k + 1
    # the evaluation rides in the loop: one integration in a traced program
    start = (options.widest * side, xp.asarray(True, device=dev), without_integrals(xp, cells, prob.seeds.shape[1]),
             xp.asarray(0, device=dev))
    width, _, ev, _ = _compat.while_loop(lambda state: state[1], narrower, start)
    return width, ev


@_compat.jit_on_jax("options")
def stage_targets(xp, targets, active, width, options):
    """The targets of the stage at ``width`` (of the domain's side): at ``width > 0`` each
    raised to at least ``options.wide_floor * width^options.floor_power`` times the mean
    target, then all scaled back to the same total; the targets themselves at width 0.

    Masses over six decades: at every narrowing of the blur the cells of tiny targets
    (1e-6 of the mean) were crushed by their neighbours' moves, steps damped to 0.02 (265
    Newton steps on an annulus, stalls on two discs). Raised, they shrink to their targets
    stage by stage (49 steps; 32 of 32 point sets on two discs and annuli converge, 28
    without the floor). Equal targets change only by rounding.
    """
    count = xp.maximum(xp.sum(xp.astype(active, targets.dtype)), 1.0)
    level = xp.where(width > 0, options.wide_floor * width ** options.floor_power * xp.sum(targets) / count, 0.0)
    raised = xp.where(active, xp.maximum(targets, level), 0.0)
    return raised * (xp.sum(targets) / xp.sum(raised))


def lifted(xp, prob, psi, ev, active, targets, options):
    """``(psi, evaluation)`` with the weights of the cells that hold less than
    ``options.final_admissible`` of their target raised until they hold it.

    Narrowed to the smallest width, the blur's tail still feeds cells of tiny targets
    outside the support (masses 1e-8 in the hole of an annulus, a few widths from its
    edge); against the density itself they hold nothing, their rows of the Newton matrix
    vanish, and the damping stalled at its floor. In a pass, the raises of those cells
    grow from ``h^2 / 1000`` (``h`` the mean spacing of the Diracs), doubled while a cell
    holds less (``G``), then are bisected (a cell that touches the support only at a
    corner would otherwise hold many times its target). Bisected together, neighbours
    can take each other's mass: a cell that holds too little at the end is put back to
    its ``G``, which lowered neighbours only help. A raised cell takes its neighbours'
    mass, and a neighbour of a tiny target may fall short in turn: up to
    ``options.lift_passes`` passes, each of at most ``options.lift_rounds`` doublings and
    ``options.lift_bisections`` bisections. Each round of a pass is one diagram; the rounds of
    a pass are the phases of one loop (in a traced program one diagram, not four: the compiled
    solve at 1e3 Diracs went from 22,901 equations to 15,021, its compile from 37 to 27 s).
    """
    n = xp.maximum(xp.sum(xp.astype(active, psi.dtype)), 1.0)
    power = 2.0 / prob.seeds.shape[1]         # h^2 = (volume / n)^(2/d)
    first = 1e-3 * xp.prod(prob.hi - prob.lo) ** power / n ** power
    cap = ev.cells.labels.shape[1]
    dev = aac.device(psi)
    zero = xp.asarray(0, device=dev)

    def poor_of(ev):
        return active & (ev.moments[:, 0] < options.final_admissible * targets)

    rounds, bisections = options.lift_rounds, options.lift_bisections
    GROW, BISECT, RESTORE, FINAL, DONE = 0, 1, 2, 3, 4

    # one pass: the raises grow (doubled while a cell holds too little), are bisected, then
    # put back to their grown value where a cell holds too little; the phases of one loop
    # whose body evaluates one diagram (one diagram in a traced program, not four)
    def one_pass(state):
        psi, ev, k_pass = state
        poor = poor_of(ev)
        start = xp.where(poor, first, 0.0)

        def holding(step):
            new = evaluate(xp, prob, psi + step, active, capacity=cap, previous=ev.cells, diagram=options.diagram)
            return new, ~poor | (new.moments[:, 0] >= options.final_admissible * targets)

        def body(loop):
            phase, step, lo, hi, grown, k, _ = loop
            code = lambda c: xp.full_like(phase, c)       # noqa: E731
            at = xp.where(phase == BISECT, 0.5 * (lo + hi), step)
            new, ok = holding(at)
            more = xp.any(~ok) & (k + 1 < rounds)
            grow_step = xp.where(ok, step, 2.0 * step)
            next_phase = xp.where(phase == GROW, xp.where(more, code(GROW), code(BISECT if bisections else RESTORE)),
                                  xp.where(phase == BISECT, xp.where(k + 1 >= bisections, code(RESTORE), code(BISECT)),
                                           xp.where(phase == RESTORE, xp.where(more, code(RESTORE), code(FINAL)),
                                                    code(DONE))))
            grown = xp.where(phase == GROW, grow_step, grown)
            lo = xp.where(phase == GROW, xp.where(grow_step > first, 0.5 * grow_step, 0.0),
                          xp.where((phase == BISECT) & ~ok, at, lo))
            hi = xp.where(phase == GROW, grow_step, xp.where((phase == BISECT) & ok, at, hi))
            step = xp.where(phase == GROW, grow_step, xp.where(phase == RESTORE, xp.where(ok, step, grown), step))
            # into the restore: from the bisection's upper end (the grown raise without bisections)
            step = xp.where((next_phase == RESTORE) & (phase != RESTORE), hi, step)
            k = xp.where(next_phase == phase, k + 1, 0)
            return next_phase, step, lo, hi, grown, k, new

        zero_i = xp.zeros_like(k_pass)
        loop = (zero_i + GROW, start, start, start, start, zero_i, ev)
        _, step, _, _, _, _, new = _compat.while_loop(lambda loop: loop[0] != DONE, body, loop)
        return psi + step, new, k_pass + 1

    psi, ev, _ = _compat.while_loop(lambda state: xp.any(poor_of(state[1])) & (state[2] < options.lift_passes),
                                    one_pass, (psi, ev, zero))
    return psi, ev
