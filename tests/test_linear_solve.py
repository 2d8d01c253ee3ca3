"""The host linear solve of the Newton steps: reuse of old factors, against scipy's spsolve."""
import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.linalg import spsolve

from sdot._core import _compat


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
    cache = _compat._factor_cache
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


@pytest.mark.parametrize("jitter", [0.0, 10.0])
def test_pcg_reports_failure(jitter):
    """A useless preconditioner within too few iterations: no answer rather than a wrong one."""
    rng = np.random.default_rng(1)
    mat = dense(*laplacian(rng, 300, jitter))
    b = rng.standard_normal(300)
    x, _ = _compat._pcg(mat, b, lambda r: r, 1e-12, 3)
    assert x is None
    x, it = _compat._pcg(mat, b, lambda r: r, 1e-10, 2000)
    assert it < 2000 and np.linalg.norm(mat @ x - b) <= 1e-10 * np.linalg.norm(b)
