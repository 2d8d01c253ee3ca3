"""Gradients of W2^2: analytic vs finite differences, torch vs JAX, the frameworks' own
checkers, and the JAX transformations (jit, grad, jvp, vmap, scan).

One problem size everywhere (JAX compiles the solver once per shape and mode).
Ground truth: central finite differences of the solver's value in FP64 (the
value itself is checked against independent references in test_solver.py),
and closed forms (one Dirac on the uniform square).
"""
import numpy as np
import pytest

import sdot

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = jax.numpy

N, GRID = 24, (6, 5)
TOL = 1e-13                     # solves behind finite differences
EPS = 1e-5


def problem(seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((N, 2)), 0.5 + rng.random(N), 0.3 + rng.random(GRID)


def w2_numpy(x, w, img):
    return float(sdot.distance(sdot.SumOfWeightedDiracs(x, w), sdot.Grid(img), tol=TOL))


def finite_differences(x, w, img, entries):
    """Central differences of W at ``entries``: list of (argument index, index tuple)."""
    out = []
    for arg, idx in entries:
        args = [np.array(a, dtype=float) for a in (x, w, img)]
        plus, minus = [a.copy() for a in args], [a.copy() for a in args]
        plus[arg][idx] += EPS
        minus[arg][idx] -= EPS
        out.append((w2_numpy(*plus) - w2_numpy(*minus)) / (2 * EPS))
    return np.array(out)


ENTRIES = [(0, (0, 0)), (0, (5, 1)), (0, (17, 0)), (1, (2,)), (1, (11,)), (2, (0, 0)), (2, (3, 2)),
           (2, (5, 4))]


def torch_gradients(x, w, img, dtype=torch.float64):
    args = [torch.tensor(a, dtype=dtype, requires_grad=True) for a in (x, w, img)]
    value = sdot.distance(sdot.SumOfWeightedDiracs(args[0], args[1]), sdot.Grid(args[2]))
    value.backward()
    return value, [a.grad for a in args]


def jax_w2(x, w, img, **options):
    return sdot.distance(sdot.SumOfWeightedDiracs(x, w), sdot.Grid(img), **options)


def pick(grads, entries):
    return np.array([np.asarray(grads[arg])[idx] for arg, idx in entries])


@pytest.fixture(scope="module")
def reference():
    """Finite differences at the test problem (computed once, with NumPy)."""
    x, w, img = problem()
    return finite_differences(x, w, img, ENTRIES)


def test_core_gradients_match_finite_differences(sdot_driver, reference):
    """NumPy has no autodiff: the core's analytic gradients, chained by hand through
    the normalisation ``m = w / sum(w)``, ``rho = v / int(v)``."""
    from sdot import _checks
    from sdot._core import gradients, plan

    sdot_driver.framework = "numpy"
    x, w, img = problem()
    src, tgt = _checks.check_pair(sdot.SumOfWeightedDiracs(x, w), sdot.Grid(img))
    xp, prob = _checks.problem(src, tgt)
    state = plan.solve_plan(xp, prob, TOL, 100)["state"]
    gy, gm, grho = gradients.gradients(xp, prob.seeds, prob.masses, prob.density, state)
    gw = (gm - np.sum(gm * prob.masses)) / w.sum()             # d/dw of W(w / sum w)
    cell = 1.0 / img.size
    gv = (grho - cell * np.sum(grho * prob.density.values)) / (img.sum() * cell)   # d/dv of W(v / int v)
    np.testing.assert_allclose(pick([gy, gw, gv], ENTRIES), reference, rtol=1e-6, atol=1e-9)


def test_torch_gradients_match_finite_differences(reference):
    _, grads = torch_gradients(*problem())
    np.testing.assert_allclose(pick([g.numpy() for g in grads], ENTRIES), reference, rtol=1e-6, atol=1e-9)


def test_jax_gradients_match_finite_differences(reference):
    grads = jax.grad(jax_w2, argnums=(0, 1, 2))(*map(jnp.asarray, problem()))
    np.testing.assert_allclose(pick(grads, ENTRIES), reference, rtol=1e-6, atol=1e-9)


def test_torch_and_jax_agree():
    x, w, img = problem(1)
    value_t, grads_t = torch_gradients(x, w, img)
    value_j, grads_j = jax.value_and_grad(jax_w2, argnums=(0, 1, 2))(*map(jnp.asarray, (x, w, img)))
    assert float(value_t.detach()) == pytest.approx(float(value_j), rel=1e-12)
    for gt, gj in zip(grads_t, grads_j):
        np.testing.assert_allclose(gt.numpy(), np.asarray(gj), rtol=0, atol=1e-10)


def test_one_dirac_closed_form():
    """One Dirac at y on the uniform unit square: W = |y - c|^2 + 1/6, dW/dy = 2 (y - c)."""
    y = torch.tensor([[0.3, 0.8]], dtype=torch.float64, requires_grad=True)
    value = sdot.distance(sdot.SumOfDiracs(y), sdot.Grid(torch.ones(3, 3, dtype=torch.float64)))
    value.backward()
    assert float(value.detach()) == pytest.approx(0.2 ** 2 + 0.3 ** 2 + 1 / 6, rel=1e-12)
    np.testing.assert_allclose(y.grad.numpy(), [[2 * (0.3 - 0.5), 2 * (0.8 - 0.5)]], atol=1e-13)


def test_torch_gradcheck():
    x, w, img = problem(2)
    args = tuple(torch.tensor(a, requires_grad=True) for a in (x[:8], w[:8], img[:3, :3]))

    def f(x, w, img):
        return sdot.distance(sdot.SumOfWeightedDiracs(x, w), sdot.Grid(img), tol=TOL)
    assert torch.autograd.gradcheck(f, args, eps=1e-6, atol=1e-7, rtol=1e-5)


def test_jax_check_grads_forward_and_reverse():
    from jax.test_util import check_grads

    x, w, img = map(jnp.asarray, problem(2))
    check_grads(lambda x, w, img: jax_w2(x, w, img, tol=TOL), (x, w, img), order=1,
                modes=("fwd", "rev"), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_every_input_gets_a_gradient_of_its_dtype():
    """float32 inputs, FP64 solve: gradients come back in float32, for every input."""
    x, w, img = problem(3)
    value, grads = torch_gradients(x, w, img, dtype=torch.float32)
    assert value.dtype == torch.float64
    for g, shape in zip(grads, (x.shape, w.shape, img.shape)):
        assert g is not None and g.dtype == torch.float32 and tuple(g.shape) == shape
        assert bool(torch.all(torch.isfinite(g))) and float(torch.abs(g).max()) > 0
    args = [jnp.asarray(a, dtype=jnp.float32) for a in (x, w, img)]
    for g, a in zip(jax.grad(jax_w2, argnums=(0, 1, 2))(*args), args):
        assert g.dtype == jnp.float32 and g.shape == a.shape and float(jnp.abs(g).max()) > 0


def test_torch_subset_of_inputs_and_autograd_grad():
    x, w, img = problem(4)
    xt = torch.tensor(x, requires_grad=True)
    value = sdot.distance(sdot.SumOfWeightedDiracs(xt, w), sdot.Grid(img))
    (gx,) = torch.autograd.grad(value, xt)
    _, full = torch_gradients(x, w, img)
    np.testing.assert_allclose(gx.numpy(), full[0].numpy(), atol=1e-12)


def test_torch_plan_tensors_are_ordinary_tensors():
    """The solve runs under torch.inference_mode, but what users get are ordinary tensors:
    modifiable in place, usable by autograd (a loss of the barycentres and weights),
    and the distance keeps its gradient, also when called under inference_mode."""
    x, w, img = problem(5)
    xt = torch.tensor(x, requires_grad=True)
    plan = sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(xt, w), sdot.Grid(img))
    arrays = [plan.distance, plan.barycenters, plan.cell_masses, plan.brenier_potential, plan.residual,
              plan.iterations, plan.converged, plan.power_diagram.weights]
    assert not any(a.is_inference() for a in arrays)
    scale = torch.ones((), dtype=torch.float64, requires_grad=True)
    loss = plan.distance + (scale * plan.barycenters).sum() + (scale * plan.brenier_potential).sum()
    loss.backward()
    assert xt.grad is not None and scale.grad is not None
    plan.brenier_potential += 1.0
    plan.barycenters[0, 0] = 0.0
    with torch.inference_mode():
        inner = sdot.distance(sdot.SumOfWeightedDiracs(torch.tensor(x), w), sdot.Grid(img))
    assert float(inner) == pytest.approx(float(plan.distance.detach()), rel=1e-12)


def test_jax_jit_value_and_grad_and_jacfwd():
    """Jitted, eager and forward-mode give the same value and gradient to 1e-12, in this
    order and with no reset between them: each solve starts without LU factors kept from
    another (factors precondition the Newton solves, and move the stopping point within
    the tolerance)."""
    x, w, img = map(jnp.asarray, problem(5))
    v, g = jax.jit(jax.value_and_grad(jax_w2))(x, w, img)
    v_eager, g_eager = jax.value_and_grad(jax_w2)(x, w, img)
    assert float(v) == pytest.approx(float(v_eager), rel=1e-12)
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_eager), atol=1e-12)
    np.testing.assert_allclose(np.asarray(jax.jacfwd(jax_w2)(x, w, img)), np.asarray(g), atol=1e-12)


def test_jax_solves_of_one_shape_compile_once_and_keep_no_factors():
    """Solves of one shape run one compiled program, with the default options or an equal
    copy of them (the linear solver is made while tracing, not a static argument), and
    each starts without the factors of the solve before it: a problem solved again after
    a nearby one, whose factors would precondition its Newton matrices, gives the same
    plan bit for bit."""
    import dataclasses

    from conftest import solve_with
    from sdot import _routes
    from sdot._core import options

    x, w, img = problem(5)
    nearby = x + 1e-4 * np.random.default_rng(1).standard_normal(x.shape)

    def plan(positions, newton_options):
        source = sdot.SumOfWeightedDiracs(jnp.asarray(positions), jnp.asarray(w))
        return solve_with(newton_options, source, sdot.Grid(jnp.asarray(img)), 1e-10)
    first = plan(x, options.DEFAULT)
    compiled = _routes.jax_solve_plan()._cache_size()
    plan(nearby, dataclasses.replace(options.DEFAULT))
    again = plan(x, dataclasses.replace(options.DEFAULT))
    assert _routes.jax_solve_plan()._cache_size() == compiled
    assert bool(first.converged)
    for name in ("distance", "brenier_potential", "cell_masses", "barycenters", "iterations"):
        np.testing.assert_array_equal(np.asarray(getattr(again, name)), np.asarray(getattr(first, name)), name)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_jax_vmap_over_each_input(axis):
    """vmap over positions, over weights, or over grid values == a loop."""
    base = list(map(jnp.asarray, problem(6)))
    other = list(map(jnp.asarray, problem(7)))
    stacked = jnp.stack([base[axis], other[axis]])
    in_axes = tuple(0 if k == axis else None for k in range(3))
    args = [stacked if k == axis else base[k] for k in range(3)]
    values = jax.vmap(jax_w2, in_axes=in_axes)(*args)
    for i, item in enumerate((base[axis], other[axis])):
        single = [item if k == axis else base[k] for k in range(3)]
        assert float(values[i]) == pytest.approx(float(jax_w2(*single)), rel=1e-10)
    grads = jax.vmap(jax.grad(jax_w2, argnums=axis), in_axes=in_axes)(*args)
    assert grads.shape == stacked.shape


def test_jax_scan_gradient_descent_decreases_the_distance():
    """A few gradient steps on the positions inside one jitted ``lax.scan``."""
    x, w, img = map(jnp.asarray, problem(8))

    def step(pos, _):
        value, g = jax.value_and_grad(jax_w2)(pos, w, img)
        return pos - 0.5 * g / w[:, None] * jnp.sum(w), value

    _, values = jax.jit(lambda p: jax.lax.scan(step, p, None, length=4))(x)
    values = np.asarray(values)
    assert np.all(np.diff(values) < 0), values


def test_batches_equal_a_loop_and_vmap():
    x = np.stack([problem(k)[0] for k in (9, 10, 11)])
    img = problem(9)[2]
    d_torch = sdot.distances(sdot.BatchOfSumOfDiracs(torch.tensor(x)), sdot.Grid(torch.tensor(img)))
    d_jax = sdot.distance(sdot.BatchOfSumOfDiracs(jnp.asarray(x)), sdot.Grid(jnp.asarray(img)))
    assert tuple(d_torch.shape) == tuple(d_jax.shape) == (3,)
    loop = [float(sdot.distance(sdot.SumOfDiracs(x[i]), sdot.Grid(img))) for i in range(3)]
    # each solve stops somewhere within its tolerance (cell masses to 1e-8, trajectories
    # differ between frameworks): W2^2 agrees to about 1e-10 of itself
    np.testing.assert_allclose(d_torch.numpy(), loop, rtol=1e-9)
    np.testing.assert_allclose(np.asarray(d_jax), loop, rtol=1e-9)
    xt = torch.tensor(x, requires_grad=True)
    sdot.distance(sdot.BatchOfSumOfDiracs(xt), sdot.Grid(img)).sum().backward()
    gj = jax.grad(lambda p: jnp.sum(sdot.distance(sdot.BatchOfSumOfDiracs(p), sdot.Grid(jnp.asarray(img)))))(
        jnp.asarray(x))
    np.testing.assert_allclose(xt.grad.numpy(), np.asarray(gj), atol=1e-10)


def test_failed_solve_under_jit_is_nan_not_silent():
    x, w, img = map(jnp.asarray, problem(12))
    value = jax.jit(lambda x: jax_w2(x, w, img, max_iter=1))(x)
    assert np.isnan(float(value))
    def partial_plan(x):
        plan = sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(x, w), sdot.Grid(img), max_iter=1,
                                           raise_on_failure=False)
        return plan.distance, plan.converged, plan.iterations, plan.residual, plan.status
    partial, converged, iterations, residual, status = jax.jit(partial_plan)(x)
    assert np.isfinite(float(partial))
    # the partial plan's status under jit: 0-d arrays of OtPlan's dtypes (as eagerly, tests/test_solver.py)
    assert [(a.shape, a.dtype) for a in (converged, iterations, residual, status)] == [
        ((), jnp.bool_), ((), jnp.int64), ((), jnp.float64), ((), jnp.int64)]
    assert not bool(converged) and int(iterations) == 1 and int(status) == 1 and float(residual) > 0


def test_quantization_loss_module():
    """The ``nn.Module`` of docs/gradients.md: a loss with learnable positions."""
    class QuantizationLoss(torch.nn.Module):
        def __init__(self, image, n):
            super().__init__()
            self.target = sdot.Grid(image)
            self.positions = torch.nn.Parameter(torch.rand(n, 2, dtype=image.dtype,
                                                           generator=torch.Generator().manual_seed(0)))

        def forward(self):
            return sdot.distance(sdot.SumOfDiracs(self.positions), self.target)

    img = torch.tensor(problem(13)[2])
    loss = QuantizationLoss(img, N)
    opt = torch.optim.SGD(loss.parameters(), lr=0.5 * N)
    values = []
    for _ in range(3):
        opt.zero_grad()
        value = loss()
        value.backward()
        opt.step()
        values.append(float(value.detach()))
    assert values[2] < values[1] < values[0]
