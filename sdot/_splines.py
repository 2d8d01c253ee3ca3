"""Uniform tensor-product B-splines as exact Bernstein polynomials per knot span.

Along one axis of ``n`` cells, in cell units (the box ``[0, n]``), the spline of
degree ``p`` with control coefficients ``c`` (one per cell, at its centre) is

    S(x) = sum over integers i of c[clamp(i, 0, n-1)] N_p(x - i - 1/2),

with ``N_p`` the centred cardinal B-spline of degree ``p`` (support
``[-(p+1)/2, (p+1)/2]``, knots at ``k - (p+1)/2``, ``k = 0..p+1``):

    N_p(u) = 1/p! sum_{k=0}^{p+1} (-1)^k C(p+1, k) (u + (p+1)/2 - k)_+^p.

The knots of ``S`` are at the integers for even ``p`` (each cell is one knot span)
and at the half-integers for odd ``p`` (each cell is cut in two at its centre, and
each half lies in one span). On a piece ``[a, a + h]`` (``h = 1`` or ``1/2``) inside
one span, ``S(a + h t) = sum_k b_k B(k, p, t)``, the Bernstein coefficients ``b`` a
fixed linear combination of ``p + 1`` neighbouring control values: a
small constant matrix per piece, computed here in exact rational arithmetic. The
tensor-product spline applies it along each axis, so the whole conversion is a
linear map written with array-API operations (``take``, ``tensordot``): torch
autograd and JAX differentiate through it.

Interpolation (``S(j + 1/2) = s_j`` at every cell centre) solves, along each
axis, ``A c = s`` with ``A[j, clamp(i)] += N_p(j - i)``, a banded ``n x n`` matrix
(diagonally dominant for ``p <= 6``), with ``xp.linalg.solve``.

The transposes of both maps (:func:`to_bernstein_transpose`,
:func:`control_values_transpose`) take cotangents of the Bernstein coefficients back
to the spline's values, for NumPy's ``OtPlan.vjp``: the ``take`` of the forward map
becomes a scatter-add (``segment_sum``) and ``A^{-1}`` becomes ``A^{-T}``.
"""
from __future__ import annotations

import functools
from fractions import Fraction
from math import comb, factorial

import numpy as np

from ._core._compat import segment_sum
from ._driver import device_of

__all__ = ["to_bernstein", "to_bernstein_transpose", "control_values", "control_values_transpose",
           "lowest_sample", "piece_matrices", "interpolation_matrix", "pieces_per_cell"]


def pieces_per_cell(degree):
    """Knot spans per cell and axis: 1 for even ``degree``, 2 for odd ``degree``."""
    return 1 if degree % 2 == 0 else 2


def _cardinal_on_piece(p, a, h):
    """Bernstein coefficients (exact) of ``t -> N_p(a + h t)`` on ``[0, 1]``.

    ``[a, a + h]`` must contain no knot of ``N_p`` in its interior.
    """
    monomial = [Fraction(0)] * (p + 1)          # coefficients of t^m
    for k in range(p + 2):
        w = a + Fraction(p + 1, 2) - k          # (w + h t)_+^p is w + h t on the piece, or 0
        if w < 0:
            continue
        scale = Fraction((-1) ** k * comb(p + 1, k), factorial(p))
        for m in range(p + 1):
            monomial[m] += scale * comb(p, m) * w ** (p - m) * h ** m
    return [sum(Fraction(comb(q, m), comb(p, m)) * monomial[m] for m in range(q + 1))
            for q in range(p + 1)]


@functools.lru_cache(maxsize=None)
def piece_matrices(p):
    """The per-axis map from control values to Bernstein coefficients.

    Returns
    -------
    offsets : ndarray of int, shape (O,)
        Piece ``s`` of cell ``j`` depends on the control values ``c[clamp(j + o)]``.
    weights : ndarray of float64, shape (r, O, p + 1)
        ``b[j, s, k] = sum_o weights[s, o, k] c[clamp(j + o)]``, ``r`` pieces per
        cell (:func:`pieces_per_cell`), piece ``s`` the interval
        ``[j + s/r, j + (s+1)/r]``.
    """
    r = pieces_per_cell(p)
    h = Fraction(1, r)
    table = {}
    for o in range(-p - 2, p + 3):
        rows = [_cardinal_on_piece(p, s * h - o - Fraction(1, 2), h) for s in range(r)]
        if any(x != 0 for row in rows for x in row):
            table[o] = rows
    offsets = np.array(sorted(table), dtype=np.int64)
    weights = np.array([[[float(x) for x in table[o][s]] for o in offsets] for s in range(r)])
    return offsets, weights


def cardinal_at_integers(p):
    """``{j: N_p(j)}`` for the integers ``j`` where it is not zero (exact)."""
    values = {}
    for j in range(-p - 1, p + 2):
        v = sum(Fraction((-1) ** k * comb(p + 1, k), factorial(p)) * (j + Fraction(p + 1, 2) - k) ** p
                for k in range(p + 2) if j + Fraction(p + 1, 2) - k > 0)
        if v != 0:
            values[j] = v
    return values


@functools.lru_cache(maxsize=32)
def interpolation_matrix(n, p):
    """``A`` (float64, ``n x n``): the spline's values at the cell centres are ``A c``.

    ``S(j + 1/2) = sum_i c[clamp(i)] N_p(j - i)``, so ``A[j, clamp(j - m)] += N_p(m)``.
    """
    a = np.zeros((n, n))
    rows = np.arange(n)
    for m, v in cardinal_at_integers(p).items():
        np.add.at(a, (rows, np.clip(rows - m, 0, n - 1)), float(v))
    return a


def _cycle(xp, x):
    """``x`` with its first axis moved to the end."""
    return xp.permute_dims(x, tuple(range(1, x.ndim)) + (0,))


def control_values(xp, samples, degree):
    """Control values of the spline of ``degree`` through ``samples`` at the cell centres.

    Solves ``A c = s`` (:func:`interpolation_matrix`) along each axis in turn with
    ``xp.linalg.solve``; a linear map of ``samples``, differentiable. Degree 1
    interpolates its control values (``A`` is the identity).
    """
    return _solve_per_axis(xp, samples, degree, transpose=False)


def control_values_transpose(xp, cotangent, degree):
    """The transpose of :func:`control_values`: ``A^{-T}`` along each axis.

    The forward map is ``A_0^{-1} x ... x A_{d-1}^{-1}`` (one factor per axis), so its
    transpose solves ``A_a^T y = g`` along each axis ``a``; ``cotangent`` has the shape
    of the samples.
    """
    return _solve_per_axis(xp, cotangent, degree, transpose=True)


def _solve_per_axis(xp, x, degree, transpose):
    """Solve ``A y = x`` (or ``A^T y = x``) along every axis of ``x`` in turn."""
    if degree == 1:
        return x
    for _ in range(x.ndim):
        n, rest = x.shape[0], tuple(x.shape[1:])
        a = interpolation_matrix(n, degree)
        a = xp.asarray(np.ascontiguousarray(a.T) if transpose else a, dtype=x.dtype, device=device_of(x))
        solved = xp.linalg.solve(a, xp.reshape(x, (n, -1)))
        x = _cycle(xp, xp.reshape(solved, (n,) + rest))
    return x


def _convert_first_axis(xp, x, offsets, weights):
    """Apply the per-axis map to the first axis of ``x`` (shape ``(n, *rest)``).

    Returns shape ``(*rest, n, r, p + 1)``: the axis goes to the end with its
    piece and Bernstein axes, so that ``d`` calls visit every axis once.
    """
    n, rest = x.shape[0], tuple(x.shape[1:])
    index = np.clip(np.arange(n)[:, None] + offsets[None, :], 0, n - 1).reshape(-1)
    near = xp.take(x, xp.asarray(index, device=device_of(x)), axis=0)
    near = xp.reshape(near, (n, offsets.shape[0]) + rest)
    w = xp.asarray(weights, dtype=x.dtype, device=device_of(x))
    y = xp.tensordot(near, w, axes=([1], [1]))                # (n, *rest, r, p + 1)
    m = len(rest)
    return xp.permute_dims(y, tuple(range(1, m + 1)) + (0, m + 1, m + 2))


def _convert_last_axes_transpose(xp, y, offsets, weights):
    """The transpose of :func:`_convert_first_axis`: ``(*rest, n, r, p + 1)`` to ``(n, *rest)``.

    ``x[i] = sum over (j, o) with clamp(j + o) = i of sum_{s, k} weights[s, o, k] y[j, s, k]``:
    a contraction with the weights, then a scatter-add of the ``O`` neighbours onto their
    (clamped) cells.
    """
    m = y.ndim - 3
    n = y.shape[m]
    rest = tuple(y.shape[:m])
    w = xp.asarray(weights, dtype=y.dtype, device=device_of(y))
    near = xp.tensordot(y, w, axes=([m + 1, m + 2], [0, 2]))          # (*rest, n, O)
    near = xp.permute_dims(near, (m, m + 1) + tuple(range(m)))        # (n, O, *rest)
    near = xp.reshape(near, (n * offsets.shape[0],) + rest)
    index = np.clip(np.arange(n)[:, None] + offsets[None, :], 0, n - 1).reshape(-1)
    return segment_sum(xp, near, xp.asarray(index, device=device_of(y)), n)


def to_bernstein(xp, control, degree):
    """Bernstein coefficients of the spline of ``degree`` with ``control`` values.

    Parameters
    ----------
    xp : namespace
        Array-API namespace of ``control``.
    control : array, shape (n0, ..., n_{d-1})
        Control values, one per cell.
    degree : int
        ``p >= 1``.

    Returns
    -------
    array, shape (r n0, ..., r n_{d-1}, (p+1)^d)
        The ``PolynomialGrid`` layout: on piece ``(q0, ...)`` (``q = r j + s``) the
        coefficient ``k = (k0 (p+1) + k1) (p+1) + ...`` of ``prod_a B(k_a, p, t_a)``,
        ``r`` = :func:`pieces_per_cell`. A linear map of ``control``.
    """
    offsets, weights = piece_matrices(degree)
    d, x = control.ndim, control
    for _ in range(d):
        x = _convert_first_axis(xp, x, offsets, weights)      # ends (n0, r, K, n1, r, K, ...)
    order = tuple(3 * a + e for a in range(d) for e in (0, 1)) + tuple(3 * a + 2 for a in range(d))
    x = xp.permute_dims(x, order)
    r, k = weights.shape[0], weights.shape[2]
    return xp.reshape(x, tuple(r * n for n in control.shape) + (k ** d,))


def to_bernstein_transpose(xp, cotangent, degree):
    """The transpose of :func:`to_bernstein`: cotangents of the control values.

    Parameters
    ----------
    cotangent : array, shape (r n0, ..., r n_{d-1}, (p+1)^d)
        A cotangent ``g`` of the Bernstein coefficients (the layout of :func:`to_bernstein`).
    degree : int
        ``p >= 1``.

    Returns
    -------
    array, shape (n0, ..., n_{d-1})
        ``T^T g``, with ``T`` the map of :func:`to_bernstein`: ``<T^T g, c> = <g, T c>``
        for every ``c``.
    """
    offsets, weights = piece_matrices(degree)
    r, k = weights.shape[0], weights.shape[2]
    d = cotangent.ndim - 1
    shape = tuple(q // r for q in cotangent.shape[:d])
    x = xp.reshape(cotangent, tuple(e for n in shape for e in (n, r)) + (k,) * d)
    order = tuple(v for a in range(d) for v in (2 * a, 2 * a + 1, 2 * d + a))
    x = xp.permute_dims(x, order)                                    # (n0, r, K, n1, r, K, ...)
    for _ in range(d):                                                # the last axis converted first
        x = _convert_last_axes_transpose(xp, x, offsets, weights)
    return x


def lowest_sample(xp, bernstein, dim, degree):
    """The lowest value of the piecewise polynomial on ``degree + 2`` points per axis and piece.

    Parameters
    ----------
    bernstein : array, shape (*pieces, (degree+1)^dim)
        Bernstein coefficients in the layout of :func:`to_bernstein`.

    Returns
    -------
    value : float
        The minimum of ``sum_k b_k prod_a B(k_a, p, t_a)`` over the points
        ``t_a = j / (p + 1)``, ``j = 0..p+1``, of every piece (its corners included).
    where : ndarray, shape (dim,)
        That point, as a fraction of the grid's extent along each axis (in ``[0, 1]``).
    """
    t = np.linspace(0.0, 1.0, degree + 2)
    k = np.arange(degree + 1)
    binomials = np.array([comb(degree, j) for j in k], dtype=np.float64)
    basis = binomials[:, None] * t[None, :] ** k[:, None] * (1 - t[None, :]) ** (degree - k[:, None])
    basis = xp.asarray(basis, dtype=bernstein.dtype, device=device_of(bernstein))
    pieces = tuple(bernstein.shape[:dim])
    x = xp.reshape(bernstein, pieces + (degree + 1,) * dim)
    for _ in range(dim):                       # contract the first Bernstein axis, append its points
        x = xp.tensordot(x, basis, axes=([dim], [0]))
    flat = xp.reshape(x, (-1,))
    lowest = int(xp.argmin(flat))
    index = np.unravel_index(lowest, pieces + (t.size,) * dim)
    where = (np.array(index[:dim]) + t[list(index[dim:])]) / np.array(pieces)
    return float(flat[lowest]), where
