"""Measures: construction, normalisation, validation, JAX pytrees."""
import numpy as np
import pytest

import sdot
from sdot import (BatchOfSumOfDiracs, BatchOfSumOfWeightedDiracs, Grid, PolynomialGrid,
                  SumOfDiracs, SumOfDiracs1d, SumOfWeightedDiracs)
from sdot._measures import align

RNG = np.random.default_rng(0)
X = RNG.random((5, 2))
W = np.array([1.0, 2.0, 3.0, 4.0, 0.0])


def _close(backend, a, b):
    np.testing.assert_allclose(backend.to_numpy(a), b, rtol=1e-12, atol=1e-14)


# ------------------------------------------------------------ normalisation
@pytest.mark.parametrize("mass, expected", [(1, 0.2), (None, 1.0), (3.0, 0.6)])
def test_sum_of_diracs(backend, mass, expected):
    x = backend.asarray(X)
    _close(backend, backend.run(lambda x: SumOfDiracs(x, mass=mass).masses, x), [expected] * 5)
    m = SumOfDiracs(x, mass=mass)
    assert (m.n, m.dim, m.batched, m.mass) == (5, 2, False, mass)
    assert m.positions is x and m.native == backend.native
    _close(backend, m.weights, np.ones(5))


@pytest.mark.parametrize("mass, scale", [(1, 0.1), (None, 1.0), (2.0, 0.2)])
def test_weighted_diracs(backend, mass, scale):
    x, w = backend.asarray(X), backend.asarray(W)
    masses = backend.run(lambda x, w: SumOfWeightedDiracs(x, w, mass=mass).masses, x, w)
    _close(backend, masses, W * scale)
    m = SumOfWeightedDiracs(x, w, mass=mass)
    assert m.weights is w and (m.n, m.dim) == (5, 2)


def test_batches(backend):
    x, w = backend.asarray(RNG.random((3, 4, 2))), backend.asarray(RNG.random((3, 4)) + 0.1)
    masses = backend.run(lambda x, w: BatchOfSumOfWeightedDiracs(x, w, mass=2).masses, x, w)
    _close(backend, masses, 2 * backend.to_numpy(w) / backend.to_numpy(w).sum(1)[:, None])
    _close(backend, backend.run(lambda x: BatchOfSumOfDiracs(x).masses, x), np.full((3, 4), 0.25))
    m = BatchOfSumOfWeightedDiracs(x, w, mass=2)
    assert (len(m), m.n, m.dim, m.batched) == (3, 4, 2, True)
    item = m[1]
    assert type(item) is SumOfWeightedDiracs and not item.batched and item.mass == 2
    _close(backend, item.positions, backend.to_numpy(x)[1])
    assert type(BatchOfSumOfDiracs(x)[0]) is SumOfDiracs
    assert [i.n for i in m] == [4, 4, 4] and bool(m) and bool(item)
    with pytest.raises(IndexError):
        m[3]
    with pytest.raises(TypeError, match="not a batch"):
        len(SumOfDiracs(x[0, ...]))


def test_sum_of_diracs_1d(backend):
    x = backend.asarray([0.1, 0.5, 0.7, 0.9])
    m = backend.run(lambda x: SumOfDiracs1d(x), x)
    assert tuple(m.positions.shape) == (4, 1) and m.dim == 1 and type(m) is SumOfDiracs1d
    _close(backend, m.positions[:, 0], [0.1, 0.5, 0.7, 0.9])
    _close(backend, m.masses, [0.25] * 4)


@pytest.mark.parametrize("mass", [1, None, 5.0])
def test_grid_density(backend, mass):
    v = backend.asarray(RNG.random((4, 8)))
    g = backend.run(lambda v: PolynomialGrid(v, domain=([0, -1], [2, 1]), mass=mass), v)
    assert (g.dim, g.degree, g.grid_shape) == (2, 0, (4, 8))
    lo, hi = g.domain
    _close(backend, lo, [0, -1])
    _close(backend, hi, [2, 1])
    _close(backend, g.cell_volume, 4 / 32)
    total = backend.to_numpy(g.density).sum() * 4 / 32
    expected = backend.to_numpy(v).sum() * 4 / 32 if mass is None else mass
    np.testing.assert_allclose(total, expected, rtol=1e-12)


def test_grid_default_domain_and_scalar_bounds(backend):
    v = backend.asarray(np.ones((2, 2, 2)))
    g = PolynomialGrid(v)
    assert (g.dim, g.degree, g.grid_shape) == (3, 0, (2, 2, 2))
    _close(backend, g.domain[0], [0, 0, 0])
    _close(backend, g.domain[1], [1, 1, 1])
    g = Grid(v, domain=(0, 2))
    _close(backend, g.domain[1], [2, 2, 2])
    _close(backend, g.integral, 8.0)


def test_bernstein_grid(backend):
    v = backend.asarray(RNG.random((3, 4, 9)))  # degree 2 in 2d: 9 coefficients per cell
    g = backend.run(lambda v: PolynomialGrid(v, domain=([0, 0], [1, 1])), v)
    assert (g.dim, g.degree, g.grid_shape) == (2, 2, (3, 4))
    _close(backend, g.integral, backend.to_numpy(v).mean(-1).sum() / 12)
    np.testing.assert_allclose(backend.to_numpy(g.density).mean(-1).sum() / 12, 1.0)


def test_with_dim(backend):
    v = backend.asarray(np.ones((4, 4, 4)))
    g = PolynomialGrid(v)
    assert (g.dim, g.degree) == (3, 0)
    g2 = g.with_dim(2)
    assert (g2.dim, g2.degree, g2.grid_shape) == (2, 1, (4, 4)) and g.dim == 3
    _close(backend, g2.integral, 1.0)
    assert g.with_dim(3).degree == 0
    with pytest.raises(ValueError, match="values"):
        g.with_dim(1)
    with pytest.raises(ValueError, match="values"):
        Grid(v).with_dim(2)
    with pytest.raises(ValueError, match="dimension mismatch"):
        PolynomialGrid(v[..., 0], domain=([0, 0], [1, 1])).with_dim(3)


def test_integer_inputs_are_cast(backend):
    x = backend.asarray([[0, 1], [2, 3]], dtype=np.int32)
    m = SumOfDiracs(x)
    assert "float64" in str(m.positions.dtype)
    assert "float64" in str(PolynomialGrid(backend.asarray([[1, 2]], dtype=np.int64)).values.dtype)


def test_dtype_kept_for_native_inputs(backend):
    x = backend.asarray(X, dtype=np.float32)
    expected = "float32" if backend.native else "float64"  # rule 1 / rule 2
    assert expected in str(SumOfDiracs(x).positions.dtype)
    assert expected in str(SumOfDiracs(x).masses.dtype)


def test_repr(backend):
    assert repr(SumOfDiracs(backend.asarray(X))).startswith("SumOfDiracs(n=5, d=2")
    assert "b=3" in repr(BatchOfSumOfDiracs(backend.asarray(np.ones((3, 4, 2)))))
    assert "grid_shape=(2, 3)" in repr(Grid(backend.asarray(np.ones((2, 3)))))


# --------------------------------------------------------------- validation
NAN = float("nan")
# (constructor, arguments as nested lists, exception, message, needs concrete values)
ERRORS = [
    (SumOfDiracs, ([1.0, 2.0],), ValueError, "positions", False),
    (SumOfDiracs, (np.zeros((0, 2)),), ValueError, "positions", False),
    (SumOfDiracs1d, (np.zeros((3, 2)),), ValueError, "positions", False),
    (BatchOfSumOfDiracs, (np.zeros((3, 2)),), ValueError, "positions", False),
    (SumOfWeightedDiracs, (np.zeros((3, 2)), [1.0, 2.0]), ValueError, "weights", False),
    (SumOfWeightedDiracs, (np.zeros((3, 2)), np.ones((3, 1))), ValueError, "weights", False),
    (BatchOfSumOfWeightedDiracs, (np.zeros((2, 3, 2)), np.ones(3)), ValueError, "weights", False),
    (SumOfDiracs, ([[0.0, NAN]],), ValueError, "positions", True),
    (SumOfDiracs, ([[0.0, np.inf]],), ValueError, "positions", True),
    (SumOfWeightedDiracs, ([[0.0], [1.0]], [1.0, np.inf]), ValueError, "weights", True),
    (SumOfWeightedDiracs, ([[0.0], [1.0]], [1.0, -1.0]), ValueError, "weights", True),
    (SumOfWeightedDiracs, ([[0.0], [1.0]], [0.0, 0.0]), ValueError, "weights", True),
    (BatchOfSumOfWeightedDiracs, (np.zeros((2, 2, 1)), [[1.0, 0], [0, 0]]), ValueError,
     "weights", True),
    (PolynomialGrid, ([[1.0, NAN]],), ValueError, "values", True),
    (PolynomialGrid, ([[1.0, -1.0]],), ValueError, "values", True),
    (PolynomialGrid, ([[0.0, 0.0]],), ValueError, "values", True),
    (PolynomialGrid, (np.ones((0, 3)),), ValueError, "values", False),
    (PolynomialGrid, (np.ones((2, 2, 5)), ([0, 0], [1, 1])), ValueError, "values", False),
    (PolynomialGrid, (np.ones((2, 2)), ([0, 0, 0], [1, 1, 1])), ValueError, "values", False),
    (Grid, (np.ones((2, 2, 4)), ([0, 0], [1, 1])), ValueError, "values", False),
    (Grid, (np.ones((2, 2)), [[0, 0], [1, 1], [2, 2]]), ValueError, "domain", False),
    (Grid, (np.ones((2, 2)), np.ones((3, 2))), ValueError, "domain", False),
    (Grid, (np.ones((2, 2)), ([0, 0], [1, 1, 1])), ValueError, "domain", False),
    (Grid, (np.ones((2, 2)), ([0, 0], [1, 0])), ValueError, "domain", False),
    (Grid, (np.ones((2, 2)), ([0, 1], [1, 0])), ValueError, "domain", False),
    (Grid, (np.ones((2, 2)), ([0, 0], [1, NAN])), ValueError, "domain", False),
    (Grid, (np.ones((2, 2)), "unit"), TypeError, "domain", False),
]


@pytest.mark.parametrize("ctor, args, exc, match, concrete", ERRORS,
                         ids=[f"{e[0].__name__}-{i}" for i, e in enumerate(ERRORS)])
def test_invalid_inputs(backend, ctor, args, exc, match, concrete):
    arrays = [backend.asarray(args[0])] + ([backend.asarray(args[1])]
                                           if ctor.__name__.endswith("WeightedDiracs") else [])
    rest = args[len(arrays):]
    build = lambda *a: ctor(*a, *rest)  # noqa: E731
    if concrete and backend.jit:
        backend.run(build, *arrays)  # tracers: value checks are skipped under jit
        return
    with pytest.raises(exc, match=match):
        backend.run(build, *arrays)


@pytest.mark.parametrize("mass, exc", [(0, ValueError), (-1.0, ValueError), (np.inf, ValueError),
                                       (NAN, ValueError), ("1", TypeError), (True, TypeError),
                                       ([1.0, 2.0], TypeError), (np.ones(2), ValueError)])
def test_invalid_mass(backend, mass, exc):
    with pytest.raises(exc, match="mass"):
        SumOfDiracs(backend.asarray(X), mass=mass)
    with pytest.raises(exc, match="mass"):
        Grid(backend.asarray(np.ones((2, 2))), mass=mass)


@pytest.mark.parametrize("bad", ["abc", [[1.0, "a"]], [[1.0, 2.0], [3.0]], object(), [[1j, 2]]])
def test_non_numeric_positions(bad):
    with pytest.raises(TypeError, match="positions"):
        SumOfDiracs(bad)


def test_nested_lists_and_numpy_scalars(sdot_driver):
    sdot_driver.framework = "numpy"
    m = SumOfWeightedDiracs([[0, 0], [1, 1]], [np.float32(1), 3])
    np.testing.assert_allclose(m.masses, [0.25, 0.75])
    g = PolynomialGrid([[1, 2], [3, 4]], domain=[[0, 0], [2, 2]], mass=np.float64(2))
    np.testing.assert_allclose(g.density, np.array([[1, 2], [3, 4]]) * 2 / 10)
    assert m.positions.dtype == np.float64 and not m.native


# -------------------------------------------------------------- autodiff
def test_torch_gradient_through_normalisation():
    torch = pytest.importorskip("torch")
    w = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    m = SumOfWeightedDiracs(torch.zeros(3, 1, dtype=torch.float64), w, mass=2.0)
    (g,) = torch.autograd.grad(m.masses[0], w)
    np.testing.assert_allclose(g.numpy(), 2 * (np.eye(3)[0] / 6 - 1 / 36))
    v = torch.ones(2, 2, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(Grid(v).density[0, 0], v)
    np.testing.assert_allclose(g.numpy(), np.eye(4)[0].reshape(2, 2) - 0.25)  # d(4 v0 / S)/dv


def test_jax_gradient_through_normalisation():
    jax = pytest.importorskip("jax")
    f = lambda w: SumOfWeightedDiracs(jax.numpy.zeros((3, 1)), w, mass=2.0).masses[0]  # noqa
    g = jax.jit(jax.grad(f))(jax.numpy.asarray([1.0, 2.0, 3.0]))
    np.testing.assert_allclose(g, 2 * (np.eye(3)[0] / 6 - 1 / 36))


# ---------------------------------------------------------------- pytrees
def _all_measures(xp_asarray):
    x, w = xp_asarray(X), xp_asarray(W)
    xb, wb = xp_asarray(np.ones((2, 5, 2))), xp_asarray(np.ones((2, 5)))
    return [SumOfDiracs(x), SumOfWeightedDiracs(x, w, mass=None), BatchOfSumOfDiracs(xb, mass=3),
            BatchOfSumOfWeightedDiracs(xb, wb), SumOfDiracs1d(x[:, 0]),
            PolynomialGrid(xp_asarray(np.ones((2, 2, 4)))).with_dim(2),
            Grid(xp_asarray(np.ones((2, 2))), domain=([0, 0], [1, 2]))]


def test_pytree_round_trip_jit_and_vmap():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    for m in _all_measures(jnp.asarray):
        leaves, tree = jax.tree_util.tree_flatten(m)
        assert all(isinstance(leaf, jax.Array) for leaf in leaves)
        back = jax.tree_util.tree_unflatten(tree, leaves)
        assert type(back) is type(m) and repr(back) == repr(m)
        attr = "masses" if hasattr(m, "masses") else "density"
        out = jax.jit(lambda m: getattr(m, attr))(m)
        np.testing.assert_allclose(out, getattr(m, attr))
    batch = BatchOfSumOfWeightedDiracs(jnp.ones((3, 4, 2)), jnp.arange(1.0, 13.0).reshape(3, 4))
    seen = []
    per_item = jax.vmap(lambda m: seen.append(m.batched) or m.masses)(batch)
    np.testing.assert_allclose(per_item, batch.masses)
    assert seen == [False]  # each call sees one item
    grid = Grid(jnp.ones((4, 4)))
    f = lambda x, g: SumOfDiracs(x, mass=2.0).masses.sum() * g.density.sum()  # noqa: E731
    np.testing.assert_allclose(jax.vmap(f, in_axes=(0, None))(jnp.ones((3, 5, 2)), grid),
                               [32.0] * 3)
    # measures are returned from jit functions too
    out = jax.jit(lambda x: SumOfWeightedDiracs(x, jnp.ones(5)))(jnp.asarray(X))
    assert type(out) is SumOfWeightedDiracs


def test_pytree_numpy_leaves(sdot_driver):
    jax = pytest.importorskip("jax")
    sdot_driver.framework = "numpy"
    m = SumOfWeightedDiracs(X, W)
    np.testing.assert_allclose(jax.jit(lambda m: m.masses)(m), W / 10)


def test_align_moves_converted_measures_next_to_native_ones(sdot_driver):
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax").numpy
    sdot_driver.framework = "jax"
    f, g = SumOfDiracs(torch.rand(4, 2)), Grid(np.ones((3, 3)))
    assert f.native and not g.native
    f2, g2 = align(f, g)
    assert f2 is f and isinstance(g2.values, torch.Tensor) and g2.values.dtype == torch.float64
    assert align(g, None) == (g, None)
    with pytest.raises(TypeError, match="torch.*JAX"):
        align(f, Grid(jnp.ones((3, 3))))
    # weights given as a list follow torch positions (and the reverse)
    m = SumOfWeightedDiracs(torch.rand(2, 2), [1.0, 2.0])
    assert isinstance(m.weights, torch.Tensor) and m.native
    m = SumOfWeightedDiracs([[0.0, 1.0]], torch.ones(1))
    assert isinstance(m.positions, torch.Tensor) and m.native
    with pytest.raises(TypeError, match="torch.*JAX"):
        SumOfWeightedDiracs(torch.rand(2, 2), jnp.ones(2))


def test_public_names():
    assert set(sdot._measures.__all__) - {"align"} <= set(sdot.__all__)
    assert set(sdot._grids.__all__) <= set(sdot.__all__)


def test_array_mass_is_differentiable_and_a_leaf():
    torch = pytest.importorskip("torch")
    jax = pytest.importorskip("jax")
    m = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(SumOfDiracs(torch.rand(4, 2), mass=m).masses.sum(), m)
    assert g.item() == pytest.approx(1.0)
    assert SumOfDiracs(X, mass=np.asarray(2.0)).mass == 2.0
    f = lambda m: Grid(jax.numpy.ones((2, 2)), mass=m).density.sum() / 4  # noqa: E731
    assert float(jax.jit(jax.grad(f))(jax.numpy.asarray(3.0))) == pytest.approx(1.0)
    leaves = jax.tree_util.tree_leaves(SumOfDiracs(jax.numpy.ones((2, 2)), mass=jax.numpy.ones(())))
    assert len(leaves) == 2
