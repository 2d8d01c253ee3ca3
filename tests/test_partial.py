"""Partial transport (a target heavier than the source) against closed forms, the C++ solver's
reference value, and capped cells integrated here by clipping polygons (tests/reference.py)."""
import math

import numpy as np
import pytest

import sdot
from sdot._core import planar
from sdot._core.planar.capped import capped_integrals

from reference import clip_to_disc, laguerre_cell, pixel_integrals

#: ../shared/reference/README.md, case partial-box-2d (the C++ solver, cell masses to 1e-11).
REF_PARTIAL_BOX = 0.0018434080297508595


def partial_box_points():
    return 0.2 + 0.6 * np.random.default_rng(7005).random((1000, 2))


def plan(backend, points, values, mass, **options):
    return sdot.optimal_transport_plan(sdot.SumOfDiracs(backend.asarray(points)),
                                       sdot.Grid(backend.asarray(values), mass=mass), **options)


def test_one_dirac_takes_the_disc_around_it(eager_backend):
    """A Dirac of mass 1 in a uniform density of mass 4 takes the disc of area 1/4 about it:
    W2^2 = 4 pi r^4 / 2 = 1 / (8 pi), psi = r^2 = 1 / (4 pi)."""
    p = plan(eager_backend, [[0.5, 0.5]], np.ones((1, 1)), 4.0)
    assert float(p.distance) == pytest.approx(1 / (8 * math.pi), rel=1e-12)
    assert float(p.brenier_potential[0]) == pytest.approx(1 / (4 * math.pi), rel=1e-12)
    assert eager_backend.to_numpy(p.barycenters) == pytest.approx(np.array([[0.5, 0.5]]), abs=1e-14)
    assert float(p.transported_mass) == pytest.approx(1.0, rel=1e-12)
    assert p.power_diagram.capped and float(p.power_diagram.cells[0].measure) == pytest.approx(1.0, rel=1e-12)


def test_the_reference_case(eager_backend):
    """partial-box-2d: 1000 Diracs of mass 1 against a uniform density of mass 2."""
    p = plan(eager_backend, partial_box_points(), np.ones((1, 1)), 2.0)
    assert bool(p.converged)
    assert float(p.distance) == pytest.approx(REF_PARTIAL_BOX, rel=1e-8)
    masses = eager_backend.to_numpy(p.cell_masses)
    assert masses == pytest.approx(np.full(1000, 1e-3), abs=1e-10)
    assert float(p.transported_mass) == pytest.approx(1.0, rel=1e-9)
    assert np.all(eager_backend.to_numpy(p.brenier_potential) > 0)


def test_adjust_weights_cuts_the_cells_by_the_balls():
    x = 0.2 + 0.6 * np.random.default_rng(0).random((20, 2))
    diagram = sdot.PowerDiagram(x)
    plan = diagram.adjust_weights(np.full(20, 1 / 20), sdot.Grid(np.ones((8, 8)), mass=2))
    assert diagram.capped and bool(plan.converged)
    assert [float(c.measure) for c in diagram.cells] == pytest.approx([1 / 20] * 20, abs=1e-10)


def test_a_grid_of_equal_pixels_is_the_uniform_density():
    points = np.random.default_rng(3).random((200, 2))
    uniform = plan_np(points, np.ones((1, 1)), 1.5)
    pixels = plan_np(points, np.ones((13, 7)), 1.5)
    assert float(pixels.distance) == pytest.approx(float(uniform.distance), rel=1e-10)
    assert pixels.brenier_potential == pytest.approx(uniform.brenier_potential, rel=1e-8)


def plan_np(points, values, mass):
    return sdot.optimal_transport_plan(sdot.SumOfDiracs(np.asarray(points)), sdot.Grid(np.asarray(values), mass=mass))


def polygon_integrals(points, psi, img, mass, sides):
    """``(masses, W2^2)`` of the capped cells at weights ``psi`` on the unit square, each cell
    clipped to its disc by polygons of ``sides`` and ``2 sides`` sides (Richardson-extrapolated:
    the error of an inscribed polygon falls as ``sides^-2``)."""
    density, lo, hi = img * mass / img.mean(), (0.0, 0.0), (1.0, 1.0)
    masses, second = np.zeros(len(points)), 0.0
    for i in range(len(points)):
        cell = laguerre_cell(points, psi, i, lo, hi)
        coarse, fine = (pixel_integrals(clip_to_disc(cell, points[i], math.sqrt(psi[i]), k), points[i], density, lo, hi)
                        for k in (sides, 2 * sides))
        masses[i] = (4 * fine[0] - coarse[0]) / 3
        second += (4 * fine[1] - coarse[1]) / 3
    return masses, second


def test_certified_on_an_image_by_polygons():
    """The masses of the capped cells at the returned weights, integrated here by clipping
    polygons to the disc (Richardson-extrapolated), equal the Dirac masses; W2^2 is theirs."""
    rng = np.random.default_rng(5)
    points = rng.random((10, 2))
    img = 0.3 + rng.random((4, 3))
    p = plan_np(points, img, 2.0)
    mass, second = polygon_integrals(points, np.asarray(p.brenier_potential), img, 2.0, 128)
    assert mass == pytest.approx(np.full(10, 1 / 10), abs=1e-7)
    assert float(p.distance) == pytest.approx(second, rel=1e-6)


def test_capped_integrals_converge_with_the_polygons():
    """Against the cells clipped to polygons of 64 and 128 sides: the error falls by about 4
    (the polygons' rate, ``sides^-2``, up to where the vertices fall on the arcs) and the
    Richardson extrapolation of the two is twenty times closer at least."""
    rng = np.random.default_rng(8)
    seeds = rng.random((12, 2))
    weights = 0.01 * rng.random(12)
    psi = 0.005 + 0.02 * rng.random(12)
    img = 0.5 + rng.random((5, 4))
    lo, hi = np.zeros(2), np.ones(2)
    cells = planar.power_cells(np, seeds, weights, np.ones(12, bool), lo, hi)
    moments, _, _ = capped_integrals(np, seeds, cells, psi, img, lo, hi)
    errors = []
    for sides in (64, 128):
        approx = [pixel_integrals(clip_to_disc(laguerre_cell(seeds, weights, i, lo, hi), seeds[i],
                                               math.sqrt(psi[i]), sides), seeds[i], img, lo, hi) for i in range(12)]
        errors.append(np.abs(moments[:, [0, 3]] - np.array(approx)))
    assert np.all(errors[0] > 1e-8)
    assert np.all((errors[0] / errors[1] > 3.5) & (errors[0] / errors[1] < 4.5))
    extrapolated = np.abs((4 * errors[1] - errors[0]) / 3)
    assert np.all(extrapolated < 0.05 * errors[1]) and np.max(extrapolated) < 2e-7


def test_balls_wider_than_the_cells_give_the_laguerre_cells():
    rng = np.random.default_rng(9)
    seeds, psi = rng.random((30, 2)), 0.01 * rng.random(30)
    img = 0.5 + rng.random((7, 9))
    lo, hi = np.zeros(2), np.ones(2)
    cells = planar.power_cells(np, seeds, psi, np.ones(30, bool), lo, hi)
    whole, facet = planar.integrate.cell_integrals(np, seeds, cells, img, lo, hi)
    capped, capped_facet, arc = capped_integrals(np, seeds, cells, psi + 3.0, img, lo, hi)
    assert capped == pytest.approx(whole, abs=1e-14)
    assert capped_facet == pytest.approx(facet, abs=1e-13)
    assert arc == pytest.approx(np.zeros(30), abs=1e-13)


def test_a_target_barely_heavier_tends_to_the_balanced_transport():
    points = np.random.default_rng(4).random((300, 2))
    img = 0.2 + np.random.default_rng(6).random((8, 8))
    balanced = float(sdot.distance(sdot.SumOfDiracs(points), sdot.Grid(img)))
    near = [float(plan_np(points, img, 1.0 + eps).distance) for eps in (1e-2, 1e-3)]
    assert near[0] < near[1] < balanced
    assert balanced - near[1] < 0.2 * (balanced - near[0])


def test_what_is_not_solved_says_so():
    pts = np.random.default_rng(0).random((10, 2))
    with pytest.raises(NotImplementedError, match="heavier than the target"):
        sdot.distance(sdot.SumOfDiracs(pts, mass=2.0), sdot.Grid(np.ones((2, 2))))
    with pytest.raises(NotImplementedError, match="solved in 1D and 2D"):
        sdot.distance(sdot.SumOfDiracs(np.random.default_rng(0).random((10, 3))), sdot.Grid(np.ones((2, 2, 2)), mass=2))
    with pytest.raises(NotImplementedError, match="2D polynomial or spline grid"):
        sdot.distance(sdot.SumOfDiracs(pts), sdot.PolynomialGrid(np.ones((2, 2, 4)), mass=2))
    torch = pytest.importorskip("torch")
    x = torch.asarray(pts, requires_grad=True)
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(x), sdot.Grid(np.ones((2, 2)), mass=2))
    with pytest.raises(NotImplementedError, match="partial plan's barycenters"):
        plan.barycenters.sum().backward()
    (g,) = torch.autograd.grad(plan.distance, x, create_graph=True)
    with pytest.raises(NotImplementedError, match="partial transport's W2"):
        g.sum().backward()


def gradient_problem():
    rng = np.random.default_rng(2)
    return 0.1 + 0.8 * rng.random((30, 2)), 0.5 + rng.random(30), 0.3 + rng.random((6, 5))


def test_gradients_match_finite_differences():
    """dW/dy = 2 m (y - b), dW/dm = psi, dW/drho = int phi per pixel, through the
    normalisation of the masses and the values, against central differences of W2^2."""
    torch = pytest.importorskip("torch")
    pts, w, img = gradient_problem()
    inputs = [torch.asarray(a, requires_grad=True) for a in (pts, w, img)]
    f = lambda p, w, v: sdot.distance(sdot.SumOfWeightedDiracs(p, w), sdot.Grid(v, mass=1.7))   # noqa: E731
    f(*inputs).backward()
    h = 1e-6
    for k, index in ((0, (3, 0)), (0, (17, 1)), (1, 5), (1, 22), (2, (2, 3)), (2, (5, 0))):
        args = [pts.copy(), w.copy(), img.copy()]
        args[k][index] += h
        up = float(f(*args))
        args[k][index] -= 2 * h
        fd = (up - float(f(*args))) / (2 * h)
        assert float(inputs[k].grad[index]) == pytest.approx(fd, rel=1e-6, abs=1e-10)


def test_numpy_jvp_and_vjp_of_the_distance(numpy_driver):
    """NumPy's plan.vjp and plan.jvp of a partial plan: the derivatives of W2^2 with respect to
    the positions, the masses before normalisation and the pixel values against central
    differences, jvp the dot product of vjp with the tangents; what is not differentiable says so."""
    pts, w, img = gradient_problem()
    f = lambda p, w, v: sdot.distance(sdot.SumOfWeightedDiracs(p, w), sdot.Grid(v, mass=1.7))   # noqa: E731
    p = sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(pts, w), sdot.Grid(img, mass=1.7))
    grads = p.vjp(distance=1.0)
    assert grads["domain"] is None
    h = 1e-6
    for k, name, index in ((0, "positions", (3, 0)), (0, "positions", (17, 1)), (1, "weights", 5),
                           (2, "values", (2, 3)), (2, "values", (5, 0))):
        args = [pts.copy(), w.copy(), img.copy()]
        args[k][index] += h
        up = float(f(*args))
        args[k][index] -= 2 * h
        fd = (up - float(f(*args))) / (2 * h)
        assert float(grads[name][index]) == pytest.approx(fd, rel=1e-6, abs=1e-10)
    rng = np.random.default_rng(4)
    tangents = dict(positions=rng.standard_normal(pts.shape), weights=rng.standard_normal(w.shape),
                    values=rng.standard_normal(img.shape))
    expected = sum(float(np.sum(grads[k] * t)) for k, t in tangents.items())
    assert float(p.jvp(**tangents)["distance"]) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(NotImplementedError, match="distance"):
        p.vjp(barycenters=np.ones(pts.shape))
    with pytest.raises(NotImplementedError, match="domain"):
        p.jvp(domain=(np.zeros(2), np.ones(2)))


def test_jax_gradients_equal_torch_eagerly_and_under_jit(sdot_driver):
    torch = pytest.importorskip("torch")
    jax = pytest.importorskip("jax")
    pts, w, img = gradient_problem()
    inputs = [torch.asarray(a, requires_grad=True) for a in (pts, w, img)]
    f = lambda p, w, v: sdot.distance(sdot.SumOfWeightedDiracs(p, w), sdot.Grid(v, mass=1.7))   # noqa: E731
    f(*inputs).backward()
    sdot_driver.framework = "jax"
    arrays = [jax.numpy.asarray(a) for a in (pts, w, img)]
    eager = jax.grad(f, argnums=(0, 1, 2))(*arrays)
    jitted = jax.jit(jax.grad(f, argnums=(0, 1, 2)))(*arrays)
    for t, e, j in zip(inputs, eager, jitted):
        assert np.asarray(e) == pytest.approx(t.grad.numpy(), abs=1e-15)
        assert np.asarray(j) == pytest.approx(t.grad.numpy(), abs=1e-15)
    assert float(jax.jit(f)(*arrays)) == pytest.approx(float(f(pts, w, img)), rel=1e-14)


def test_diracs_whose_voronoi_cells_hold_no_mass_take_it_from_afar():
    """A Dirac far from the support (its Voronoi cell on black) still takes its mass: at the
    returned weights the capped cells, integrated here by clipping polygons to the discs, hold
    the Dirac masses, and W2^2 is theirs."""
    img = np.zeros((16, 16))
    img[6:10, 6:10] = 1.0
    points = np.array([[0.5, 0.5], [0.05, 0.05], [0.45, 0.5], [0.9, 0.2]])
    p = plan_np(points, img, 2.0)
    mass, second = polygon_integrals(points, np.asarray(p.brenier_potential), img, 2.0, 256)
    assert mass == pytest.approx(np.full(4, 1 / 4), abs=1e-6)    # the polygons' error: 3e-7
    assert float(p.distance) == pytest.approx(second, rel=1e-5)
    assert float(p.transported_mass) == pytest.approx(1.0, abs=1e-10)


def test_far_diracs_on_every_framework(eager_backend):
    """Diracs on black (one far outside the domain, a cluster 1e-4 wide): every framework
    takes the NumPy plan's steps (W2^2 and masses equal to rounding)."""
    img = np.zeros((16, 16))
    img[6:10, 6:10] = 1.0
    points = np.vstack([[[0.5, 0.5], [3.0, -2.0], [0.45, 0.5], [0.9, 0.2]],
                        0.05 + 1e-4 * np.random.default_rng(0).random((8, 2))])
    expected = plan_np(points, img, 2.0)
    p = plan(eager_backend, points, img, 2.0)
    assert eager_backend.to_numpy(p.cell_masses) == pytest.approx(np.full(12, 1 / 12), abs=1e-10)
    assert float(p.distance) == pytest.approx(float(expected.distance), rel=1e-12)


def test_most_diracs_on_black_converge_in_few_steps():
    """400 Diracs uniform in the square over a 20x20 square of a 64x64 image (nine in ten
    Voronoi cells on black): every Dirac takes its mass, in at most 25 Newton steps (43 when
    the steps did not keep the weights of the cells that would fall below the floor)."""
    img = np.zeros((64, 64))
    img[20:40, 20:40] = 1.0
    x = np.random.default_rng(3).random((400, 2))
    p = plan_np(x, img, 2.0)
    assert np.asarray(p.cell_masses) == pytest.approx(np.full(400, 1 / 400), abs=1e-10)
    assert int(p.iterations) <= 25


@pytest.mark.parametrize("spread", ["uniform", "cluster"])
def test_two_pieces_on_black(eager_backend, spread):
    """A support of two pieces on black (a rectangle and a denser square): 200 Diracs uniform in
    the square, or 60 in a cluster 1e-4 wide, each take their mass, checked at the returned
    weights by clipping polygons to the discs. (The damped Newton steps stalled on both, at
    errors of 12% and 100% of a target: a group of cells whose balls held their piece of the
    support whole moved their weights together without changing their masses; the solve goes
    on over a uniform background.)"""
    img = np.zeros((16, 16))
    img[4:10, 5:12] = 1.0
    img[12:15, 1:4] = 2.0
    if spread == "uniform":
        points = np.random.default_rng(2).random((200, 2))
    else:
        points = 0.5 + 1e-4 * np.random.default_rng(1).random((60, 2))
    p = plan(eager_backend, points, img, 2.0)
    n = len(points)
    assert eager_backend.to_numpy(p.cell_masses) == pytest.approx(np.full(n, 1 / n), abs=1e-10)
    if spread == "cluster":
        mass, second = polygon_integrals(points, eager_backend.to_numpy(p.brenier_potential), img, 2.0, 256)
        assert mass == pytest.approx(np.full(n, 1 / n), abs=1e-6)
        assert float(p.distance) == pytest.approx(second, rel=1e-5)


def test_batches_and_jax_vmap_are_the_items(sdot_driver):
    jax = pytest.importorskip("jax")
    rng = np.random.default_rng(0)
    X, img = 0.2 + 0.6 * rng.random((3, 50, 2)), 0.5 + rng.random((8, 8))
    single = [float(plan_np(x, img, 2.0).distance) for x in X]
    assert np.asarray(sdot.distances(sdot.BatchOfSumOfDiracs(X), sdot.Grid(img, mass=2))) == pytest.approx(
        single, rel=1e-12)
    sdot_driver.framework = "jax"
    f = lambda x: sdot.distance(sdot.SumOfDiracs(x), sdot.Grid(jax.numpy.asarray(img), mass=2))   # noqa: E731
    assert np.asarray(jax.jit(jax.vmap(f))(jax.numpy.asarray(X))) == pytest.approx(single, rel=1e-12)


def test_on_a_line(eager_backend):
    """1D: one Dirac in a uniform density of mass 2 takes [1/4, 3/4]: W2^2 = 2 (2/3) (1/4)^3 =
    1/48, psi = 1/16; 40 Diracs on a grey segment image take their masses exactly."""
    b = eager_backend
    one = sdot.optimal_transport_plan(sdot.SumOfDiracs1d(b.asarray([0.5])), sdot.Grid(b.asarray(np.ones(1)), mass=2))
    assert float(one.distance) == pytest.approx(1 / 48, rel=1e-13)
    assert float(one.brenier_potential[0]) == pytest.approx(1 / 16, rel=1e-13)
    x = 0.2 + 0.6 * np.random.default_rng(1).random(40)
    img = 0.5 + np.random.default_rng(2).random(13)
    p = sdot.optimal_transport_plan(sdot.SumOfDiracs1d(b.asarray(x)), sdot.Grid(b.asarray(img), mass=1.6))
    assert b.to_numpy(p.cell_masses) == pytest.approx(np.full(40, 1 / 40), abs=1e-10)


def test_gradients_on_a_line_match_finite_differences():
    torch = pytest.importorskip("torch")
    x, img = 0.2 + 0.6 * np.random.default_rng(1).random(30), 0.5 + np.random.default_rng(2).random(13)
    xt, vt = torch.asarray(x, requires_grad=True), torch.asarray(img, requires_grad=True)
    f = lambda x, v: sdot.distance(sdot.SumOfDiracs1d(x), sdot.Grid(v, mass=1.6))   # noqa: E731
    f(xt, vt).backward()
    h = 1e-6
    for k, grad, (base, other) in ((4, xt.grad, (x, None)), (3, vt.grad, (img, None))):
        up, down = base.copy(), base.copy()
        up[k] += h
        down[k] -= h
        args = (lambda a: (a, img)) if base is x else (lambda a: (x, a))
        fd = (float(f(*args(up))) - float(f(*args(down)))) / (2 * h)
        assert float(grad[k]) == pytest.approx(fd, rel=1e-6)


@pytest.mark.parametrize("y", [0.5, 0.13])
def test_one_dirac_on_a_polynomial_line(eager_backend, y):
    """One Dirac of mass 1 in a Bernstein density of mass 2 (degree 3): it takes the interval
    ``[y - r, y + r]`` (cut by the domain) holding mass 1; ``r`` found here by bisection on the
    quadrature of the polynomials (cut at the cells' edges: exact), W2^2 by the same quadrature."""
    b = eager_backend
    coefficients = 0.2 + np.random.default_rng(3).random((5, 4))
    def on(r, power=0):     # the integral of (x - y)^power rho over [y - r, y + r], to rounding
        a, c = max(y - r, 0.0), min(y + r, 1.0)
        edges = np.unique(np.concatenate([[a, c], np.arange(6)[(np.arange(6) / 5 > a) & (np.arange(6) / 5 < c)] / 5]))
        total = 0.0
        for a, c in zip(edges[:-1], edges[1:]):
            k = min(int(a * 5), 4)
            xs, ws = np.polynomial.legendre.leggauss(12)
            u = a + (c - a) * 0.5 * (xs + 1)
            local = np.stack([math.comb(3, j) * (u * 5 - k) ** j * (1 - (u * 5 - k)) ** (3 - j) for j in range(4)], 1)
            total += (0.5 * (c - a) * ws * (local @ coefficients[k]) * (u - y) ** power).sum()
        return 2.0 * total / coefficients.mean()         # (a cell's mass: its mean coefficient / 5)
    low, high = 0.0, 1.0
    for _ in range(100):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if on(mid) < 1.0 else (low, mid)
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs1d(b.asarray([y])),
                                       sdot.PolynomialGrid(b.asarray(coefficients), mass=2))
    assert float(plan.distance) == pytest.approx(on(high, 2), rel=1e-12)
    assert float(plan.brenier_potential[0]) == pytest.approx(high * high, rel=1e-10)


def test_polynomial_and_spline_lines(numpy_driver):
    """Many Diracs against a Bernstein grid and a spline: every Dirac takes its mass; a constant
    spline is the uniform density (disjoint balls: ``W2^2 = sum 2 rho r^3 / 3``, ``r = m / (2
    rho)``); a target barely heavier tends to the balanced transport."""
    rng = np.random.default_rng(4)
    x, coefficients = 0.1 + 0.8 * rng.random(40), 0.3 + rng.random((7, 3))
    for target in (sdot.PolynomialGrid(coefficients, mass=1.7), sdot.SplineGrid(0.3 + rng.random(9), mass=1.7)):
        plan = sdot.optimal_transport_plan(sdot.SumOfDiracs1d(x), target)
        assert np.asarray(plan.cell_masses) == pytest.approx(np.full(40, 1 / 40), abs=1e-11)
    spread = np.array([0.1, 0.3, 0.5, 0.9])
    w = float(sdot.distance(sdot.SumOfDiracs1d(spread), sdot.SplineGrid(np.full(6, 0.4), mass=3.0)))
    assert w == pytest.approx(4 * 2 * 3.0 * (0.25 / 6) ** 3 / 3, rel=1e-12)
    balanced = float(sdot.distance(sdot.SumOfDiracs1d(x), sdot.PolynomialGrid(coefficients)))
    nearly = float(sdot.distance(sdot.SumOfDiracs1d(x), sdot.PolynomialGrid(coefficients, mass=1 + 1e-5)))
    assert nearly == pytest.approx(balanced, rel=1e-3) and nearly < balanced


def test_polynomial_line_gradients_match_finite_differences():
    """dW/dy and dW/d(coefficients) (through torch) against central differences; JAX agrees."""
    torch = pytest.importorskip("torch")
    import jax

    rng = np.random.default_rng(5)
    x, coefficients = 0.2 + 0.6 * rng.random(20), 0.3 + rng.random((6, 3))
    f = lambda x, c: sdot.distance(sdot.SumOfDiracs1d(x), sdot.PolynomialGrid(c, mass=1.6))   # noqa: E731
    xt, ct = torch.asarray(x, requires_grad=True), torch.asarray(coefficients, requires_grad=True)
    f(xt, ct).backward()
    h = 1e-6
    for k in (0, 7):
        e = np.zeros(20)
        e[k] = h
        assert float(xt.grad[k]) == pytest.approx((float(f(x + e, coefficients)) - float(f(x - e, coefficients)))
                                                  / (2 * h), rel=1e-6)
    for k in ((2, 1), (4, 0)):
        e = np.zeros((6, 3))
        e[k] = h
        assert float(ct.grad[k]) == pytest.approx((float(f(x, coefficients + e)) - float(f(x, coefficients - e)))
                                                  / (2 * h), rel=1e-5, abs=1e-9)
    gj = jax.grad(f, argnums=(0, 1))(jax.numpy.asarray(x), jax.numpy.asarray(coefficients))
    assert np.asarray(gj[0]) == pytest.approx(xt.grad.numpy(), rel=1e-10)
    assert np.asarray(gj[1]) == pytest.approx(ct.grad.numpy(), rel=1e-10, abs=1e-14)


def test_inputs_users_bring():
    """Clusters, duplicates, zero masses, a Dirac outside the box, tiny and huge domains: every
    cell takes its mass (W2^2 scales as the domain squared), in a cluster 1e-6 wide too; a
    cluster 1e-9 wide stalls loudly."""
    rng = np.random.default_rng(0)
    img = 0.3 + rng.random((16, 16))
    x = rng.random((200, 2))
    base = float(plan_np(x, img, 1.5).distance)
    clustered = x.copy()
    clustered[:50] = 0.4 + 1e-4 * rng.random((50, 2))
    repeated = x.copy()
    repeated[10:13] = x[11]
    outside = x.copy()
    outside[0] = [1.01, 0.5]                # just outside: its Voronoi cell meets the box
    for points in (clustered, repeated, outside):
        p = plan_np(points, img, 1.5)
        assert np.asarray(p.cell_masses) == pytest.approx(np.full(200, 1 / 200), abs=1e-10)
    w = rng.random(200)
    w[:20] = 0.0
    p = sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(x, w), sdot.Grid(img, mass=1.5))
    assert np.asarray(p.cell_masses) == pytest.approx(w / w.sum(), abs=1e-10)
    for s in (1e-6, 1e6):
        scaled = sdot.distance(sdot.SumOfDiracs(s * x), sdot.Grid(img, domain=((0, 0), (s, s)), mass=1.5))
        assert float(scaled) == pytest.approx(s * s * base, rel=1e-9)
    wide = float(plan_np(clustered, img, 1.5).distance)
    clustered[:50] = 0.4 + 1e-6 * rng.random((50, 2))
    p = plan_np(clustered, img, 1.5)        # (its Voronoi cells held 1e-12 of their targets)
    assert np.asarray(p.cell_masses) == pytest.approx(np.full(200, 1 / 200), abs=1e-10)
    assert float(p.distance) == pytest.approx(wide, rel=1e-3)   # the cluster 100 times narrower
    clustered[:50] = 0.4 + 1e-9 * rng.random((50, 2))
    with pytest.raises(sdot.OtNotConverged, match="partial transport did not converge"):
        plan_np(clustered, img, 1.5)        # (the balanced transport stalls there too)


def test_on_the_torus():
    """Partial transport with ``metric=PeriodicMetric``: one Dirac at a corner takes a disc that
    wraps around it (``W2^2 = 1 / (4 pi)`` against the uniform density of mass 2); far from the
    sides, the plane's answer; a translation of the torus by whole pixels changes nothing; two
    Diracs on the circle in closed form; gradients across a side against finite differences,
    JAX's (eager and jit) equal to torch's; the plot draws no edge along the sides."""
    import jax
    import matplotlib
    import torch

    from sdot.metrics import Norm2, PeriodicMetric

    matplotlib.use("Agg")
    torus, circle = PeriodicMetric(Norm2(), [1.0, 1.0]), PeriodicMetric(Norm2(), [1.0])
    corner = sdot.distance(sdot.SumOfDiracs(np.array([[0.01, 0.99]])), sdot.Grid(np.ones((1, 1)), mass=2.0),
                           metric=torus)
    assert float(corner) == pytest.approx(1 / (4 * math.pi), rel=1e-12)
    rng = np.random.default_rng(0)
    middle = 0.35 + 0.3 * rng.random((50, 2))
    plane, torus_w = (float(sdot.distance(sdot.SumOfDiracs(middle), sdot.Grid(np.ones((8, 8)), mass=2.0), metric=m))
                      for m in (None, torus))
    assert torus_w == pytest.approx(plane, rel=1e-11)
    x, img = rng.random((100, 2)), 0.5 + rng.random((8, 8))
    x[0] = [0.003, 0.5]

    def w(points, values=img):
        return float(sdot.distance(sdot.SumOfDiracs(points), sdot.Grid(values, mass=1.7), metric=torus))
    moved = w(x + np.array([3, 5]) / 8, np.roll(img, (3, 5), axis=(0, 1)))
    assert moved == pytest.approx(w(x), rel=1e-12)
    two = sdot.distance(sdot.SumOfDiracs1d(np.array([0.02, 0.5])), sdot.Grid(np.ones(4), mass=3.0), metric=circle)
    assert float(two) == pytest.approx(2 * 2 * 3.0 * (1 / 12) ** 3 / 3, rel=1e-12)     # r = 1/12 each
    xt, vt = torch.tensor(x, requires_grad=True), torch.tensor(img, requires_grad=True)
    sdot.distance(sdot.SumOfDiracs(xt), sdot.Grid(vt, mass=1.7), metric=torus).backward()
    h = 1e-6
    for i, a in ((0, 0), (7, 1)):
        e = np.zeros_like(x)
        e[i, a] = h
        assert float(xt.grad[i, a]) == pytest.approx((w(x + e) - w(x - e)) / (2 * h), rel=1e-6)
    e = np.zeros_like(img)
    e[2, 7] = h
    assert float(vt.grad[2, 7]) == pytest.approx((w(x, img + e) - w(x, img - e)) / (2 * h), rel=1e-6)
    f = lambda p: sdot.distance(sdot.SumOfDiracs(p), sdot.Grid(jax.numpy.asarray(img), mass=1.7),   # noqa: E731
                                metric=torus)
    for g in (jax.grad(f), jax.jit(jax.grad(f))):
        assert np.asarray(g(jax.numpy.asarray(x))) == pytest.approx(xt.grad.numpy(), rel=1e-12, abs=1e-15)
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(x), sdot.Grid(img, mass=1.7), metric=torus)
    assert sum(float(c.measure) for c in plan.power_diagram.cells) == pytest.approx(1.0, abs=1e-9)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    segments = plan.power_diagram.plot(ax=ax).collections[0].get_segments()
    plt.close(fig)
    along = [s for s in segments if np.any(np.all(np.abs(s - 0.0) < 1e-12, axis=0) | np.all(np.abs(s - 1.0) < 1e-12,
                                                                                            axis=0))]
    assert not along
