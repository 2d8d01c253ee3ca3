"""Shared fixtures: the ``backend`` fixture and the driver settings fixture.

``backend`` runs a test on every backend: "numpy", "array_api_strict",
"strict-static" (array_api_strict with data-dependent shapes off: the core's traced code
paths, without compiling), "torch", "jax" and "jax-jit" (JAX under ``jax.jit``). The environment variable
``SDOT_TEST_BACKENDS`` (comma-separated) selects a subset, e.g.
``SDOT_TEST_BACKENDS=numpy,torch pytest``.
"""
from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest

ALL_BACKENDS = ("numpy", "array_api_strict", "strict-static", "torch", "jax", "jax-jit")
BACKENDS = tuple(b.strip() for b in os.environ.get("SDOT_TEST_BACKENDS", ",".join(ALL_BACKENDS))
                 .split(",") if b.strip())
_unknown = set(BACKENDS) - set(ALL_BACKENDS)
if _unknown:
    raise pytest.UsageError(f"SDOT_TEST_BACKENDS: unknown backends {sorted(_unknown)}, "
                            f"choose among {ALL_BACKENDS}")

# XLA compiles the whole solver once per input shape (about 6 s at the default optimisation
# level, 4 s at level 0); the tests use many shapes and time nothing, so they compile cheaply.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")

try:
    import torch

    torch.set_num_threads(1)  # 10x faster than the default on 2 busy cores
except ImportError:  # pragma: no cover
    torch = None
try:
    import jax

    jax.config.update("jax_enable_x64", True)
except ImportError:  # pragma: no cover
    jax = None


#: Each program XLA compiles for the CPU holds about 2,000 memory mappings (the whole solve:
#: measured 1,800 to 2,100) until its cache entry is dropped, and Linux refuses new mappings
#: beyond ``vm.max_map_count`` (65,530 by default): after about 30 compiled solves in one
#: process, XLA's next compile died (SIGSEGV or SIGABRT). The tests drop JAX's caches when
#: the mappings pass this share of the limit (room for 16 more compiles).
MAPPINGS_SHARE = 0.5


def _mappings():
    try:
        with open("/proc/self/maps") as maps:
            return sum(1 for _ in maps)
    except OSError:  # pragma: no cover (not Linux)
        return 0


def _max_mappings():
    try:
        with open("/proc/sys/vm/max_map_count") as limit:
            return int(limit.read())
    except (OSError, ValueError):  # pragma: no cover
        return 65530


_MAX_MAPPINGS = _max_mappings()


@pytest.fixture(autouse=True)
def _bounded_jax_caches():
    """Drop JAX's compiled programs once the process nears the kernel's mapping limit."""
    yield
    if jax is not None and _mappings() > MAPPINGS_SHARE * _MAX_MAPPINGS:
        jax.clear_caches()


class Backend:
    """One framework for the tests: build inputs, read results, run functions.

    Attributes
    ----------
    name : str
        "numpy", "array_api_strict", "strict-static", "torch", "jax" or "jax-jit".
    framework : str
        The ``sdot.driver.framework`` used while the test runs.
    xp : module
        Array-API namespace of the backend.
    static : bool
        Shapes may not depend on values ("jax-jit", "strict-static"): the core takes
        fixed budgets and reports what an eager run would retry.
    host : bool
        The core may reach NumPy and scipy (not on array_api_strict).
    """

    def __init__(self, name):
        import array_api_compat as aac

        self.name = name
        self.framework = {"array_api_strict": "numpy", "strict-static": "numpy", "jax-jit": "jax"}.get(name, name)
        self.static = name in ("strict-static", "jax-jit")
        self.host = not name.endswith("strict") and name != "strict-static"
        if name in ("array_api_strict", "strict-static"):
            self.xp = pytest.importorskip("array_api_strict")
        elif name == "torch":
            self.xp = aac.array_namespace(pytest.importorskip("torch").zeros(1))
        elif name.startswith("jax"):
            self.xp = pytest.importorskip("jax").numpy
        else:
            self.xp = aac.array_namespace(np.zeros(1))

    def asarray(self, a, dtype=None):
        """An input array of this backend (float64 unless ``dtype`` says otherwise)."""
        host = np.asarray(a, dtype=np.float64 if dtype is None else dtype)
        if self.name == "numpy":        # read-only: the solver never writes into its inputs
            host = host.copy()
            host.flags.writeable = False
            return host
        if self.name == "torch":
            return torch.from_numpy(host.copy())
        return self.xp.asarray(host, dtype=getattr(self.xp, host.dtype.name))

    def to_numpy(self, a):
        """A NumPy copy of the array ``a``."""
        if torch is not None and isinstance(a, torch.Tensor):
            return a.detach().cpu().numpy()
        if not self.host:
            return np.from_dlpack(a)
        return np.asarray(a)

    def run(self, fn, *args):
        """``fn(*args)``, under ``jax.jit`` for the "jax-jit" backend."""
        if self.name == "jax-jit":
            return jax.jit(fn)(*args)
        return fn(*args)

    def shapes(self):
        """The context of a test on this backend: array_api_strict without data-dependent
        shapes for "strict-static" (its ``nonzero``, ``unique`` and boolean masks raise, and
        the core's eager sizing raises too)."""
        if self.name != "strict-static":
            return contextlib.nullcontext()
        import array_api_strict

        return array_api_strict.ArrayAPIStrictFlags(data_dependent_shapes=False)

    def __repr__(self):
        return f"Backend({self.name!r})"


def solve_with(options, source, target, tol, log=None, max_iter=300):
    """:func:`sdot.optimal_transport_plan` (the partial plan if not converged, no exception)
    solved with the Newton ``options`` (a :class:`sdot._core.options.NewtonOptions`) and,
    if given, the step ``log(step, residual, damping, width)``."""
    from sdot import _api

    xp, prob = _api._problem(*_api._check_pair(source, target))
    return _api._solve(xp, prob, tol, max_iter, log, False, options)[0]


@pytest.fixture
def sdot_driver():
    """``sdot.driver``, with its settings restored after the test."""
    from sdot._driver import driver

    saved = driver.framework, driver.dtype, driver.device
    yield driver
    driver.framework, driver.dtype, driver.device = saved


def _activate(name, driver):
    b = Backend(name)
    driver.framework = b.framework
    driver.dtype = "FP64"
    return b


@pytest.fixture(params=BACKENDS)
def backend(request, sdot_driver):
    """Every selected backend in turn; the driver framework follows the backend."""
    b = _activate(request.param, sdot_driver)
    with b.shapes():
        yield b


EAGER_BACKENDS = tuple(b for b in BACKENDS if b != "jax-jit")


@pytest.fixture(params=EAGER_BACKENDS)
def eager_backend(request, sdot_driver):
    """The backends whose tests do not run under ``jax.jit`` (those whose checks cannot be
    traced); "strict-static" runs the solver's traced code paths for them."""
    b = _activate(request.param, sdot_driver)
    with b.shapes():
        yield b


#: Tests marked ``slow`` (``pytest -m "not slow"`` is the quick subset: every module on
#: NumPy, array_api_strict and torch): besides those on JAX (their names hold "jax" or "jit"),
#: these run subprocesses or large cases.
SLOW_TESTS = (
    "test_docs.py::test_doc_examples_run",          # each doc page in a fresh interpreter
    "test_docs.py::test_examples_run",
    "test_hard_densities.py::test_degenerate_inputs_do_not_crash_the_process",
    "test_hard_densities.py::test_generated_supports_array_api_strict",
    "test_driver.py::test_env_variables_and_no_framework_import",   # fresh interpreters
    "test_driver.py::test_default_detection_and_jax_x64_policy",
    "test_driver.py::test_detection_follows_imported_framework",
)


def pytest_collection_modifyitems(config, items):
    """Mark the JAX tests and :data:`SLOW_TESTS` ``slow``."""
    for item in items:
        name = item.nodeid.split("/")[-1]
        if "jax" in item.name or "jit" in item.name or name.startswith(SLOW_TESTS):
            item.add_marker(pytest.mark.slow)
