"""The host linear solve of the Newton steps: reuse of old factors, against scipy's spsolve."""
import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.linalg import spsolve

from sdot._core import _compat
from sdot._core._compat import linalg


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
    cache = linalg._factor_cache
    cache.lu = None
    before = cache.factorisations, cache.reuses
    rows, cols, w, diag = laplacian(rng, 500, 0.0)
    b = rng.standard_normal(500)
    x = _compat.solve_laplacian(xp, rows, cols, w, diag, b)
    np.testing.assert_allclose(x, spsolve(dense(rows, cols, w, diag).tocsc(), b), rtol=1e-9)
    w2 = w * (1.0 + 0.05 * rng.random(w.size))          # the next Newton matrix
    w2 = np.concatenate([w2[:w.size // 2], w2[:w.size // 2]])
    diag2 = np.bincount(rows, weights=w2, minlength=500) + 1e-3
    x2 = _compat.solve_laplacian(xp, rows, cols, w2, diag2, b)
    exact = spsolve(dense(rows, cols, w2, diag2).tocsc(), b)
    assert np.linalg.norm(x2 - exact) <= 1e-8 * np.linalg.norm(exact)
    assert (cache.factorisations, cache.reuses) == (before[0] + 1, before[1] + 1)


def test_factors_of_another_problem_are_not_tried(monkeypatch):
    """A matrix of the same size from another problem (weights spread over orders of
    magnitude, like facet integrals: its diagonal changes by about 1 relative) is
    factorised without trying the old factors; a nearby one (5% changes) tries them."""
    import array_api_compat.numpy as xp

    monkeypatch.setattr(linalg, "_factor_cache", linalg._FactorCache())
    tried = []
    monkeypatch.setattr(linalg, "_pcg", lambda *args: tried.append(len(tried)) or (None, 0))
    rng = np.random.default_rng(5)
    rows, cols, w, _ = laplacian(rng, 400, 0.0)
    b = rng.standard_normal(400)
    first, other = (np.exp(2 * rng.standard_normal(w.size // 2)) for _ in range(2))
    nearby = other * (1 + 0.05 * rng.random(other.size))
    for half in (first, other, nearby):
        w = np.tile(half, 2)
        diag = np.bincount(rows, weights=w, minlength=400) + 1e-3
        x = _compat.solve_laplacian(xp, rows, cols, w, diag, b)
        np.testing.assert_allclose(x, spsolve(dense(rows, cols, w, diag).tocsc(), b), rtol=1e-9)
    assert (linalg._factor_cache.factorisations, len(tried)) == (3, 1)   # only the nearby one tried


@pytest.mark.parametrize("jitter", [0.0, 10.0])
def test_pcg_reports_failure(jitter):
    """A useless preconditioner within too few iterations: no answer rather than a wrong one."""
    rng = np.random.default_rng(1)
    mat = dense(*laplacian(rng, 300, jitter))
    b = rng.standard_normal(300)
    x, _ = linalg._pcg(mat, b, lambda r: r, 1e-12, 3)
    assert x is None
    x, it = linalg._pcg(mat, b, lambda r: r, 1e-10, 2000)
    assert it < 2000 and np.linalg.norm(mat @ x - b) <= 1e-10 * np.linalg.norm(b)


@pytest.mark.parametrize("rtol", [1e-4, 1e-10])
def test_solve_meets_the_requested_residual(backend, rtol):
    """``solve_laplacian`` honours ``rtol`` on every backend: ``|b - A x| <= rtol |b|``
    (a fresh factorisation is exact; a reused one, or the conjugate gradient
    without a host, stops at ``rtol``)."""
    rng = np.random.default_rng(2)
    rows, cols, w, diag = laplacian(rng, 400, 1.0)
    b = rng.standard_normal(400)
    mat = dense(rows, cols, w, diag)
    xp = backend.xp
    rc = [backend.asarray(a, np.int64) for a in (rows, cols)]
    _compat.solve_laplacian(xp, *rc, *(backend.asarray(a) for a in (w, diag, b)))  # factors to reuse
    w2 = w * (1.0 + 0.2 * rng.random(w.size))
    w2 = np.concatenate([w2[:w.size // 2], w2[:w.size // 2]])
    diag2 = np.bincount(rows, weights=w2, minlength=400) + 1e-3
    mat = dense(rows, cols, w2, diag2)

    def run(r, c, weights, d, rhs, tol):
        return _compat.solve_laplacian(xp, r, c, weights, d, rhs, tol)
    x = backend.to_numpy(backend.run(run, *rc, *(backend.asarray(a) for a in (w2, diag2, b, np.float64(rtol)))))
    assert np.linalg.norm(b - mat @ x) <= rtol * np.linalg.norm(b) * (1 + 1e-6)
    if rtol == 1e-4:
        assert np.linalg.norm(b - mat @ x) > 1e-10 * np.linalg.norm(b), "a loose tolerance saves iterations"


def test_newton_solves_to_a_tenth_of_the_tolerance_or_the_forcing_term():
    """The Newton direction's residual adds at most ``tol / 10`` to the masses' error,
    or is ``forcing`` (1e-2 by default) relative to the right-hand side if that is looser."""
    import array_api_compat.numpy as xp
    from sdot._core import newton, options

    forcing = options.DEFAULT.forcing
    rtol = [float(newton._linear_rtol(xp, 1e-8, xp.asarray(norm), forcing)) for norm in (1e-2, 1.0, 2e-8, 1e-8, 1e3)]
    assert rtol == pytest.approx([1e-2, 1e-2, 0.05, 0.1, 1e-2], rel=1e-12)


@pytest.mark.parametrize("sort", [False, True])
def test_host_matrix_equals_the_assembled_sum(sort):
    """``_host_matrix`` (sorted rows: no sort; else a stable sort) equals ``D - W``
    assembled by scipy, with repeated entries summed and zero weights dropped."""
    rng = np.random.default_rng(3)
    n = 60
    rows, cols = rng.integers(0, n, 500), rng.integers(0, n, 500)
    rows = np.sort(rows) if sort else rows
    w = rng.random(500) * (rng.random(500) > 0.3)
    diag = rng.random(n) + 1.0
    mat = linalg._host_matrix(rows, cols, w, diag)
    assert mat.nnz == n + np.count_nonzero(w)
    np.testing.assert_allclose(mat.toarray(), dense(rows, cols, w, diag).toarray(), rtol=0, atol=1e-15)


def _solve_repeatedly(monkeypatch, solves, iterations):
    """Solve the same matrix ``solves`` times, the preconditioned solves reporting the
    ``iterations`` in turn (all of them used): ``(factorisations, reuses, budget)``."""
    import array_api_compat.numpy as xp

    rng = np.random.default_rng(2)
    rows, cols, w, diag = laplacian(rng, 400, 1.0)
    b = rng.standard_normal(400)
    exact = spsolve(dense(rows, cols, w, diag).tocsc(), b)
    reported = iter(iterations)
    monkeypatch.setattr(linalg, "_pcg", lambda mat, b, precondition, rtol, max_iter: (
        precondition(b), next(reported)))
    cache = linalg._FactorCache()
    monkeypatch.setattr(linalg, "_factor_cache", cache)
    for _ in range(solves):
        x = _compat.solve_laplacian(xp, rows, cols, w, diag, b)
        np.testing.assert_allclose(x, exact, rtol=1e-9)
    assert next(reported, None) is None
    return cache.factorisations, cache.reuses, cache.lu.nnz / 400 if cache.lu else None


def test_factors_kept_while_cheap(monkeypatch):
    """Solves that take at most CG_FRESH iterations never pay for a new factorisation."""
    assert _solve_repeatedly(monkeypatch, 13, [linalg.CG_FRESH] * 12)[:2] == (1, 12)


def test_factors_renewed_once_their_extra_iterations_cost_a_factorisation(monkeypatch):
    """Rent or buy: the factors go once the iterations beyond CG_FRESH, summed since the
    factorisation, exceed nnz(L + U) / n; the next solve factorises again and starts
    a new sum."""
    import math

    budget = _solve_repeatedly(monkeypatch, 2, [linalg.CG_FRESH])[2]
    assert budget > 20                                     # the rule before: renew beyond 20
    half = linalg.CG_FRESH + math.floor(budget / 2)       # two of these stay within the budget
    assert _solve_repeatedly(monkeypatch, 5, [half, half, 0, half])[:2] == (1, 4)
    over = half + 2                                        # two of these exceed it
    # factorise, reuse, reuse (then drop), factorise, reuse, reuse (a new sum: kept)
    assert _solve_repeatedly(monkeypatch, 6, [over, over, half, half])[:3] == (2, 4, budget)


def test_inexact_newton_takes_the_steps_of_exact_solves(monkeypatch, sdot_driver):
    """Newton directions solved to the relative residual ``forcing`` (of the default
    options) reach the tolerance in the same steps as (nearly) exact ones (``forcing``
    1e-12), at the same weights, in fewer conjugate gradient iterations (a Gaussian image:
    damped steps, then quadratic ones). NumPy: the iterations are counted on the host."""
    import dataclasses
    from pathlib import Path

    from conftest import solve_with

    import sdot
    from sdot._core import options

    sdot_driver.framework = "numpy"
    data = Path(__file__).parent / "data"
    points, image = np.load(data / "points_2d_10000.npy")[:4000], np.load(data / "image_gauss64.npy")
    iterations, caches = [], []
    pcg = linalg._pcg

    def counted(*args):
        x, it = pcg(*args)
        iterations[-1] += it
        return x, it
    monkeypatch.setattr(linalg, "_pcg", counted)

    def run(newton_options):
        iterations.append(0)
        caches.append(linalg._FactorCache())
        monkeypatch.setattr(linalg, "_factor_cache", caches[-1])
        return solve_with(newton_options, sdot.SumOfDiracs(points), sdot.Grid(image), 1e-8)
    inexact = run(options.DEFAULT)
    exact = run(dataclasses.replace(options.DEFAULT, forcing=1e-12))
    assert bool(inexact.converged) and bool(exact.converged)
    assert int(inexact.iterations) == int(exact.iterations) >= 6
    assert float(inexact.residual) <= 1e-8
    psi, psi_exact = (np.asarray(p.brenier_potential) for p in (inexact, exact))
    np.testing.assert_allclose(psi, psi_exact, rtol=0, atol=1e-6 * np.ptp(psi_exact))
    assert iterations[0] < iterations[1]      # measured 42 and 63, and 1 and 2 factorisations
    assert caches[0].factorisations <= caches[1].factorisations


@pytest.mark.parametrize("regulariser", [1e-3, 1e-9])
def test_fp32_factors_give_fp64_solutions(monkeypatch, regulariser):
    """From FP32_FACTORS_FROM rows the factors are FP32 and only precondition: the
    answer still meets the FP64 residual, fresh or reused, also with the solver's
    gauge regulariser (1e-9 relative, below FP32's rounding) and a centred right-hand side."""
    import array_api_compat.numpy as xp

    monkeypatch.setattr(linalg, "FP32_FACTORS_FROM", 0)
    monkeypatch.setattr(linalg, "_factor_cache", linalg._FactorCache())
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
        x = _compat.solve_laplacian(xp, rows, cols, w, diag, b)
        assert np.linalg.norm(b - mat @ x) <= linalg.CG_RTOL * np.linalg.norm(b) * (1 + 1e-6)
    cache = linalg._factor_cache
    assert cache.single and (cache.factorisations, cache.reuses) == (1, 1)


def test_fp32_factors_fall_back_to_fp64_beyond_its_range(monkeypatch):
    """Entries FP32 cannot hold (1e40): FP64 factors, the exact solution."""
    import array_api_compat.numpy as xp

    monkeypatch.setattr(linalg, "FP32_FACTORS_FROM", 0)
    monkeypatch.setattr(linalg, "_factor_cache", linalg._FactorCache())
    rng = np.random.default_rng(8)
    rows, cols, w, diag = (1e40 * a if a.dtype == np.float64 else a for a in laplacian(rng, 300, 1.0))
    b = rng.standard_normal(300)
    x = _compat.solve_laplacian(xp, rows, cols, w, diag, b)
    np.testing.assert_allclose(x, spsolve(dense(rows, cols, w, diag).tocsc(), b), rtol=1e-9)
    assert not linalg._factor_cache.single and linalg._factor_cache.factorisations == 1   # FP32 raised


def test_fp32_factors_that_do_not_converge_are_replaced_by_fp64(monkeypatch):
    """Fresh FP32 factors whose conjugate gradient fails: FP64 factors (a second
    factorisation, counted) solve directly."""
    import array_api_compat.numpy as xp

    monkeypatch.setattr(linalg, "FP32_FACTORS_FROM", 0)
    monkeypatch.setattr(linalg, "_factor_cache", linalg._FactorCache())
    monkeypatch.setattr(linalg, "_pcg", lambda *args: (None, linalg.CG_MAX_ITER))
    rng = np.random.default_rng(9)
    rows, cols, w, diag = laplacian(rng, 300, 1.0)
    b = rng.standard_normal(300)
    x = _compat.solve_laplacian(xp, rows, cols, w, diag, b)
    np.testing.assert_allclose(x, spsolve(dense(rows, cols, w, diag).tocsc(), b), rtol=1e-9)
    cache = linalg._factor_cache
    assert not cache.single and cache.factorisations == 2


def test_newton_matrix_is_the_voronoi_laplacian(backend):
    """At zero weights and a uniform density the Newton matrix's off-diagonal entries are
    ``|facet ij| / (2 |y_i - y_j|)`` (the facets from scipy's Voronoi diagram of the seeds
    and their mirror images in the sides of the box, which clips the cells to the box),
    each pair once per direction, and its diagonal their row sums (plus the regulariser)."""
    from scipy.spatial import Voronoi

    from sdot._core import geometry, integrate, newton, options

    xp, n = backend.xp, 150
    y = np.random.default_rng(7).random((n, 2))
    expected = np.zeros((n, n))
    vor = Voronoi(np.concatenate([y, y * [-1, 1], y * [1, -1], [2, 0] - y * [1, -1], [0, 2] + y * [1, -1]]))
    for (p, q), ridge in zip(vor.ridge_points, vor.ridge_vertices):
        if p < n and q < n:
            a, b = vor.vertices[ridge]
            expected[p, q] = expected[q, p] = np.linalg.norm(a - b) / (2 * np.linalg.norm(y[p] - y[q]))

    def matrix(seeds):
        active = xp.ones((n,), dtype=xp.bool)
        lo, hi = xp.asarray([0.0, 0.0], dtype=xp.float64), xp.asarray([1.0, 1.0], dtype=xp.float64)
        cells = geometry.power_cells(xp, seeds, xp.zeros((n,), dtype=xp.float64), active, lo, hi)
        moments, facet = integrate.cell_integrals(xp, seeds, cells, xp.ones((1, 1), dtype=xp.float64), lo, hi)
        return newton._laplacian(xp, seeds, cells, facet, active, moments[:, 0], options.DEFAULT.regularisation)[:4]

    rows, cols, w, diag = (backend.to_numpy(a) for a in backend.run(matrix, backend.asarray(y)))
    got = np.zeros((n, n))
    np.add.at(got, (rows, cols), w)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(diag, expected.sum(axis=1), rtol=1e-8)
