"""The conjugate gradient preconditioned by the diagonal, on a CSR matrix (numba).

The loop of :func:`.._compat.linalg.conjugate_gradient` with the matrix-vector product, the
dot products and the updates fused, the rows split among the host's threads (three passes of
the rows per iteration): at 1e5 3D seeds an iteration of scipy's product and NumPy's updates
took 4.5 to 6 ms. The column indices are unsigned: numba wraps a signed index around when it
is negative, and that test slowed the product by half.
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
