"""The sparse SPD solve of the Newton step, behind one protocol (:class:`LinearSolver`).

Two implementations: :class:`FactorPCG`, sparse LU factors reused as the preconditioner of
a conjugate gradient on the host (Jacobi-preconditioned where the host is not reachable),
and :class:`JacobiPCG`, Jacobi-preconditioned conjugate gradient in pure array API. Each is
made by its options (a frozen dataclass, hashable: a static argument under ``jax.jit``),
``options.solver()``, once per Newton solve: what it keeps between the solves of the Newton
steps (factors) belongs to that solve, not to the process.
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Protocol

import array_api_compat as aac
import numpy as np

from .arrays import segment_sum
from .control import while_loop
from .host import host_callback
from .ordering import nested_dissection


class LinearSolver(Protocol):
    """Solves the Newton matrices of one Newton solve (it may keep state between them)."""

    def solve(self, xp, rows, cols, weights, diag, rhs, rtol=None, points=None, fresh=None):
        """Solve ``(D - W) x = rhs`` for a sparse symmetric weighted Laplacian.

        ``W[rows, cols] += weights`` (entries may repeat), ``D = diag`` (already including
        the gauge regulariser), to a relative residual ``rtol`` (a 0-d array; default the
        solver's options' ``rtol``). ``points`` (n, dim): the positions of the rows, for a
        fill-reducing ordering. ``fresh`` (a boolean 0-d array): the first solve of a
        Newton solve, which uses nothing kept from another one (under ``jax.jit`` one solver
        serves every run of the compiled solve). Traceable; returns ``x``, or NaN entries if
        the solve failed.
        """


@dataclasses.dataclass(frozen=True)
class JacobiPCGOptions:
    """Options of :class:`JacobiPCG`."""

    #: Default relative residual.
    rtol: float = 1e-10

    def solver(self) -> JacobiPCG:
        """A new solver with these options."""
        return JacobiPCG(self)


class JacobiPCG:
    """:class:`LinearSolver`: Jacobi-preconditioned conjugate gradient in pure array API,
    at most ``4 n + 100`` iterations; keeps nothing between solves."""

    def __init__(self, options: JacobiPCGOptions = JacobiPCGOptions()):
        self.options = options

    def solve(self, xp, rows, cols, weights, diag, rhs, rtol=None, points=None, fresh=None):
        return _solve_cg(xp, rows, cols, weights, diag, rhs, _rtol(xp, rtol, self.options.rtol, rhs))


@dataclasses.dataclass(frozen=True)
class FactorPCGOptions:
    """Options of :class:`FactorPCG`."""

    #: Default relative residual of the conjugate gradients.
    rtol: float = 1e-10
    #: Iterations of a solve preconditioned by kept factors before a new factorisation.
    max_iterations: int = 40
    #: Iterations of a solve preconditioned by the factors of the previous Newton matrix (3 to
    #: 15 measured); iterations beyond it are what older factors cost (see :class:`_FactorCache`).
    fresh_iterations: int = 10
    #: Relative change of the diagonal beyond which a matrix is another problem's, whose factors
    #: are not tried (one solve's Newton matrices: at most 0.6; another point set: about 1).
    other_problem: float = 0.8
    #: Rows from which the factors are FP32: they only precondition the FP64 conjugate
    #: gradient, whose FP64 residual decides (half the memory traffic; a gain at 1e6 rows).
    fp32_factors_from: int = 500_000
    #: Rows from which the factors are ordered by nested dissection of the ``points`` rather
    #: than by minimum degree: a faster factorisation, more fill (a gain from about 1e5 rows).
    nested_dissection_from: int = 50_000

    def solver(self) -> FactorPCG:
        """A new solver with these options (no factors kept yet)."""
        return FactorPCG(self)


class FactorPCG:
    """:class:`LinearSolver`: on the host, in FP64, conjugate gradient preconditioned by
    the sparse LU factors of an earlier matrix of this solver (successive Newton matrices
    differ little) while they are worth keeping (see :class:`_FactorCache`, ``cache``), or,
    when that does not reach ``rtol`` in ``max_iterations`` iterations, a new factorisation
    (scipy's SuperLU in symmetric mode; FP32 factors from ``fp32_factors_from`` rows), kept
    for the next solve; given the ``points``, from ``nested_dissection_from`` rows the
    factors are those of the matrix reordered by :func:`.ordering.nested_dissection`.
    Where the host is not reachable (GPU, array_api_strict), :class:`JacobiPCG`.
    Under ``jax.jit`` the host callback runs the solves on this solver's cache.
    """

    def __init__(self, options: FactorPCGOptions = FactorPCGOptions()):
        self.options = options
        self.cache = _FactorCache(options)

    def solve(self, xp, rows, cols, weights, diag, rhs, rtol=None, points=None, fresh=None):
        rtol = _rtol(xp, rtol, self.options.rtol, rhs)
        if fresh is None:
            fresh = xp.asarray(False, device=aac.device(rhs))
        cache = self.cache

        def host(r, c, w, d, b, tol, new, *pts):
            if new:
                cache.lu = None
            mat = _host_matrix(r, c, w, d)
            try:
                return cache.solve(mat, b.astype(np.float64), float(tol), pts[0] if pts else None)
            except (RuntimeError, ValueError, ArithmeticError):     # e.g. SuperLU: "Factor is exactly singular"
                cache.lu = None
                return np.full(b.shape, np.nan)       # the Newton step sees a failed solve and takes no trial
        args = (rows, cols, weights, diag, rhs, rtol, fresh) + (() if points is None else (points,))
        out = host_callback(xp, host, tuple(rhs.shape), _numpy_dtype(rhs), *args)
        return _solve_cg(xp, rows, cols, weights, diag, rhs, rtol) if out is None else out


def _rtol(xp, rtol, default, rhs):
    """``rtol``, or ``default`` as a 0-d array like ``rhs``."""
    return xp.asarray(default, dtype=rhs.dtype, device=aac.device(rhs)) if rtol is None else rtol


def _host_matrix(rows, cols, weights, diag):
    """``D - W`` as a scipy CSR matrix in FP64, built without sorting when ``rows``
    is non-decreasing (the Newton step's are): each row holds its diagonal, then
    its entries of nonzero weight in their order (repeats are summed by the
    product and by the factorisation)."""
    import scipy.sparse as sp

    if np.any(rows[1:] < rows[:-1]):
        order = np.argsort(rows, kind="stable")
        rows, cols, weights = rows[order], cols[order], weights[order]
    keep = weights != 0
    if not np.all(keep):                       # eagerly the solver passes facets only
        rows, cols, weights = rows[keep], cols[keep], weights[keep]
    n = diag.shape[0]
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n) + 1, out=indptr[1:])
    at = np.arange(rows.size) + rows + 1       # past the diagonals of rows 0..rows
    data, indices = np.empty(indptr[-1], dtype=np.float64), np.empty(indptr[-1], dtype=np.int64)
    data[indptr[:-1]], indices[indptr[:-1]] = diag, np.arange(n)
    data[at], indices[at] = -weights, cols
    return sp.csr_matrix((data, indices, indptr), shape=(n, n))


class _FactorCache:
    """The last sparse LU factorisation of a :class:`FactorPCG` (one at a time, under a
    lock: XLA runs host callbacks on threads of its own); ``factorisations``, ``reuses``
    and ``iterations`` (of the preconditioned conjugate gradients) count what :meth:`solve`
    did, with the ``options`` (a :class:`FactorPCGOptions`).

    Old factors precondition worse as the Newton matrices drift: a rent-or-buy rule
    keeps them while the iterations they cost beyond ``options.fresh_iterations``, summed
    over the solves since the factorisation (``aged``), stay within ``nnz(L + U) / n``,
    about what a new factorisation costs in iterations (measured ratio of their times:
    30, 47 and 77 at 1e4, 1e5 and 1e6 seeds; ``nnz(L + U) / n``: 35, 53 and 77).
    Factors are only tried on a matrix whose diagonal is within ``options.other_problem``
    of theirs: not on another problem of the same size (the items of a ``jax.vmap``), which
    they would not precondition.
    """

    def __init__(self, options: FactorPCGOptions = FactorPCGOptions()):
        self.options = options
        self.lu, self.diag, self.aged, self.factorisations, self.reuses = None, None, 0, 0, 0
        self.iterations = 0
        self.single = False             # the factors are FP32
        self.lock = threading.Lock()

    def solve(self, mat, b, rtol, points=None):
        with self.lock:
            return self._solve(mat, b, rtol, points)

    def _solve(self, mat, b, rtol, points):
        options = self.options
        lu, self.lu = self.lu, None
        diag = mat.diagonal()
        if lu is not None and lu.shape == mat.shape and (
                np.linalg.norm(diag - self.diag) <= options.other_problem * np.linalg.norm(self.diag)):
            x, iterations = self._pcg(mat, b, _preconditioner(lu, self.single), rtol)
            if x is not None:
                self.reuses += 1
                self.aged += max(iterations - options.fresh_iterations, 0)
                if self.aged <= _factorisation_cost(lu):   # else a new factorisation next time
                    self.lu = lu
                return x
        n = mat.shape[0]
        points = points if n >= options.nested_dissection_from else None
        lu, self.single = _factorise(mat, n >= options.fp32_factors_from, points)
        self.lu, self.diag, self.aged = lu, diag, 0
        self.factorisations += 1
        if self.single:
            x, _ = self._pcg(mat, b, _preconditioner(lu, True), rtol)
            if x is not None:
                return x
            self.lu, self.single = _factorise(mat, False, points)   # FP32 could not represent the matrix
            self.factorisations += 1
        return self.lu.solve(b)

    def _pcg(self, mat, b, precondition, rtol):
        """:func:`_pcg` within ``options.max_iterations``, its iterations counted."""
        x, iterations = _pcg(mat, b, precondition, rtol, self.options.max_iterations)
        self.iterations += iterations
        return x, iterations


def _factorisation_cost(lu):
    """What a new factorisation like ``lu`` costs, in preconditioned iterations:
    about ``nnz(L + U) / n`` for minimum degree (see :class:`_FactorCache`), a
    quarter of it for nested dissection (measured time ratios 19 and 23 at 1e5 and
    1e6 rows, for ``nnz(L + U) / n`` of 68 and 90)."""
    return lu.nnz / lu.shape[0] / (4.0 if isinstance(lu, _Reordered) else 1.0)


def _factorise(mat, single, points=None):
    """Sparse LU factors of ``mat`` and whether they are FP32.

    Rows and columns are ordered by :func:`.ordering.nested_dissection` of the
    ``points`` if given (measured on Delaunay Laplacians: factorisation 0.81 ->
    0.33 s at 1e5 rows, 20.5 -> 7.1 s at 1e6 in FP64, for 1.2 to 1.3 times the
    fill), else by SuperLU's minimum degree on ``A + A^T``.
    """
    if points is None:
        return _superlu(mat, single, "MMD_AT_PLUS_A")
    order = nested_dissection(points, mat.indptr, mat.indices)
    factors, single = _superlu(_reordered(mat, order), single, "NATURAL")
    return _Reordered(factors, order), single


def _superlu(mat, single, ordering):
    """SuperLU factors (symmetric mode, diagonal pivots, columns ordered by
    ``ordering``) and whether they are FP32.

    FP32 factors are those of ``mat + diag(mat) / (1000 n)``: the gauge regulariser
    (1e-9 relative) is below FP32's rounding, and without the shift the pivot of the
    constant vector would be rounding noise of either sign; with it, it is about a
    thousandth of a diagonal entry. FP64 if FP32 fails (a singular factor)."""
    import scipy.sparse as sp
    from scipy.sparse.linalg import splu

    options = dict(permc_spec=ordering, diag_pivot_thresh=0.0, options=dict(SymmetricMode=True))
    if single:
        shifted = mat + sp.diags(mat.diagonal() / (1000.0 * mat.shape[0]))
        try:
            with np.errstate(over="ignore"):
                return splu(shifted.astype(np.float32).tocsc(), **options), True
        except RuntimeError:
            pass
    return splu(mat.tocsc(), **options), False


def _reordered(mat, order):
    """``mat[order][:, order]`` of a CSR matrix."""
    import scipy.sparse as sp

    position = np.empty_like(order)
    position[order] = np.arange(order.size)
    rows = mat[order]
    return sp.csr_matrix((rows.data, position[rows.indices], rows.indptr), shape=mat.shape)


class _Reordered:
    """Factors of ``A[order][:, order]`` that solve with ``A``."""

    def __init__(self, factors, order):
        self.factors, self.order = factors, order
        self.shape, self.nnz = factors.shape, factors.nnz

    def solve(self, b):
        y = self.factors.solve(b[self.order])
        x = np.empty_like(y)
        x[self.order] = y
        return x


def _preconditioner(lu, single):
    """``r -> LU^-1 r`` in FP64; FP32 factors get ``r`` scaled to its largest entry."""
    if not single:
        return lu.solve

    def solve(r):
        scale = np.max(np.abs(r))
        scale = scale if np.isfinite(scale) and scale > 0 else 1.0
        return lu.solve((r / scale).astype(np.float32)).astype(np.float64) * scale
    return solve


def _pcg(mat, b, precondition, rtol, max_iter):
    """Host conjugate gradient on the scipy matrix ``mat``: ``(x, iterations)``, x None
    unless the true residual ``|b - mat x|`` is within ``rtol |b|``.

    Old factors may precondition this matrix badly: the iteration may then diverge or
    break down (NaN), and the check sends the caller to a new factorisation."""
    import array_api_compat.numpy as npx

    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        x, it = conjugate_gradient(npx, mat.__matmul__, precondition, b, rtol, max_iter)
    return (x if np.linalg.norm(b - mat @ x) <= rtol * np.linalg.norm(b) else None), int(it)


def _numpy_dtype(x):
    return np.float32 if "float32" in str(x.dtype) else np.float64


def _solve_cg(xp, rows, cols, weights, diag, rhs, rtol, max_iter=None):
    n = rhs.shape[0]

    def matvec(x):
        return diag * x - segment_sum(xp, weights * xp.take(x, cols), rows, n)
    return conjugate_gradient(xp, matvec, lambda r: r / diag, rhs, rtol,
                              4 * n + 100 if max_iter is None else max_iter)[0]


def conjugate_gradient(xp, matvec, precondition, rhs, rtol, max_iter):
    """Preconditioned conjugate gradient from 0 until ``|r| <= rtol |rhs|`` (the
    recurrence's residual) or ``max_iter`` iterations: ``(x, iterations)``. Traceable."""
    x = xp.zeros_like(rhs)
    z = precondition(rhs)
    target = rtol * xp.sqrt(xp.sum(rhs * rhs))

    def cond(s):
        x, r, p, rz, it = s
        return xp.logical_and(xp.sqrt(xp.sum(r * r)) > target, it < max_iter)

    def body(s):
        x, r, p, rz, it = s
        ap = matvec(p)
        alpha = rz / xp.sum(p * ap)
        x = x + alpha * p
        r = r - alpha * ap
        z = precondition(r)
        rz_new = xp.sum(r * z)
        p = z + (rz_new / rz) * p
        return x, r, p, rz_new, it + 1

    it0 = xp.asarray(0, device=aac.device(rhs))
    x, _, _, _, it = while_loop(cond, body, (x, rhs, z, xp.sum(rhs * z), it0))
    return x, it
