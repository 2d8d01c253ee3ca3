"""Eager JAX calls on the CPU solve on the host: the NumPy core on views of the arrays,
nothing compiled, JAX arrays back with the analytic gradient rule."""
from __future__ import annotations

import numpy as np
import pytest

import sdot
from sdot import _routes
from sdot._core import plan

jax = pytest.importorskip("jax")
jnp = jax.numpy


@pytest.fixture
def solves(monkeypatch, sdot_driver):
    """The namespaces the core solved with, and whether the compiled JAX solve ran."""
    sdot_driver.framework, sdot_driver.dtype = "jax", "FP64"
    seen = {"core": [], "compiled": 0}
    real_solve, real_compiled = plan.solve_plan, _routes.jax_solve_plan

    def solve_plan(xp, *args, **kwargs):
        seen["core"].append(xp.__name__ if hasattr(xp, "__name__") else type(xp).__name__)
        return real_solve(xp, *args, **kwargs)

    def compiled(*reachable):
        seen["compiled"] += 1
        return real_compiled(*reachable)
    monkeypatch.setattr(plan, "solve_plan", solve_plan)
    monkeypatch.setattr(_routes, "jax_solve_plan", compiled)
    return seen


def problem():
    rng = np.random.default_rng(5)
    x, w = rng.random((60, 2)), rng.random(60) + 0.5
    yy, xx = np.mgrid[0:8, 0:8]
    img = np.exp(-((xx - 2.5) ** 2 + (yy - 4.0) ** 2) / 9.0)
    img[:, 6:] = 0.0                                 # a zero region too
    return jnp.asarray(x), jnp.asarray(w), jnp.asarray(img)


def loss(x, w, img):
    # tol 1e-12: the NumPy and torch cores agree to the solve's tolerance (at the default
    # 1e-10, solves that stop at a residual of 6e-11 give gradients 2e-9 apart)
    return sdot.distance(sdot.SumOfWeightedDiracs(x, w), sdot.Grid(img), tol=1e-12)


def test_eager_calls_and_gradients_run_the_numpy_core(solves):
    """``distance`` and ``jax.grad`` of concrete JAX arrays: the NumPy core twice, no compiled
    solve; JAX arrays back, equal to torch's value and gradients."""
    x, w, img = problem()
    d = loss(x, w, img)
    grads = jax.grad(loss, argnums=(0, 1, 2))(x, w, img)
    assert solves["compiled"] == 0 and len(solves["core"]) == 2
    assert all("numpy" in name for name in solves["core"]), solves["core"]
    assert isinstance(d, jax.Array) and d.dtype == jnp.float64
    assert all(isinstance(g, jax.Array) and g.shape == a.shape for g, a in zip(grads, (x, w, img)))
    # torch's autograd of the same problem (its rule is tested against finite differences)
    torch = pytest.importorskip("torch")
    inputs = [torch.tensor(np.asarray(a), requires_grad=True) for a in (x, w, img)]
    d_torch = loss(*inputs)
    d_torch.backward()
    assert float(d) == pytest.approx(float(d_torch.detach()), rel=1e-12)
    for g, t in zip(grads, inputs):
        np.testing.assert_allclose(np.asarray(g), t.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_eager_forward_mode_and_the_plan(solves):
    """``jax.jvp`` outside ``jit`` agrees with the gradient; the plan's arrays are JAX arrays,
    equal to those of NumPy inputs under the JAX driver (also solved on the host)."""
    x, w, img = problem()
    direction = jnp.asarray(np.random.default_rng(1).standard_normal(x.shape))
    _, tangent = jax.jvp(lambda p: loss(p, w, img), (x,), (direction,))
    grad = jax.grad(loss)(x, w, img)
    assert float(tangent) == pytest.approx(float(jnp.sum(grad * direction)), rel=1e-10)
    ot = sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(x, w), sdot.Grid(img))
    assert solves["compiled"] == 0
    for name in ("barycenters", "cell_masses", "brenier_potential", "converged", "iterations", "residual"):
        assert isinstance(getattr(ot, name), jax.Array), name
    ref = sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(np.asarray(x), np.asarray(w)),
                                      sdot.Grid(np.asarray(img)))    # NumPy inputs, JAX driver: the same
    np.testing.assert_array_equal(np.asarray(ot.barycenters), np.asarray(ref.barycenters))
    cells = ot.power_diagram.cells
    assert sum(float(c.measure) for c in cells) == pytest.approx(1.0, rel=1e-9)


def test_a_power_diagram_of_jax_arrays_is_built_on_the_host(solves, monkeypatch):
    """``PowerDiagram`` of concrete JAX arrays: the NumPy core, NumPy's cells."""
    seen = []
    real = plan.diagram
    monkeypatch.setattr(plan, "diagram", lambda xp, *a: seen.append(xp) or real(xp, *a))
    x = np.random.default_rng(2).random((30, 2))
    cells = sdot.PowerDiagram(jnp.asarray(x)).cells
    assert len(seen) == 1 and "numpy" in getattr(seen[0], "__name__", type(seen[0]).__name__)
    ref = sdot.PowerDiagram(x).cells
    assert [float(c.measure) for c in cells] == [float(c.measure) for c in ref]


def test_concrete_batches_loop_on_the_host(solves):
    """A batch of concrete JAX sources: one host solve per item (``jax.vmap`` is only taken
    when traced: see test_gradients), each equal to the item's own distance."""
    x, _, img = problem()
    batch = jnp.stack([x, x[::-1] * 0.9 + 0.05])
    looped = sdot.distance(sdot.BatchOfSumOfDiracs(batch), sdot.Grid(img))
    assert solves["compiled"] == 0 and len(solves["core"]) == 2 and looped.shape == (2,)
    items = [float(sdot.distance(sdot.SumOfDiracs(b), sdot.Grid(img))) for b in batch]
    np.testing.assert_array_equal(np.asarray(looped), items)


def test_the_host_path_equals_the_jitted_solve(solves):
    """The same value and gradients under ``jax.jit`` (traced inputs: the NumPy core by a host
    callback, ``driver.jit_route = "callback"``) as eagerly on the host, to 1e-12; the compiled
    route agrees to 1e-10 (tests/test_jax_jit_host.py)."""
    x, w, img = problem()
    value_and_grad = jax.value_and_grad(loss, argnums=(0, 1, 2))
    d, grads = value_and_grad(x, w, img)
    d_jit, grads_jit = jax.jit(value_and_grad)(x, w, img)
    assert solves["compiled"] == 0 and len(solves["core"]) == 2
    assert float(d) == pytest.approx(float(d_jit), rel=1e-12)
    for g, gj in zip(grads, grads_jit):
        np.testing.assert_allclose(np.asarray(g), np.asarray(gj), rtol=1e-12, atol=1e-14)


def test_hard_inputs_take_numpys_path_bit_for_bit(solves):
    """What users bring (an annulus with its hole, duplicates, a zero mass, a Dirac far
    outside the domain, a cluster 1e-5 wide): eager JAX arrays give NumPy's plan exactly
    (the same core on the same numbers), and the gradient exists and is finite."""
    rng = np.random.default_rng(8)
    x = np.concatenate([rng.random((50, 2)), [[0.3, 0.3], [0.3, 0.3], [40.0, -25.0]],
                        0.7 + 1e-5 * rng.random((5, 2))])
    w = np.concatenate([rng.random(50) + 0.5, [1.0, 1.0, 0.5], np.ones(5)])
    w[10] = 0.0
    yy, xx = np.mgrid[0:16, 0:16] + 0.5
    r2 = (xx - 8) ** 2 + (yy - 8) ** 2
    img = ((r2 < 49) & (r2 > 9)) * 1.0                      # an annulus on a zero background
    ref = sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(x, w), sdot.Grid(img), tol=1e-7,
                                      raise_on_failure=False)
    args = [jnp.asarray(a) for a in (x, w, img)]
    ot = sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(*args[:2]), sdot.Grid(args[2]), tol=1e-7,
                                     raise_on_failure=False)
    assert solves["compiled"] == 0 and bool(ot.converged) == bool(ref.converged) is True
    for name in ("distance", "barycenters", "cell_masses", "brenier_potential"):
        np.testing.assert_array_equal(np.asarray(getattr(ot, name)), np.asarray(getattr(ref, name)), err_msg=name)
    grad = jax.grad(lambda p: sdot.distance(sdot.SumOfWeightedDiracs(p, args[1]), sdot.Grid(args[2]), tol=1e-7))(args[0])
    assert np.all(np.isfinite(np.asarray(grad)))


def _rss_mib():
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


@pytest.mark.skipif(not __import__("pathlib").Path("/proc/self/statm").exists(), reason="Linux's /proc")
def test_eager_gradients_of_the_plan_do_not_grow_memory(solves):
    """Eager ``jax.grad`` of the barycentres, 100 calls at N = 200: the derivative rules find
    the solve's state in the bounded store by a token, JAX's caches hold no state and compile
    nothing new, and the resident memory of the last 70 calls grows by less than 6 MiB (it
    grew by ~0.5 MiB per call when the products ran on the host thread)."""
    from sdot import _jax_host

    rng = np.random.default_rng(3)
    img, base = jnp.asarray(0.5 + rng.random((12, 12))), rng.random((200, 2))
    c = jnp.asarray(rng.random((200, 2)))
    grad = jax.grad(lambda x: jnp.sum(c * sdot.barycenters(sdot.SumOfDiracs(x), sdot.Grid(img))))
    rss = []
    with _jax_host.STORE.bounded(entries=4):
        for k in range(100):
            g = grad(jnp.asarray(base + 1e-4 * k))
            if k in (29, 99):
                float(g[0, 0])
                rss.append(_rss_mib())
        assert len(_jax_host.STORE) <= 4 and np.all(np.isfinite(np.asarray(g)))
    assert rss[1] - rss[0] < 6.0, rss


def test_an_eager_call_at_a_new_size_compiles_almost_nothing(solves):
    """A first eager solve at new shapes compiles at most 3 XLA programs (the inputs'
    conversion; the normalisation of masses and density runs in NumPy: it compiled 13
    programs, ~0.5 s, before), and its arrays equal the NumPy driver's bit for bit."""
    from jax import monitoring

    rng = np.random.default_rng(11)
    x, img = rng.random((37, 2)), 0.5 + rng.random((7, 5))
    source, target = sdot.SumOfDiracs(jnp.asarray(x)), sdot.Grid(jnp.asarray(img))
    compiles = []

    def listener(event, *_, **__):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(event)
    monitoring.register_event_duration_secs_listener(listener)
    try:
        plan = sdot.optimal_transport_plan(source, target)
        float(plan.distance)
    finally:
        monitoring.unregister_event_duration_listener(listener)
    assert len(compiles) <= 3, compiles
    sdot.driver.framework = "numpy"
    want = sdot.optimal_transport_plan(sdot.SumOfDiracs(x), sdot.Grid(img))
    np.testing.assert_array_equal(np.asarray(plan.barycenters), want.barycenters)
    assert float(plan.distance) == float(want.distance)
