"""The driver: settings, detection, conversion rules 1-4, JAX x64 policy."""
import json
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import sdot
from sdot import _driver
from sdot._core import _compat
from sdot._driver import Driver, compute_dtype, device_of, namespace, to_array

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = jax.numpy
import array_api_compat as aac  # noqa: E402
import array_api_strict as xps  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ------------------------------------------------ fresh interpreters (rule 4)
# Each script prints a JSON dict; the four run in parallel, once per session.
SCRIPTS = {
    # SDOT_* variables are read; torch/jax stay unimported; with the NumPy framework, a measure
    # built once the user has imported jax is a pytree (no import hook, no solve needed).
    "env": ({"SDOT_FRAMEWORK": "numpy", "SDOT_DTYPE": "fp32", "SDOT_DEVICE": "cpu", "SDOT_JIT_ROUTE": "Compiled",
             "SDOT_JAX_CACHE": "0", "SDOT_HOST": "off", "SDOT_SIZE_BUCKETS": "No", "SDOT_COMPILED": "0",
             "SDOT_NUM_THREADS": "3", "SDOT_DIRECT_NAMESPACES": "0"}, """
        import sys, numpy as np, sdot
        from sdot._host import threads
        from sdot._core._compat import namespaces
        out = dict(driver=repr(sdot.driver), host=[threads.settings().threads, threads.settings().compiled,
                                                   threads.settings().reachable, namespaces.DIRECT],
                   imported=[m for m in ("torch", "jax") if m in sys.modules])
        m = sdot.SumOfDiracs(np.ones((3, 2)))
        out["dtype"] = str(m.positions.dtype)
        import jax
        out["meta_path"] = [type(f).__name__ for f in sys.meta_path if "sdot" in type(f).__module__]
        m = sdot.SumOfDiracs(np.ones((3, 2)))
        out["jit"] = jax.jit(lambda m: m.masses)(m).tolist()
    """),
    # Nothing imported: the first installed of jax, torch; converting to JAX imports it
    # and applies the x64 policy (one warning, flag on, float64 arrays).
    "default": ({}, """
        import sys, warnings, numpy as np, sdot
        out = dict(framework=sdot.driver.framework,
                   imported=[m for m in ("torch", "jax") if m in sys.modules])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            a = sdot.SumOfDiracs(np.ones((3, 2)))
            b = sdot.Grid([[1, 2]])
        import jax
        out.update(warnings=[str(w.message) for w in caught], x64=jax.config.jax_enable_x64,
                   dtypes=[str(a.positions.dtype), str(b.values.dtype)],
                   filename=caught[0].filename if caught else "")
        out["jit"] = jax.jit(lambda m: m.masses)(a).tolist()
    """),
    "torch-first": ({}, """
        import sys, torch, sdot
        out = dict(framework=sdot.driver.framework, jax="jax" in sys.modules)
    """),
    # jax imported first, x64 off: a float32 JAX input is kept (rule 1), the flag
    # turned on once.
    "jax-first": ({}, """
        import warnings, jax, jax.numpy as jnp, sdot
        x = jnp.ones((3, 2))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            m = sdot.SumOfDiracs(x)
            sdot.SumOfDiracs(x)
        out = dict(framework=sdot.driver.framework, n_warnings=len(caught),
                   x64=jax.config.jax_enable_x64, same=m.positions is x, dtype=str(x.dtype))
    """),
}


@pytest.fixture(scope="module")
def fresh():
    """Run SCRIPTS in parallel in fresh interpreters; their JSON outputs by name."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("SDOT_") and k != "JAX_ENABLE_X64"}
    base["PYTHONPATH"] = ROOT + os.pathsep + base.get("PYTHONPATH", "")
    procs = {}
    for name, (env, code) in SCRIPTS.items():
        code = textwrap.dedent(code) + "\nimport json; print(json.dumps(out))\n"
        procs[name] = subprocess.Popen([sys.executable, "-c", code], env={**base, **env},
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True, cwd=ROOT)
    results = {}
    for name, p in procs.items():
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, f"{name}:\n{stderr}"
        results[name] = json.loads(stdout.strip().splitlines()[-1])
    return results


def test_env_variables_and_no_framework_import(fresh):
    out = fresh["env"]
    assert out["driver"] == ("Driver(framework='numpy', dtype='FP32', device='cpu', jit_route='compiled', "
                             "jax_cache=None, host=False, size_buckets=False, compiled=False, threads=3)")
    assert out["host"] == [3, False, False, False]      # the host's settings, set by the driver
    assert out["imported"] == [] and out["dtype"] == "float32"
    assert out["jit"] == pytest.approx([1 / 3] * 3)  # pytree registered when built with jax imported
    assert out["meta_path"] == []                      # sdot installs no import hook


def test_default_detection_and_jax_x64_policy(fresh):
    out = fresh["default"]
    expected = _driver._detect_framework({}, {})
    assert out["framework"] == expected and out["imported"] == []
    if expected != "jax":
        pytest.skip("jax is not the first installed framework")
    assert len(out["warnings"]) == 1 and "jax_enable_x64" in out["warnings"][0]
    assert 'jax.config.update("jax_enable_x64", True)' in out["warnings"][0]
    assert out["filename"] == "<string>"  # the warning points at the user's line
    assert out["x64"] and out["dtypes"] == ["float64", "float64"]
    assert out["jit"] == [1 / 3] * 3


def test_detection_follows_imported_framework(fresh):
    assert fresh["torch-first"] == {"framework": "torch", "jax": False}
    out = fresh["jax-first"]
    assert out["framework"] == "jax" and out["n_warnings"] == 1 and out["x64"]
    assert out["same"] and out["dtype"] == "float32"


# --------------------------------------------------------------- settings
@pytest.mark.parametrize("env, modules, installed, expected", [
    ({"SDOT_FRAMEWORK": "numpy"}, {"jax", "torch"}, {"jax", "torch"}, "numpy"),
    ({}, {"jax", "torch"}, {"jax", "torch"}, "jax"),
    ({}, {"torch"}, {"jax", "torch"}, "torch"),
    ({}, set(), {"jax", "torch"}, "jax"),
    ({}, set(), {"torch"}, "torch"),
    ({}, set(), set(), "numpy"),
])
def test_detection_order(env, modules, installed, expected):
    assert _driver._detect_framework(env, modules, installed.__contains__) == expected


def test_settings_from_environment():
    d = Driver({"SDOT_FRAMEWORK": "Torch", "SDOT_DTYPE": "fp32", "SDOT_DEVICE": "cuda:1"})
    assert (d.framework, d.dtype, d.device) == ("torch", "FP32", "cuda:1")
    assert Driver({"SDOT_FRAMEWORK": "numpy"}).dtype == "FP64"
    assert Driver({"SDOT_FRAMEWORK": "numpy"}).device is None
    with pytest.raises(ValueError, match="SDOT_DTYPE.*FP32"):
        Driver({"SDOT_DTYPE": "FP16"})
    with pytest.raises(ValueError, match="SDOT_FRAMEWORK.*numpy"):
        Driver({"SDOT_FRAMEWORK": "tensorflow"})
    assert Driver({"SDOT_FRAMEWORK": "numpy"}).jit_route == "callback"
    with pytest.raises(ValueError, match="SDOT_JIT_ROUTE.*compiled"):
        Driver({"SDOT_JIT_ROUTE": "traced"})
    with pytest.raises(ValueError, match="SDOT_NUM_THREADS.*integer >= 1"):
        Driver({"SDOT_NUM_THREADS": "many"})
    with pytest.raises(ValueError, match="SDOT_NUM_THREADS.*integer >= 1"):
        Driver({"SDOT_NUM_THREADS": "0"})


@pytest.mark.parametrize("setting, value, allowed", [
    ("framework", "tensorflow", "numpy"), ("framework", None, "torch"),
    ("dtype", "FP16", "FP64"), ("dtype", "float64", "FP32"),
    ("device", "gpu", "cuda:N"), ("device", "cuda:x", "mps"), ("jit_route", "jit", "callback"),
    ("size_buckets", "sometimes", "True or False"), ("host", 1, "True or False"), ("compiled", "no", "True or False"),
    ("threads", 0, "integer >= 1"), ("threads", 2.0, "integer >= 1"), ("threads", True, "integer >= 1"),
    ("direct_namespaces", None, "True or False"),
])
def test_invalid_settings(sdot_driver, setting, value, allowed):
    before = getattr(sdot_driver, setting)
    with pytest.raises(ValueError, match=f"driver.{setting}.*{allowed}"):
        setattr(sdot_driver, setting, value)
    assert getattr(sdot_driver, setting) == before


def test_valid_settings(sdot_driver):
    for fw in ("numpy", "torch", "jax"):
        sdot_driver.framework = fw
        assert sdot_driver.framework == fw
    for dev in ("cpu", "cuda", "cuda:3", "mps", None):
        sdot_driver.device = dev
        assert sdot_driver.device == dev
    sdot_driver.dtype = "fp32"
    assert sdot_driver.dtype == "FP32"
    from sdot._host import threads

    sdot_driver.threads, sdot_driver.compiled = 1, False         # the host's settings, for the process
    assert (threads.settings().threads, threads.settings().compiled) == (1, False)
    assert (sdot_driver.threads, sdot_driver.compiled) == (1, False)


# ------------------------------------------------------------------ rule 1
@pytest.mark.parametrize("make", [lambda: torch.ones(3, dtype=torch.float32, requires_grad=True),
                                  lambda: jnp.ones(3, dtype=jnp.float32),
                                  lambda: xps.ones(3, dtype=xps.float32)],
                         ids=["torch", "jax", "array_api_strict"])
@pytest.mark.parametrize("framework", ["numpy", "torch", "jax"])
def test_native_inputs_are_kept(sdot_driver, make, framework):
    sdot_driver.framework = framework
    x = make()
    assert to_array(x, "x") is x


def test_native_integer_inputs_are_cast_in_their_framework(sdot_driver):
    sdot_driver.framework = "numpy"
    assert to_array(torch.arange(3), "x").dtype == torch.float64
    assert to_array(jnp.arange(3), "x").dtype == jnp.float64
    assert to_array(xps.asarray([True, False]), "x").dtype == xps.float64
    sdot_driver.dtype = "FP32"
    assert to_array(torch.arange(3), "x").dtype == torch.float32
    with pytest.raises(TypeError, match="x"):
        to_array(torch.ones(2, dtype=torch.complex64), "x")


def test_tracers_are_kept(sdot_driver):
    sdot_driver.framework = "torch"
    jax.jit(lambda x: assert_is(to_array(x, "x"), x) or x)(jnp.ones(2))


def assert_is(a, b):
    assert a is b


def test_numpy_weights_beside_positions_traced_twice(sdot_driver):
    """``jax.jit(jax.grad(...))`` of positions with NumPy weights: the weights, a constant of the
    jit trace, are kept beside the grad's tracer, not brought to the host (a
    TracerArrayConversionError before)."""
    sdot_driver.framework = "jax"
    x, m = np.random.default_rng(0).random((20, 2)), np.full(20, 1 / 20)

    def w(p):
        return sdot.distance(sdot.SumOfWeightedDiracs(p, m), sdot.Grid(np.ones((2, 2))))
    eager = jax.grad(w)(jnp.asarray(x))
    assert np.asarray(jax.jit(jax.grad(w))(jnp.asarray(x))) == pytest.approx(np.asarray(eager), rel=1e-12)


# ------------------------------------------------------------------ rule 2
@pytest.mark.parametrize("framework, kind", [("numpy", np.ndarray), ("torch", torch.Tensor),
                                             ("jax", jax.Array)])
@pytest.mark.parametrize("dtype", ["FP32", "FP64"])
def test_lists_and_numpy_are_converted(sdot_driver, framework, kind, dtype):
    sdot_driver.framework, sdot_driver.dtype = framework, dtype
    name = "float32" if dtype == "FP32" else "float64"
    for value in ([[1, 2], [3, 4]], np.ones((2, 2), np.float32), np.ones(2), 3.0, np.int64(2)):
        out = to_array(value, "x")
        assert isinstance(out, kind) and str(out.dtype).endswith(name)
        assert "cpu" in str(device_of(out)).lower()
    sdot_driver.device = "cpu"
    assert isinstance(to_array([1.0], "x"), kind)


def test_conversions_are_zero_copy(sdot_driver):
    host = np.ones((100, 3))
    sdot_driver.framework = "numpy"
    assert np.shares_memory(to_array(host, "x"), host)
    sdot_driver.framework = "torch"
    assert to_array(host, "x").data_ptr() == host.ctypes.data
    readonly = np.ones(3)
    readonly.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "non-writable array" warning from torch
        assert to_array(readonly, "x").tolist() == [1.0] * 3
    sdot_driver.framework = "jax"
    buf = np.zeros(1000 * 8 + 64, np.uint8)  # XLA shares 64-byte aligned buffers
    offset = -buf.ctypes.data % 64
    aligned = buf[offset:offset + 8000].view(np.float64)
    assert to_array(aligned, "x").unsafe_buffer_pointer() == aligned.ctypes.data


@pytest.mark.parametrize("bad", ["abc", [1, "a"], object(), [[1.0], [1.0, 2.0]], {"a": 1}, 1j])
def test_non_numeric_inputs(bad):
    with pytest.raises(TypeError, match="weights"):
        to_array(bad, "weights")


def test_numpy_framework_runs_on_cpu_only(sdot_driver):
    sdot_driver.framework, sdot_driver.device = "numpy", "cuda"
    with pytest.raises(ValueError, match="numpy"):
        to_array([1.0], "x")


# ------------------------------------------------- namespaces and dtypes
def test_namespace():
    # NumPy and JAX: array_api_compat's namespace with direct calls (tests/test_compat.py), None ignored
    assert namespace(np.ones(2), None) is _compat.namespace(np.ones(2))
    assert namespace(np.ones(2), None).take is not aac.array_namespace(np.ones(2)).take
    assert namespace(jnp.ones(2)) is _compat.namespace(jnp.ones(2)) and aac.is_jax_namespace(namespace(jnp.ones(2)))
    assert namespace(xps.ones(2), xps.ones(1)) is xps
    with pytest.raises(TypeError, match="torch.*JAX"):
        namespace(torch.ones(2), None, jnp.ones(2))
    with pytest.raises(TypeError, match="numpy and torch"):
        namespace(np.ones(2), torch.ones(2))
    with pytest.raises(TypeError):
        namespace(None)


def test_compute_dtype(sdot_driver):
    for xp in (aac.array_namespace(np.ones(1)), aac.array_namespace(torch.ones(1)), jnp, xps):
        sdot_driver.dtype = "FP64"
        assert compute_dtype(xp) == xp.float64
        sdot_driver.dtype = "FP32"
        assert compute_dtype(xp) == xp.float32


def test_device_of():
    assert device_of(np.ones(1)) == "cpu"
    assert device_of(torch.ones(1)) == torch.device("cpu")


def test_mps_refuses_fp64(sdot_driver):
    sdot_driver.framework, sdot_driver.device = "torch", "mps"
    with pytest.raises(ValueError, match="mps.*FP32|FP32.*mps"):
        to_array(np.ones(2), "x")
    with pytest.raises(ValueError, match="mps"):
        compute_dtype(aac.array_namespace(torch.ones(1)))
    sdot_driver.dtype = "FP32"
    assert compute_dtype(aac.array_namespace(torch.ones(1))) == torch.float32
    sdot_driver.dtype, sdot_driver.device = "FP64", None
    with pytest.raises(ValueError, match="mps"):
        compute_dtype(aac.array_namespace(torch.ones(1)), device="mps:0")


def test_convert_like():
    x = np.arange(3.0)
    assert _driver.convert_like(x, np.ones(1)) is x
    t = _driver.convert_like(jnp.asarray(x), torch.ones(1))
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.tolist() == [0, 1, 2]
    assert isinstance(_driver.convert_like(t, jnp.ones(1)), jax.Array)
    assert isinstance(_driver.convert_like(t, xps.ones(1)), xps.Array if hasattr(xps, "Array")
                      else type(xps.ones(1)))
    # one framework, another device: moved device to device (a DLPack export to NumPy would
    # be refused on a GPU), not through the host
    device1 = xps.Device("device1")
    moved = _driver.convert_like(xps.asarray([1.0, 2.0]), xps.ones(1, device=device1))
    assert moved.device == device1


# ------------------------------------------------------- devices the framework lacks
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_without_cuda_is_an_sdot_error(sdot_driver, device):
    """``driver.device = "cuda..."`` without CUDA: a ``ValueError`` naming the setting at the
    first conversion, with torch (not torch's ``AssertionError``) and with JAX."""
    import sdot

    sdot_driver.device = device
    for framework in ("torch", "jax"):
        sdot_driver.framework = framework
        with pytest.raises(ValueError, match=rf"sdot.driver.device = '{device}' is not available to "
                                             f"{'torch' if framework == 'torch' else 'JAX'}"):
            sdot.SumOfDiracs(np.random.default_rng(0).random((5, 2)))
    sdot_driver.framework = "torch"
    if not torch.backends.mps.is_available():
        sdot_driver.dtype, sdot_driver.device = "FP32", "mps"
        with pytest.raises(ValueError, match="sdot.driver.device = 'mps' is not available to torch"):
            to_array([1.0], "x")


def test_jax_x64_warning_once_per_process(sdot_driver, monkeypatch):
    """FP64 with ``jax_enable_x64`` off: sdot turns it on and warns once per process, not at
    every call (even if the flag is turned off again between calls)."""
    import sdot

    monkeypatch.setitem(_driver._jax_state, "warned", False)     # as in a fresh process
    sdot_driver.framework, sdot_driver.dtype = "jax", "FP64"
    pts, img = np.random.default_rng(1).random((20, 2)), np.ones((3, 3))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):
                jax.config.update("jax_enable_x64", False)
                d = sdot.distance(sdot.SumOfDiracs(pts), sdot.Grid(img))
                assert d.dtype == jnp.float64 and jax.config.jax_enable_x64
    finally:
        jax.config.update("jax_enable_x64", True)
    x64 = [w for w in caught if "jax_enable_x64" in str(w.message)]
    assert len(x64) == 1 and x64[0].category is UserWarning


def test_torch_solves_on_one_thread_and_restores_the_callers(monkeypatch):
    """The solve runs on one torch thread (its many small operations lose to intra-op threads
    on a shared machine) and gives the caller's thread count back."""
    torch = pytest.importorskip("torch")
    import sdot

    seen = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda k: (seen.append(k), real(k)))
    real(2)
    try:
        x = torch.tensor(np.random.default_rng(0).random((30, 2)))
        sdot.distance(sdot.SumOfDiracs(x), sdot.Grid(torch.ones((4, 4), dtype=torch.float64)))
        assert seen == [1, 2] and torch.get_num_threads() == 2
    finally:
        real(1)
