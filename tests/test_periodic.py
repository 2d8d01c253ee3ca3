"""Periodic domains (``metric=PeriodicMetric``): the C++ solver's periodic reference values, closed
forms on lattices, invariance under translations of the torus, the plane's answer where no cell
reaches a side, and derivatives across a side."""
import math

import numpy as np
import pytest

import sdot
from sdot.metrics import Norm2, PeriodicMetric

#: ../shared/reference/README.md, periodic domains (the C++ solver's periodic mode, masses to 1e-11).
REF_TORUS_GAUSS_CORNER = 0.06476906197871544
REF_TORUS3D_BOX = 0.00654279036561948

TORUS2 = PeriodicMetric(Norm2(), [1.0, 1.0])
TORUS3 = PeriodicMetric(Norm2(), [1.0, 1.0, 1.0])

#: What the periodic solve runs on (the host; the compiled route refuses: tested below).
EAGER = pytest.mark.only_backends("numpy", "torch", "jax", "array_api_strict",
                                  reason="periodic domains are solved on the host (the compiled route refuses)")


def gauss_corner(n=64):
    """image_gauss_corner64 (tests/data/README.md): ``exp(-d^2 / (2 * 0.12^2))`` at the pixel
    centres, ``d`` the torus distance to (0.9, 0.1): it wraps around the corner."""
    c = (np.arange(n) + 0.5) / n
    x, y = np.meshgrid(c, c, indexing="ij")
    dx, dy = np.abs(x - 0.9), np.abs(y - 0.1)
    dx, dy = np.minimum(dx, 1 - dx), np.minimum(dy, 1 - dy)
    return np.exp(-(dx * dx + dy * dy) / (2 * 0.12 ** 2))


def distance(backend, points, values, metric, **options):
    return float(sdot.distance(sdot.SumOfDiracs(backend.asarray(points)), sdot.Grid(backend.asarray(values)),
                               metric=metric, **options))


@pytest.mark.only_backends("numpy", "torch", "jax", reason="the reference case per framework (array_api_strict: "
                                                              "below, smaller)")
def test_torus_reference_2d(backend):
    """torus-gauss-corner-1e3: a Gaussian that wraps around the corner of the unit square."""
    points, image = np.random.default_rng(7311).random((1000, 2)), gauss_corner()
    w = distance(backend, points, image, TORUS2, tol=1e-11)
    assert w == pytest.approx(REF_TORUS_GAUSS_CORNER, rel=1e-9)
    # the plane's cells cannot reach across a side: a larger value
    assert distance(backend, points, image, None) > 2 * w


@pytest.mark.only_backends("numpy", "torch", "jax", reason="one 3D case per framework")
def test_torus_reference_3d(backend):
    """torus3d-box-500: 500 Diracs against the uniform density of the unit cube, periodic on every axis."""
    w = distance(backend, np.random.default_rng(7312).random((500, 3)), np.ones((1, 1, 1)), TORUS3, tol=1e-11)
    assert w == pytest.approx(REF_TORUS3D_BOX, rel=1e-9)


@pytest.mark.parametrize("dim", [2, 3])
def test_a_translated_lattice_keeps_its_cells(numpy_driver, dim):
    """Diracs on a k^d lattice translated by any vector, against the uniform density: every cell
    is a cube of side a = 1/k about its Dirac, W2^2 = d a^2 / 12, whatever the translation (the
    plane's, for the same points, is larger: the cells at the sides are cut)."""
    k = 6 if dim == 2 else 4
    axes = np.meshgrid(*[np.arange(k)] * dim, indexing="ij")
    lattice = (np.stack([a.ravel() for a in axes], axis=1) + 0.5) / k
    shift = np.random.default_rng(dim).random(dim)
    points = lattice + shift            # beyond the box: folded onto the torus
    metric = PeriodicMetric(Norm2(), [1.0] * dim)
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(points), sdot.Grid(np.ones((1,) * dim)), metric=metric,
                                       tol=1e-12)
    assert float(plan.distance) == pytest.approx(dim / (12 * k * k), rel=1e-10)
    # barycentres next to their Dirac (unfolded), each the Dirac itself
    assert np.asarray(plan.barycenters) == pytest.approx(points, abs=1e-10)
    assert np.asarray(plan.cell_masses) == pytest.approx(np.full(k ** dim, k ** -dim), abs=1e-12)
    plane = float(sdot.distance(sdot.SumOfDiracs(np.mod(points, 1.0)), sdot.Grid(np.ones((1,) * dim))))
    assert plane > 1.2 * dim / (12 * k * k)


@EAGER
def test_translating_diracs_and_density_together_changes_nothing(backend):
    """A translation of the torus by whole pixels: the image rolled, the Diracs moved alike."""
    rng = np.random.default_rng(11)
    points = rng.random((60, 2))
    image = 0.2 + gauss_corner(16)
    w = distance(backend, points, image, TORUS2, tol=1e-12)
    shift = np.array([5, 11])
    moved = distance(backend, points + shift / 16.0, np.roll(image, tuple(shift), axis=(0, 1)), TORUS2, tol=1e-12)
    assert moved == pytest.approx(w, rel=1e-12)


def test_the_cylinder_is_periodic_along_one_axis(numpy_driver):
    """Period on x only: a lattice translated along x keeps its square cells, along y it does not."""
    k = 5
    axes = np.meshgrid(np.arange(k), np.arange(k), indexing="ij")
    lattice = (np.stack([a.ravel() for a in axes], axis=1) + 0.5) / k
    cylinder = PeriodicMetric(Norm2(), [1.0, None])
    uniform = sdot.Grid(np.ones((1, 1)))
    along_x = float(sdot.distance(sdot.SumOfDiracs(lattice + [0.37, 0.0]), uniform, metric=cylinder, tol=1e-12))
    assert along_x == pytest.approx(2 / (12 * k * k), rel=1e-10)
    along_y = float(sdot.distance(sdot.SumOfDiracs(lattice + [0.0, 0.05]), uniform, metric=cylinder, tol=1e-12))
    assert along_y > 1.01 * 2 / (12 * k * k)
    torus = float(sdot.distance(sdot.SumOfDiracs(lattice + [0.0, 0.05]), uniform, metric=TORUS2, tol=1e-12))
    assert torus == pytest.approx(2 / (12 * k * k), rel=1e-10)


def test_far_from_the_sides_the_torus_is_the_plane(numpy_driver):
    """Diracs and density (zero near the sides) in the middle of the box: no cell reaches a side
    at the optimum, the periodic answer is the plane's (a zero region: through the continuation)."""
    rng = np.random.default_rng(5)
    points = 0.3 + 0.4 * rng.random((200, 2))
    image = np.zeros((32, 32))
    image[10:22, 8:24] = 1.0 + rng.random((12, 16))
    source, target = sdot.SumOfDiracs(points), sdot.Grid(image)
    torus = sdot.optimal_transport_plan(source, target, metric=TORUS2, tol=1e-11)
    plane = sdot.optimal_transport_plan(source, target, tol=1e-11)
    assert float(torus.distance) == pytest.approx(float(plane.distance), rel=1e-9)
    assert np.asarray(torus.barycenters) == pytest.approx(np.asarray(plane.barycenters), abs=1e-8)


def test_diracs_moved_by_periods_give_the_same_plan(numpy_driver):
    points = np.random.default_rng(2).random((200, 2))
    periods = np.random.default_rng(3).integers(-3, 4, size=(200, 2))
    image = 0.5 + gauss_corner()
    a = sdot.optimal_transport_plan(sdot.SumOfDiracs(points), sdot.Grid(image), metric=TORUS2, tol=1e-12)
    b = sdot.optimal_transport_plan(sdot.SumOfDiracs(points + periods), sdot.Grid(image), metric=TORUS2, tol=1e-12)
    assert float(b.distance) == pytest.approx(float(a.distance), rel=1e-12)
    assert np.asarray(b.barycenters) == pytest.approx(np.asarray(a.barycenters) + periods, abs=1e-9)


def test_gradient_across_a_side_against_finite_differences(numpy_driver):
    """``dW/dy_i = 2 m_i (y_i - b_i)`` for a Dirac on either side of x = 0 (folded to x = 1):
    central differences agree, and the gradient is continuous across the side."""
    points = np.random.default_rng(7311).random((300, 2))
    points[0] = [0.002, 0.4]
    image = gauss_corner()

    def w(p):
        return float(sdot.distance(sdot.SumOfDiracs(p), sdot.Grid(image), metric=TORUS2, tol=1e-13))

    grads = []
    for x0 in (0.002, -0.002):
        p = points.copy()
        p[0, 0] = x0
        plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(p), sdot.Grid(image), metric=TORUS2, tol=1e-13)
        g = 2 / len(p) * (p[0] - np.asarray(plan.barycenters)[0])
        h = 1e-6
        for axis in (0, 1):
            up, down = p.copy(), p.copy()
            up[0, axis] += h
            down[0, axis] -= h
            assert g[axis] == pytest.approx((w(up) - w(down)) / (2 * h), rel=1e-5, abs=1e-9)
        grads.append(g)
    assert grads[0] == pytest.approx(grads[1], rel=0.1)


@pytest.mark.only_backends("torch", reason="torch's autograd against JAX's grad")
def test_torch_and_jax_gradients_agree(backend):
    import jax
    import torch

    points = np.random.default_rng(9).random((200, 2))
    image = 0.1 + gauss_corner()
    x = torch.tensor(points, requires_grad=True)
    masses = torch.full((200,), 1.0, dtype=torch.float64, requires_grad=True)
    values = torch.tensor(image, requires_grad=True)
    w = sdot.distance(sdot.SumOfWeightedDiracs(x, masses), sdot.Grid(values), metric=TORUS2, tol=1e-12)
    w.backward()
    grads = jax.grad(lambda *a: sdot.distance(sdot.SumOfWeightedDiracs(a[0], a[1]), sdot.Grid(a[2]), metric=TORUS2,
                                              tol=1e-12), argnums=(0, 1, 2))(
        jax.numpy.asarray(points), jax.numpy.ones(200), jax.numpy.asarray(image))
    for t, j in zip((x.grad, masses.grad, values.grad), grads):
        assert t.numpy() == pytest.approx(np.asarray(j), rel=1e-8, abs=1e-12)


def test_plan_derivatives_against_finite_differences(numpy_driver):
    """The plan's arrays (barycentres next to their Diracs, potentials, cell masses) along a
    change of positions (a Dirac across x = 0 included), weights and pixel values."""
    rng = np.random.default_rng(4)
    points, weights, image = rng.random((100, 2)), 0.5 + rng.random(100), 0.3 + rng.random((8, 8))
    points[0] = [0.001, 0.5]
    dy, dm, dv = rng.standard_normal((100, 2)), rng.standard_normal(100), rng.standard_normal((8, 8))

    def plan(t):
        return sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(points + t * dy, weights + t * dm),
                                           sdot.Grid(image + t * dv), metric=TORUS2, tol=1e-13)
    tangent = plan(0.0).jvp(positions=dy, weights=dm, values=dv)
    h = 1e-6
    up, down = plan(h), plan(-h)
    for name in ("distance", "barycenters", "brenier_potential", "cell_masses"):
        fd = (np.asarray(getattr(up, name)) - np.asarray(getattr(down, name))) / (2 * h)
        assert np.asarray(tangent[name]) == pytest.approx(fd, rel=1e-5, abs=1e-6 * np.abs(fd).max()), name
    # the reverse mode is its transpose
    cb = rng.standard_normal((100, 2))
    back = plan(0.0).vjp(barycenters=cb)
    pairing = (back["positions"] * dy).sum() + (back["weights"] * dm).sum() + (back["values"] * dv).sum()
    assert pairing == pytest.approx((cb * np.asarray(tangent["barycenters"])).sum(), rel=1e-10)


@pytest.mark.only_backends("torch", reason="torch's double backward against finite differences and JAX")
def test_second_derivatives(backend):
    import jax
    import torch

    rng = np.random.default_rng(6)
    points, image, dy = rng.random((100, 2)), 0.3 + rng.random((8, 8)), rng.standard_normal((100, 2))

    def grad(p, create_graph=False):
        x = torch.tensor(p, requires_grad=True)
        w = sdot.distance(sdot.SumOfDiracs(x), sdot.Grid(torch.tensor(image)), metric=TORUS2, tol=1e-13)
        return x, torch.autograd.grad(w, x, create_graph=create_graph)[0]
    x, g = grad(points, create_graph=True)
    hv = torch.autograd.grad((g * torch.tensor(dy)).sum(), x)[0].numpy()
    h = 1e-6
    fd = (grad(points + h * dy)[1].numpy() - grad(points - h * dy)[1].numpy()) / (2 * h)
    assert hv == pytest.approx(fd, rel=1e-4, abs=1e-6 * np.abs(fd).max())     # (h^2 terms: two close Diracs)
    f = lambda p: sdot.distance(sdot.SumOfDiracs(p), sdot.Grid(jax.numpy.asarray(image)), metric=TORUS2,  # noqa: E731
                                tol=1e-13)
    hj = jax.jvp(jax.grad(f), (jax.numpy.asarray(points),), (jax.numpy.asarray(dy),))[1]
    assert np.asarray(hj) == pytest.approx(hv, rel=1e-9, abs=1e-12)


def test_value_gradient_against_finite_differences(numpy_driver):
    """``dW/drho`` (through :meth:`OtPlan.vjp`, the masses and density normalised) along a random
    change of the pixel values, against central differences."""
    rng = np.random.default_rng(4)
    points = rng.random((100, 2))
    image = 0.5 + rng.random((8, 8))
    direction = rng.standard_normal((8, 8))

    def w(v):
        return float(sdot.distance(sdot.SumOfDiracs(points), sdot.Grid(v), metric=TORUS2, tol=1e-13))

    torch = pytest.importorskip("torch")
    values = torch.tensor(image, requires_grad=True)
    sdot.distance(sdot.SumOfDiracs(torch.tensor(points)), sdot.Grid(values), metric=TORUS2, tol=1e-13).backward()
    h = 1e-6
    fd = (w(image + h * direction) - w(image - h * direction)) / (2 * h)
    assert float((values.grad.numpy() * direction).sum()) == pytest.approx(fd, rel=1e-6)


def test_the_plot_draws_the_pieces(numpy_driver):
    import matplotlib

    matplotlib.use("Agg")
    points = np.random.default_rng(1).random((50, 2))
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(points), sdot.Grid(np.ones((1, 1))), metric=TORUS2)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    plan.power_diagram.plot(ax=ax)
    segments = ax.collections[0].get_segments()
    inside = np.concatenate(segments)
    assert inside.min() >= -1e-12 and inside.max() <= 1 + 1e-12     # wrapped in the domain
    ends = np.stack(segments)                                       # (on a torus the sides are no edges)
    on_side = np.any(np.all((np.abs(ends) < 1e-12) | (np.abs(ends - 1) < 1e-12), axis=1), axis=1)
    assert not on_side.any()
    assert len(ax.lines[0].get_xdata()) == 50


def _area(v):
    return 0.5 * np.sum(v[:, 0] * np.roll(v[:, 1], -1) - np.roll(v[:, 0], -1) * v[:, 1])


def test_cells_on_the_torus(numpy_driver):
    """``PowerDiagram.cells`` on a torus: each cell whole, next to its Dirac (its pieces moved
    back by their periods). A translated lattice: squares about the Diracs, across the sides
    too. Random Diracs (uniform density): convex counter-clockwise polygons whose areas are the
    cells' masses and sum to 1, neighbours on both sides of every facet. 3D: convex hulls of the
    vertices (scipy) of the cells' masses, facet areas those of the hulls. A cylinder: facets on
    the non-periodic sides only."""
    from scipy.spatial import ConvexHull

    k = 4
    axes = np.meshgrid(np.arange(k), np.arange(k), indexing="ij")
    lattice = (np.stack([a.ravel() for a in axes], axis=1) + 0.5) / k + [0.37, 0.9]
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(lattice), sdot.Grid(np.ones((1, 1))), metric=TORUS2)
    for cell, y in zip(plan.power_diagram.cells, lattice):
        assert np.sort(cell.vertices, axis=0) == pytest.approx(np.sort(y + 0.125 * np.array(
            [[-1, -1], [1, -1], [1, 1], [-1, 1]]), axis=0), abs=1e-12)
        assert len(cell.facets) == 4 and _area(cell.vertices) == pytest.approx(1 / 16, rel=1e-12)
    rng = np.random.default_rng(1)
    points = rng.random((200, 2))
    cells = sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(points, 0.5 + rng.random(200)),
                                        sdot.Grid(np.ones((1, 1))), metric=TORUS2).power_diagram.cells
    areas = np.array([_area(c.vertices) for c in cells])
    assert areas == pytest.approx(np.array([float(c.measure) for c in cells]), abs=1e-13)
    assert areas.sum() == pytest.approx(1.0, abs=1e-12)
    for c in cells:
        edges = np.roll(c.vertices, -1, axis=0) - c.vertices
        turns = edges[:, 0] * np.roll(edges[:, 1], -1) - edges[:, 1] * np.roll(edges[:, 0], -1)
        assert np.all(turns > 0)                                    # convex, counter-clockwise
        assert np.abs(c.barycenter - c.vertices.mean(axis=0)).max() < 0.2     # next to its Dirac
        for j, _ in c.facets:
            assert c.index in [f[0] for f in cells[j].facets]
    cells3 = sdot.optimal_transport_plan(sdot.SumOfDiracs(rng.random((60, 3))), sdot.Grid(np.ones((1, 1, 1))),
                                         metric=TORUS3).power_diagram.cells
    hulls = [ConvexHull(c.vertices) for c in cells3]
    assert [h.volume for h in hulls] == pytest.approx([float(c.measure) for c in cells3], abs=1e-12)
    assert [sum(f.area for f in c.facets) for c in cells3] == pytest.approx([h.area for h in hulls], rel=1e-11)
    cylinder = PeriodicMetric(Norm2(), [1.0, None])
    cells = sdot.optimal_transport_plan(sdot.SumOfDiracs(points[:50]), sdot.Grid(np.ones((1, 1))),
                                        metric=cylinder).power_diagram.cells
    assert sum(_area(c.vertices) for c in cells) == pytest.approx(1.0, abs=1e-12)
    assert {j for c in cells for j, _ in c.facets if j < 0} == {-1, -3}          # y = lo and y = hi only


def test_clear_errors(numpy_driver):
    points = np.random.default_rng(0).random((20, 2))
    source, target = sdot.SumOfDiracs(points), sdot.Grid(np.ones((4, 4)))
    with pytest.raises(ValueError, match="period must equal the domain"):
        sdot.distance(source, target, metric=PeriodicMetric(Norm2(), [2.0, 1.0]))
    with pytest.raises(ValueError, match="2 periods for a 3D"):
        sdot.distance(sdot.SumOfDiracs(np.random.default_rng(0).random((20, 3))), sdot.Grid(np.ones((2, 2, 2))),
                      metric=TORUS2)
    with pytest.raises(TypeError, match="metric must be"):
        sdot.distance(source, target, metric="torus")
    with pytest.raises(ValueError, match="> 0 or None"):
        PeriodicMetric(Norm2(), [0.0, 1.0])
    with pytest.raises(ValueError, match="at least one axis"):
        PeriodicMetric(Norm2(), [None, None])
    plan = sdot.optimal_transport_plan(source, target, metric=TORUS2)
    assert plan.vjp(barycenters=np.ones((20, 2)))["domain"] is None
    with pytest.raises(NotImplementedError, match="domain"):
        plan.jvp(domain=(np.zeros(2), np.ones(2)))
    # Norm2 is the default
    assert float(sdot.distance(source, target, metric=Norm2())) == float(sdot.distance(source, target))


@pytest.mark.only_backends("jax", reason="jax.jit's callback route")
def test_under_jit_as_eagerly(backend):
    """Under ``jax.jit`` the host callback solves the periodic problem: the same W2^2 and gradients
    as eagerly, also when the derivative callbacks rebuild the solve's state (an evicted store)."""
    import jax

    from sdot import _jax_host

    rng = np.random.default_rng(4)
    points, image = jax.numpy.asarray(rng.random((100, 2))), jax.numpy.asarray(0.3 + rng.random((8, 8)))

    def w(p, v):
        return sdot.distance(sdot.SumOfDiracs(p), sdot.Grid(v), metric=TORUS2, tol=1e-12)
    eager = jax.value_and_grad(w, argnums=(0, 1))(points, image)
    jitted = jax.jit(jax.value_and_grad(w, argnums=(0, 1)))(points, image)
    with _jax_host.STORE.bounded(0):
        rebuilt = jax.jit(jax.value_and_grad(w, argnums=(0, 1)))(points, image)
    for other in (jitted, rebuilt):
        assert float(other[0]) == float(eager[0])
        for a, b in zip(other[1], eager[1]):
            assert np.asarray(a) == pytest.approx(np.asarray(b), rel=1e-12, abs=1e-15)
    # the jitted plan's diagram is the torus's (its cells computed when asked)
    plan = jax.jit(lambda p: sdot.optimal_transport_plan(sdot.SumOfDiracs(p), sdot.Grid(image), metric=TORUS2))(points)
    assert plan.power_diagram.metric == TORUS2


@pytest.mark.only_backends("jax-jit", reason="the compiled route refuses clearly")
def test_the_compiled_route_refuses_clearly(backend):
    import jax

    points, image = jax.numpy.asarray(np.random.default_rng(0).random((20, 2))), jax.numpy.ones((4, 4))
    with pytest.raises(NotImplementedError, match="compiled route"):
        jax.jit(lambda p: sdot.distance(sdot.SumOfDiracs(p), sdot.Grid(image), metric=TORUS2))(points)


@pytest.mark.parametrize("dim", [2, 3])
def test_polynomial_grids_translate_by_whole_cells(numpy_driver, dim):
    """Bernstein polynomials of degree 2 per cell: rolling the cells and moving the Diracs alike
    changes nothing on the torus."""
    rng = np.random.default_rng(dim)
    cells = (6,) * dim if dim == 2 else (3,) * dim
    coefficients = 0.5 + rng.random(cells + (3 ** dim,))
    points = rng.random((60, dim))
    metric = PeriodicMetric(Norm2(), [1.0] * dim)
    w = float(sdot.distance(sdot.SumOfDiracs(points), sdot.PolynomialGrid(coefficients), metric=metric, tol=1e-12))
    shift = np.full(dim, 2)
    rolled = np.roll(coefficients, tuple(shift), axis=tuple(range(dim)))
    moved = float(sdot.distance(sdot.SumOfDiracs(points + shift / cells[0]), sdot.PolynomialGrid(rolled),
                                metric=metric, tol=1e-12))
    assert moved == pytest.approx(w, rel=1e-12)


def _first_images(margin, **diagram):
    """Newton options whose periodic diagrams start from the images within ``margin`` mean
    spacings of the box (inf: every image within half a period of it), and other ``diagram``
    options."""
    import dataclasses

    from sdot._core.options import DEFAULT

    return dataclasses.replace(DEFAULT, diagram=dataclasses.replace(DEFAULT.diagram, periodic_margin=(margin,) * 2,
                                                                    **diagram))


@pytest.mark.parametrize("case", ["uniform-2d", "gauss-corner-2d", "gauss-centre-2d", "uniform-3d"])
def test_the_images_left_out_change_nothing(numpy_driver, case):
    """The diagram takes the images its certificate asks for (fewer than all those within half a
    period of the box): the same steps and W2^2 as with all of them, from the default first
    images and from very few (half a spacing: the certificate then adds what the cells need;
    without it W2^2 was 1.5% off on the uniform square). Uniform Diracs on a Gaussian: weights
    vary by many squared spacings, the images are tested by a descent over the cells (by the
    global bound, 2.06 sites per Dirac)."""
    from conftest import plan_with

    dim = 3 if case.endswith("3d") else 2
    points = np.random.default_rng(8).random((2000 if dim == 2 else 400, dim))
    c = (np.arange(32) + 0.5) / 32
    values = {"gauss-corner-2d": gauss_corner(32),
              "gauss-centre-2d": 0.2 + np.exp(-((c[:, None] - 0.5) ** 2 + (c[None, :] - 0.5) ** 2) / (2 * 0.15 ** 2))
              }.get(case, np.ones((1,) * dim))
    metric = PeriodicMetric(Norm2(), [1.0] * dim)
    source, target = sdot.SumOfDiracs(points), sdot.Grid(values)
    every = plan_with(_first_images(math.inf), source, target, 1e-11, metric=metric)
    # the default first images; very few; the descent for every test of the images left out
    for options in (sdot._core.options.DEFAULT, _first_images(0.5), _first_images(0.5, periodic_pairs=0)):
        few = plan_with(options, source, target, 1e-11, metric=metric)
        # (the same diagrams; other sites round otherwise: a step more or less at the tolerance)
        assert abs(int(few.iterations) - int(every.iterations)) <= 1
        assert float(few.distance) == pytest.approx(float(every.distance), rel=1e-12)
        sites = [p.power_diagram._state[1].labels.shape[0] for p in (few, every)]
        assert sites[0] < sites[1]
        if case == "gauss-centre-2d":
            assert sites[0] < 1.6 * len(points)


@pytest.mark.parametrize("dim", [2, 3])
def test_compiled_kernels_agree_with_the_array_route(numpy_driver, dim):
    """The cells' radii and support functions by the compiled kernels (sdot._host.compiled.radii)
    against array operations on the same diagram, and a periodic solve on either route."""
    import sdot._core.options
    from sdot._core import evaluation, periodic, plan
    from sdot._core.density import grid_density
    from sdot._host.compiled import radii
    from sdot._host.threads import host_settings

    rng = np.random.default_rng(dim)
    points = rng.random((300, dim))
    prob = evaluation.Problem(points, np.full(300, 1 / 300), grid_density(np.ones((1,) * dim), np.zeros(dim),
                                                                          np.ones(dim)), np.ones(dim))
    cells = plan.evaluation_at(np, prob, 1e-4 * rng.standard_normal(300), np.ones(300, bool)).cells
    live = periodic._live_vertices(np, cells)
    v = np.asarray(cells.vertices)
    expected = np.max(np.where(live, np.sum(v * v, axis=-1), 0.0), axis=1)
    size, corners = (cells.size, cells.corners) if dim == 3 else (None, None)
    got = radii.spatial(v, size, corners) if dim == 3 else radii.planar(v, cells.count)
    assert got == pytest.approx(expected, rel=1e-15, abs=0)
    pick = rng.integers(0, v.shape[0], 500)
    e = rng.standard_normal((500, dim))
    brute = np.max(np.where(live[pick], np.einsum("pvd,pd->pv", v[pick], e), -np.inf), axis=1)
    assert radii.support(v, cells.count, size, corners, pick, e) == pytest.approx(brute, rel=1e-14)
    source, target = sdot.SumOfDiracs(points), sdot.Grid(np.ones((1,) * dim))
    metric = PeriodicMetric(Norm2(), [1.0] * dim)
    compiled = sdot.optimal_transport_plan(source, target, metric=metric, tol=1e-11)
    with host_settings(compiled=False):
        arrays = sdot.optimal_transport_plan(source, target, metric=metric, tol=1e-11)
    assert int(arrays.iterations) == int(compiled.iterations)
    assert float(arrays.distance) == pytest.approx(float(compiled.distance), rel=1e-12)


def test_power_diagram_on_the_torus(numpy_driver):
    """``PowerDiagram(x, metric=...)``: its cells at the plan's weights are the plan's (the same
    edges drawn), and ``adjust_weights`` solves on the torus."""
    import matplotlib

    matplotlib.use("Agg")
    rng = np.random.default_rng(12)
    points, masses = rng.random((60, 2)), 0.5 + rng.random(60)
    target = sdot.Grid(0.5 + rng.random((8, 8)))
    plan = sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(points, masses), target, metric=TORUS2)
    diagram = sdot.PowerDiagram(points, weights=plan.brenier_potential, metric=TORUS2)
    assert diagram.metric == TORUS2
    edges = [np.sort(np.round(np.concatenate(d.plot().collections[-1].get_segments()), 9), axis=0)
             for d in (diagram, plan.power_diagram)]
    assert edges[0] == pytest.approx(edges[1], abs=1e-9)
    fitted = sdot.PowerDiagram(points, metric=TORUS2)
    again = fitted.adjust_weights(masses / masses.sum(), target)
    assert float(again.distance) == pytest.approx(float(plan.distance), rel=1e-12)
    with pytest.raises(ValueError, match="period must equal the domain"):
        sdot.PowerDiagram(points, metric=PeriodicMetric(Norm2(), [2.0, 1.0]))


def test_a_shape_on_black_with_diracs_all_over_the_torus(numpy_driver):
    """A square on black, Diracs spread over the torus: the solve starts from the Voronoi cells
    and a blur over the whole box (the plane's starts, which move the Diracs into the support's
    box, do not hold on a torus: before, 300 steps at a residual of 0.08). Rolling the image and
    moving the Diracs alike changes nothing."""
    image = np.zeros((16, 16))
    image[5:10, 4:11] = 1.0
    points = np.random.default_rng(13).random((150, 2))
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(points), sdot.Grid(image), metric=TORUS2, tol=1e-12)
    assert bool(plan.converged) and int(plan.iterations) < 80
    shift = np.array([7, 12])
    moved = sdot.distance(sdot.SumOfDiracs(points + shift / 16.0), sdot.Grid(np.roll(image, tuple(shift), axis=(0, 1))),
                          metric=TORUS2, tol=1e-12)
    assert float(moved) == pytest.approx(float(plan.distance), rel=1e-10)


@pytest.mark.parametrize("scale, offset", [(1000.0, -300.0), (1e-3, 5.0)])
def test_huge_and_tiny_domains(numpy_driver, scale, offset):
    """The torus of a domain moved and scaled: W2^2 times the scale squared (a shape on black,
    the Diracs given relative to the domain)."""
    rng = np.random.default_rng(3)
    points, image = rng.random((200, 2)), np.zeros((16, 16))
    image[3:9, 10:15] = 1.0 + rng.random((6, 5))
    unit = float(sdot.distance(sdot.SumOfDiracs(points), sdot.Grid(image), metric=TORUS2, tol=1e-12))
    metric = PeriodicMetric(Norm2(), [scale, scale])
    domain = (np.full(2, offset), np.full(2, offset + scale))
    w = float(sdot.distance(sdot.SumOfDiracs(offset + scale * points), sdot.Grid(image, domain=domain), metric=metric,
                            tol=1e-12))
    assert w == pytest.approx(unit * scale ** 2, rel=1e-11)


@pytest.mark.only_backends("torch", reason="the mass gradient of a Dirac of zero mass, through torch's autograd")
def test_a_dirac_of_zero_mass_near_a_corner(backend):
    """``dW/dm_i`` of a zero-mass Dirac is ``psi^c_i``, the least over the torus (its images
    included): against a one-sided finite difference."""
    import torch

    rng = np.random.default_rng(3)
    points, image = rng.random((150, 2)), 0.5 + rng.random((8, 8))
    points[0] = [0.01, 0.99]
    masses = np.ones(150)
    masses[0] = 0.0
    weights = torch.tensor(masses, requires_grad=True)
    sdot.distance(sdot.SumOfWeightedDiracs(torch.tensor(points), weights), sdot.Grid(torch.tensor(image)),
                  metric=TORUS2, tol=1e-13).backward()

    def w(m):
        return float(sdot.distance(sdot.SumOfWeightedDiracs(points, m), sdot.Grid(image), metric=TORUS2, tol=1e-13))
    h = 1e-7
    step = np.zeros(150)
    step[0] = h
    assert float(weights.grad[0]) == pytest.approx((w(masses + step) - w(masses)) / h, rel=1e-3)


def test_the_blur_of_a_periodic_domain_wraps_around():
    """The continuation's blur on a periodic domain is a blur on the circle along each axis that
    wraps: it keeps the mass, commutes with rolling the image around the torus (along the wrapping
    axis only, on a cylinder), and is as large across a side as inside (a bump at a side spreads
    to the other side)."""
    from sdot._core import continuation

    rng = np.random.default_rng(4)
    image = rng.random((24, 16)) * (rng.random((24, 16)) < 0.3)
    lo, hi = np.zeros(2), np.ones(2)
    for width in (0.03, 0.2, 1.5):
        torus = continuation.blurred(np, image, np.asarray(width), lo, hi, periodic=(True, True))
        assert torus.sum() == pytest.approx(image.sum(), rel=1e-13) and np.all(torus > 0)
        rolled = continuation.blurred(np, np.roll(image, (7, 11), axis=(0, 1)), np.asarray(width), lo, hi,
                                      periodic=(True, True))
        assert np.allclose(rolled, np.roll(torus, (7, 11), axis=(0, 1)), rtol=1e-12, atol=1e-15)
        cylinder = continuation.blurred(np, image, np.asarray(width), lo, hi, periodic=(True, False))
        rolled = continuation.blurred(np, np.roll(image, 7, axis=0), np.asarray(width), lo, hi, periodic=(True, False))
        assert np.allclose(rolled, np.roll(cylinder, 7, axis=0), rtol=1e-12, atol=1e-15)
    bump = np.zeros((32, 1))
    bump[0, 0] = 1.0
    spread = continuation.blurred(np, bump, np.asarray(0.05), lo, hi, periodic=(True, True))[:, 0]
    assert spread[31] == pytest.approx(spread[1], rel=1e-12) and spread[31] > 0.1 * spread[0]


def test_a_gaussian_near_a_side(numpy_driver):
    """A Gaussian density near a side of the torus: the blur of the continuation wraps around
    (before, the plane's blur kept its mass in the box and made a jump at the side: 96 steps here,
    300 unsolved with 2e4 Diracs, against 20 in the plane). Rolling the image by half a period
    and moving the Diracs alike gives the same W2^2."""
    c = (np.arange(32) + 0.5) / 32
    x, y = np.meshgrid(c, c, indexing="ij")
    image = np.exp(-((x - 0.95) ** 2 + (y - 0.4) ** 2) / (2 * 0.1 ** 2)) + 1e-3
    points = np.random.default_rng(2).random((500, 2))
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(points), sdot.Grid(image), metric=TORUS2, tol=1e-10)
    assert bool(plan.converged) and int(plan.iterations) <= 40
    moved = sdot.optimal_transport_plan(sdot.SumOfDiracs(points + [0.5, 0.0]), sdot.Grid(np.roll(image, 16, axis=0)),
                                        metric=TORUS2, tol=1e-10)
    assert int(moved.iterations) <= 40
    assert float(moved.distance) == pytest.approx(float(plan.distance), rel=1e-9)


def test_a_seed_is_hidden_once_all_its_pieces_are():
    """On a periodic domain a seed's cell is the union of its sites' cells: the hiding step of the
    seeds is the least over seeds of their last nonempty piece's time (an empty piece counts as
    hidden; a seed hidden already, all its pieces empty, bounds nothing, as in the plane: counted
    as hidden at t = 0 it stopped every step of a cluster of Diracs on a 3D torus)."""
    import array_api_compat.numpy as xp

    from sdot._core.hiding import first_hidden_of_seeds

    times = np.array([0.5, np.inf, 0.2, 0.3, 0.9, 0.1, np.inf])
    owner = np.array([0, 1, 2, 0, 2, 1, 3])
    active = np.array([True, True, True, True, True, True, False])
    count = np.array([4, 3, 5, 6, 3, 0, 0])
    # seed 0: max(0.5, 0.3); seed 1: inf (its empty piece does not hide it sooner); seed 2: 0.9
    assert float(first_hidden_of_seeds(xp, times, owner, active, count)) == 0.5
    count[1] = 0                                    # seed 1's other piece empty too: hidden already
    assert float(first_hidden_of_seeds(xp, times, owner, active, count)) == 0.5
    count[0] = 0                                    # seed 0 left with its piece of time 0.3
    assert float(first_hidden_of_seeds(xp, times, owner, active, count)) == 0.3
