"""Under ``jax.jit`` on the CPU a solve is one host callback of the NumPy core (the default
``sdot.driver.jit_route = "callback"``): a new number of Diracs compiles in well under a
second, the answers equal the eager host path's and the compiled route's, the derivative
callbacks find the solve's state in a bounded store or rebuild it, and memory stays flat.
The persistent compilation cache (``sdot.driver.jax_cache``) serves the callback-free compiled
route across processes."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import sdot
from sdot import _jax_host, _routes

jax = pytest.importorskip("jax")
jnp = jax.numpy
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def compiled_solves(monkeypatch, sdot_driver):
    """The JAX driver; counts the solves traced into the program (the compiled route)."""
    sdot_driver.framework, sdot_driver.dtype = "jax", "FP64"
    seen = {"compiled": 0}
    real = _routes.jax_solve_plan

    def counted(*reachable):
        seen["compiled"] += 1
        return real(*reachable)
    monkeypatch.setattr(_routes, "jax_solve_plan", counted)
    return seen


def problem(n, seed=0, dim=2):
    rng = np.random.default_rng(seed)
    img = 0.5 + rng.random((6,) * dim)
    return jnp.asarray(rng.random((n, dim))), jnp.asarray(rng.random(n) + 0.5), jnp.asarray(img)


def loss(x, w, img):
    return sdot.distance(sdot.SumOfWeightedDiracs(x, w), sdot.Grid(img))


def bary(x, w, img):
    return sdot.barycenters(sdot.SumOfWeightedDiracs(x, w), sdot.Grid(img))


def assert_close(got, want, rtol=1e-12, atol=1e-14):
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=rtol, atol=atol)


def test_a_new_size_compiles_in_well_under_a_second(compiled_solves):
    """A user's jitted ``value_and_grad``: after a first size, a new N compiles and runs in
    under 3 s (measured: 0.1-0.6 s), nothing traces the compiled solve, and the value and
    gradients equal the eager host path's to 1e-12."""
    value_and_grad = jax.value_and_grad(loss, argnums=(0, 1, 2))
    step = jax.jit(value_and_grad)
    jax.block_until_ready(step(*problem(40)))
    args = problem(57, seed=1)
    start = time.perf_counter()
    got = jax.block_until_ready(step(*args))
    assert time.perf_counter() - start < 3.0
    assert step._cache_size() == 2 and compiled_solves["compiled"] == 0
    assert_close(got, value_and_grad(*args))


def test_transformations_equal_the_eager_host_path(compiled_solves):
    """Jacobians of the barycentres (forward and reverse), the Hessian of W2^2, ``vmap`` and
    ``lax.scan`` under ``jit``, and traced ``tol``/``max_iter``: equal to the eager calls."""
    x, w, img = problem(12, seed=2)

    @jax.jit
    def program(x, batch, tol, max_iter):
        jf, jr = jax.jacfwd(bary)(x, w, img), jax.jacrev(bary)(x, w, img)
        hess = jax.hessian(loss)(x, w, img)
        batched = jax.vmap(jax.value_and_grad(loss), in_axes=(0, None, None))(batch, w, img)
        _, scanned = jax.lax.scan(lambda c, xi: (c, loss(xi, w, img)), 0.0, batch)
        plan = sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(x, w), sdot.Grid(img), tol=tol,
                                           max_iter=max_iter, raise_on_failure=False)
        return jf, jr, hess, batched, scanned, (plan.distance, plan.residual, plan.converged)
    batch = jnp.stack([x, 0.9 * x + 0.05])
    jf, jr, hess, (values, grads), scanned, (dist, residual, converged) = program(x, batch, 1e-12, 300)
    assert compiled_solves["compiled"] == 0
    assert_close(jf, jax.jacfwd(bary)(x, w, img), atol=1e-12)
    assert_close(jr, jf, atol=1e-12)
    assert_close(hess, jax.hessian(loss)(x, w, img), atol=1e-12)
    for i in range(2):
        assert_close((values[i], grads[i]), jax.value_and_grad(loss)(batch[i], w, img))
        assert_close(scanned[i], values[i])
    assert bool(converged) and float(residual) <= 1e-12
    assert_close(dist, sdot.distance(sdot.SumOfWeightedDiracs(x, w), sdot.Grid(img), tol=1e-12))
    cut = program(x, batch, 1e-12, 1)[-1]
    assert np.isnan(float(jax.jit(lambda x: sdot.distance(sdot.SumOfWeightedDiracs(x, w), sdot.Grid(img),
                                                          max_iter=1))(x)))
    assert not bool(cut[2]) and np.isfinite(float(cut[0]))        # raise_on_failure=False: the partial plan
    assert program._cache_size() == 1


@pytest.mark.parametrize("dim", [1, 3])
def test_lines_and_volumes(compiled_solves, dim):
    """1D and 3D under ``jit``: the value and gradient of the eager calls, and a plan returned
    whose power diagram's cells are those of the eager plan."""
    x, w, img = problem(9, seed=3, dim=dim)
    value_and_grad = jax.value_and_grad(loss, argnums=(0, 1, 2))
    assert_close(jax.jit(value_and_grad)(x, w, img), value_and_grad(x, w, img), atol=1e-12)
    plan = jax.jit(lambda x: sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(x, w), sdot.Grid(img)))(x)
    eager = sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(x, w), sdot.Grid(img))
    assert_close([c.measure for c in plan.power_diagram.cells], [c.measure for c in eager.power_diagram.cells],
                 atol=1e-12)
    assert compiled_solves["compiled"] == 0


def test_a_polynomial_grid_under_jit(compiled_solves):
    """A degree-1 ``PolynomialGrid`` under ``jit``: the value and gradients of the eager calls,
    and the returned plan's diagram measures its cells under the polynomial (the eager plan's
    masses), not under the coefficients read as pixels."""
    x, w, _ = problem(10, seed=5)
    coefficients = jnp.asarray(0.5 + np.random.default_rng(5).random((3, 4, 4)))

    def plan_of(x, c):
        return sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(x, w), sdot.PolynomialGrid(c))
    value_and_grad = jax.value_and_grad(lambda x, c: plan_of(x, c).distance, argnums=(0, 1))
    assert_close(jax.jit(value_and_grad)(x, coefficients), value_and_grad(x, coefficients), atol=1e-12)
    got, want = jax.jit(plan_of)(x, coefficients), plan_of(x, coefficients)
    measures = np.array([float(c.measure) for c in got.power_diagram.cells])
    assert_close(measures, np.array([float(c.measure) for c in want.power_diagram.cells]), atol=1e-12)
    assert_close(measures, want.cell_masses, atol=1e-10)
    assert compiled_solves["compiled"] == 0


def test_a_diagram_adjusted_under_jit_has_the_plans_cells(compiled_solves):
    """``PowerDiagram.adjust_weights`` inside ``jit``: the returned diagram's cells (computed
    outside) are the eager ones, a zero-mass Dirac's empty."""
    x, w, img = problem(12, seed=9)
    w = w.at[3].set(0.0)

    def adjusted(x):
        diagram = sdot.PowerDiagram(x)
        diagram.adjust_weights(w / jnp.sum(w), sdot.Grid(img))
        return diagram
    got, want = jax.jit(adjusted)(x).cells, adjusted(x).cells
    assert_close([c.measure for c in got], [c.measure for c in want], atol=1e-12)
    assert float(got[3].measure) == 0.0


def test_the_callback_and_the_compiled_route_agree(sdot_driver):
    """One solve in one program, ``tol`` and ``max_iter`` traced (the compiled route compiles it
    once for all three calls): W2^2, the barycentres, the gradient of W2^2 and a
    vector-Jacobian product of the barycentres agree to 1e-10; the compiled solve obeys the
    traced options. The compiled route is a GPU's (``driver.host = False``): its later calls
    move nothing between host and device (``jax.transfer_guard("disallow")``)."""
    sdot_driver.framework = "jax"
    x, w, img = problem(20, seed=4)
    c = jnp.asarray(np.random.default_rng(5).normal(size=x.shape))

    def program(x, w, img, tol, max_iter):
        def outputs(x, w, img):
            plan = sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(x, w), sdot.Grid(img), tol=tol,
                                               max_iter=max_iter, raise_on_failure=False)
            return (plan.distance, plan.barycenters), (plan.residual, plan.converged)
        (value, b), pullback, status = jax.vjp(outputs, x, w, img, has_aux=True)
        return (value, b, pullback((jnp.ones(()), jnp.zeros_like(b))), pullback((jnp.zeros(()), c))), status
    routes = {}
    for route in ("callback", "compiled"):      # the route is read when tracing: one function each
        sdot_driver.jit_route, sdot_driver.host = route, route == "callback"
        jitted = jax.jit(lambda *args: program(*args))
        routes[route] = jitted(x, w, img, jnp.asarray(1e-11), jnp.asarray(300))
    assert_close(routes["callback"][0], routes["compiled"][0], rtol=1e-10, atol=1e-10)
    options = [(jnp.asarray(tol), jnp.asarray(steps)) for tol, steps in ((1e-4, 300), (1e-11, 1))]
    with jax.transfer_guard("disallow"):             # on the device: arguments, results and all between
        (_, loose), (_, cut) = (jitted(x, w, img, *o) for o in options)
    assert jitted._cache_size() == 1
    assert float(routes["compiled"][1][0]) <= 1e-11 < float(loose[0]) <= 1e-4 and bool(loose[1])
    assert not bool(cut[1]) and float(cut[0]) > 1e-11


def test_a_store_miss_rebuilds_the_same_derivatives(compiled_solves):
    """With a store that keeps nothing, every derivative callback rebuilds the solve's state
    from its inputs and weights: the same gradients, Jacobian and Hessian to 1e-12."""
    x, w, img = problem(15, seed=6)

    @jax.jit
    def program(x, img):
        return (jax.grad(loss, argnums=(0, 1, 2))(x, w, img), jax.jacrev(bary)(x, w, img),
                jax.hessian(loss)(x, w, img), jax.jvp(lambda im: bary(x, w, im), (img,), (img,))[1])
    kept = program(x, img)
    with _jax_host.STORE.bounded(entries=0) as store:
        rebuilt = program(x, img)
        assert store.misses > 0 and store.hits == 0 and len(store) == 0
    assert_close(rebuilt, kept, atol=1e-12)


def _rss_mib():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="Linux's /proc")
def test_memory_stays_flat_over_many_calls(compiled_solves):
    """150 calls of a jitted ``value_and_grad`` at N = 300 (the gradient with respect to the
    grid's values reads the stored state): the store holds at most its bound of states, and
    the resident memory of the last 100 calls grows by less than 8 MiB (a state is 0.18 MiB
    here: a store that kept them all would grow by 18 MiB)."""
    _, w, img = problem(300, seed=7)
    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 2)))
    base = np.random.default_rng(8).random((300, 2))
    rss = []
    with _jax_host.STORE.bounded(entries=8) as store:
        for k in range(150):
            value, _ = step(jnp.asarray(base + 1e-4 * k), w, img)
            assert len(store) <= 8
            if k in (49, 149):
                float(value)
                rss.append(_rss_mib())
        assert np.isfinite(float(value)) and store.hits == 150
    assert rss[1] - rss[0] < 8.0, rss


def test_the_store_bounds_its_bytes():
    """Beyond the most recent state, the store keeps at most ``nbytes`` of arrays."""
    store = _jax_host.HostStore(entries=10, nbytes=3000)
    tokens = [store.put((np.zeros(100),)) for _ in range(5)]            # 800 bytes each
    assert len(store) == 3 and store.get(tokens[0]) is None and store.get(tokens[-1]) is not None
    big = store.put((np.zeros(1000),))
    assert len(store) == 1 and store.get(big) is not None
    assert len(set(tokens)) == 5 and all(t > 0 for t in tokens)


CACHE_SCRIPT = r"""
import json, os, sys
import sdot
sdot._jax_cache.MIN_COMPILE_SECONDS = 0.0       # the test's programs compile fast: store them all
import numpy as np, jax, jax.numpy as jnp
jax.config.update("jax_enable_x64", True)
hits = []
jax.monitoring.register_event_listener(lambda name, **kw: hits.append(name) if name.endswith("cache_hits") else None)
cache = sdot.driver.jax_cache
sdot.driver.jit_route = "compiled"              # the 1D solve compiled: no host callback
x = jnp.asarray(np.random.default_rng(0).random(12))
img = jnp.asarray(np.random.default_rng(1).random(7) + 0.5)
d1 = float(jax.jit(lambda x: sdot.distance(sdot.SumOfDiracs1d(x), sdot.Grid(img)))(x))
compiled_hits = len(hits)
before = sorted(os.listdir(cache))
sdot.driver.jit_route = "callback"              # a 2D solve by callback: JAX stores nothing of it
y = jnp.asarray(np.random.default_rng(2).random((12, 2)))
d2 = float(jax.jit(lambda y: sdot.distance(sdot.SumOfDiracs(y), sdot.Grid(jnp.ones((3, 3)))))(y))
after = sorted(os.listdir(cache))
print(json.dumps(dict(cache=cache, d1=d1, hits=compiled_hits, before=before, after=after,
                      mode=oct(os.stat(cache).st_mode & 0o777))))
"""


def test_the_persistent_cache_serves_a_second_process(tmp_path):
    """``SDOT_JAX_CACHE=<dir>``: the first process compiles the 1D solve on the compiled route
    (callback-free) and JAX stores it in the directory, created 0700; a second process loads
    it (cache hits) and gets the same W2^2. The callback route's program is not stored."""
    cache = tmp_path / "jax-cache"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SDOT_")}
    env.update(SDOT_FRAMEWORK="jax", SDOT_JAX_CACHE=str(cache),
               PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", CACHE_SCRIPT], capture_output=True, text=True, env=env,
                              timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["cache"] == str(cache) and first["mode"] == "0o700"
    assert first["hits"] == 0 and any(name.startswith("jit__lambda") for name in first["before"])
    assert second["hits"] >= 1 and second["d1"] == first["d1"]
    programs = [[name for name in run[key] if name.startswith("jit__lambda")]     # the users' jitted lambdas
                for run, key in ((first, "before"), (first, "after"), (second, "after"))]
    assert len(programs[0]) == 1 and programs[0] == programs[1] == programs[2]    # the callback's not stored


def test_the_cache_directory_must_be_private(tmp_path, sdot_driver):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ValueError, match="writable by other users"):
        sdot_driver.jax_cache = str(shared)
    saved = sdot_driver.jax_cache
    assert sdot_driver.jax_cache == saved
    private = tmp_path / "a" / "b"
    try:
        sdot_driver.jax_cache = str(private)
        assert stat.S_IMODE(private.stat().st_mode) == 0o700
        assert jax.config.jax_compilation_cache_dir == str(private)
    finally:
        sdot_driver.jax_cache = None
    assert jax.config.jax_compilation_cache_dir is None
    with pytest.raises(ValueError, match="jit_route"):
        sdot_driver.jit_route = "traced"
