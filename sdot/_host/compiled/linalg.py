"""The conjugate gradient on a CSR matrix (numba), preconditioned by the diagonal, or by the
diagonal and a coarse level.

The loop of :func:`sdot._core.linear_solvers.conjugate_gradient` with the matrix-vector product, the
dot products and the updates fused, the rows split among the host's threads (three or four
passes of the rows per iteration): at 1e5 3D seeds an iteration of scipy's product and NumPy's
updates took 4.5 to 6 ms. The column indices are unsigned: numba wraps a signed index around
when it is negative, and that test slowed the product by half.

:func:`two_level_cg` adds to the diagonal's ``r / diag`` the correction ``P A_c^{-1} P^T r`` of
a coarse space: ``P`` the indicator of groups of neighbouring rows (boxes of a grid over the
seeds), ``A_c = P^T A P`` (dense, Cholesky). On the Newton matrices of a 3D box at 1e5 seeds,
to the Newton steps' 1e-2: 110 to 117 iterations with the diagonal alone, 19 to 25 with 512
groups (the Laplacian's smooth errors, which the diagonal leaves for the most iterations, are
what a coarse space removes).
"""
from __future__ import annotations

import numpy as np

from ._numba import njit


@njit
def _product(first, last, indptr, indices, data, p, ap, partial, slot):
    """``ap = A p`` on the rows ``first .. last - 1``; ``partial[slot] = p . ap`` there."""
    total = 0.0
    for i in range(first, last):
        acc = 0.0
        for k in range(indptr[i], indptr[i + 1]):
            acc += data[k] * p[indices[k]]
        ap[i] = acc
        total += p[i] * acc
    partial[slot] = total


@njit
def _update(first, last, alpha, x, r, p, ap, inverse_diag, z, partial, slot):
    """``x += alpha p``, ``r -= alpha ap``, ``z = r / diag`` on the rows; ``partial[slot] = (r . z,
    r . r)`` there."""
    rz = 0.0
    rr = 0.0
    for i in range(first, last):
        x[i] += alpha * p[i]
        ri = r[i] - alpha * ap[i]
        r[i] = ri
        zi = ri * inverse_diag[i]
        z[i] = zi
        rz += ri * zi
        rr += ri * ri
    partial[slot, 0] = rz
    partial[slot, 1] = rr


@njit
def _direction(first, last, beta, z, p):
    for i in range(first, last):
        p[i] = z[i] + beta * p[i]


def jacobi_cg(mat, b, rtol, max_iter):
    """``(x, iterations)``: the conjugate gradient on the scipy CSR ``mat`` from 0, preconditioned
    by its diagonal, until ``|r| <= rtol |b|`` (the recurrence's residual) or ``max_iter``."""
    from . import ranges, run_ranges

    n = b.shape[0]
    indptr = np.ascontiguousarray(mat.indptr, dtype=np.uint64)
    indices = np.ascontiguousarray(mat.indices, dtype=np.uint32 if n < 2 ** 32 else np.uint64)
    data = np.ascontiguousarray(mat.data, dtype=np.float64)
    inverse_diag = 1.0 / mat.diagonal()
    x = np.zeros(n)
    r = np.array(b, dtype=np.float64)
    z = r * inverse_diag
    p = z.copy()
    ap = np.empty(n)
    parts = ranges(n, fewest=16384, per_thread=1)
    partial = np.zeros((len(parts), 2))
    rz = float(r @ z)
    target = rtol * float(np.sqrt(r @ r))
    rr = float(r @ r)
    it = 0
    while np.sqrt(rr) > target and it < max_iter:
        run_ranges(lambda k, a, e: _product(a, e, indptr, indices, data, p, ap, partial[:, 0], k), parts)
        alpha = rz / partial[:, 0].sum()
        run_ranges(lambda k, a, e: _update(a, e, alpha, x, r, p, ap, inverse_diag, z, partial, k), parts)
        rz_new, rr = partial.sum(axis=0)
        beta = rz_new / rz
        rz = rz_new
        run_ranges(lambda k, a, e: _direction(a, e, beta, z, p), parts)
        it += 1
    return x, it


@njit
def _update_coarse(first, last, alpha, x, r, p, ap, groups, coarse, partial, slot):
    """``x += alpha p``, ``r -= alpha ap`` on the rows; ``coarse[slot]``: ``P^T r`` there,
    ``partial[slot, 1] = r . r`` there."""
    rr = 0.0
    for g in range(coarse.shape[1]):
        coarse[slot, g] = 0.0
    for i in range(first, last):
        x[i] += alpha * p[i]
        ri = r[i] - alpha * ap[i]
        r[i] = ri
        coarse[slot, groups[i]] += ri
        rr += ri * ri
    partial[slot, 1] = rr


@njit
def _precondition(first, last, r, inverse_diag, groups, y, z, partial, slot):
    """``z = r / diag + y[groups]`` on the rows; ``partial[slot, 0] = r . z`` there."""
    rz = 0.0
    for i in range(first, last):
        zi = r[i] * inverse_diag[i] + y[groups[i]]
        z[i] = zi
        rz += r[i] * zi
    partial[slot, 0] = rz


@njit
def _coarse_matrix(indptr, indices, data, groups, out):
    """``out += P^T A P``: ``out[groups[i], groups[j]] += A_ij``."""
    for i in range(indptr.shape[0] - 1):
        gi = groups[i]
        for k in range(indptr[i], indptr[i + 1]):
            out[gi, groups[indices[k]]] += data[k]


def grid_groups(points, per_group=200, most=512):
    """Groups of about ``per_group`` neighbouring points (at most ``most`` groups): the boxes
    of a regular grid over their bounding box that hold any, numbered ``0 .. k - 1``."""
    n, d = points.shape
    side = max(1, int(round(min(n / per_group, most) ** (1.0 / d))))
    lo, hi = points.min(axis=0), points.max(axis=0)
    box = np.minimum(((points - lo) / np.where(hi > lo, hi - lo, 1.0) * side).astype(np.int64), side - 1)
    key = np.ravel_multi_index(tuple(box.T), (side,) * d)
    held = np.bincount(key, minlength=side ** d) > 0
    return (np.cumsum(held) - 1)[key]


def two_level_cg(mat, b, rtol, max_iter, groups):
    """``(x, iterations)``: the conjugate gradient on the scipy CSR ``mat`` (symmetric positive
    definite) from 0, preconditioned by its diagonal and the coarse space of ``groups`` (the
    module docstring), until ``|r| <= rtol |b|`` or ``max_iter``; None if the coarse matrix is
    not positive definite."""
    import scipy.linalg

    from . import ranges, run_ranges

    n = b.shape[0]
    groups = np.ascontiguousarray(groups, dtype=np.int64)
    k = int(groups.max()) + 1 if n else 1
    indptr = np.ascontiguousarray(mat.indptr, dtype=np.uint64)
    indices = np.ascontiguousarray(mat.indices, dtype=np.uint32 if n < 2 ** 32 else np.uint64)
    data = np.ascontiguousarray(mat.data, dtype=np.float64)
    coarse_matrix = np.zeros((k, k))
    _coarse_matrix(indptr, indices, data, groups, coarse_matrix)
    coarse_matrix = 0.5 * (coarse_matrix + coarse_matrix.T)
    # (the Laplacian's constant vector: a shift far below the preconditioner's other terms)
    coarse_matrix[np.diag_indices(k)] += 1e-10 * np.abs(np.diag(coarse_matrix)).max()
    try:
        factor = scipy.linalg.cho_factor(coarse_matrix, check_finite=False)
    except (np.linalg.LinAlgError, ValueError):
        return None
    coarse_inverse = scipy.linalg.cho_solve(factor, np.eye(k), check_finite=False)    # (k <= 512: 2 MB)
    inverse_diag = 1.0 / mat.diagonal()
    x = np.zeros(n)
    r = np.array(b, dtype=np.float64)
    z, ap = np.empty(n), np.empty(n)
    parts = ranges(n, fewest=16384, per_thread=1)
    partial = np.zeros((len(parts), 2))
    coarse = np.zeros((len(parts), k))
    y = coarse_inverse @ np.bincount(groups, weights=r, minlength=k)
    run_ranges(lambda s, a, e: _precondition(a, e, r, inverse_diag, groups, y, z, partial, s), parts)
    p = z.copy()
    rz = partial[:, 0].sum()
    rr = float(r @ r)
    target = rtol * float(np.sqrt(rr))
    it = 0
    while np.sqrt(rr) > target and it < max_iter:
        run_ranges(lambda s, a, e: _product(a, e, indptr, indices, data, p, ap, partial[:, 0], s), parts)
        alpha = rz / partial[:, 0].sum()
        run_ranges(lambda s, a, e: _update_coarse(a, e, alpha, x, r, p, ap, groups, coarse, partial, s), parts)
        rr = partial[:, 1].sum()
        y = coarse_inverse @ coarse.sum(axis=0)
        run_ranges(lambda s, a, e: _precondition(a, e, r, inverse_diag, groups, y, z, partial, s), parts)
        rz_new = partial[:, 0].sum()
        beta = rz_new / rz
        rz = rz_new
        run_ranges(lambda s, a, e: _direction(a, e, beta, z, p), parts)
        it += 1
    return x, it
