"""The route a GPU takes, run on the CPU (``sdot.driver.host = False``): array-API code only,
no host callback, a bounded number of device-to-host synchronisations per Newton step, and the
answers of the host's route."""
import collections

import numpy as np
import pytest

import sdot


def _problem(dim, n, seed=1):
    """``n`` Diracs and a grid density with a zero layer (the last along the last axis)."""
    rng = np.random.default_rng(seed)
    values = rng.random((8 if dim == 2 else 4,) * dim) + 0.5
    values[..., -1] = 0.0
    return rng.random((n, dim)), values


@pytest.mark.parametrize("dim", [2, 3])
def test_torch_on_the_gpu_route_equals_the_host_route(sdot_driver, dim):
    torch = pytest.importorskip("torch")
    x, values = _problem(dim, 60)

    def solve():
        positions = torch.tensor(x, requires_grad=True)
        w2 = sdot.distance(sdot.SumOfDiracs(positions), sdot.Grid(torch.tensor(values)))
        w2.backward()
        return float(w2), positions.grad.numpy()

    host = solve()
    sdot_driver.host = False
    gpu_route = solve()
    assert gpu_route[0] == pytest.approx(host[0], rel=1e-10)
    np.testing.assert_allclose(gpu_route[1], host[1], rtol=0, atol=1e-8 * np.abs(host[1]).max())


def _synchronisations(torch, x, values):
    """``(Newton steps, {operation: count})`` of the operations that make a device wait for the
    host (a value read back, a shape that depends on values) in one torch solve."""
    from torch.utils._python_dispatch import TorchDispatchMode

    syncing = ("aten._local_scalar_dense", "aten.item", "aten.nonzero", "aten.masked_select", "aten.unique",
               "aten._unique", "aten.repeat_interleave", "aten._to_copy")

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func)
            if name.startswith(syncing) and not (name.startswith("aten._to_copy")
                                                 and (kwargs or {}).get("device") is None):
                self.ops[name] += 1
            return func(*args, **(kwargs or {}))

    with Count() as count:
        plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(torch.tensor(x)), sdot.Grid(torch.tensor(values)))
    return int(plan.iterations), count.ops


def test_torch_on_the_gpu_route_waits_for_the_host_a_bounded_number_of_times_per_step(sdot_driver):
    """At most :data:`SYNCS_PER_STEP` reads back per Newton step (its decisions: convergence,
    the damping's trials, the eager loops' stops and listings), none per cell: four times the
    Diracs, less than :data:`GROWTH` times the reads."""
    torch = pytest.importorskip("torch")
    sdot_driver.host = False
    counts = {}
    for n in (100, 400):
        steps, ops = _synchronisations(torch, *_problem(2, n))
        counts[n] = sum(ops.values())
        assert counts[n] <= 20 + SYNCS_PER_STEP * steps, (n, steps, dict(ops))
    assert counts[400] < GROWTH * counts[100], counts


#: Reads back per Newton step on the GPU route, measured on the CPU: 2D (a zero layer) 56 at 100
#: Diracs, 108 at 400, 96 at 1600; 3D 50 at 100, 81 at 400.
SYNCS_PER_STEP = 120
#: From 100 to 400 Diracs the reads grew 1.9 times (2D): by the rounds of the eager loops.
GROWTH = 2.5


@pytest.mark.slow
@pytest.mark.parametrize("dim", [2, 3])
def test_jax_programs_on_the_gpu_route_hold_no_host_callback(sdot_driver, dim):
    """Under ``jax.jit`` with ``driver.host = False``: the lowered programs of ``distance``, its
    gradient and the plan's barycentres call nothing back on the host (the host's route does:
    the check can fail)."""
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    sdot_driver.framework, sdot_driver.jit_route = "jax", "compiled"
    x, values = (jax.numpy.asarray(a) for a in _problem(dim, 30))
    def distance(x, v):
        return sdot.distance(sdot.SumOfDiracs(x), sdot.Grid(v))

    if dim == 2:            # (a setting read when JAX traces: each function below is traced anew)
        assert "callback" in jax.jit(lambda x, v: distance(x, v)).lower(x, values).as_text()
    sdot_driver.host = False
    programs = {"distance": lambda x, v: distance(x, v), "gradient": jax.grad(distance, argnums=(0, 1)),
                "barycentres": lambda x, v: sdot.optimal_transport_plan(sdot.SumOfDiracs(x), sdot.Grid(v)).barycenters}
    for name, fn in programs.items():
        assert "callback" not in jax.jit(fn).lower(x, values).as_text(), name


@pytest.mark.slow
def test_eager_jax_on_the_gpu_route_pads_nearby_sizes_into_one_program(sdot_driver, caplog):
    """Eager JAX calls off the host run the compiled solve: 41 and 43 Diracs, padded to 44 by
    Diracs of zero mass (``driver.size_buckets``), compile one program between them; the plans
    (cut to their Diracs) are the host route's, and eager ``jax.grad`` (its derivative rule
    traced around concrete cells) is ``2 m (x - b)``."""
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    from sdot._routes import bucket_size

    assert [bucket_size(n) for n in (16, 17, 41, 43, 44, 45, 1000, 1024, 1025, 1100)] == [16, 18, 44, 44, 44, 48,
                                                                                         1024, 1024, 1152, 1152]
    sdot_driver.framework, sdot_driver.host = "jax", False
    caplog.set_level("WARNING")
    for n in (41, 43):
        x, values = _problem(2, n, seed=n)
        with jax.log_compiles():
            plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(jax.numpy.asarray(x)), sdot.Grid(values), tol=1e-11)
        grad = jax.grad(lambda x: sdot.distance(sdot.SumOfDiracs(x), sdot.Grid(values), tol=1e-11))(
            jax.numpy.asarray(x))
        sdot_driver.framework = "numpy"
        host = sdot.optimal_transport_plan(sdot.SumOfDiracs(x), sdot.Grid(values), tol=1e-11)
        sdot_driver.framework = "jax"
        assert plan.barycenters.shape == (n, 2) and plan.power_diagram.positions.shape == (n, 2)
        assert abs(float(plan.distance) / float(host.distance) - 1) < 1e-10
        for name in ("barycenters", "brenier_potential", "cell_masses"):
            np.testing.assert_allclose(getattr(plan, name), getattr(host, name), atol=1e-9, err_msg=name)
        np.testing.assert_allclose(grad, 2.0 / n * (x - host.barycenters), atol=1e-9)
    compiles = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Compiling jit(run)")]
    assert len(compiles) == 1, compiles


def test_torch_on_the_gpu_route_solves_diracs_on_the_sides_of_the_square(sdot_driver):
    """400 Diracs on the four sides of the unit square: the 20 nearest seeds of each lie on its
    own side, so its first cell is a strip across the square, and the repair's local test finds
    the true neighbours one cell a round (96 rounds; the solve stopped at status 3 with a
    residual of 0.04). From ``local_rounds`` on the repair tests vertices exactly: converged,
    to the host route's W2^2."""
    torch = pytest.importorskip("torch")
    t = np.random.default_rng(0).random(100)
    x = np.concatenate([np.stack([t, 0 * t], 1), np.stack([1 + 0 * t, t], 1),
                        np.stack([t, 1 + 0 * t], 1), np.stack([0 * t, t], 1)])

    def plan():
        return sdot.optimal_transport_plan(sdot.SumOfDiracs(torch.tensor(x)), sdot.Grid(torch.ones((1, 1))),
                                           tol=1e-10, raise_on_failure=False)

    host = plan()
    sdot_driver.host = False
    gpu_route = plan()
    assert int(gpu_route.status) == 0 and float(gpu_route.residual) <= 1e-10
    assert float(gpu_route.distance) == pytest.approx(float(host.distance), rel=1e-10)
