"""Shared fixtures: the ``backend`` fixture and the driver settings fixture.

``backend`` runs a test on every backend: "numpy", "array_api_strict",
"strict-static" (array_api_strict with data-dependent shapes off: the core's traced code
paths, without compiling), "strict-device1" (array_api_strict on its non-default device
``Device("device1")``, which refuses operations mixing devices: a stand-in for a GPU, small
sizes), "torch", "jax" and "jax-jit" (JAX under ``jax.jit``, solves on the compiled route:
``sdot.driver.jit_route = "compiled"``). The environment variable
``SDOT_TEST_BACKENDS`` (comma-separated) selects a subset, e.g.
``SDOT_TEST_BACKENDS=numpy,torch pytest``; it also skips the cases of a test's own list of
backends (a parameter such as ``name``) that it does not select. A test that does not apply to
some backends says so with ``@pytest.mark.skip_backends(*names, reason=...)`` or
``@pytest.mark.only_backends(*names, reason=...)`` (as array-api-extra's ``skip_xp_backend``).
"""
from __future__ import annotations

import contextlib
import os
import sys

import numpy as np
import pytest

ALL_BACKENDS = ("numpy", "array_api_strict", "strict-static", "strict-device1", "torch", "jax", "jax-jit")
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
        "numpy", "array_api_strict", "strict-static", "strict-device1", "torch", "jax" or "jax-jit".
    framework : str
        The ``sdot.driver.framework`` used while the test runs.
    xp : module
        Array-API namespace of the backend.
    static : bool
        Shapes may not depend on values ("jax-jit", "strict-static"): the core takes
        fixed budgets and reports what an eager run would retry.
    host : bool
        The core may reach NumPy and scipy (not on array_api_strict).
    device : object
        The device of the backend's inputs (and of the results): ``None`` for the default
        device, ``array_api_strict.Device("device1")`` for "strict-device1".
    native : bool
        Inputs are a framework's own arrays, kept as given (rule 1); False for NumPy inputs,
        which sdot converts to its driver's framework (rule 2).
    autograd : bool
        The framework records eager derivatives (torch: ``backward``, ``autograd.grad``).
    jitted_kernels : bool
        The core's kernels run under ``jax.jit`` even in eager calls (JAX: one trace per shape).
    """

    def __init__(self, name):
        import array_api_compat as aac

        self.name = name
        strict = name.startswith(("array_api_strict", "strict"))
        self.framework = "numpy" if strict else {"jax-jit": "jax"}.get(name, name)
        self.static = name in ("strict-static", "jax-jit")     # traced code paths (static shapes)
        self.jit = name == "jax-jit"                            # under jax.jit (compiled)
        self.strict = strict                                    # array_api_strict
        self.host = not strict
        self.native = name != "numpy"
        self.autograd = name == "torch"
        self.jitted_kernels = name.startswith("jax")
        self.device = None
        if name in ("array_api_strict", "strict-static", "strict-device1"):
            self.xp = pytest.importorskip("array_api_strict")
            if name == "strict-device1":
                self.device = self.xp.Device("device1")
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
        return self.xp.asarray(host, dtype=getattr(self.xp, host.dtype.name), device=self.device)

    def to_numpy(self, a):
        """A NumPy copy of the array ``a``."""
        if torch is not None and isinstance(a, torch.Tensor):
            return a.detach().cpu().numpy()
        if not self.host:
            if self.device is not None:     # the test's own copy: device1 -> the default device
                a = a.to_device(self.xp.Device("CPU_DEVICE"))
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
        the core's eager sizing raises too); for "strict-device1", arrays of device1 that
        cannot leave it (:func:`_bound_to`)."""
        if self.name == "strict-device1":
            return _bound_to(self.xp, self.device)
        if self.name != "strict-static":
            return contextlib.nullcontext()
        import array_api_strict

        return array_api_strict.ArrayAPIStrictFlags(data_dependent_shapes=False)

    def __repr__(self):
        return f"Backend({self.name!r})"


@contextlib.contextmanager
def _bound_to(xp, device):
    """array_api_strict arrays on ``device`` that cannot leave it silently, like a GPU's: NumPy
    already refuses them (``np.asarray`` raises), and within the context their DLPack export
    raises too, so that no host path (scipy, NumPy) can read them, but for sdot's explicit
    copies to the host (``sdot._driver._to_host``: :class:`sdot.Cell` objects, plots, error
    messages). Mixing devices raises in array_api_strict itself."""
    cls = type(xp.asarray(0.0))
    exported = cls.__dlpack__

    def refused(self, *args, **kwargs):
        caller = sys._getframe(1).f_code
        explicit = caller.co_name == "_to_host" and caller.co_filename.endswith(os.path.join("sdot", "_driver.py"))
        if self.device == device and not explicit:
            raise RuntimeError(f"an array of {device} read through DLPack (it would leave its device)")
        return exported(self, *args, **kwargs)
    cls.__dlpack__ = refused
    try:
        yield
    finally:
        cls.__dlpack__ = exported


def solve_with(options, source, target, tol, log=None, max_iter=300):
    """:func:`sdot.optimal_transport_plan` (the partial plan if not converged, no exception)
    solved with the Newton ``options`` (a :class:`sdot._core.options.NewtonOptions`) and,
    if given, the step ``log(step, residual, damping, width)``."""
    from sdot import _checks, _routes

    xp, prob = _checks.problem(*_checks.check_pair(source, target))
    return _routes.solve(xp, prob, tol, max_iter, log, False, options)[0]


def plan_with(options, source, target, tol=None, raise_on_failure=True, max_iter=300, metric=None):
    """:func:`sdot.optimal_transport_plan` solved with the Newton ``options`` (a
    :class:`sdot._core.options.NewtonOptions`): the public route, its exceptions included."""
    from sdot import _api

    return _api._plan_of_pair(source, target, tol, max_iter, False, raise_on_failure, 1, metric, options=options)


@pytest.fixture
def sdot_driver():
    """``sdot.driver``, with its settings restored after the test."""
    from sdot._driver import driver

    names = ("framework", "dtype", "device", "jit_route", "host", "size_buckets", "compiled", "threads",
             "direct_namespaces")
    saved = [getattr(driver, name) for name in names]
    yield driver
    for name, value in zip(names, saved):
        setattr(driver, name, value)


@pytest.fixture
def numpy_driver(sdot_driver):
    """``sdot.driver.framework = "numpy"`` for the test (restored after it): single-process
    references on the NumPy core, and grids that hold NumPy values."""
    sdot_driver.framework = "numpy"
    return sdot_driver


@pytest.fixture
def array_kernels():
    """The host runs the array-API kernels (the compiled ones off, ``HostSettings.compiled``):
    for the tests of their own machinery, and to compare the two routes."""
    from sdot._host.threads import host_settings

    with host_settings(compiled=False):
        yield


@pytest.fixture(scope="module")
def client():
    """The dask tests' cluster: a ``LocalCluster`` of 2 one-thread worker processes and its
    client, one per test module, closed after it."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster, distributed.Client(cluster) as c:
        yield c


def _activate(name, driver):
    b = Backend(name)
    driver.framework = b.framework
    driver.dtype = "FP64"
    # "jax-jit" tests the traced core: the compiled route (the default callback route runs the
    # NumPy core, tested on "numpy"; tests/test_jax_jit_host.py tests the callback itself)
    driver.jit_route = "compiled" if name == "jax-jit" else "callback"
    return b


@pytest.fixture(params=BACKENDS)
def backend(request, sdot_driver):
    """Every selected backend in turn; the driver framework follows the backend."""
    b = _activate(request.param, sdot_driver)
    with b.shapes():
        yield b


EAGER_BACKENDS = tuple(b for b in BACKENDS if b != "jax-jit")

#: A test of the ``backend`` fixture run on the frameworks users bring (a large case, or one
#: the array_api_strict namespaces run smaller elsewhere).
USER_FRAMEWORKS = pytest.mark.only_backends("numpy", "torch", "jax", reason="the frameworks users bring; the "
                                            "array_api_strict namespaces run smaller cases")


@pytest.fixture(params=EAGER_BACKENDS)
def eager_backend(request, sdot_driver):
    """The backends whose tests do not run under ``jax.jit`` (those whose checks cannot be
    traced); "strict-static" runs the solver's traced code paths for them."""
    b = _activate(request.param, sdot_driver)
    with b.shapes():
        yield b


#: The backends of the quick subset (``pytest -m "not slow"``): a test parametrised by
#: backend runs there on these only, its other backends are marked ``slow``.
QUICK_BACKENDS = ("numpy", "torch")

#: Modules marked ``slow``: JAX's (compiles) and dask's (a cluster per module).
SLOW_MODULES = ("test_jax", "test_dask")

#: Tests marked ``slow`` (``pytest -m "not slow"`` is the quick subset: every module on
#: NumPy and torch): besides :data:`SLOW_MODULES`, those on JAX (their names hold "jax" or
#: "jit") and those on the other backends, these run subprocesses or large cases.
SLOW_TESTS = (
    "test_spatial.py::test_local_reclips_on_a_shell_of_zero_density_voxels_change_nothing",
    "test_hard_densities.py::test_repeated_returns_on_scattered_pixels",
    "test_hard_densities.py::test_one_dirac_very_far_from_a_shape",
    "test_docs.py::test_doc_examples_run",          # each doc page in a fresh interpreter
    "test_docs.py::test_examples_run",
    "test_hard_densities.py::test_degenerate_inputs_do_not_crash_the_process",
    "test_hard_densities.py::test_generated_supports_array_api_strict",
    "test_driver.py::test_env_variables_and_no_framework_import",   # fresh interpreters
    "test_driver.py::test_default_detection_and_jax_x64_policy",
    "test_driver.py::test_detection_follows_imported_framework",
)


#: The tests (``"module.py"`` or ``"module.py::test"``) that call the core's kernels directly.
#: Eager JAX never runs them on the CPU (concrete JAX arrays are solved by the NumPy core on
#: the host, ``sdot._routes``): they run on JAX under ``jit`` ("jax-jit"), and their eager code
#: paths on numpy, torch and array_api_strict.
KERNEL_TESTS = ("test_integrals.py", "test_update.py", "test_agreement.py", "test_trials.py", "test_repair.py",
                "test_sensitivity_integrals.py", "test_spatial_integrals.py", "test_spatial_sensitivity_integrals.py",
                "test_spatial_bernstein_integrals.py", "test_linear_solve.py",
                "test_power_diagram.py::test_capacity_grows_on_overflow")

#: The invariances (scale, translation, sizes of the same solve): they hold for every backend
#: alike, and a solve on each checks the backend.
INVARIANCES = ("test_hard_densities.py::test_scaling_multiplies_w2_by_the_square",
               "test_hard_densities.py::test_translation_changes_nothing",
               "test_trials.py::test_abandoned_trials_leave_the_solve_unchanged")

#: Solves of several kinds of input that "jax-jit" runs all of, in one compiled program: the
#: traced code paths of "strict-static" and the fallbacks of the array_api_strict backends
#: take one kind.
ONE_KIND_ON_STRICT = INVARIANCES + ("test_hard_densities.py::test_degenerate_dirac_sets",)

#: The tests of the 2D diagram's updates, checks, repairs and trials: they run compiled in
#: every 2D solve under ``jit`` (test_hard_densities.py's and test_jax_jit_host.py's: 20 to 400
#: Diracs, zero backgrounds, degenerate sets), and their edge cases traced on "strict-static".
UPDATE_TESTS = ("test_update.py", "test_agreement.py", "test_trials.py", "test_repair.py")

#: Solves of batches: a loop over the items on every backend but traced JAX
#: (``sdot._batched``), run on numpy, torch, JAX and strict-device1; the single solves of the
#: array_api_strict backends run in the other tests.
BATCH_LOOPS = ("test_batches_of_targets.py::test_batches_on_both_sides_equal_the_loop",
               "test_batches_of_targets.py::test_one_side_broadcasts_against_a_batch",
               "test_batches_of_targets.py::test_batch_of_spline_grids_is_its_items_and_differentiates",
               "test_solver.py::test_batch_is_a_loop_over_items")
_BATCH_REASON = "a batch is a loop over single solves: see conftest.BATCH_LOOPS"

#: The tests not run on a backend, and why.
#: Partial transport is solved with data-dependent shapes (eagerly): refused under static
#: shapes (test_partial.py::test_what_is_not_solved_says_so).
PARTIAL = ("test_partial.py::test_one_dirac", "test_partial.py::test_the_reference_case",
           "test_partial.py::test_on_a_line", "test_partial.py::test_far_diracs", "test_partial.py::test_two_pieces")
#: Partial transport tests too slow on the array-API route (strict backends).
PARTIAL_SLOW = ("test_partial.py::test_the_reference_case", "test_partial.py::test_far_diracs",
                "test_partial.py::test_two_pieces")
_PARTIAL_REASON = ("the array-API route of partial transport runs on one Dirac here (13 s for 1000 on array_api_strict, "
                   "6 s for 12 Diracs on black)")

#: The tests not run on a backend, and why: ``(prefixes, reason)`` pairs.
SKIPPED_ON = {
    "array_api_strict": ((BATCH_LOOPS, _BATCH_REASON), (PARTIAL_SLOW, _PARTIAL_REASON)),
    "strict-static": ((BATCH_LOOPS, _BATCH_REASON),
                      (PARTIAL, "partial transport is eager only (data-dependent shapes), see conftest.PARTIAL")),
    "jax-jit": ((UPDATE_TESTS, "each case compiles for seconds: these kernels run compiled in the 2D solves under "
                               "jit, their cases traced on strict-static, see conftest.UPDATE_TESTS"),),
    "jax": ((KERNEL_TESTS, "eager JAX solves on the host's NumPy core: the kernels run on JAX under jit "
                           "(jax-jit), see conftest.KERNEL_TESTS"),),
    "strict-device1": ((KERNEL_TESTS + INVARIANCES + ("test_solver.py::test_batch_is_a_loop_over_items",),
                        "strict-device1 checks where the public functions' arrays live, at small sizes: the "
                        "kernels and these larger solves run on array_api_strict (the same fallbacks on the "
                        "default device), see conftest.SKIPPED_ON"),
                       (PARTIAL_SLOW, _PARTIAL_REASON)),
}

#: The tests that run their first case only on a backend, all of them if None (their other
#: sizes, densities or flags run on the other backends): "strict-device1" checks where arrays
#: live, which the case does not change; "jax-jit" compiles each case (seconds to a minute)
#: while "strict-static" runs every case of :data:`KERNEL_TESTS` on the same traced code
#: paths without compiling; :data:`ONE_KIND_ON_STRICT` once on the array_api_strict backends.
FIRST_CASE_ONLY = {"strict-device1": None, "jax-jit": KERNEL_TESTS, "strict-static": ONE_KIND_ON_STRICT,
                   "array_api_strict": ONE_KIND_ON_STRICT}


def _first_case_only(on, name, seen):
    """Whether the test ``name`` (its id from the module on) repeats, on a backend ``on`` of
    :data:`FIRST_CASE_ONLY`, a test already collected there with other parameters."""
    tests = FIRST_CASE_ONLY[on]
    if tests is not None and not name.startswith(tests):
        return False
    key = (name.split("[")[0], on)
    if key in seen:
        return True
    seen.add(key)
    return False


def pytest_collection_modifyitems(config, items):
    """Mark :data:`SLOW_MODULES`, :data:`SLOW_TESTS`, the JAX tests and the other backends than
    :data:`QUICK_BACKENDS` ``slow``; skip the tests of :data:`SKIPPED_ON` and the repeated cases of
    :data:`FIRST_CASE_ONLY`."""
    repeated = pytest.mark.skip(reason="one case per test on this backend, see conftest.FIRST_CASE_ONLY")
    unselected = pytest.mark.skip(reason="a backend that SDOT_TEST_BACKENDS does not select")
    seen = set()
    for item in items:
        name = item.nodeid.split("/")[-1]
        callspec = getattr(item, "callspec", None)
        on = None if callspec is None else callspec.params.get("backend", callspec.params.get("eager_backend"))
        params = () if callspec is None else callspec.params.values()
        reasons = [reason for prefixes, reason in SKIPPED_ON.get(on, ()) if name.startswith(prefixes)]
        reasons += [m.kwargs["reason"] for m in item.iter_markers("skip_backends") if on in m.args]
        reasons += [m.kwargs["reason"] for m in item.iter_markers("only_backends") if on not in m.args]
        if any(isinstance(p, str) and p in ALL_BACKENDS and p not in BACKENDS for p in params):
            item.add_marker(unselected)         # the test's own list of backends (a parameter) too
        elif reasons:
            item.add_marker(pytest.mark.skip(reason=reasons[0]))
        elif on in FIRST_CASE_ONLY and _first_case_only(on, name, seen):
            item.add_marker(repeated)
        elsewhere = any(isinstance(p, str) and p in ALL_BACKENDS and p not in QUICK_BACKENDS for p in params)
        if elsewhere or name.startswith(SLOW_TESTS + SLOW_MODULES) or "jax" in item.name or "jit" in item.name:
            item.add_marker(pytest.mark.slow)
