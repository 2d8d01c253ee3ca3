"""Exact 2D solves against a ``PolynomialGrid`` of Bernstein degree p (coefficients per cell).

Ground truth that does not come from the code under test: the reference case bernstein1-2d
(tests/data/README.md), the constant-per-cell grid (another code path, itself checked against
the C++ references), the same density written differently (de Casteljau subdivision, degree
elevation), an independent quadrature of the density over the Laguerre cells of scipy
(:mod:`reference`: polygons clipped to every grid cell, collapsed Gauss rules) and central
finite differences of the solver's value.
"""
from __future__ import annotations

from math import comb
from pathlib import Path

import array_api_compat.numpy as npx
import numpy as np
import pytest

import reference
import sdot
from sdot._core import plan as core_plan
from sdot._core.density import PixelDensity
from sdot._core.planar import integrate
from sdot._core.planar.polygons import Cells
from conftest import USER_FRAMEWORKS

DATA = Path(__file__).parent / "data"
REF_BERNSTEIN1 = 0.0005614890065925226


def bernstein(rng, shape, p, low=0.2):
    """Random positive Bernstein coefficients of degree ``p`` on a grid of ``shape``."""
    return low + rng.random(tuple(shape) + ((p + 1) ** 2,))


def w2(points, coefficients, domain=None, **options):
    return float(sdot.distance(sdot.SumOfDiracs(points), sdot.PolynomialGrid(coefficients, domain=domain),
                               tol=1e-12, **options))


# ------------------------------------------------------------------ the integrals
def diagram(seeds, psi, lo, hi):
    """The cells of ``(seeds, psi)`` in the box, on NumPy (the geometry is not under test here)."""
    return core_plan.diagram(npx, seeds, psi, PixelDensity(np.ones((1, 1)), lo, hi)).cells


def on_backend(b, cells):
    return Cells(*(b.asarray(getattr(cells, f), dtype=np.asarray(getattr(cells, f)).dtype) for f in Cells._fields))


def integrals(b, seeds, cells, coefficients, lo, hi):
    args = [b.asarray(a) for a in (seeds, coefficients, lo, hi)]
    out = b.run(lambda s, c, d, l, h: integrate.bernstein_cell_integrals(b.xp, s, c, d, l, h),
                args[0], on_backend(b, cells), *args[1:])
    return tuple(b.to_numpy(a) for a in out)


def quadrature(seeds, psi, coefficients, lo, hi, vertices, count):
    """Cell moments and edge integrals by :mod:`reference` (scipy's cells; the edges of ``vertices``)."""
    polys = reference.laguerre_cells(seeds, psi, lo, hi)
    moments = np.array([reference.bernstein_cell_moments(p, seeds[i], coefficients, lo, hi)
                        for i, p in enumerate(polys)])
    facet = np.zeros(vertices.shape[:2])
    for i in range(len(seeds)):
        k = int(count[i])
        for s in range(k):
            a, b = seeds[i] + vertices[i, s], seeds[i] + vertices[i, (s + 1) % k]
            facet[i, s] = reference.bernstein_segment_integral(a, b, coefficients, lo, hi)
    return moments, facet


@pytest.mark.parametrize("case", ["one-dirac-one-cell", "diracs-3x3"])
def test_cell_integrals_against_independent_quadrature(backend, case):
    """A random degree-2 density: per cell the mass, first and second moments about the seed,
    per edge the density along it, against the quadrature of scipy's cells clipped to every
    grid cell, to 1e-12 (a Dirac outside the box, cells across several grid cells)."""
    rng = np.random.default_rng(3)
    if case == "one-dirac-one-cell" and backend.framework == "jax":
        pytest.skip("the same kernel as diracs-3x3 on JAX: one compile is enough")
    if case == "one-dirac-one-cell":
        lo, hi = np.array([0.0, 0.0]), np.array([1.0, 1.0])
        seeds, psi, shape = np.array([[0.3, 0.6]]), np.zeros(1), (1, 1)
    else:
        lo, hi = np.array([-0.5, 0.25]), np.array([1.5, 1.0])
        seeds = lo + (hi - lo) * rng.random((7, 2))
        seeds[0] = [1.9, 0.5]
        psi, shape = 0.05 * rng.random(7), (3, 3)
    coefficients = bernstein(rng, shape, 2)
    cells = diagram(seeds, psi, lo, hi)
    moments, facet = integrals(backend, seeds, cells, coefficients, lo, hi)
    want_m, want_f = quadrature(seeds, psi, coefficients, lo, hi, cells.vertices, cells.count)
    np.testing.assert_allclose(moments, want_m, rtol=0, atol=1e-12 * np.abs(want_m).max())
    np.testing.assert_allclose(facet, want_f, rtol=0, atol=1e-12 * np.abs(want_f).max())


def test_potential_integrals_are_the_transpose_of_the_moments(backend):
    """``sum(g * c) == sum_i (-psi_i mass_i + M2_i)`` for ``g`` the potential integrals (the
    gradient of W2^2 in the coefficients), and the general polynomial integrals against random
    coefficients likewise, degree 3, a far cell (a Dirac at 40 domain sides) included."""
    rng = np.random.default_rng(4)
    lo, hi = np.array([-0.5, 0.2]), np.array([1.5, 1.4])
    seeds = lo + (hi - lo) * rng.random((20, 2))
    seeds[0] = [40.0, 30.0]
    psi = 0.05 * rng.random(20)
    psi[0] = 3200.0                          # the far Dirac owns a cell in the box
    cells = diagram(seeds, psi, lo, hi)
    assert cells.count[0] > 0
    coefficients = bernstein(rng, (3, 4), 3)
    moments = integrate.bernstein_cell_integrals(npx, seeds, cells, coefficients, lo, hi)[0]
    poly = rng.standard_normal((20, 4))
    b = backend
    args = [b.asarray(a) for a in (seeds, psi, poly, lo, hi)]
    shape = coefficients.shape
    g_psi, g_poly = (b.to_numpy(a) for a in b.run(
        lambda s, c, w, k, l, h: (integrate.bernstein_potential_integrals(b.xp, s, c, w, l, h, shape),
                                  integrate.bernstein_polynomial_integrals(b.xp, s, c, k, l, h, shape)),
        args[0], on_backend(b, cells), *args[1:]))
    assert g_psi.shape == shape
    want = np.sum(moments[:, 3] - psi * moments[:, 0])
    assert np.sum(g_psi * coefficients) == pytest.approx(want, rel=1e-11)
    assert np.sum(g_poly * coefficients) == pytest.approx(np.sum(poly * moments), rel=1e-11)


@pytest.mark.parametrize("p", [0, 1, 2, 3])
def test_constant_cells_are_the_pixel_walk(p):
    """All coefficients of a cell equal: the density is the pixel grid of their value, and
    the integrals equal those of the pixel walk (p = 0: the same problem) to 1e-13."""
    rng = np.random.default_rng(5)
    lo, hi = np.array([0.0, -1.0]), np.array([2.0, 1.0])
    seeds = lo + (hi - lo) * rng.random((60, 2))
    psi = 0.02 * rng.random(60)
    img = 0.1 + rng.random((7, 5))
    cells = diagram(seeds, psi, lo, hi)
    want = integrate.cell_integrals(npx, seeds, cells, img, lo, hi)
    got = integrate.bernstein_cell_integrals(npx, seeds, cells, np.repeat(img[..., None], (p + 1) ** 2, axis=2), lo, hi)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-13 * np.abs(b).max())
    g_want = integrate.potential_integrals(npx, seeds, cells, psi, lo, hi, img.shape)
    g_got = integrate.bernstein_potential_integrals(npx, seeds, cells, psi, lo, hi, img.shape + ((p + 1) ** 2,))
    np.testing.assert_allclose(g_got.sum(axis=2), g_want, rtol=0, atol=1e-13 * np.abs(g_want).max())


# ------------------------------------------------------------------ solves
@USER_FRAMEWORKS
def test_reference_bernstein1_2d(backend):
    """The reference case bernstein1-2d (16x16 cells of degree 1, 2000 Diracs) to 1e-8."""
    b = backend
    points, values = np.load(DATA / "points_2d_2000_r7001.npy"), np.load(DATA / "bern1_16x16x4_r7002.npy")
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(b.asarray(points)), sdot.PolynomialGrid(b.asarray(values)))
    assert bool(plan.converged) and float(plan.residual) <= 1e-10
    assert float(plan.distance) == pytest.approx(REF_BERNSTEIN1, rel=1e-8)
    assert int(plan.iterations) <= 12


def test_every_backend_against_quadrature_of_its_cells(eager_backend):
    """A small degree-2 problem on a non-unit domain: the plan's cells (scipy's, from its
    potential) hold the Diracs' masses and give its W2^2 and barycentres under the independent
    quadrature, to 1e-9."""
    b = eager_backend
    rng = np.random.default_rng(6)
    lo, hi = np.array([-1.0, 0.5]), np.array([2.0, 1.5])
    x = lo + (hi - lo) * rng.random((9, 2))
    w = 0.5 + rng.random(9)
    coefficients = bernstein(rng, (3, 2), 2)
    plan = sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(b.asarray(x), b.asarray(w)),
                                       sdot.PolynomialGrid(b.asarray(coefficients), domain=(lo, hi)), tol=1e-12)
    assert bool(plan.converged)
    psi = b.to_numpy(plan.brenier_potential)
    rho = coefficients / (coefficients.mean() * np.prod(hi - lo))        # mass 1
    polys = reference.laguerre_cells(x, psi, lo, hi)
    mom = np.array([reference.bernstein_cell_moments(p, x[i], rho, lo, hi) for i, p in enumerate(polys)])
    np.testing.assert_allclose(mom[:, 0], w / w.sum(), rtol=0, atol=1e-10)
    assert float(plan.distance) == pytest.approx(mom[:, 3].sum(), rel=1e-9)
    np.testing.assert_allclose(b.to_numpy(plan.barycenters), x + mom[:, 1:3] / mom[:, :1], rtol=0, atol=1e-9)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_constant_coefficients_solve_the_pixel_grid(sdot_driver, p):
    """A degree-p grid with all coefficients of a cell equal gives the answer of the grid of
    those constants (another code path) to 1e-12."""
    sdot_driver.framework = "numpy"
    rng = np.random.default_rng(7)
    x, img = rng.random((40, 2)), 0.2 + rng.random((5, 4))
    want = float(sdot.distance(sdot.SumOfDiracs(x), sdot.Grid(img), tol=1e-12))
    assert w2(x, np.repeat(img[..., None], (p + 1) ** 2, axis=2)) == pytest.approx(want, rel=1e-12)


def subdivided(c):
    """The Bernstein coefficients of each cell split into 2 x 2 (de Casteljau at 1/2 along
    each axis): the same density on a grid twice as fine."""
    n0, n1, nn = c.shape
    p = int(round(np.sqrt(nn))) - 1
    half = 0.5 ** np.arange(p + 1)
    # left half: b_j = sum_{k <= j} c_k B(k, j, 1/2); right half: b_j = sum_{k >= j} c_k B(k - j, p - j, 1/2)
    left = np.array([[comb(j, k) * half[j] if k <= j else 0.0 for k in range(p + 1)] for j in range(p + 1)])
    right = np.array([[comb(p - j, k - j) * half[p - j] if k >= j else 0.0 for k in range(p + 1)]
                      for j in range(p + 1)])
    c = c.reshape(n0, n1, p + 1, p + 1)
    split0 = np.stack([np.einsum("jk,abkl->abjl", m, c) for m in (left, right)], axis=1)      # (n0, 2, n1, ...)
    split0 = split0.reshape(2 * n0, n1, p + 1, p + 1)
    split1 = np.stack([np.einsum("jl,abkl->abkj", m, split0) for m in (left, right)], axis=2)
    return split1.reshape(2 * n0, 2 * n1, nn)


def elevated(c):
    """The Bernstein coefficients of degree p + 1 of the same density (each axis:
    ``c'_k = k / (p+1) c_{k-1} + (1 - k / (p+1)) c_k``)."""
    n0, n1, nn = c.shape
    p = int(round(np.sqrt(nn))) - 1
    e = np.array([[(k / (p + 1) if j == k - 1 else 0.0) + ((1 - k / (p + 1)) if j == k else 0.0)
                   for j in range(p + 1)] for k in range(p + 2)])
    return np.einsum("ik,jl,abkl->abij", e, e, c.reshape(n0, n1, p + 1, p + 1)).reshape(n0, n1, (p + 2) ** 2)


def test_the_same_density_written_differently(sdot_driver):
    """A degree-1 density, its cells split in four by de Casteljau, and its degree elevated
    to 2 then 3: the same W2^2 to 1e-12."""
    sdot_driver.framework = "numpy"
    rng = np.random.default_rng(8)
    x, c = rng.random((40, 2)), bernstein(rng, (3, 4), 1)
    grid = sdot.PolynomialGrid(c)
    assert np.allclose(reference.bernstein_density(x, subdivided(c)), reference.bernstein_density(x, c))
    assert np.allclose(reference.bernstein_density(x, elevated(elevated(c))), reference.bernstein_density(x, c))
    want = float(sdot.distance(sdot.SumOfDiracs(x), grid, tol=1e-12))
    assert w2(x, subdivided(c)) == pytest.approx(want, rel=1e-12)
    assert w2(x, elevated(c)) == pytest.approx(want, rel=1e-12)
    assert w2(x, elevated(elevated(c))) == pytest.approx(want, rel=1e-12)


def test_zero_background_and_a_cell_zero_on_its_border(sdot_driver):
    """Coefficients zero outside a block of cells, and among them cells whose only positive
    coefficient is the middle one (the density ``t0 (1 - t0) t1 (1 - t1)``, zero on the cell's
    border): most Diracs outside the support; the solve converges, and the quadrature of
    scipy's cells of its potential confirms the masses and W2^2."""
    sdot_driver.framework = "numpy"
    rng = np.random.default_rng(9)
    c = np.zeros((6, 6, 9))
    c[2:5, 1:4] = 0.5 + rng.random((3, 3, 9))
    c[3, 2] = 0.0
    c[3, 2, 4] = 3.0
    c[1, 4, 4] = 2.0                                    # an isolated bump
    x = rng.random((30, 2))
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(x), sdot.PolynomialGrid(c), tol=1e-11)
    assert bool(plan.converged)
    rho = c / (c.mean())
    polys = reference.laguerre_cells(x, np.asarray(plan.brenier_potential), np.zeros(2), np.ones(2))
    mom = np.array([reference.bernstein_cell_moments(p, x[i], rho) for i, p in enumerate(polys)])
    np.testing.assert_allclose(mom[:, 0], 1 / 30, rtol=0, atol=1e-9)
    assert float(plan.distance) == pytest.approx(mom[:, 3].sum(), rel=1e-8)


def test_power_diagram_adjust_weights(sdot_driver):
    """``PowerDiagram.adjust_weights`` against a degree-2 grid: each cell's measure is its mass."""
    sdot_driver.framework = "numpy"
    rng = np.random.default_rng(10)
    x, masses = rng.random((12, 2)), 0.5 + rng.random(12)
    pd = sdot.PowerDiagram(x)
    pd.adjust_weights(masses, sdot.PolynomialGrid(bernstein(rng, (4, 4), 2)))
    np.testing.assert_allclose([cell.measure for cell in pd.cells], masses / masses.sum(), atol=1e-10)


# ------------------------------------------------------------------ gradients
def gradient_problem():
    rng = np.random.default_rng(11)
    return rng.random((16, 2)), 0.5 + rng.random(16), bernstein(rng, (3, 2), 2, low=0.5)


def test_gradients_match_finite_differences_and_agree_across_frameworks(sdot_driver):
    """d W2^2 / d(positions, masses, coefficients) from torch against central finite differences
    of NumPy solves (FP64, tol 1e-13), and ``torch.func.grad``'s and JAX's (eager) equal to
    torch's to 1e-10."""
    import torch

    jax = pytest.importorskip("jax")
    x, w, c = gradient_problem()

    def value(x, w, c):
        return float(sdot.distance(sdot.SumOfWeightedDiracs(x, w), sdot.PolynomialGrid(c), tol=1e-13))
    sdot_driver.framework = "numpy"
    eps = 1e-5
    entries = [(0, (3, 0)), (0, (9, 1)), (1, (4,)), (2, (0, 0, 0)), (2, (1, 1, 4)), (2, (2, 1, 8))]
    fd = []
    for arg, idx in entries:
        plus, minus = [np.array(a) for a in (x, w, c)], [np.array(a) for a in (x, w, c)]
        plus[arg][idx] += eps
        minus[arg][idx] -= eps
        fd.append((value(*plus) - value(*minus)) / (2 * eps))
    args = [torch.tensor(a, requires_grad=True) for a in (x, w, c)]
    d = sdot.distance(sdot.SumOfWeightedDiracs(args[0], args[1]), sdot.PolynomialGrid(args[2]), tol=1e-13)
    d.backward()
    torch_grads = [a.grad.numpy() for a in args]
    np.testing.assert_allclose([torch_grads[a][i] for a, i in entries], fd, rtol=1e-6, atol=1e-9)
    func_grads = torch.func.grad(lambda *a: sdot.distance(sdot.SumOfWeightedDiracs(a[0], a[1]), sdot.PolynomialGrid(a[2]),
                                                          tol=1e-13), argnums=(0, 1, 2))(*map(torch.tensor, (x, w, c)))
    for got, want in zip(func_grads, torch_grads):
        np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-10)
    jnp = jax.numpy
    jax_grads = jax.grad(lambda *a: sdot.distance(sdot.SumOfWeightedDiracs(a[0], a[1]), sdot.PolynomialGrid(a[2]),
                                                  tol=1e-13), argnums=(0, 1, 2))(*map(jnp.asarray, (x, w, c)))
    for got, want in zip(jax_grads, torch_grads):
        np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=1e-10)


def test_jax_jit_vmap_and_grad(sdot_driver):
    """Under one ``jax.jit``: a batch of two sources (``distances``, a ``vmap`` of the solve) and
    the gradient of their sum with respect to the positions and the coefficients equal the
    eager ones item by item."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    x, _, c = gradient_problem()
    batch = np.stack([x, 1.0 - x])

    def total(xb, c):
        return jnp.sum(sdot.distances(sdot.BatchOfSumOfDiracs(xb), sdot.PolynomialGrid(c)))
    value, (gx, gc) = jax.jit(jax.value_and_grad(total, argnums=(0, 1)))(jnp.asarray(batch), jnp.asarray(c))
    eager = [jax.value_and_grad(lambda x, c: sdot.distance(sdot.SumOfDiracs(x), sdot.PolynomialGrid(c)),
                                argnums=(0, 1))(jnp.asarray(item), jnp.asarray(c)) for item in batch]
    assert float(value) == pytest.approx(sum(float(v) for v, _ in eager), rel=1e-10)
    np.testing.assert_allclose(np.asarray(gx), np.stack([np.asarray(g[0]) for _, g in eager]), atol=1e-10)
    np.testing.assert_allclose(np.asarray(gc), sum(np.asarray(g[1]) for _, g in eager), atol=1e-10)


def test_input_errors(sdot_driver):
    """Clear errors naming ``values``: a coefficient axis that is not (p+1)^2 long, negative or
    NaN coefficients, a coefficient axis that is no (p+1)^3 in 3D (1D: test_linear_bernstein.py)."""
    sdot_driver.framework = "numpy"
    x = np.random.default_rng(12).random((5, 2))
    with pytest.raises(ValueError, match="values"):
        sdot.distance(sdot.SumOfDiracs(x), sdot.PolynomialGrid(np.ones((3, 3, 5))))
    with pytest.raises(ValueError, match="values"):
        sdot.PolynomialGrid(np.ones((3, 3, 5)), domain=((0, 0), (1, 1)))
    bad = np.ones((3, 3, 4))
    bad[1, 1, 2] = -1.0
    with pytest.raises(ValueError, match="values"):
        sdot.PolynomialGrid(bad)
    bad[1, 1, 2] = np.nan
    with pytest.raises(ValueError, match="values"):
        sdot.PolynomialGrid(bad)
    with pytest.raises(ValueError, match="Bernstein coefficients"):    # 7 is no (p+1)^3
        sdot.distance(sdot.SumOfDiracs(np.random.default_rng(12).random((5, 3))), sdot.PolynomialGrid(np.ones((2, 2, 2, 7))))


def test_numpy_vjp_of_the_distance_wrt_coefficients_matches_finite_differences(sdot_driver):
    """NumPy's ``plan.vjp(distance=1)`` on a degree-2 grid: positions, weights and coefficients
    against central differences (the plan's other derivatives: test_bernstein_plan_derivatives.py)."""
    sdot_driver.framework = "numpy"
    rng = np.random.default_rng(11)
    x, w, c = rng.uniform(0.05, 0.95, (30, 2)), rng.uniform(0.5, 1.5, 30), rng.uniform(0.3, 1.5, (3, 4, 9))

    def plan(x, w, c):
        return sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(x, w), sdot.PolynomialGrid(c), tol=1e-12)
    got = plan(x, w, c).vjp(distance=1.0)
    eps = 1e-6
    for name, base in (("positions", x), ("weights", w), ("values", c)):
        direction = rng.standard_normal(base.shape)
        args = {"positions": x, "weights": w, "values": c}
        up = dict(args, **{name: base + eps * direction})
        down = dict(args, **{name: base - eps * direction})
        fd = (float(plan(up["positions"], up["weights"], up["values"]).distance)
              - float(plan(down["positions"], down["weights"], down["values"]).distance)) / (2 * eps)
        assert float((got[name] * direction).sum()) == pytest.approx(fd, rel=1e-5, abs=1e-10)


def test_jax_scan_of_gradient_steps_equals_the_eager_loop(sdot_driver):
    """Three gradient steps on the positions against a degree-2 grid, as one jitted
    ``lax.scan``, equal the same steps taken eagerly (the loss is the distance plus the
    barycentres' spread, so the scan carries the plan's derivatives too)."""
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    x, _, c = gradient_problem()
    c2 = bernstein(np.random.default_rng(9), c.shape[:2], 2)

    def loss(x):
        plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(x), sdot.PolynomialGrid(jnp.asarray(c2)))
        return plan.distance + jnp.sum((plan.barycenters - x) ** 2)

    def step(x, _):
        value, g = jax.value_and_grad(loss)(x)
        return x - 0.1 * g, value
    x_scan, values = jax.jit(lambda x: jax.lax.scan(step, x, length=3))(jnp.asarray(x))
    x_loop, eager = jnp.asarray(x), []
    for _ in range(3):
        x_loop, value = step(x_loop, None)
        eager.append(float(value))
    np.testing.assert_allclose(np.asarray(values), eager, rtol=1e-10)
    np.testing.assert_allclose(np.asarray(x_scan), np.asarray(x_loop), rtol=0, atol=1e-10)
