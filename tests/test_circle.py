"""The circle (``metric=PeriodicMetric(Norm2(), [L])`` in 1D): the torus's 2D Newton solve of a
density constant across, closed forms (a lattice, one Dirac against a polynomial density),
translations of the circle, and derivatives across the side, on every framework."""
import math

import numpy as np
import pytest

import sdot
from sdot.metrics import Norm2, PeriodicMetric

CIRCLE = PeriodicMetric(Norm2(), [1.0])
TORUS2 = PeriodicMetric(Norm2(), [1.0, 1.0])

EAGER = pytest.mark.only_backends("numpy", "torch", "jax", "array_api_strict",
                                  reason="periodic domains are solved on the host (the compiled route refuses)")


def problem(seed=0, n=30, zeros=True):
    """Diracs of unequal masses, one just right of 0, against a 16-pixel density with zeros at
    both ends (a gap across the side) and inside."""
    rng = np.random.default_rng(seed)
    x, masses, image = rng.random(n), 0.5 + rng.random(n), 0.1 + rng.random(16)
    x[0] = 0.001
    if zeros:
        image[[0, 1, 7, 8, 15]] = 0.0
    return x, masses / masses.sum(), image


def circle_plan(x, masses, image, **options):
    return sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(x[:, None], masses), sdot.Grid(image), metric=CIRCLE,
                                       **options)


@pytest.mark.parametrize("zeros", [False, True])
def test_the_circle_is_the_torus_of_a_density_constant_across(numpy_driver, zeros):
    """Diracs on the line y = 1/2 of the unit torus against a density constant in y: the cells
    are strips and W2^2 is the circle's plus 1/12 (the 2D Newton solve, checked against the C++
    solver's periodic mode, against the 1D closed form)."""
    x, masses, image = problem(1, zeros=zeros)
    circle = circle_plan(x, masses, image)
    points = np.stack([x, np.full_like(x, 0.5)], axis=1)
    torus = sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(points, masses), sdot.Grid(image[:, None]),
                                        metric=TORUS2, tol=1e-13)
    assert float(circle.distance) == pytest.approx(float(torus.distance) - 1 / 12, rel=1e-11)
    assert np.asarray(circle.barycenters)[:, 0] == pytest.approx(np.asarray(torus.barycenters)[:, 0], abs=1e-11)
    assert np.asarray(circle.cell_masses) == pytest.approx(masses, abs=1e-15)
    # the line's cells cannot wrap around: more
    assert float(sdot.distance(sdot.SumOfWeightedDiracs(x[:, None], masses), sdot.Grid(image))) > float(
        circle.distance)


@pytest.mark.parametrize("k", [1, 2, 7])
def test_a_translated_lattice(numpy_driver, k):
    """``k`` Diracs ``1/k`` apart moved by any amount, beyond the domain too: cells of length
    ``1/k`` about them, W2^2 = 1 / (12 k^2), barycentres the Diracs."""
    x = (np.arange(k) + 0.5) / k + 2.37
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs1d(x), sdot.Grid(np.ones(3)), metric=CIRCLE)
    assert float(plan.distance) == pytest.approx(1 / (12 * k * k), rel=1e-13)
    assert np.asarray(plan.barycenters)[:, 0] == pytest.approx(x, abs=1e-13)


def test_one_dirac_against_a_polynomial_density(numpy_driver):
    """One Dirac takes the whole circle, ``[y - 1/2, y + 1/2]``: W2^2 is the integral of
    ``d(x, y)^2 rho(x)``, here by Gauss-Legendre quadrature of the Bernstein polynomials (exact
    for these degrees)."""
    rng = np.random.default_rng(3)
    coefficients = 0.2 + rng.random((5, 4))         # degree 3 on 5 cells
    nodes, weights = np.polynomial.legendre.leggauss(8)
    t = 0.5 * (nodes + 1.0)
    basis = np.stack([math.comb(3, j) * t ** j * (1 - t) ** (3 - j) for j in range(4)], axis=1)
    x = ((np.arange(5)[:, None] + t[None, :]) / 5).ravel()
    rho = (coefficients @ basis.T).ravel()
    w = np.tile(0.5 * weights / 5, 5)
    for y in (0.3, 0.9, -1.5):                     # (antipodes at cell edges: the quadrature is exact)
        d = np.abs(x - np.mod(y, 1.0))
        d = np.minimum(d, 1 - d)
        expected = (w * rho * d * d).sum() / (w * rho).sum()
        got = float(sdot.distance(sdot.SumOfDiracs1d(np.array([y])), sdot.PolynomialGrid(coefficients),
                                  metric=CIRCLE))
        assert got == pytest.approx(expected, rel=1e-13)


@EAGER
def test_on_every_framework(backend):
    """The same W2^2 on every framework, and rolling the pixels while moving the Diracs alike
    changes nothing."""
    x, masses, image = problem(2)
    reference = float(circle_plan(x, masses, image).distance)

    def w(points, values):
        return float(sdot.distance(sdot.SumOfWeightedDiracs(backend.asarray(points[:, None]), backend.asarray(masses)),
                                   sdot.Grid(backend.asarray(values)), metric=CIRCLE))
    assert w(x, image) == pytest.approx(reference, rel=1e-13)
    assert w(x + 5 / 16, np.roll(image, 5)) == pytest.approx(reference, rel=1e-12)


def test_polynomial_densities_translate_by_whole_cells_and_splines_are_the_torus(numpy_driver):
    """Bernstein polynomials of degree 2: rolling the cells and moving the Diracs alike changes
    nothing. A spline density: the torus's 2D solve of the spline constant across (as above)."""
    rng = np.random.default_rng(5)
    x, coefficients, values = rng.random(40), 0.3 + rng.random((8, 3)), 0.3 + rng.random(8)
    w = float(sdot.distance(sdot.SumOfDiracs1d(x), sdot.PolynomialGrid(coefficients), metric=CIRCLE))
    moved = float(sdot.distance(sdot.SumOfDiracs1d(x + 3 / 8), sdot.PolynomialGrid(np.roll(coefficients, 3, axis=0)),
                                metric=CIRCLE))
    assert moved == pytest.approx(w, rel=1e-12)
    spline = float(sdot.distance(sdot.SumOfDiracs1d(x), sdot.SplineGrid(values), metric=CIRCLE))
    torus = float(sdot.distance(sdot.SumOfDiracs(np.stack([x, np.full_like(x, 0.5)], axis=1)),
                                sdot.SplineGrid(values[:, None]), metric=TORUS2, tol=1e-13))
    assert spline == pytest.approx(torus - 1 / 12, rel=1e-11)


def test_plan_derivatives_against_finite_differences(numpy_driver):
    """The plan's arrays along a change of positions (the Dirac at 0.001 across 0), masses and
    pixel values; the position gradient continuous across the side."""
    x, masses, image = problem(4, zeros=False)
    rng = np.random.default_rng(6)
    dy, dm, dv = rng.standard_normal(30), rng.standard_normal(30), rng.standard_normal(16)
    dy[0] = -1.0

    def plan(t):
        return circle_plan(x + t * dy, masses + t * dm, image + t * dv)
    tangent = plan(0.0).jvp(positions=dy[:, None], weights=dm, values=dv)
    h = 1e-6
    up, down = plan(h), plan(-h)
    for name in ("distance", "barycenters", "brenier_potential", "cell_masses"):
        fd = (np.asarray(getattr(up, name)) - np.asarray(getattr(down, name))) / (2 * h)
        assert np.asarray(tangent[name]) == pytest.approx(fd, rel=1e-5, abs=1e-7 * np.abs(fd).max()), name
    grads = [2 * masses[0] * (p - np.asarray(circle_plan(x + p - x[0], masses, image).barycenters)[0, 0])
             for p in (0.0005, -0.0005)]
    assert grads[0] == pytest.approx(grads[1], rel=0.05)


@pytest.mark.only_backends("torch", reason="torch's autograd, double backward and JAX")
def test_torch_and_jax_derivatives(backend):
    """First derivatives (a Dirac of zero mass too: ``psi^c``, against a one-sided difference)
    and a Hessian-vector product, torch against JAX and finite differences."""
    import jax
    import torch

    x, masses, image = problem(7)
    masses[3] = 0.0
    dy = np.random.default_rng(8).standard_normal(30)

    def torch_grads(p, create_graph=False):
        args = [torch.tensor(a, requires_grad=True) for a in (p, masses, image)]
        w = sdot.distance(sdot.SumOfWeightedDiracs(args[0][:, None], args[1]), sdot.Grid(args[2]), metric=CIRCLE)
        return args, torch.autograd.grad(w, args, create_graph=create_graph)
    args, grads = torch_grads(x, create_graph=True)
    hv = torch.autograd.grad((grads[0] * torch.tensor(dy)).sum(), args[0])[0].numpy()
    h = 1e-6
    fd = (torch_grads(x + h * dy)[1][0].numpy() - torch_grads(x - h * dy)[1][0].numpy()) / (2 * h)
    assert hv == pytest.approx(fd, rel=1e-4, abs=1e-6 * np.abs(fd).max())

    def f(p, m, v):
        return sdot.distance(sdot.SumOfWeightedDiracs(p[:, None], m), sdot.Grid(v), metric=CIRCLE)
    jx = [jax.numpy.asarray(a) for a in (x, masses, image)]
    for t, j in zip(grads, jax.grad(f, argnums=(0, 1, 2))(*jx)):
        assert t.detach().numpy() == pytest.approx(np.asarray(j), rel=1e-9, abs=1e-14)
    hj = jax.jvp(lambda p: jax.grad(f)(p, *jx[1:]), (jx[0],), (jax.numpy.asarray(dy),))[1]
    assert np.asarray(hj) == pytest.approx(hv, rel=1e-9, abs=1e-12)
    step = np.zeros(30)
    step[3] = 1e-8

    def w(m):
        m = m / m.sum()
        return float(sdot.distance(sdot.SumOfWeightedDiracs(x[:, None], m), sdot.Grid(image), metric=CIRCLE))
    # d/dt W(normalised m + t e_3) = dW/dm_3 - sum_i m_i dW/dm_i (the normalisation)
    g = grads[1].detach().numpy()
    assert g[3] - (g * masses).sum() == pytest.approx((w(masses + step) - w(masses)) / 1e-8, rel=1e-4)


@pytest.mark.only_backends("jax", reason="jax.jit's callback route")
def test_under_jit_as_eagerly(backend):
    import jax

    x, masses, image = problem(9)

    def w(p, v):
        return sdot.distance(sdot.SumOfWeightedDiracs(p[:, None], masses), sdot.Grid(v), metric=CIRCLE)
    args = (jax.numpy.asarray(x), jax.numpy.asarray(image))
    eager = jax.value_and_grad(w, argnums=(0, 1))(*args)
    jitted = jax.jit(jax.value_and_grad(w, argnums=(0, 1)))(*args)
    assert float(jitted[0]) == float(eager[0])
    for a, b in zip(jitted[1], eager[1]):
        assert np.asarray(a) == pytest.approx(np.asarray(b), rel=1e-12, abs=1e-15)


def test_power_diagram_on_the_circle(numpy_driver):
    """``PowerDiagram(x, metric=...)``: ``adjust_weights`` solves on the circle; the plot ticks
    the cells' ends but not the domain's (the side is no boundary), and a cell across the side
    shows as two pieces."""
    import matplotlib

    matplotlib.use("Agg")
    x, image = np.array([0.05, 0.1, 0.5, 0.93]), np.ones(8)
    image[2:4] = 0.0
    diagram = sdot.PowerDiagram(x, metric=CIRCLE)
    plan = diagram.adjust_weights(np.full(4, 0.25), sdot.Grid(image))
    assert np.asarray(plan.cell_masses) == pytest.approx(np.full(4, 0.25), abs=1e-15)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ticks = np.sort(diagram.plot(ax=ax).lines[1].get_xdata())
    plt.close(fig)
    assert len(ticks) == 4 and ticks[0] > 0 and ticks[-1] < 1
    # the Dirac at 0.05 holds [7/8, 1) and [0, 1/16): 3/16 long, 1/4 of the mass (the density is 4/3)
    assert ticks[0] == pytest.approx(1 / 16, abs=1e-12) and ticks[-1] == pytest.approx(7 / 8, abs=1e-12)
    # its cell, whole, next to it: [-1/8, 1/16], between the Diracs at 0.93 and 0.1
    cell = diagram.cells[0]
    assert cell.vertices[:, 0] == pytest.approx([-1 / 8, 1 / 16], abs=1e-12)
    assert [f[0] for f in cell.facets] == [3, 1] and float(cell.measure) == pytest.approx(0.25, abs=1e-14)
    assert sum(c.vertices[1, 0] - c.vertices[0, 0] for c in diagram.cells) == pytest.approx(1.0, abs=1e-12)
