"""The sparse SPD solve of the Newton step, behind one protocol (:class:`LinearSolver`).

Two implementations: :class:`FactorPCG`, sparse LU factors reused as the preconditioner of
a conjugate gradient on the host (Jacobi-preconditioned where the host is not reachable),
and :class:`JacobiPCG`, Jacobi-preconditioned conjugate gradient in pure array API. Each is
made by its options (a frozen dataclass, hashable: a static argument under ``jax.jit``),
``options.solver()``, once per Newton solve: what it keeps between the solves of the Newton
steps (factors) belongs to that solve, not to the process. The factors, their ordering and
the host's conjugate gradient are in :mod:`sdot._host.sparse_lu`.
"""
from __future__ import annotations

import dataclasses
from typing import Protocol

import array_api_compat as aac

from .._host import sparse_lu
from ._compat.arrays import segment_sum
from ._compat.control import while_loop
from ._compat.host import host_callback, host_dtype


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
    #: 15 measured); iterations beyond it are what older factors cost (see
    #: :class:`sdot._host.sparse_lu.FactorCache`).
    fresh_iterations: int = 10
    #: Relative change of the diagonal beyond which a matrix is another problem's, whose factors
    #: are not tried (one solve's Newton matrices: at most 0.6; another point set: about 1).
    other_problem: float = 0.8
    #: Rows from which SuperLU's factors are FP32: they only precondition the FP64 conjugate
    #: gradient, whose FP64 residual decides (half the memory traffic; a gain at 1e6 rows).
    fp32_factors_from: int = 500_000
    #: Rows from which the factors are ordered by nested dissection of the ``points`` rather
    #: than by minimum degree: a faster factorisation, more fill (a gain from about 1e5 rows).
    nested_dissection_from: int = 50_000
    #: The same for seeds in 3D, whose Newton matrices fill more (measured on box3d's first
    #: Newton matrix: factorisation 0.41 -> 0.24 s at 1e4 rows, 3.8 -> 2.0 s at 3e4).
    nested_dissection_from_3d: int = 5_000
    #: Rows of 3D seeds from which a solve to at least ``jacobi_rtol_3d`` first tries the
    #: conjugate gradient preconditioned by the diagonal, within ``jacobi_iterations_3d``
    #: iterations (see :class:`sdot._host.sparse_lu.FactorCache`).
    jacobi_first_from_3d: int = 5_000
    jacobi_rtol_3d: float = 1e-3
    jacobi_iterations_3d: int = 400
    #: Factors by CHOLMOD (:mod:`sdot._host.cholmod`, where cvxopt is installed), at
    #: ``cholmod_cost`` preconditioned iterations a factorisation (see
    #: :class:`sdot._host.sparse_lu.FactorCache`; measured time ratios in 2D: 19, 12 and 23 at
    #: 1e4, 1e5 and 1e6 rows; box3d's Newton matrix at 1e4: 0.08 s against SuperLU's 0.22 s).
    cholmod: bool = True
    cholmod_cost: float = 15.0

    def solver(self) -> FactorPCG:
        """A new solver with these options (no factors kept yet)."""
        return FactorPCG(self)


class FactorPCG:
    """:class:`LinearSolver`: on the host, in FP64, conjugate gradient preconditioned by
    the sparse factors of an earlier matrix of this solver (successive Newton matrices
    differ little) while they are worth keeping (``cache``, a
    :class:`sdot._host.sparse_lu.FactorCache`), or, when that does not reach ``rtol`` in
    ``max_iterations`` iterations, a new factorisation (CHOLMOD's Cholesky with ``cholmod``
    and cvxopt installed; else scipy's SuperLU in symmetric mode, FP32 factors from
    ``fp32_factors_from`` rows, and given the ``points``, from ``nested_dissection_from``
    rows, those of the matrix reordered by :func:`sdot._host.ordering.nested_dissection`),
    kept for the next solve. Where the host is not reachable
    (GPU, array_api_strict), :class:`JacobiPCG`. Under ``jax.jit`` the host callback runs
    the solves on this solver's cache.
    """

    def __init__(self, options: FactorPCGOptions = FactorPCGOptions()):
        self.options = options
        self.cache = sparse_lu.FactorCache(options, _numpy_conjugate_gradient, sparse_lu.compiled_jacobi_cg)

    def solve(self, xp, rows, cols, weights, diag, rhs, rtol=None, points=None, fresh=None):
        rtol = _rtol(xp, rtol, self.options.rtol, rhs)
        if fresh is None:
            fresh = xp.asarray(False, device=aac.device(rhs))
        cache = self.cache
        args = (rows, cols, weights, diag, rhs, rtol, fresh) + (() if points is None else (points,))
        out = host_callback(xp, lambda *a: sparse_lu.solve_laplacian(cache, *a), tuple(rhs.shape),
                            host_dtype(rhs), *args)
        return _solve_cg(xp, rows, cols, weights, diag, rhs, rtol) if out is None else out


def _numpy_conjugate_gradient(matvec, precondition, rhs, rtol, max_iter):
    """:func:`conjugate_gradient` on the host's NumPy arrays (the preconditioned solves of
    :class:`sdot._host.sparse_lu.FactorCache`)."""
    import array_api_compat.numpy as npx

    return conjugate_gradient(npx, matvec, precondition, rhs, rtol, max_iter)


def _rtol(xp, rtol, default, rhs):
    """``rtol``, or ``default`` as a 0-d array like ``rhs``."""
    return xp.asarray(default, dtype=rhs.dtype, device=aac.device(rhs)) if rtol is None else rtol


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
