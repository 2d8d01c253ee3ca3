"""Densities blurred to a width ``s``: the path the solver follows on hard densities.

Where the density vanishes (a shape on a black background, holes, separate blobs), or
varies by orders of magnitude, the damped Newton method stalls: a cell without mass has
no row in the Newton matrix, and a cell of low density next to a dense region is moved
by its linearisation far into it. The solver then first solves for the density blurred
to a width ``s`` (positive in the support's box, smooth at the scale ``s``), and narrows ``s``
stage after stage down to the density itself (:mod:`.newton`).

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


def blurred(xp, density, width, lo, hi):
    """``density`` (n_0, ..., n_{d-1}) on the box ``[lo, hi]`` blurred to ``width`` (a 0-d
    array > 0, in units of the domain): the same grid, the same total mass, positive
    everywhere in the support's box, 0 outside it."""
    return blurred_in_pixels(xp, density, *(width * n / (hi[a] - lo[a]) for a, n in enumerate(density.shape)))


def blurred_in_pixels(xp, density, *widths):
    """:func:`blurred` with the width in pixels along each axis: the blur matrix of each
    axis applied along it (the kernel is separable), within the support's box (the
    smallest box of pixels that holds every positive one)."""
    out = density
    positive = density > 0
    for axis, width in enumerate(widths):
        others = tuple(a for a in range(density.ndim) if a != axis)
        hit = xp.astype(xp.any(positive, axis=others) if others else positive, xp.int64)
        inside = (xp.cumulative_sum(hit) > 0) & (xp.flip(xp.cumulative_sum(xp.flip(hit, axis=0)), axis=0) > 0)
        b = blur_matrix(xp, density.shape[axis], width, density, inside)
        out = xp.moveaxis(xp.tensordot(b, out, axes=([1], [axis])), 0, axis)
    return out


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
