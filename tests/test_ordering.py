"""Nested dissection of the Newton matrix by the seeds' positions: a permutation,
less fill than independent orderings, and the same solves on every backend."""
import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.csgraph import reverse_cuthill_mckee
from scipy.sparse.linalg import spsolve, splu
from scipy.spatial import Delaunay

from sdot._core import linear_solvers as linalg
from sdot._host import sparse_lu
from sdot._host.ordering import nested_dissection

FACTORS = linalg.FactorPCGOptions()


def delaunay_laplacian(points, jitter=None):
    """Regularised Laplacian (CSR) of the Delaunay graph of ``points``, weights 1 on
    its edges, each times ``1 + jitter[edge]`` if given (jitter: one per edge)."""
    n = points.shape[0]
    tri = Delaunay(points).simplices
    edges = np.unique(np.sort(np.stack([tri.ravel(), np.roll(tri, 1, axis=1).ravel()], 1), axis=1), axis=0)
    w = np.ones(len(edges)) if jitter is None else 1.0 + jitter[:len(edges)]
    weights = sp.coo_matrix((np.r_[w, w], (np.r_[edges[:, 0], edges[:, 1]], np.r_[edges[:, 1], edges[:, 0]])),
                            shape=(n, n)).tocsr()
    return (sp.diags(np.asarray(weights.sum(axis=1)).ravel() * (1 + 1e-9)) - weights).tocsr()


def off_diagonal(mat):
    """``(rows, cols, w)`` with ``mat = D - W``: the entries of ``W``."""
    coo = mat.tocoo()
    keep = coo.row != coo.col
    return coo.row[keep], coo.col[keep], -coo.data[keep]


def fill(mat, order):
    """nnz(L + U) / n of SuperLU's factors of ``mat[order][:, order]``, in that order."""
    lu = splu(sparse_lu.reordered(mat, order).tocsc(), permc_spec="NATURAL", diag_pivot_thresh=0.0,
              options=dict(SymmetricMode=True))
    return lu.nnz / mat.shape[0]


@pytest.mark.parametrize("n, dim", [(0, 2), (1, 2), (8, 2), (9, 2), (1000, 2), (3000, 3)])
def test_nested_dissection_is_a_permutation(n, dim):
    """Any size (fewer rows than a leaf included), 2D or 3D, repeated points and
    rows without neighbours: every row once."""
    rng = np.random.default_rng(n)
    points = np.round(rng.random((n, dim)), 1)           # many repeated coordinates
    mat = sp.random(n, n, density=min(1.0, 6.0 / max(n, 1)), random_state=n, format="csr")
    mat = (mat + mat.T).tocsr()
    order = nested_dissection(points, mat.indptr, mat.indices)
    assert np.array_equal(np.sort(order), np.arange(n))


def test_nested_dissection_cuts_the_fill_of_a_planar_laplacian():
    """On the Delaunay graph of 2e4 random points in random order, the factors in
    nested-dissection order have a tenth of the fill of reverse Cuthill-McKee's
    (an independent ordering, measured 55 and 665 per row) and stay within 1.5 times
    that of SuperLU's minimum degree (measured 42), whose factorisation takes longer
    (66 per row when every cut edge's lower end separated, not a cover)."""
    rng = np.random.default_rng(1)
    points = rng.random((20_000, 2))
    mat = delaunay_laplacian(points, rng.random(3 * 20_000))
    nested = fill(mat, nested_dissection(points, mat.indptr, mat.indices))
    assert nested < fill(mat, reverse_cuthill_mckee(mat, symmetric_mode=True)) / 10
    minimum_degree = splu(mat.tocsc(), permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0,
                          options=dict(SymmetricMode=True)).nnz / mat.shape[0]
    assert nested < 1.5 * minimum_degree


@pytest.mark.parametrize("single", [False, True])
def test_reordered_factors_solve_and_precondition_the_matrix(single):
    """With the points given, the factors are those of the reordered matrix: the
    solve is scipy's, fresh (FP64) or through their FP64 conjugate gradient (FP32),
    and they precondition the next Newton matrix (reused, not refactorised)."""
    import array_api_compat.numpy as xp

    solver = dataclasses.replace(FACTORS, nested_dissection_from=0, fp32_factors_from=0 if single else 10**9,
                                 cholmod=False).solver()
    rng = np.random.default_rng(3)
    points = rng.random((3000, 2))
    jitter = rng.random(3 * 3000)
    b = rng.standard_normal(3000)
    b -= b.mean()
    for step in range(2):                                  # the next Newton matrix: 5% changes
        mat = delaunay_laplacian(points, jitter * (1.0 + 0.05 * step * rng.random(jitter.size)))
        x = solver.solve(xp, *off_diagonal(mat), mat.diagonal(), b, points=points)
        exact = spsolve(mat.tocsc(), b)
        assert np.linalg.norm(x - exact) <= 1e-8 * np.linalg.norm(exact)
    cache = solver.cache
    assert isinstance(cache.lu, sparse_lu.ReorderedFactors) and cache.single == single
    assert (cache.factorisations, cache.reuses) == (1, 1)


def test_solve_with_points_on_every_backend(backend):
    """The points reach the host solve on every backend (under ``jax.jit`` through
    the callback), whose factors are ordered by them; the residual is met."""
    solver = dataclasses.replace(FACTORS, nested_dissection_from=0, cholmod=False).solver()
    rng = np.random.default_rng(5)
    points = rng.random((800, 2))
    rows, cols, w = off_diagonal(delaunay_laplacian(points, rng.random(3 * 800)))
    diag = np.bincount(rows, weights=w, minlength=800) + 1e-3
    b = rng.standard_normal(800)
    mat = sp.csr_matrix((np.r_[-w, diag], (np.r_[rows, np.arange(800)], np.r_[cols, np.arange(800)])))
    xp = backend.xp

    def run(r, c, weights, d, rhs, pts):
        return solver.solve(xp, r, c, weights, d, rhs, points=pts)
    args = [backend.asarray(a, np.int64) for a in (rows, cols)] + [backend.asarray(a) for a in (w, diag, b, points)]
    x = backend.to_numpy(backend.run(run, *args))
    assert np.linalg.norm(b - mat @ x) <= solver.options.rtol * np.linalg.norm(b) * (1 + 1e-6)
    host = backend.host           # elsewhere: Jacobi conjugate gradient
    assert isinstance(solver.cache.lu, sparse_lu.ReorderedFactors) == host


def test_solver_orders_its_newton_matrices_by_the_seeds(eager_backend, monkeypatch):
    """The Newton step hands the seeds to the solve: with nested dissection from any
    size, the Gaussian reference case (C++ solvers' W2^2) is met as before, and the
    host factorisations were ordered by the seeds."""
    from pathlib import Path

    from conftest import solve_with

    import sdot
    from sdot._core import options
    from sdot._host import ordering

    data = Path(__file__).parent / "data"
    sizes = []
    monkeypatch.setattr(sparse_lu, "nested_dissection",
                        lambda points, *args: sizes.append(points.shape) or ordering.nested_dissection(points, *args))
    b = eager_backend
    nested = dataclasses.replace(options.DEFAULT, linear=dataclasses.replace(options.DEFAULT.linear,
                                                                          nested_dissection_from=0, cholmod=False))
    plan = solve_with(nested, sdot.SumOfDiracs(b.asarray(np.load(data / "points_2d_1000.npy"))),
                      sdot.Grid(b.asarray(np.load(data / "image_gauss64.npy"))), sdot.default_tolerance())
    assert bool(plan.converged) and float(plan.distance) == pytest.approx(0.009027850355009845, rel=1e-8)
    host = b.host
    assert (len(sizes) >= 1) == host and all(s == (1000, 2) for s in sizes)


def test_3d_loose_solves_by_jacobi_before_any_factorisation():
    """3D seeds at a Newton step's loose tolerance: the diagonal-preconditioned conjugate
    gradient meets it (against scipy's direct solve) without a factorisation; at a tight
    tolerance the factors (CHOLMOD's with cvxopt installed, else SuperLU's ordered by nested
    dissection in 3D from a few thousand rows) are made."""
    import array_api_compat.numpy as xp

    from sdot._host.cholmod import available as cholmod_available

    rng = np.random.default_rng(9)
    n = 6000
    points = rng.random((n, 3))
    mat = delaunay_laplacian(points, rng.random(8 * n))
    b = rng.standard_normal(n)
    b -= b.mean()
    exact = spsolve(mat.tocsc(), b)
    solver = FACTORS.solver()
    x = solver.solve(xp, *off_diagonal(mat), mat.diagonal(), b, rtol=np.asarray(1e-2), points=points)
    assert np.linalg.norm(b - mat @ x) <= 1e-2 * np.linalg.norm(b)
    assert np.linalg.norm(x - exact) <= 0.5 * np.linalg.norm(exact)
    assert (solver.cache.jacobi_solves, solver.cache.factorisations) == (1, 0)
    x = solver.solve(xp, *off_diagonal(mat), mat.diagonal(), b, rtol=np.asarray(1e-10), points=points)
    assert np.linalg.norm(x - exact) <= 1e-8 * np.linalg.norm(exact)
    factors = sparse_lu.CholmodFactors if cholmod_available() else sparse_lu.ReorderedFactors
    assert solver.cache.factorisations == 1 and isinstance(solver.cache.lu, factors)
