"""The Newton matrix's sparse factors on the host, kept to precondition a conjugate gradient.

:class:`FactorCache` holds the factors of one ``_core.linear_solvers.FactorPCG`` solver (CHOLMOD's
Cholesky factors, :mod:`.cholmod`, where cvxopt is installed; else scipy's SuperLU in symmetric
mode) and decides when to make new ones; :func:`solve_laplacian` is what the
solver runs on the host (through ``_compat``'s ``host_callback``).
"""
from __future__ import annotations

import threading

import numpy as np

from .cholmod import CholmodFactors
from .cholmod import available as cholmod_available
from .ordering import nested_dissection


def solve_laplacian(cache, rows, cols, weights, diag, rhs, rtol, fresh, points=None):
    """``(D - W) x = rhs`` (see :func:`laplacian_matrix`) in FP64 to the relative residual
    ``rtol`` by the :class:`FactorCache` ``cache``, which forgets its factors first if
    ``fresh``; NaN entries if the solve failed (the Newton step then takes no trial)."""
    if fresh:
        cache.lu = None
    mat = laplacian_matrix(rows, cols, weights, diag)
    try:
        return cache.solve(mat, rhs.astype(np.float64), float(rtol), points)
    except (RuntimeError, ValueError, ArithmeticError):     # e.g. SuperLU: "Factor is exactly singular"
        cache.lu = None
        return np.full(rhs.shape, np.nan)


def laplacian_matrix(rows, cols, weights, diag):
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


class FactorCache:
    """The last sparse factorisation of a ``_core.linear_solvers.FactorPCG`` (one at a time, under a
    lock: XLA runs host callbacks on threads of its own); ``factorisations``, ``reuses``
    and ``iterations`` (of the preconditioned conjugate gradients) count what :meth:`solve`
    did, with the ``options`` (a ``_core.linear_solvers.FactorPCGOptions``, or anything with its fields).

    Old factors precondition worse as the Newton matrices drift: a rent-or-buy rule
    keeps them while the iterations they cost beyond ``options.fresh_iterations``, summed
    over the solves since the factorisation (``aged``), stay within ``nnz(L + U) / n``,
    about what a new factorisation costs in iterations (measured ratio of their times:
    30, 47 and 77 at 1e4, 1e5 and 1e6 seeds; ``nnz(L + U) / n``: 35, 53 and 77).
    Factors are only tried on a matrix whose diagonal is within ``options.other_problem``
    of theirs: not on another problem of the same size (the items of a ``jax.vmap``), which
    they would not precondition.

    Seeds in 3D (``points`` of 3 columns) from ``options.jacobi_first_from_3d`` rows, at a
    loose ``rtol`` (the Newton steps ask for 1e-2), first try the conjugate gradient
    preconditioned by the diagonal (``jacobi_cg(mat, b, rtol, max_iter, points) -> (x,
    iterations)`` if given and not None: the compiled one, which adds a coarse level of the
    rows grouped by their ``points``; ``jacobi_solves`` counts its successes): their
    Newton matrices fill their factors 25 to 40 times (nested dissection, 1e4 to 3e4
    rows), while about 50 to 100 iterations of the diagonal alone reach 1e-2 (20 to 25
    with the coarse level at 1e5 rows).
    """

    def __init__(self, options, cg, jacobi_cg=None):
        self.options, self.cg, self.jacobi_cg = options, cg, jacobi_cg
        self.lu, self.diag, self.aged, self.factorisations, self.reuses = None, None, 0, 0, 0
        self.factored = None            # the matrix of the factors (a solve with it is direct)
        self.iterations = 0
        self.jacobi_solves = 0
        self.single = False             # the factors are FP32
        self.lock = threading.Lock()

    def solve(self, mat, b, rtol, points=None):
        with self.lock:
            return self._solve(mat, b, rtol, points)

    def _solve(self, mat, b, rtol, points):
        options = self.options
        lu, self.lu = self.lu, None
        diag = mat.diagonal()
        if lu is not None and not self.single and _same(self.factored, mat):
            self.lu = lu                # the factors of this very matrix: a direct solve, the same each time
            return lu.solve(b)
        if lu is not None and lu.shape == mat.shape and (
                np.linalg.norm(diag - self.diag) <= options.other_problem * np.linalg.norm(self.diag)):
            x, iterations = self._pcg(mat, b, preconditioner(lu, self.single), rtol)
            if x is not None:
                self.reuses += 1
                self.aged += max(iterations - options.fresh_iterations, 0)
                if self.aged <= factorisation_cost(lu, options):   # else a new factorisation next time
                    self.lu = lu
                return x
        n = mat.shape[0]
        three_d = points is not None and points.ndim == 2 and points.shape[1] == 3
        if three_d and n >= options.jacobi_first_from_3d and rtol >= options.jacobi_rtol_3d:
            found = None if self.jacobi_cg is None else self.jacobi_cg(mat, b, rtol, options.jacobi_iterations_3d,
                                                                        points)
            if found is not None:
                x, iterations = found
                x = x if np.linalg.norm(b - mat @ x) <= rtol * np.linalg.norm(b) else None
            else:
                x, iterations = pcg(mat, b, lambda r: r / diag, rtol, options.jacobi_iterations_3d, self.cg)
            self.iterations += iterations
            if x is not None:
                self.jacobi_solves += 1
                return x
        points = points if n >= (options.nested_dissection_from_3d if three_d else options.nested_dissection_from) \
            else None
        lu, self.single = factorise(mat, n >= options.fp32_factors_from, points, options.cholmod)
        self.lu, self.diag, self.aged, self.factored = lu, diag, 0, mat
        self.factorisations += 1
        if self.single:
            x, _ = self._pcg(mat, b, preconditioner(lu, True), rtol)
            if x is not None:
                return x
            self.lu, self.single = factorise(mat, False, points)   # FP32 could not represent the matrix
            self.factored = mat
            self.factorisations += 1
        return self.lu.solve(b)

    def _pcg(self, mat, b, precondition, rtol):
        """:func:`pcg` within ``options.max_iterations``, its iterations counted."""
        x, iterations = pcg(mat, b, precondition, rtol, self.options.max_iterations, self.cg)
        self.iterations += iterations
        return x, iterations


def _same(a, b):
    """Whether the CSR matrices ``a`` and ``b`` are equal, entry by entry (the products of a
    differentiable plan solve with its matrix again and again: each must give the same
    result, as ``torch.autograd.gradcheck`` asks)."""
    return (a is not None and a.shape == b.shape and a.nnz == b.nnz and np.array_equal(a.indptr, b.indptr)
            and np.array_equal(a.indices, b.indices) and np.array_equal(a.data, b.data))


def factorisation_cost(lu, options):
    """What a new factorisation like ``lu`` costs, in preconditioned iterations:
    ``options.cholmod_cost`` for CHOLMOD's; about ``nnz(L + U) / n`` for SuperLU's by minimum
    degree (see :class:`FactorCache`), a quarter of it for nested dissection (measured time
    ratios 19 and 23 at 1e5 and 1e6 rows, for ``nnz(L + U) / n`` of 68 and 90)."""
    if isinstance(lu, CholmodFactors):
        return options.cholmod_cost
    return lu.nnz / lu.shape[0] / (4.0 if isinstance(lu, ReorderedFactors) else 1.0)


def factorise(mat, single, points=None, cholmod=False):
    """Sparse factors of ``mat`` and whether they are FP32.

    With ``cholmod`` and cvxopt installed, CHOLMOD's Cholesky factors (:mod:`.cholmod`,
    FP64), unless the matrix is not numerically positive definite; else SuperLU's LU factors.
    Rows and columns are ordered by :func:`.ordering.nested_dissection` of the
    ``points`` if given (measured on Delaunay Laplacians: factorisation 0.81 ->
    0.33 s at 1e5 rows, 20.5 -> 7.1 s at 1e6 in FP64, for 1.2 to 1.3 times the
    fill), else by SuperLU's minimum degree on ``A + A^T``.
    """
    if cholmod and cholmod_available():
        try:
            return CholmodFactors(mat), False
        except ArithmeticError:
            pass
    if points is None:
        return superlu(mat, single, "MMD_AT_PLUS_A")
    order = nested_dissection(points, mat.indptr, mat.indices)
    factors, single = superlu(reordered(mat, order), single, "NATURAL")
    return ReorderedFactors(factors, order), single


def superlu(mat, single, ordering):
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


def reordered(mat, order):
    """``mat[order][:, order]`` of a CSR matrix."""
    import scipy.sparse as sp

    position = np.empty_like(order)
    position[order] = np.arange(order.size)
    rows = mat[order]
    return sp.csr_matrix((rows.data, position[rows.indices], rows.indptr), shape=mat.shape)


class ReorderedFactors:
    """Factors of ``A[order][:, order]`` that solve with ``A``."""

    def __init__(self, factors, order):
        self.factors, self.order = factors, order
        self.shape, self.nnz = factors.shape, factors.nnz

    def solve(self, b):
        y = self.factors.solve(b[self.order])
        x = np.empty_like(y)
        x[self.order] = y
        return x


def preconditioner(lu, single):
    """``r -> LU^-1 r`` in FP64; FP32 factors get ``r`` scaled to its largest entry."""
    if not single:
        return lu.solve

    def solve(r):
        scale = np.max(np.abs(r))
        scale = scale if np.isfinite(scale) and scale > 0 else 1.0
        return lu.solve((r / scale).astype(np.float32)).astype(np.float64) * scale
    return solve


def pcg(mat, b, precondition, rtol, max_iter, cg):
    """The conjugate gradient ``cg(matvec, precondition, rhs, rtol, max_iter) -> (x,
    iterations)`` (``_compat``'s, on NumPy) on the scipy matrix ``mat``: ``(x, iterations)``,
    x None unless the true residual ``|b - mat x|`` is within ``rtol |b|``.

    Old factors may precondition this matrix badly: the iteration may then diverge or
    break down (NaN), and the check sends the caller to a new factorisation."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        x, it = cg(mat.__matmul__, precondition, b, rtol, max_iter)
    return (x if np.linalg.norm(b - mat @ x) <= rtol * np.linalg.norm(b) else None), int(it)


def compiled_jacobi_cg(mat, rhs, rtol, max_iter, points=None):
    """The compiled conjugate gradient (:mod:`.compiled.linalg`): preconditioned by the
    diagonal and, given the rows' ``points``, a coarse level of groups of neighbouring rows
    (:func:`sdot._host.compiled.linalg.two_level_cg`); ``(x, iterations)``, or None where the compiled
    kernels are off."""
    from . import compiled

    if not compiled.enabled():
        return None
    from .compiled import linalg

    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        if points is not None:
            found = linalg.two_level_cg(mat, rhs, rtol, max_iter, _groups_of(np.asarray(points)))
            if found is not None:
                return found
        return linalg.jacobi_cg(mat, rhs, rtol, max_iter)


_groups = []


def _groups_of(points):
    """:func:`sdot._host.compiled.linalg.grid_groups` of ``points``, the last kept (the seeds of a
    solve do not move between its Newton steps)."""
    from .compiled import linalg

    key = (points.shape, hash(points.tobytes()))
    if not _groups or _groups[0][0] != key:
        _groups[:] = [(key, linalg.grid_groups(points))]
    return _groups[0][1]
