"""SplineGrid: the uniform B-spline of degree p = continuity + 1 as an exact Bernstein
PolynomialGrid. Ground truth: the spline evaluated from its definition with scipy's
cardinal B-spline (de Boor's recursion, ``BSpline.basis_element``), a Bernstein evaluator
written here, Gauss quadrature, and finite differences of the linear map."""
from __future__ import annotations

import re
from math import comb

import numpy as np
import pytest
from scipy.interpolate import BSpline

import sdot
from sdot import PolynomialGrid, SplineGrid

SHAPES = {1: (7,), 2: (5, 4), 3: (3, 1, 2)}
DOMAINS = {d: (np.array(lo), np.array(hi)) for d, (lo, hi) in
           {1: ([-1.0], [2.0]), 2: ([-1.0, 0.5], [2.0, 1.25]), 3: ([0.0, -2.0, 1.0], [1.0, -1.5, 3.0])}.items()}


def spline_formula(c, lo, hi, p, pts):
    """``S(x) = sum_i c[clamp(i)] N_p(x - i - 1/2)`` per axis in cell units, tensor product."""
    n_p = BSpline.basis_element(np.arange(p + 2) - (p + 1) / 2, extrapolate=False)
    result = c
    for a, n in enumerate(c.shape):
        u = (pts[:, a] - lo[a]) / (hi[a] - lo[a]) * n
        i = np.arange(-p - 2, n + p + 2)
        along = np.nan_to_num(n_p(u[:, None] - i[None, :] - 0.5))        # (points, i)
        onto = np.zeros((i.size, n))
        onto[np.arange(i.size), np.clip(i, 0, n - 1)] = 1.0              # clamped extension
        basis = along @ onto                                              # (points, n)
        result = np.einsum("pn,pn...->p...", basis, result) if a else np.einsum("pn,n...->p...", basis, result)
    return result


def bernstein_grid_at(values, lo, hi, pts):
    """The PolynomialGrid of Bernstein ``values`` (SPEC layout) at the points ``pts``."""
    d = pts.shape[1]
    shape = np.array(values.shape[:d])
    p = round(values.shape[-1] ** (1 / d)) - 1
    u = (pts - lo) / (hi - lo) * shape
    cell = np.minimum(np.floor(u).astype(int), shape - 1)
    t = u - cell
    k = np.arange(p + 1)
    basis = [np.array([comb(p, j) for j in k]) * t[:, a, None] ** k * (1 - t[:, a, None]) ** (p - k)
             for a in range(d)]
    coef = values[tuple(cell.T)].reshape((len(pts),) + (p + 1,) * d)
    for b in basis:
        coef = np.einsum("pk,pk...->p...", b, coef)
    return coef


def random_points(lo, hi, rng, n=1500):
    lo, hi = np.asarray(lo), np.asarray(hi)
    pts = lo + (hi - lo) * rng.random((n, lo.size))
    return np.concatenate([pts, lo[None], hi[None], 0.5 * (lo + hi)[None]])


@pytest.mark.parametrize("dim", [1, 2, 3])
@pytest.mark.parametrize("continuity", [0, 1, 2])
def test_bernstein_form_is_the_spline(dim, continuity, sdot_driver):
    sdot_driver.framework = "numpy"
    rng = np.random.default_rng(10 * dim + continuity)
    c, (lo, hi), p = rng.random(SHAPES[dim]), DOMAINS[dim], continuity + 1
    grid = SplineGrid(c, continuity=continuity, domain=(lo, hi), mass=None)
    poly = grid.as_polynomial_grid()
    assert isinstance(grid, PolynomialGrid) and type(poly) is PolynomialGrid
    assert (grid.degree, poly.degree, grid.continuity, grid.grid_shape) == (p, p, continuity, SHAPES[dim])
    assert poly.grid_shape == tuple((2 if p % 2 else 1) * n for n in SHAPES[dim])   # odd p: knots at centres
    pts = random_points(lo, hi, rng)
    np.testing.assert_allclose(bernstein_grid_at(np.asarray(poly.values), lo, hi, pts),
                               spline_formula(c, lo, hi, p, pts), rtol=0, atol=1e-13)


@pytest.mark.parametrize("continuity", [0, 1, 2, 3])
def test_constant_nonnegative_and_integral(continuity, sdot_driver):
    sdot_driver.framework = "numpy"
    rng = np.random.default_rng(continuity)
    lo, hi = DOMAINS[2]
    const = SplineGrid(np.full((4, 3), 2.5), continuity=continuity, domain=(lo, hi), mass=None)
    np.testing.assert_allclose(np.asarray(const.as_polynomial_grid().values), 2.5, rtol=1e-15)
    c = rng.random((6, 5)) * (rng.random((6, 5)) < 0.5)              # zeros and positives
    c[0, 0] = 1.0
    grid = SplineGrid(c, continuity=continuity, domain=(lo, hi), mass=None)
    assert np.asarray(grid.as_polynomial_grid().values).min() >= 0
    # the integral of S: Gauss-Legendre on each half cell (inside one knot span), exact for degree p
    t, w = np.polynomial.legendre.leggauss(continuity + 2)
    half = [lo[a] + (hi[a] - lo[a]) / (2 * n) * (np.arange(2 * n)[:, None] + (t + 1) / 2)
            for a, n in enumerate(c.shape)]
    xs, ys = np.meshgrid(half[0].ravel(), half[1].ravel(), indexing="ij")
    weights = np.outer(np.tile(w, 2 * c.shape[0]), np.tile(w, 2 * c.shape[1])) / 4
    vol = np.prod((hi - lo) / (2 * np.array(c.shape)))
    quadrature = np.sum(weights * spline_formula(c, lo, hi, continuity + 1,
                                                 np.stack([xs.ravel(), ys.ravel()], 1)).reshape(xs.shape)) * vol
    assert float(grid.integral) == pytest.approx(quadrature, rel=1e-13)
    normalised = SplineGrid(c, continuity=continuity, domain=(lo, hi), mass=3.0)
    assert float(normalised.as_polynomial_grid().integral) == pytest.approx(quadrature, rel=1e-13)
    poly = normalised.with_dim(2)
    assert float(np.mean(poly.density) * np.prod(hi - lo)) == pytest.approx(3.0, rel=1e-13)


@pytest.mark.parametrize("dim, continuity", [(1, 2), (2, 1), (2, 2), (3, 1)])
def test_interpolation_through_the_samples(dim, continuity, sdot_driver):
    sdot_driver.framework = "numpy"
    rng = np.random.default_rng(dim)
    lo, hi = DOMAINS[dim]
    shape = {1: (9,), 2: (6, 5), 3: (4, 3, 3)}[dim]
    samples = 1.0 + 0.3 * rng.random(shape)
    grid = SplineGrid(samples, continuity=continuity, domain=(lo, hi), interpolate=True, mass=None)
    centres = np.stack(np.meshgrid(*[lo[a] + (hi[a] - lo[a]) * (np.arange(n) + 0.5) / n
                                     for a, n in enumerate(shape)], indexing="ij"), -1).reshape(-1, dim)
    control = np.asarray(grid.control_values)
    np.testing.assert_allclose(spline_formula(control, lo, hi, continuity + 1, centres), samples.ravel(),
                               rtol=0, atol=1e-13)
    np.testing.assert_allclose(bernstein_grid_at(np.asarray(grid.as_polynomial_grid().values), lo, hi, centres),
                               samples.ravel(), rtol=0, atol=1e-13)
    assert not np.allclose(control, samples)                   # degree >= 2 does not interpolate its controls
    assert np.asarray(grid.values) is samples or np.array_equal(grid.values, samples)


def interpolation_matrix(n, p):
    """``A[j, i]``: the weight of control value ``i`` in ``S`` at the centre of cell ``j``."""
    centres = ((np.arange(n) + 0.5) / n)[:, None]
    return np.stack([spline_formula(e, np.zeros(1), np.ones(1), p, centres) for e in np.eye(n)], 1)


def test_interpolation_that_dips_below_zero_is_refused(sdot_driver):
    sdot_driver.framework = "numpy"
    samples = np.array([0.0, 0.0, 1.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="dips below zero.*interpolate=False") as err:
        SplineGrid(samples, continuity=2, interpolate=True)
    value, x = re.search(r"S = (\S+) at x = \[(\S+)\]", str(err.value)).groups()
    control = np.linalg.solve(interpolation_matrix(5, 3), samples)
    at_x = spline_formula(control, np.zeros(1), np.ones(1), 3, np.array([[float(x)]]))[0]
    assert float(value) < 0 and at_x == pytest.approx(float(value), abs=2e-3)
    with pytest.raises(ValueError, match="dips below zero.*interpolate=False"):
        SplineGrid(np.kron(np.eye(3), np.ones((2, 2))) + 0.01, continuity=1, interpolate=True)
    # degree 2 through a narrow dip: S >= 0 (min 0.02 at the centre) but a Bernstein coefficient is < 0
    samples = np.array([1.0, 1.0, 0.02, 1.0, 1.0])
    with pytest.raises(ValueError, match="negative Bernstein coefficients.*may dip below zero"):
        SplineGrid(samples, continuity=1, interpolate=True)
    with pytest.raises(ValueError, match="values must be >= 0"):
        SplineGrid([1.0, -0.5, 1.0], continuity=1, interpolate=True)
    # degree 1 interpolates its (non-negative) control values: never refused
    SplineGrid([0.0, 0.0, 1.0, 0.0, 0.0], continuity=0, interpolate=True)


def test_validation(sdot_driver):
    sdot_driver.framework = "numpy"
    v = np.ones((3, 4))
    for bad, err, match in [(-1, ValueError, "continuity must be an integer >= 0, got -1"),
                            (1.5, TypeError, "continuity must be an integer"),
                            (True, TypeError, "continuity must be an integer"),
                            ("1", TypeError, "continuity must be an integer")]:
        with pytest.raises(err, match=match):
            SplineGrid(v, continuity=bad)
    with pytest.raises(TypeError, match="interpolate must be True or False"):
        SplineGrid(v, interpolate="yes")
    for too_smooth in (17, 50):           # at once, not after minutes of integrals
        with pytest.raises(ValueError, match="the largest supported degree is 17 .*continuity 16"):
            SplineGrid(v, continuity=too_smooth)
    with pytest.raises(ValueError, match="degree 18 per axis: the largest supported degree is 17"):
        sdot.PolynomialGrid(np.ones((2, 2, 19 ** 2)), domain=([0, 0], [1, 1]))
    with pytest.raises(ValueError, match="values must be >= 0"):
        SplineGrid(-v)
    with pytest.raises(ValueError, match="values contains NaN"):
        SplineGrid(np.where(v > 0, np.nan, v))
    with pytest.raises(ValueError, match="all zero"):
        SplineGrid(0 * v)
    with pytest.raises(ValueError, match="non-empty"):
        SplineGrid(np.ones((0, 3)))
    with pytest.raises(ValueError, match="values must have 3 axes"):
        SplineGrid(v, domain=([0, 0, 0], [1, 1, 1]))
    with pytest.raises(ValueError, match="values must have 3 axes.*dimension mismatch"):
        SplineGrid(v).with_dim(3)
    with pytest.raises(ValueError, match="dimension mismatch"):
        sdot.distance(sdot.SumOfDiracs(np.random.default_rng(0).random((4, 3))), SplineGrid(v))


@pytest.mark.parametrize("continuity, interpolate", [(1, True), (2, False)])
def test_backends(backend, continuity, interpolate):
    rng = np.random.default_rng(continuity)
    v = 1.0 + rng.random((4, 3))
    want = SplineGrid(v, continuity=continuity, interpolate=interpolate)
    want_values, want_density = np.asarray(want.as_polynomial_grid().values), np.asarray(want.density)
    grid = SplineGrid(backend.asarray(v), continuity=continuity, interpolate=interpolate)
    assert grid.native == backend.native and grid.degree == continuity + 1

    def convert(x):
        g = SplineGrid(x, continuity=continuity, interpolate=interpolate)
        return g.with_dim(2).values, g.density

    values, density = backend.run(convert, backend.asarray(v))
    np.testing.assert_allclose(backend.to_numpy(values), want_values, rtol=1e-13)
    np.testing.assert_allclose(backend.to_numpy(density), want_density, rtol=1e-13)


@pytest.mark.parametrize("continuity, interpolate", [(0, False), (2, True)])
def test_autodiff_is_the_transpose(continuity, interpolate, sdot_driver):
    torch = pytest.importorskip("torch")
    jax = pytest.importorskip("jax")
    sdot_driver.framework = "numpy"
    rng = np.random.default_rng(5)
    v = 1.0 + rng.random((4, 3))

    def bernstein(x):
        return SplineGrid(x, continuity=continuity, interpolate=interpolate).as_polynomial_grid().values

    cot = rng.normal(size=np.shape(bernstein(v)))
    loss = lambda x: np.sum(bernstein(x) * cot)                 # noqa: E731
    direction = rng.normal(size=v.shape)
    h = 1e-3                                                    # the map is linear: any step is exact
    fd = (loss(v + h * direction) - loss(v - h * direction)) / (2 * h)

    t = torch.tensor(v, requires_grad=True)
    (g_torch,) = torch.autograd.grad((bernstein(t) * torch.from_numpy(cot)).sum(), t)
    assert float(np.sum(g_torch.numpy() * direction)) == pytest.approx(fd, rel=1e-10)

    def f(grid):                                                # the SplineGrid itself is the pytree argument
        return jax.numpy.sum(grid.as_polynomial_grid().values * cot)

    grid = SplineGrid(jax.numpy.asarray(v), continuity=continuity, interpolate=interpolate)
    g_jax = jax.jit(jax.grad(f))(grid)
    assert type(g_jax) is SplineGrid and g_jax.continuity == continuity
    np.testing.assert_allclose(np.asarray(g_jax.values), g_torch.numpy(), rtol=1e-13, atol=1e-13)


def test_distance_to_spline_is_distance_to_its_bernstein_grid(sdot_driver):
    sdot_driver.framework = "numpy"
    rng = np.random.default_rng(3)
    x, v = rng.random((20, 2)), 0.5 + rng.random((6, 5))
    spline = SplineGrid(v, continuity=1)
    converted = np.asarray(spline.as_polynomial_grid().values)
    want = sdot.distance(sdot.SumOfDiracs(x), PolynomialGrid(converted))
    assert float(sdot.distance(sdot.SumOfDiracs(x), spline)) == pytest.approx(float(want), rel=1e-12)


@pytest.mark.parametrize("continuity", [0, 1])
def test_gradient_wrt_spline_values_matches_finite_differences_torch_and_jax(continuity):
    """d W2^2 / d values through the spline's linear map: torch autograd against central
    differences along random directions, and JAX's grad equal to torch's."""
    torch = pytest.importorskip("torch")
    jax = pytest.importorskip("jax")
    rng = np.random.default_rng(7 + continuity)
    x, v = rng.uniform(0.05, 0.95, (25, 2)), 0.5 + rng.random((5, 4))

    def w2(values):
        return sdot.distance(sdot.SumOfDiracs(x), SplineGrid(values, continuity=continuity), tol=1e-12)
    vt = torch.tensor(v, requires_grad=True)
    (g,) = torch.autograd.grad(w2(vt), vt)
    for _ in range(2):
        dv, eps = rng.standard_normal(v.shape), 1e-5
        fd = (float(w2(torch.tensor(v + eps * dv))) - float(w2(torch.tensor(v - eps * dv)))) / (2 * eps)
        assert float((g * torch.tensor(dv)).sum()) == pytest.approx(fd, rel=1e-5, abs=1e-9)
    gj = jax.grad(w2)(jax.numpy.asarray(v, dtype=jax.numpy.float64))     # conftest enables x64
    np.testing.assert_allclose(np.asarray(gj), g.numpy(), rtol=1e-9, atol=1e-12)


# ------------------------------------------- NumPy's jvp and vjp in terms of the spline's values
@pytest.mark.parametrize("interpolate", [False, True])
@pytest.mark.parametrize("continuity", [0, 1, 2])
@pytest.mark.parametrize("dim", [1, 2, 3])
def test_transpose_of_the_spline_map(dim, continuity, interpolate, sdot_driver):
    """``<T^T u, v> = <u, T v>`` for the spline's map ``T`` (values -> Bernstein coefficients,
    itself checked against the spline's formula above) and random ``u``, ``v``."""
    sdot_driver.framework = "numpy"
    rng = np.random.default_rng(100 * dim + 10 * continuity + interpolate)
    grid = SplineGrid(np.ones(SHAPES[dim]), continuity=continuity, interpolate=interpolate)
    v = 1.0 + 0.2 * rng.random(SHAPES[dim])           # positive: a valid SplineGrid's values
    forward = grid.bernstein_tangent(v)
    as_grid = SplineGrid(v, continuity=continuity, interpolate=interpolate, mass=None).as_polynomial_grid()
    np.testing.assert_allclose(forward, as_grid.values, rtol=0, atol=1e-14)
    u = rng.standard_normal(forward.shape)
    back = grid.values_cotangent(u)
    assert back.shape == v.shape
    assert np.sum(back * v) == pytest.approx(np.sum(u * forward), rel=1e-12, abs=1e-12)


def test_transpose_of_the_spline_map_on_backends(backend):
    """The transpose (a scatter-add and ``A^T`` solves) on every backend equals NumPy's."""
    rng = np.random.default_rng(4)
    grid = SplineGrid(np.ones((4, 3)), continuity=2, interpolate=True)
    u = rng.standard_normal((8, 6, 16))           # cubic: two knot spans per cell and axis
    with backend.shapes():
        got = backend.run(grid.values_cotangent, backend.asarray(u))
    np.testing.assert_allclose(backend.to_numpy(got), grid.values_cotangent(u), rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("dim, continuity, interpolate", [(1, 2, True), (2, 0, True), (2, 1, False),
                                                          (3, 1, True)])
def test_numpy_derivatives_wrt_spline_values_equal_torch_autograd(dim, continuity, interpolate, sdot_driver):
    """NumPy's ``plan.vjp`` wrt the spline's values (distance and barycentres) equals torch
    autograd's gradient through the spline's map, and ``plan.jvp`` along a tangent of the values
    is its dual (``<grad, dv> = <cotangent, jvp(dv)>``)."""
    torch = pytest.importorskip("torch")
    sdot_driver.framework = "numpy"
    rng = np.random.default_rng(20 + dim + continuity)
    shape = {1: (7,), 2: (5, 4), 3: (3, 2, 2)}[dim]
    x, v = rng.uniform(0.1, 0.9, (12, dim)), 1.0 + rng.random(shape)
    cot = rng.standard_normal((12, dim))
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(x), SplineGrid(v, continuity, interpolate=interpolate),
                                       tol=1e-12)
    got_distance, got_barycenters = plan.vjp(distance=1.0)["values"], plan.vjp(barycenters=cot)["values"]

    vt = torch.tensor(v, requires_grad=True)
    out = sdot.optimal_transport_plan(sdot.SumOfDiracs(torch.tensor(x)),
                                      SplineGrid(vt, continuity, interpolate=interpolate), tol=1e-12)
    (want_distance,) = torch.autograd.grad(out.distance, vt, retain_graph=True)
    (want_barycenters,) = torch.autograd.grad((out.barycenters * torch.from_numpy(cot)).sum(), vt)
    for got, want in ((got_distance, want_distance), (got_barycenters, want_barycenters)):
        assert got.shape == shape
        np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=1e-10 * np.abs(want.numpy()).max())

    dv = rng.standard_normal(shape)
    tangent = plan.jvp(values=dv)
    assert float(tangent["distance"]) == pytest.approx(float(np.sum(want_distance.numpy() * dv)), rel=1e-10)
    assert float(np.sum(tangent["barycenters"] * cot)) == pytest.approx(
        float(np.sum(want_barycenters.numpy() * dv)), rel=1e-10)


def test_numpy_derivatives_wrt_spline_values_match_finite_differences(sdot_driver):
    """``plan.jvp(values=dv)`` and ``<plan.vjp(...)["values"], dv>`` for an interpolating C^1
    spline against central differences of the distance and the barycentres."""
    sdot_driver.framework = "numpy"
    rng = np.random.default_rng(31)
    x, v = rng.uniform(0.1, 0.9, (8, 2)), 1.0 + rng.random((3, 4))
    dv, cot = rng.standard_normal(v.shape), rng.standard_normal((8, 2))

    def plan(values):
        grid = SplineGrid(values, continuity=1, interpolate=True)
        return sdot.optimal_transport_plan(sdot.SumOfDiracs(x), grid, tol=1e-13)
    eps = 1e-6
    up, down = plan(v + eps * dv), plan(v - eps * dv)
    fd_distance = (float(up.distance) - float(down.distance)) / (2 * eps)
    fd_barycenters = (up.barycenters - down.barycenters) / (2 * eps)
    base = plan(v)
    tangent = base.jvp(values=dv)
    assert float(tangent["distance"]) == pytest.approx(fd_distance, rel=1e-6, abs=1e-10)
    np.testing.assert_allclose(tangent["barycenters"], fd_barycenters, rtol=0, atol=1e-7)
    assert float(np.sum(base.vjp(distance=1.0)["values"] * dv)) == pytest.approx(fd_distance, rel=1e-6, abs=1e-10)
    assert float(np.sum(base.vjp(barycenters=cot)["values"] * dv)) == pytest.approx(
        float(np.sum(fd_barycenters * cot)), rel=1e-6, abs=1e-8)


def test_the_largest_degree_keeps_the_masses_exact(sdot_driver):
    """At continuity 16 (degree 17, the largest) the cells' masses still sum to the total
    (1e-9 off at continuity 22, which the solver's tolerance cannot tell from converged)."""
    sdot_driver.framework = "numpy"
    rng = np.random.default_rng(0)
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(rng.random((20, 2))),
                                       SplineGrid(rng.uniform(0.5, 2.0, (8, 8)), continuity=16))
    assert abs(float(np.sum(np.asarray(plan.cell_masses))) - 1.0) < 1e-11
    assert float(plan.residual) <= 1e-10
