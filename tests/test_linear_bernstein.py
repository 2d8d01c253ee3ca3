"""1D exact solves against a ``PolynomialGrid`` of Bernstein degree p (coefficients per segment).

Ground truth that does not come from the code under test: closed forms by hand (the density
``2t`` on [0, 1]), the constant-per-segment grid (another code path, itself checked in exact
rationals in test_linear.py), the same density written differently (de Casteljau subdivision,
degree elevation), the quantile formula ``W2^2 = int_0^1 (Q(u) - G^-1(u))^2 du`` integrated by
scipy's adaptive quadrature, ``G^-1`` by scipy's root finding on the density's CDF summed here
term by term, and central finite differences of the solver's value.
"""
from __future__ import annotations

from math import comb

import numpy as np
import pytest

import sdot
from sdot._core.linear import integrate
from sdot._core.linear.cells import power_cells

scipy_integrate = pytest.importorskip("scipy.integrate")
scipy_optimize = pytest.importorskip("scipy.optimize")


def w2(y, c, weights=None, domain=None, **options):
    src = sdot.SumOfDiracs1d(y) if weights is None else sdot.SumOfWeightedDiracs(np.asarray(y)[:, None], weights)
    return float(sdot.distance(src, sdot.PolynomialGrid(c, domain=domain), **options))


# ------------------------------------------------------------------ the independent reference
class Density:
    """The density of Bernstein coefficients ``c`` (n0, p + 1) on ``[lo, hi]``, normalised to
    mass 1, by its definition: its CDF ``G`` (the integral of each basis function by
    ``int_0^t B(j, p, s) ds = sum_{l > j} B(l, p + 1, t) / (p + 1)``) and ``G^-1`` by brentq."""

    def __init__(self, c, lo=0.0, hi=1.0):
        self.c, self.lo, self.hi = np.asarray(c, dtype=float), lo, hi
        self.n0, self.p = self.c.shape[0], self.c.shape[1] - 1
        self.h = (hi - lo) / self.n0
        self.total = self.c.mean(axis=1).sum() * self.h
        self.edges_mass = np.concatenate([[0.0], np.cumsum(self.c.mean(axis=1) * self.h)]) / self.total

    def cdf(self, x):
        k = min(max(int(np.floor((x - self.lo) / self.h)), 0), self.n0 - 1)
        t = min(max((x - self.lo) / self.h - k, 0.0), 1.0)
        q = self.p + 1
        within = sum(self.c[k, j] * sum(comb(q, m) * t ** m * (1 - t) ** (q - m) for m in range(j + 1, q + 1)) / q
                     for j in range(q))
        return self.edges_mass[k] + within * self.h / self.total

    def quantile(self, u):
        if u <= 0:
            return self.lo
        if u >= 1:
            return self.hi
        return scipy_optimize.brentq(lambda x: self.cdf(x) - u, self.lo, self.hi, xtol=1e-15, rtol=1e-15)

    def w2(self, y, masses):
        """The quantile formula, Dirac by Dirac: ``int_{C_{i-1}}^{C_i} (y_i - G^-1(u))^2 du``,
        split at the masses of the grid's edges (where ``G^-1`` has kinks)."""
        order = np.argsort(y)
        y, masses = np.asarray(y)[order], np.asarray(masses)[order] / np.sum(masses)
        levels = np.concatenate([[0.0], np.cumsum(masses)])
        levels[-1] = 1.0
        total = 0.0
        for i, yi in enumerate(y):
            a, b = levels[i], levels[i + 1]
            cuts = [a] + [m for m in self.edges_mass if a < m < b] + [b]
            for u0, u1 in zip(cuts[:-1], cuts[1:]):
                total += scipy_integrate.quad(lambda u: (yi - self.quantile(u)) ** 2, u0, u1,
                                              epsabs=1e-15, epsrel=1e-13, limit=200)[0]
        return total, levels[1:-1]


def subdivided(c):
    """Each segment split in 2 by de Casteljau at 1/2: the same density on a grid twice as fine."""
    n0, q = c.shape
    p = q - 1
    left = np.array([[comb(j, k) * 0.5 ** j if k <= j else 0.0 for k in range(q)] for j in range(q)])
    right = np.array([[comb(p - j, k - j) * 0.5 ** (p - j) if k >= j else 0.0 for k in range(q)] for j in range(q)])
    return np.stack([c @ left.T, c @ right.T], axis=1).reshape(2 * n0, q)


def elevated(c):
    """The same density in degree p + 1: ``c'_k = k / (p+1) c_{k-1} + (1 - k / (p+1)) c_k``."""
    n0, q = c.shape
    e = np.array([[(k / q if j == k - 1 else 0.0) + ((1 - k / q) if j == k else 0.0) for j in range(q)]
                  for k in range(q + 1)])
    return c @ e.T


# ------------------------------------------------------------------ closed forms
def ramp_integral(a, b, y):
    """``int_a^b 2x (x - y)^2 dx``."""
    f = lambda x: x ** 4 / 2 - 4 * y * x ** 3 / 3 + y * y * x * x      # noqa: E731
    return f(b) - f(a)


def test_one_dirac_against_the_ramp(sdot_driver):
    """One Dirac at y against ``rho(t) = 2t`` (coefficients (0, 2)): W2^2 = 1/2 - 4y/3 + y^2,
    barycentre 2/3."""
    sdot_driver.framework = "numpy"
    for y in (0.3, -0.5, 1.0):
        plan = sdot.optimal_transport_plan(sdot.SumOfDiracs1d(np.array([y])), sdot.PolynomialGrid(np.array([[0.0, 2.0]])))
        assert float(plan.distance) == pytest.approx(0.5 - 4 * y / 3 + y * y, rel=1e-14)
        assert float(plan.barycenters[0, 0]) == pytest.approx(2 / 3, rel=1e-15)


def test_two_diracs_against_the_ramp(backend):
    """Two equal Diracs at 0.2 and 0.9 against ``rho(t) = 2t``: the boundary is where
    ``x^2 = 1/2``, ``1/sqrt 2`` (read from the weights), the barycentres ``4 b^3 / 3`` and
    ``4 (1 - b^3) / 3``, W2^2 the two ramp integrals; on every backend (one jit compile)."""
    def run(y, c):
        plan = sdot.optimal_transport_plan(sdot.SumOfDiracs1d(y), sdot.PolynomialGrid(c))
        return plan.distance, plan.barycenters, plan.brenier_potential, plan.cell_masses
    y = np.array([0.9, 0.2])
    out = backend.run(run, backend.asarray(y), backend.asarray([[0.0, 2.0]]))
    distance, bary, psi, masses = (backend.to_numpy(a) for a in out)
    b = 2 ** -0.5
    boundary = (y[0] + y[1]) / 2 - (psi[0] - psi[1]) / (2 * (y[0] - y[1]))
    assert boundary == pytest.approx(b, rel=1e-15)
    assert float(distance) == pytest.approx(ramp_integral(0, b, 0.2) + ramp_integral(b, 1, 0.9), rel=1e-14)
    np.testing.assert_allclose(bary[:, 0], [4 * (1 - b ** 3) / 3, 4 * b ** 3 / 3], rtol=0, atol=1e-15)
    np.testing.assert_allclose(masses, [0.5, 0.5], rtol=0, atol=1e-15)


# ------------------------------------------------------------------ the same density, other code
@pytest.mark.parametrize("p", [1, 2, 3])
def test_equal_coefficients_are_the_constant_grid(sdot_driver, p):
    """All coefficients of a segment equal: the W2^2, barycentres and weights of the constant
    grid of those values (the exact piecewise-linear CDF) to 1e-13; a Dirac outside the domain."""
    sdot_driver.framework = "numpy"
    rng = np.random.default_rng(1)
    y, img = rng.random(30), 0.1 + rng.random(7)
    y[0] = 1.7
    want = sdot.optimal_transport_plan(sdot.SumOfDiracs1d(y), sdot.Grid(img, domain=(-1.0, 1.5)))
    got = sdot.optimal_transport_plan(sdot.SumOfDiracs1d(y),
                                      sdot.PolynomialGrid(np.repeat(img[:, None], p + 1, axis=1), domain=(-1.0, 1.5)))
    assert float(got.distance) == pytest.approx(float(want.distance), rel=1e-13)
    np.testing.assert_allclose(np.asarray(got.barycenters), np.asarray(want.barycenters), rtol=0, atol=1e-13)
    np.testing.assert_allclose(np.asarray(got.brenier_potential), np.asarray(want.brenier_potential), rtol=0, atol=1e-13)


def test_subdivision_and_degree_elevation(sdot_driver):
    """A random degree-2 density, its segments split in two by de Casteljau (twice), its
    degree elevated to 3 and 4: the same W2^2 to 1e-13."""
    sdot_driver.framework = "numpy"
    rng = np.random.default_rng(2)
    y, c = rng.random(25), 0.1 + rng.random((5, 3))
    xs = np.linspace(0, 1, 101)
    ref = Density(c)
    assert np.allclose([Density(subdivided(subdivided(c))).cdf(x) for x in xs], [ref.cdf(x) for x in xs])
    want = w2(y, c)
    for other in (subdivided(c), subdivided(subdivided(c)), elevated(c), elevated(elevated(c))):
        assert w2(y, other) == pytest.approx(want, rel=1e-13)


# ------------------------------------------------------------------ against the quantile formula
CASES = {
    # a random degree-2 density on (-1, 2), weighted Diracs, one outside the domain
    "random": (np.random.default_rng(3).random((4, 3)) + 0.2, (-1.0, 2.0)),
    # zero segments, segments vanishing at one end (t^2, 1 - t), a dip ((1 - t)^2 + t^2)
    "zero-regions": (np.array([[0.0, 0.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.5, 0.0], [0.0, 0.0, 0.0],
                               [0.0, 0.0, 0.0], [1.0, 0.0, 1.0], [1.0, 2.0, 1.0]]), (0.0, 1.0)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_against_the_quantile_formula(sdot_driver, case):
    """W2^2 against the quantile formula by scipy (quad of brentq's inverse CDF) to 1e-10,
    each boundary between consecutive Diracs where the CDF reaches their cumulative mass
    (brentq) to 1e-12, each cell's mass its Dirac's."""
    sdot_driver.framework = "numpy"
    c, (lo, hi) = CASES[case]
    rng = np.random.default_rng(4)
    n = 9
    y = lo + (hi - lo) * rng.random(n)
    y[0] = hi + 0.5
    m = 0.5 + rng.random(n)
    ref = Density(c, lo, hi)
    want, levels = ref.w2(y, m)
    plan = sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(y[:, None], m),
                                       sdot.PolynomialGrid(c, domain=(lo, hi)), tol=1e-13)
    assert float(plan.distance) == pytest.approx(want, rel=1e-10)
    np.testing.assert_allclose(np.asarray(plan.cell_masses), m / m.sum(), rtol=0, atol=1e-14)
    order = np.argsort(y)
    ys, psi = y[order], np.asarray(plan.brenier_potential)[order]
    boundaries = (ys[:-1] + ys[1:]) / 2 - (psi[1:] - psi[:-1]) / (2 * (ys[1:] - ys[:-1]))
    np.testing.assert_allclose(boundaries, [ref.quantile(u) for u in levels], rtol=0, atol=1e-12 * (hi - lo))


# ------------------------------------------------------------------ the integrals and their transpose
def test_integrals_and_their_transpose(backend):
    """At given weights (cells not the optimal ones, one empty, one far outside): the cell
    moments against scipy's quad of the density's definition to 1e-13, the ends' densities, and
    the potential integrals the transpose of the moments (``sum(g c) = sum(M2 - psi mass)``)."""
    rng = np.random.default_rng(5)
    lo, hi = np.array([-0.5]), np.array([1.5])
    c = 0.1 + rng.random((3, 4))
    y = np.array([[0.1], [0.4], [0.45], [1.2], [3.0]])
    psi = np.array([0.0, 0.02, -0.5, 0.01, 3.5])
    import array_api_compat.numpy as npx
    cells = power_cells(npx, y, psi, np.ones(5, dtype=bool), lo, hi)
    assert list(cells.count) == [2, 2, 0, 2, 2]
    b = backend
    args = [b.asarray(a) for a in (y, c, psi, lo, hi)]
    on_b = type(cells)(*(b.asarray(np.asarray(a), dtype=np.asarray(a).dtype) for a in cells))
    moments, facet, g = (b.to_numpy(a) for a in b.run(
        lambda s, cl, k, w, l, h: integrate.bernstein_cell_integrals(b.xp, s, cl, k, l, h)
        + (integrate.bernstein_potential_integrals(b.xp, s, cl, w, l, h, c.shape),),
        args[0], on_b, *args[1:]))

    def rho(x):
        k = min(int((x - lo[0]) * 1.5), 2)
        t = (x - lo[0]) * 1.5 - k
        return sum(c[k, j] * comb(3, j) * t ** j * (1 - t) ** (3 - j) for j in range(4))
    for i in range(5):
        a, z = (y[i, 0] + cells.vertices[i, :, 0]) if cells.count[i] else (0.0, 0.0)
        assert all(abs(e - edge) > 1e-6 for e in (a, z) for edge in (1 / 6, 5 / 6))
        want = [scipy_integrate.quad(lambda x: rho(x) * (x - y[i, 0]) ** m, a, z, points=[1 / 6, 5 / 6],
                                     epsabs=1e-15, epsrel=1e-13)[0] for m in range(3)]
        np.testing.assert_allclose(moments[i], want, rtol=0, atol=1e-13)
        if cells.count[i]:           # the ends here are inside grid segments, or the domain's ends
            np.testing.assert_allclose(facet[i], [rho(a), rho(z)], rtol=1e-13)
        else:
            assert moments[i].tolist() == [0.0] * 3 and facet[i].tolist() == [0.0] * 2
    assert g.shape == c.shape
    assert np.sum(g * c) == pytest.approx(np.sum(moments[:, 2] - psi * moments[:, 0]), rel=1e-13)


# ------------------------------------------------------------------ gradients
def test_gradients_match_finite_differences(sdot_driver):
    """d W2^2 / d(positions, masses, coefficients) from torch against central finite differences
    of NumPy solves (a zero coefficient in the density), JAX's gradients under ``jax.jit`` equal to
    torch's to 1e-12 (the plan's derivatives: test_bernstein_plan_derivatives.py)."""
    import torch

    jax = pytest.importorskip("jax")
    rng = np.random.default_rng(6)
    y, m, c = rng.random(8), 0.5 + rng.random(8), 0.3 + rng.random((4, 3))
    c[2, 0] = 0.0

    def value(y, m, c):
        return w2(y, c, weights=m)
    sdot_driver.framework = "numpy"
    eps = 1e-6
    entries = [(0, (2,)), (0, (5,)), (1, (3,)), (2, (0, 0)), (2, (1, 2)), (2, (2, 1)), (2, (3, 1))]
    fd = []
    for arg, idx in entries:
        plus, minus = [np.array(a) for a in (y, m, c)], [np.array(a) for a in (y, m, c)]
        plus[arg][idx] += eps
        minus[arg][idx] -= eps
        fd.append((value(*plus) - value(*minus)) / (2 * eps))
    args = [torch.tensor(a, requires_grad=True) for a in (y, m, c)]
    sdot.distance(sdot.SumOfWeightedDiracs(args[0][:, None], args[1]), sdot.PolynomialGrid(args[2])).backward()
    torch_grads = [a.grad.numpy() for a in args]
    np.testing.assert_allclose([torch_grads[a][i] for a, i in entries], fd, rtol=1e-7, atol=1e-10)
    jnp = jax.numpy

    def total(y, m, c):
        return sdot.distance(sdot.SumOfWeightedDiracs(y[:, None], m), sdot.PolynomialGrid(c))
    for got, want in zip(jax.jit(jax.grad(total, argnums=(0, 1, 2)))(*map(jnp.asarray, (y, m, c))), torch_grads):
        np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=1e-12)
