"""The linear solvers of the Newton steps: reuse of old factors by the host solver, the
pure-array conjugate gradient, against scipy's spsolve."""
import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.linalg import spsolve

from sdot._core import linear_solvers as linalg
from sdot._host import sparse_lu

FACTORS = linalg.FactorPCGOptions()


def laplacian(rng, n, jitter):
    """Regularised weighted Laplacian of a random graph (rows, cols, weights, diag)."""
    rows = np.repeat(np.arange(n), 4)
    cols = (rows + rng.integers(1, n, rows.size)) % n
    w = 1.0 + jitter * rng.random(rows.size)
    rows, cols, w = np.concatenate([rows, cols]), np.concatenate([cols, rows]), np.concatenate([w, w])
    diag = np.bincount(rows, weights=w, minlength=n) + 1e-3
    return rows, cols, w, diag


def dense(rows, cols, w, diag):
    n = diag.size
    return sp.csr_matrix((np.concatenate([-w, diag]), (np.concatenate([rows, np.arange(n)]),
                                                       np.concatenate([cols, np.arange(n)]))), shape=(n, n))


def test_successive_solves_reuse_the_factors():
    """A first solve factorises; a nearby matrix of the same size is solved by
    conjugate gradient preconditioned with those factors, to the same answer."""
    import array_api_compat.numpy as xp

    rng = np.random.default_rng(0)
    solver = FACTORS.solver()
    rows, cols, w, diag = laplacian(rng, 500, 0.0)
    b = rng.standard_normal(500)
    x = solver.solve(xp, rows, cols, w, diag, b)
    np.testing.assert_allclose(x, spsolve(dense(rows, cols, w, diag).tocsc(), b), rtol=1e-9)
    w2 = w * (1.0 + 0.05 * rng.random(w.size))          # the next Newton matrix
    w2 = np.concatenate([w2[:w.size // 2], w2[:w.size // 2]])
    diag2 = np.bincount(rows, weights=w2, minlength=500) + 1e-3
    x2 = solver.solve(xp, rows, cols, w2, diag2, b)
    exact = spsolve(dense(rows, cols, w2, diag2).tocsc(), b)
    assert np.linalg.norm(x2 - exact) <= 1e-8 * np.linalg.norm(exact)
    assert (solver.cache.factorisations, solver.cache.reuses) == (1, 1)
    fresh = FACTORS.solver()                              # another solve's solver: its own factors
    np.testing.assert_allclose(fresh.solve(xp, rows, cols, w2, diag2, b), exact, rtol=1e-9)
    assert (fresh.cache.factorisations, fresh.cache.reuses, solver.cache.factorisations) == (1, 0, 1)


def test_a_fresh_solve_forgets_the_factors():
    """``fresh``, the first solve of a Newton solve (under ``jax.jit`` one solver serves
    every run of the compiled solve): a new factorisation, not the kept factors."""
    import array_api_compat.numpy as xp

    rng = np.random.default_rng(0)
    solver = FACTORS.solver()
    rows, cols, w, diag = laplacian(rng, 500, 0.0)
    b = rng.standard_normal(500)
    first = solver.solve(xp, rows, cols, w, diag, b)
    again = solver.solve(xp, rows, cols, w, diag, b, fresh=np.asarray(True))
    np.testing.assert_array_equal(again, first)
    assert (solver.cache.factorisations, solver.cache.reuses) == (2, 0)


def test_factors_of_another_problem_are_not_tried(monkeypatch):
    """A matrix of the same size from another problem (weights spread over orders of
    magnitude, like facet integrals: its diagonal changes by about 1 relative) is
    factorised without trying the old factors; a nearby one (5% changes) tries them."""
    import array_api_compat.numpy as xp

    solver = FACTORS.solver()
    tried = []
    monkeypatch.setattr(sparse_lu, "pcg", lambda *args: tried.append(len(tried)) or (None, 0))
    rng = np.random.default_rng(5)
    rows, cols, w, _ = laplacian(rng, 400, 0.0)
    b = rng.standard_normal(400)
    first, other = (np.exp(2 * rng.standard_normal(w.size // 2)) for _ in range(2))
    nearby = other * (1 + 0.05 * rng.random(other.size))
    for half in (first, other, nearby):
        w = np.tile(half, 2)
        diag = np.bincount(rows, weights=w, minlength=400) + 1e-3
        x = solver.solve(xp, rows, cols, w, diag, b)
        np.testing.assert_allclose(x, spsolve(dense(rows, cols, w, diag).tocsc(), b), rtol=1e-9)
    assert (solver.cache.factorisations, len(tried)) == (3, 1)   # only the nearby one tried


@pytest.mark.parametrize("jitter", [0.0, 10.0])
def test_pcg_reports_failure(jitter):
    """A useless preconditioner within too few iterations: no answer rather than a wrong one."""
    rng = np.random.default_rng(1)
    mat = dense(*laplacian(rng, 300, jitter))
    b = rng.standard_normal(300)
    x, _ = sparse_lu.pcg(mat, b, lambda r: r, 1e-12, 3, linalg._numpy_conjugate_gradient)
    assert x is None
    x, it = sparse_lu.pcg(mat, b, lambda r: r, 1e-10, 2000, linalg._numpy_conjugate_gradient)
    assert it < 2000 and np.linalg.norm(mat @ x - b) <= 1e-10 * np.linalg.norm(b)


@pytest.mark.parametrize("options", [FACTORS, linalg.JacobiPCGOptions()], ids=["factors", "jacobi"])
@pytest.mark.parametrize("rtol", [1e-4, 1e-10])
def test_solve_meets_the_requested_residual(backend, rtol, options):
    """Both linear solvers honour ``rtol`` on every backend: ``|b - A x| <= rtol |b|``
    (a fresh factorisation is exact; a reused one, or the conjugate gradient
    without a host or by choice, stops at ``rtol``)."""
    rng = np.random.default_rng(2)
    rows, cols, w, diag = laplacian(rng, 400, 1.0)
    b = rng.standard_normal(400)
    mat = dense(rows, cols, w, diag)
    xp = backend.xp
    solver = options.solver()
    rc = [backend.asarray(a, np.int64) for a in (rows, cols)]
    solver.solve(xp, *rc, *(backend.asarray(a) for a in (w, diag, b)))  # factors to reuse
    w2 = w * (1.0 + 0.2 * rng.random(w.size))
    w2 = np.concatenate([w2[:w.size // 2], w2[:w.size // 2]])
    diag2 = np.bincount(rows, weights=w2, minlength=400) + 1e-3
    mat = dense(rows, cols, w2, diag2)

    def run(r, c, weights, d, rhs, tol):
        return solver.solve(xp, r, c, weights, d, rhs, tol)
    x = backend.to_numpy(backend.run(run, *rc, *(backend.asarray(a) for a in (w2, diag2, b, np.float64(rtol)))))
    assert np.linalg.norm(b - mat @ x) <= rtol * np.linalg.norm(b) * (1 + 1e-6)
    if rtol == 1e-4:
        assert np.linalg.norm(b - mat @ x) > 1e-10 * np.linalg.norm(b), "a loose tolerance saves iterations"


def test_newton_solves_to_a_tenth_of_the_tolerance_or_the_forcing_term():
    """The Newton direction's residual adds at most ``tol / 10`` to the masses' error,
    or is ``forcing`` (1e-2 by default) relative to the right-hand side if that is looser; after a
    step damped below ``tiny_step``, a hundred times tighter."""
    import array_api_compat.numpy as xp
    from sdot._core import damping, options

    def rtol(norm, t):
        return float(damping.linear_rtol(xp, 1e-8, xp.asarray(norm), xp.asarray(t), 1.0, options.DEFAULT))
    assert [rtol(norm, 1.0) for norm in (1e-2, 1.0, 2e-8, 1e-8, 1e3)] == pytest.approx([1e-2, 1e-2, 0.05, 0.1, 1e-2],
                                                                                       rel=1e-12)
    assert rtol(1.0, 1e-4) == pytest.approx(1e-4, rel=1e-12)
    assert rtol(1e-5, 0.0) == pytest.approx(1e-4, rel=1e-12)


@pytest.mark.parametrize("sort", [False, True])
def test_laplacian_matrix_equals_the_assembled_sum(sort):
    """``laplacian_matrix`` (sorted rows: no sort; else a stable sort) equals ``D - W``
    assembled by scipy, with repeated entries summed and zero weights dropped."""
    rng = np.random.default_rng(3)
    n = 60
    rows, cols = rng.integers(0, n, 500), rng.integers(0, n, 500)
    rows = np.sort(rows) if sort else rows
    w = rng.random(500) * (rng.random(500) > 0.3)
    diag = rng.random(n) + 1.0
    mat = sparse_lu.laplacian_matrix(rows, cols, w, diag)
    assert mat.nnz == n + np.count_nonzero(w)
    np.testing.assert_allclose(mat.toarray(), dense(rows, cols, w, diag).toarray(), rtol=0, atol=1e-15)


def _solve_repeatedly(monkeypatch, solves, iterations, options=FACTORS):
    """Solve the same matrix ``solves`` times, the preconditioned solves reporting the
    ``iterations`` in turn (all of them used): ``(factorisations, reuses, budget)``. (The factors
    of a matrix solve that very matrix directly: here it counts as another each time.)"""
    import array_api_compat.numpy as xp

    rng = np.random.default_rng(2)
    rows, cols, w, diag = laplacian(rng, 400, 1.0)
    b = rng.standard_normal(400)
    exact = spsolve(dense(rows, cols, w, diag).tocsc(), b)
    reported = iter(iterations)
    monkeypatch.setattr(sparse_lu, "pcg", lambda mat, b, precondition, rtol, max_iter, cg: (
        precondition(b), next(reported)))
    monkeypatch.setattr(sparse_lu, "_same", lambda a, b: False)
    solver = options.solver()
    for _ in range(solves):
        x = solver.solve(xp, rows, cols, w, diag, b)
        np.testing.assert_allclose(x, exact, rtol=1e-9)
    assert next(reported, None) is None
    cache = solver.cache
    assert cache.iterations == sum(iterations)
    return cache.factorisations, cache.reuses, sparse_lu.factorisation_cost(cache.lu, options) if cache.lu else None


def test_factors_kept_while_cheap(monkeypatch):
    """Solves that take at most ``fresh_iterations`` iterations never pay for a new
    factorisation."""
    assert _solve_repeatedly(monkeypatch, 13, [FACTORS.fresh_iterations] * 12)[:2] == (1, 12)


@pytest.mark.parametrize("cholmod", [False, True])
def test_factors_renewed_once_their_extra_iterations_cost_a_factorisation(monkeypatch, cholmod):
    """Rent or buy: the factors go once the iterations beyond ``fresh_iterations``, summed
    since the factorisation, exceed what a factorisation costs (SuperLU's: nnz(L + U) / n;
    CHOLMOD's: ``cholmod_cost``); the next solve factorises again and starts a new sum."""
    import math

    if cholmod:
        pytest.importorskip("cvxopt")
    options = dataclasses.replace(FACTORS, cholmod=cholmod)
    budget = _solve_repeatedly(monkeypatch, 2, [FACTORS.fresh_iterations], options)[2]
    if cholmod:
        assert budget == FACTORS.cholmod_cost
    else:
        assert budget > 20                                 # the rule before: renew beyond 20
    half = FACTORS.fresh_iterations + math.floor(budget / 2)   # two of these stay within the budget
    assert _solve_repeatedly(monkeypatch, 5, [half, half, 0, half], options)[:2] == (1, 4)
    over = half + 2                                        # two of these exceed it
    # factorise, reuse, reuse (then drop), factorise, reuse, reuse (a new sum: kept)
    assert _solve_repeatedly(monkeypatch, 6, [over, over, half, half], options)[:3] == (2, 4, budget)


def test_cholmod_factors_solve_the_newton_matrix_and_precondition_the_next():
    """The default host solver factors a 2D Newton matrix (a Delaunay Laplacian,
    regularised) by CHOLMOD where cvxopt is installed: the solve equals scipy's direct one,
    and the next matrix (5% changes) is solved by the conjugate gradient that those factors
    precondition. A matrix that is not positive definite falls back to SuperLU's factors."""
    import array_api_compat.numpy as xp
    from scipy.spatial import Delaunay

    from sdot._host.cholmod import CholmodFactors

    pytest.importorskip("cvxopt")
    rng = np.random.default_rng(4)
    points = rng.random((3000, 2))
    edges = Delaunay(points).simplices[:, [0, 1, 1, 2, 2, 0]].reshape(-1, 2)
    rows, cols = np.concatenate([edges[:, 0], edges[:, 1]]), np.concatenate([edges[:, 1], edges[:, 0]])
    jitter = rng.random(edges.shape[0])
    b = rng.standard_normal(3000)
    solver = FACTORS.solver()
    for step in range(2):
        w = np.tile(1.0 + jitter * (1.0 + 0.05 * step * rng.random(jitter.size)), 2)
        diag = np.bincount(rows, weights=w, minlength=3000) + 1e-6
        x = solver.solve(xp, rows, cols, w, diag, b, points=points)
        exact = spsolve(dense(rows, cols, w, diag).tocsc(), b)
        assert np.linalg.norm(x - exact) <= 1e-8 * np.linalg.norm(exact)
        assert isinstance(solver.cache.lu, CholmodFactors)
    assert (solver.cache.factorisations, solver.cache.reuses) == (1, 1)
    indefinite = dense(rows, cols, w, diag - 1.0)
    with pytest.raises(ArithmeticError):
        CholmodFactors(indefinite)
    lu, single = sparse_lu.factorise(indefinite, False, cholmod=True)
    assert not isinstance(lu, CholmodFactors) and not single
    y = rng.standard_normal(3000)
    np.testing.assert_allclose(lu.solve(indefinite @ y), y, rtol=1e-6)


def recording(made):
    """Options of the host solver that append each solver they make to ``made`` (a linear
    solver of one's own, through the seam the solves use)."""
    @dataclasses.dataclass(frozen=True)
    class Recorded(linalg.FactorPCGOptions):
        def solver(self):
            made.append(super().solver())
            return made[-1]
    return Recorded()


def test_inexact_newton_takes_the_steps_of_exact_solves(sdot_driver):
    """Newton directions solved to the relative residual ``forcing`` (of the default
    options) reach the tolerance in the same steps as (nearly) exact ones (``forcing``
    1e-12), at the same weights, in fewer conjugate gradient iterations (a Gaussian image:
    damped steps, then quadratic ones). NumPy: the iterations are counted on the host,
    by each solve's own solver."""
    from pathlib import Path

    from conftest import solve_with

    import sdot
    from sdot._core import options

    sdot_driver.framework = "numpy"
    data = Path(__file__).parent / "data"
    points, image = np.load(data / "points_2d_10000.npy")[:4000], np.load(data / "image_gauss64.npy")
    solvers = []

    def run(forcing):
        newton_options = dataclasses.replace(options.DEFAULT, forcing=forcing, linear=recording(solvers))
        return solve_with(newton_options, sdot.SumOfDiracs(points), sdot.Grid(image), 1e-8)
    inexact = run(options.DEFAULT.forcing)
    exact = run(1e-12)
    assert len(solvers) == 2
    assert bool(inexact.converged) and bool(exact.converged)
    assert int(inexact.iterations) == int(exact.iterations) >= 6
    assert float(inexact.residual) <= 1e-8
    psi, psi_exact = (np.asarray(p.brenier_potential) for p in (inexact, exact))
    np.testing.assert_allclose(psi, psi_exact, rtol=0, atol=1e-6 * np.ptp(psi_exact))
    inexact_cache, exact_cache = (s.cache for s in solvers)
    assert inexact_cache.iterations < exact_cache.iterations      # measured 42 and 63
    assert inexact_cache.factorisations <= exact_cache.factorisations     # 1 and 2


def test_a_solve_with_the_pure_array_solver(sdot_driver):
    """The linear solver is pluggable: with Jacobi-preconditioned conjugate gradient
    instead of the host's factors, the same steps and a plan within the tolerance of the
    default one (a Gaussian image, NumPy)."""
    from pathlib import Path

    from conftest import solve_with

    import sdot
    from sdot._core import options

    sdot_driver.framework = "numpy"
    data = Path(__file__).parent / "data"
    source = sdot.SumOfDiracs(np.load(data / "points_2d_1000.npy"))
    target = sdot.Grid(np.load(data / "image_gauss64.npy"))
    made = []
    default = solve_with(dataclasses.replace(options.DEFAULT, linear=recording(made)), source, target, 1e-10)
    jacobi = solve_with(dataclasses.replace(options.DEFAULT, linear=linalg.JacobiPCGOptions()), source, target, 1e-10)
    assert bool(default.converged) and bool(jacobi.converged)
    assert int(jacobi.iterations) == int(default.iterations)
    assert made[0].cache.factorisations >= 1                 # the default is the host's factors
    np.testing.assert_allclose(jacobi.cell_masses, default.cell_masses, rtol=0, atol=2e-10)
    assert float(jacobi.distance) == pytest.approx(float(default.distance), rel=1e-8)


@pytest.mark.parametrize("regulariser", [1e-3, 1e-9])
def test_fp32_factors_give_fp64_solutions(regulariser):
    """From ``fp32_factors_from`` rows the factors are FP32 and only precondition: the
    answer still meets the FP64 residual, fresh or reused, also with the solver's
    gauge regulariser (1e-9 relative, below FP32's rounding) and a centred right-hand side."""
    import array_api_compat.numpy as xp

    solver = dataclasses.replace(FACTORS, fp32_factors_from=0, cholmod=False).solver()
    rng = np.random.default_rng(7)
    rows, cols, w, diag = laplacian(rng, 500, 1.0)
    diag = diag - 1e-3 + regulariser * diag.mean()
    b = rng.standard_normal(500)
    b -= b.mean()
    for step in range(2):                                  # fresh factors, then reused ones
        if step:
            w = np.tile(w[:w.size // 2] * (1.0 + 0.05 * rng.random(w.size // 2)), 2)
            diag = np.bincount(rows, weights=w, minlength=500) + regulariser * diag.mean()
        mat = dense(rows, cols, w, diag)
        x = solver.solve(xp, rows, cols, w, diag, b)
        assert np.linalg.norm(b - mat @ x) <= solver.options.rtol * np.linalg.norm(b) * (1 + 1e-6)
    cache = solver.cache
    assert cache.single and (cache.factorisations, cache.reuses) == (1, 1)


def test_fp32_factors_fall_back_to_fp64_beyond_its_range():
    """Entries FP32 cannot hold (1e40): FP64 factors, the exact solution."""
    import array_api_compat.numpy as xp

    solver = dataclasses.replace(FACTORS, fp32_factors_from=0, cholmod=False).solver()
    rng = np.random.default_rng(8)
    rows, cols, w, diag = (1e40 * a if a.dtype == np.float64 else a for a in laplacian(rng, 300, 1.0))
    b = rng.standard_normal(300)
    x = solver.solve(xp, rows, cols, w, diag, b)
    np.testing.assert_allclose(x, spsolve(dense(rows, cols, w, diag).tocsc(), b), rtol=1e-9)
    assert not solver.cache.single and solver.cache.factorisations == 1   # FP32 raised


def test_fp32_factors_that_do_not_converge_are_replaced_by_fp64(monkeypatch):
    """Fresh FP32 factors whose conjugate gradient fails: FP64 factors (a second
    factorisation, counted) solve directly."""
    import array_api_compat.numpy as xp

    solver = dataclasses.replace(FACTORS, fp32_factors_from=0, cholmod=False).solver()
    monkeypatch.setattr(sparse_lu, "pcg", lambda mat, b, precondition, rtol, max_iter, cg: (None, max_iter))
    rng = np.random.default_rng(9)
    rows, cols, w, diag = laplacian(rng, 300, 1.0)
    b = rng.standard_normal(300)
    x = solver.solve(xp, rows, cols, w, diag, b)
    np.testing.assert_allclose(x, spsolve(dense(rows, cols, w, diag).tocsc(), b), rtol=1e-9)
    cache = solver.cache
    assert not cache.single and cache.factorisations == 2


def test_newton_matrix_is_the_voronoi_laplacian(backend):
    """At zero weights and a uniform density the Newton matrix's off-diagonal entries are
    ``|facet ij| / (2 |y_i - y_j|)`` (the facets from scipy's Voronoi diagram of the seeds
    and their mirror images in the sides of the box, which clips the cells to the box),
    each pair once per direction, and its diagonal their row sums (plus the regulariser)."""
    from scipy.spatial import Voronoi

    from sdot._core import newton_matrix, options, planar
    from sdot._core.planar import integrate

    xp, n = backend.xp, 150
    y = np.random.default_rng(7).random((n, 2))
    expected = np.zeros((n, n))
    vor = Voronoi(np.concatenate([y, y * [-1, 1], y * [1, -1], [2, 0] - y * [1, -1], [0, 2] + y * [1, -1]]))
    for (p, q), ridge in zip(vor.ridge_points, vor.ridge_vertices):
        if p < n and q < n:
            a, b = vor.vertices[ridge]
            expected[p, q] = expected[q, p] = np.linalg.norm(a - b) / (2 * np.linalg.norm(y[p] - y[q]))

    def matrix(seeds):
        dev = backend.device
        active = xp.ones((n,), dtype=xp.bool, device=dev)
        lo, hi = (xp.asarray(v, dtype=xp.float64, device=dev) for v in ([0.0, 0.0], [1.0, 1.0]))
        cells = planar.power_cells(xp, seeds, xp.zeros((n,), dtype=xp.float64, device=dev), active, lo, hi)
        moments, facet = integrate.cell_integrals(xp, seeds, cells, xp.ones((1, 1), dtype=xp.float64, device=dev),
                                                  lo, hi)
        return newton_matrix._laplacian(xp, seeds, cells, facet, active, moments[:, 0], options.DEFAULT.regularisation)[:4]

    rows, cols, w, diag = (backend.to_numpy(a) for a in backend.run(matrix, backend.asarray(y)))
    got = np.zeros((n, n))
    np.add.at(got, (rows, cols), w)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(diag, expected.sum(axis=1), rtol=1e-8)


def test_the_factors_of_a_matrix_solve_it_again_the_same():
    """The products of a differentiable plan solve with its Newton matrix again and again:
    each gives the same vector, bit for bit (``torch.autograd.gradcheck`` asks it of a
    backward), by the factors of that very matrix."""
    import array_api_compat.numpy as xp

    rng = np.random.default_rng(3)
    rows, cols, w, diag = laplacian(rng, 300, 1.0)
    b = rng.standard_normal(300)
    solver = FACTORS.solver()
    first = solver.solve(xp, rows, cols, w, diag, b)
    for _ in range(3):
        assert np.array_equal(solver.solve(xp, rows, cols, w, diag, b), first)
    assert solver.cache.factorisations == 1
