"""Framework, dtype and device selection, and conversion of user inputs.

``driver`` is the single instance of :class:`Driver`. Torch and JAX are never
imported by this module: they are imported lazily, only when an input has to
be converted to them (``docs/backends.md``).
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import numbers
import sys
import warnings

import array_api_compat as aac
import numpy as np

from . import _pytrees
from ._autodiff import detach
from ._core._compat import host_view, is_traced, namespace as namespace_of, namespaces
from ._host import threads as host_threads

__all__ = ["Driver", "driver", "to_array", "namespace", "compute_dtype",
           "device_of", "is_tracer", "convert_like"]

FRAMEWORKS = ("numpy", "torch", "jax", "dask")
DTYPES = ("FP32", "FP64")
_DEVICE_RE = re.compile(r"cpu|cuda(:\d+)?|mps")


def _check_framework(value):
    name = str(value).lower()
    if name not in FRAMEWORKS:
        raise ValueError(f"sdot.driver.framework must be one of {FRAMEWORKS}, got {value!r}")
    needs = {"numpy": (), "dask": ("dask", "distributed")}.get(name, (name,))
    missing = [m for m in needs if importlib.util.find_spec(m) is None]
    if missing:
        extra = " (pip install 'sdot-xp[dask]')" if name == "dask" else ""
        raise ValueError(f"sdot.driver.framework = {name!r}, but {' and '.join(missing)} "
                         f"{'is' if len(missing) == 1 else 'are'} not installed{extra}")
    return name


def _check_dtype(value):
    name = str(value).upper()
    if name not in DTYPES:
        raise ValueError(f"sdot.driver.dtype must be one of {DTYPES}, got {value!r}")
    return name


def _check_device(value):
    if value is None:
        return None
    name = str(value).lower()
    if not _DEVICE_RE.fullmatch(name):
        raise ValueError("sdot.driver.device must be None, 'cpu', 'cuda', 'cuda:N' or "
                         f"'mps', got {value!r}")
    return name


JIT_ROUTES = ("callback", "compiled")


def _check_jit_route(value):
    name = str(value).lower()
    if name not in JIT_ROUTES:
        raise ValueError(f"sdot.driver.jit_route must be one of {JIT_ROUTES}, got {value!r}")
    return name


def _check_jax_cache(value):
    """None (off), or the directory of JAX's persistent compilation cache (see
    :mod:`._jax_cache`): ``True``, "1", "on" or "true" for the default one, else a path."""
    from . import _jax_cache

    return _jax_cache.directory(value)


def _check_size_buckets(value):
    """A bool, from True/False or "1"/"0", "on"/"off", "true"/"false", "yes"/"no"."""
    if isinstance(value, bool):
        return value
    name = str(value).strip().lower()
    if name in ("1", "on", "true", "yes"):
        return True
    if name in ("0", "off", "false", "no"):
        return False
    raise ValueError(f"sdot.driver.size_buckets must be True or False (or '1', '0', 'on', 'off'), got {value!r}")


def _detect_framework(environ, modules, installed=None):
    """The framework chosen at import time (docs/backends.md, "Which framework at import", in this order)."""
    if environ.get("SDOT_FRAMEWORK"):
        return environ["SDOT_FRAMEWORK"]
    for name in ("jax", "torch"):
        if name in modules:
            return name
    if installed is None:
        installed = lambda name: importlib.util.find_spec(name) is not None  # noqa: E731
    for name in ("jax", "torch"):
        if installed(name):
            return name
    return "numpy"


def _check_bool(name, value):
    if not isinstance(value, bool):
        raise ValueError(f"sdot.driver.{name} must be True or False, got {value!r}")
    return value


def _switch(text):
    """An on/off environment variable: on unless "0", "false", "no" or "off"."""
    return text.strip().lower() not in ("0", "false", "no", "off")


def _parse_count(text):
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"an integer >= 1, got {text!r}") from None


def _check_count(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"sdot.driver.{name} must be an integer >= 1, got {value!r}")
    return int(value)


class _HostSetting:
    """A driver setting that is a field of the host's settings (:mod:`._host.threads`, the
    process's), validated by ``check`` on assignment."""

    def __init__(self, field, check, doc):
        self.field, self.check, self.__doc__ = field, check, doc

    def __get__(self, obj, owner=None):
        return self if obj is None else getattr(host_threads.settings(), self.field)

    def __set__(self, obj, value):
        host_threads.configure(**{self.field: self.check(value)})


class _Setting:
    """A driver setting, validated by ``check`` on assignment."""

    def __init__(self, check, doc):
        self.check, self.__doc__ = check, doc

    def __set_name__(self, owner, name):
        self.attr = "_" + name

    def __get__(self, obj, owner=None):
        return self if obj is None else getattr(obj, self.attr)

    def __set__(self, obj, value):
        setattr(obj, self.attr, self.check(value))


class Driver:
    """Run-time settings of sdot: ``framework``, ``dtype``, ``device``, for JAX ``jit_route``,
    ``jax_cache`` and ``size_buckets``, and the host's ``host``, ``compiled`` and ``threads``.
    Every environment variable of sdot is read here, at import.

    The single instance is ``sdot.driver``. Every setting is validated on
    assignment and raises ``ValueError`` naming the allowed values.

    Attributes
    ----------
    framework : {"numpy", "torch", "jax", "dask"}
        Framework that receives inputs without a framework of their own
        (NumPy arrays, lists, scalars). Initial value: ``$SDOT_FRAMEWORK``,
        else jax if already imported, else torch if already imported, else
        the first installed of jax and torch, else numpy. "dask": the
        positions of the Diracs go to dask arrays and the functions that take
        them (:mod:`sdot.dask`) solve on the current ``dask.distributed`` client;
        the other inputs stay NumPy arrays.
    dtype : {"FP32", "FP64"}
        Precision of the computation (``$SDOT_DTYPE``, default "FP64").
    device : {None, "cpu", "cuda", "cuda:N", "mps"}
        Device of converted inputs (``$SDOT_DEVICE``). ``None`` means where the
        inputs are, else the cpu. A device the framework does not have (CUDA without
        a GPU...) raises ``ValueError`` at the first conversion.
    jit_route : {"callback", "compiled"}
        How a solve runs under ``jax.jit`` (and ``vmap``, ``scan``) on the CPU
        (``$SDOT_JIT_ROUTE``, default "callback"): "callback", the NumPy core in one
        ``jax.pure_callback`` (the jitted program holds only the callback: it compiles in
        well under a second for every size); "compiled", the whole solve traced into the
        program (compiled by XLA once per shape). Arrays on other devices (GPU, TPU) always
        take the compiled route.
    jax_cache : None or str
        Directory of JAX's persistent compilation cache, or None (off, the default).
        ``$SDOT_JAX_CACHE`` or an assignment: "1" (or ``True``) for a private per-user,
        per-host directory, ``~/.cache/sdot/jax/<hostname>``; a path for that directory.
        Created with mode 0700; one writable by others is refused (JAX executes what it
        holds). JAX stores no program that calls back into Python, so it serves the
        compiled route without host callbacks (GPU, TPU), not the callback route.
    size_buckets : bool
        Whether an eager call on JAX arrays that runs the compiled solve (arrays on a GPU or
        TPU, or ``host`` False) pads the Diracs to the next size ``m 2^e`` (``8 <= m <= 16``,
        at most 1/8 more; Diracs of zero mass at one point of the domain, which take no cell): sizes a
        few percent apart then share one compiled program (``$SDOT_SIZE_BUCKETS``, default
        True). Under your own ``jax.jit`` the program is yours: pad there (docs/backends.md).
    host : bool
        Whether torch and JAX arrays on the CPU use the host: NumPy views, the compiled
        kernels, host callbacks under ``jax.jit`` (``$SDOT_HOST``, default True). False: they
        take the route of a GPU on the CPU, array-API code only (under ``jax.jit`` the
        compiled route, whatever ``jit_route``, its program without host callbacks), to test
        or measure that route without a GPU. NumPy arrays always use the host.
    compiled : bool
        Whether the host runs its compiled kernels (numba, the ``fast`` extra) where they
        apply (``$SDOT_COMPILED``, default True); False: the array-API kernels, on NumPy.
    threads : int
        Threads of the host's NumPy kernels (``$SDOT_NUM_THREADS``, default the cores, at most 8).
    direct_namespaces : bool
        Whether NumPy and torch arrays use sdot's direct calls where array_api_compat's
        namespaces only add argument handling (``$SDOT_DIRECT_NAMESPACES``, default True; the
        same results: False to rule them out when chasing a bug).

    ``host``, ``compiled``, ``threads`` and ``direct_namespaces`` are the process's (every
    solve's, every thread's).
    """

    def __init__(self, environ=None):
        environ = os.environ if environ is None else environ
        for attr, var, default in (("framework", "SDOT_FRAMEWORK", None),
                                   ("dtype", "SDOT_DTYPE", "FP64"),
                                   ("device", "SDOT_DEVICE", None),
                                   ("jit_route", "SDOT_JIT_ROUTE", "callback"),
                                   ("jax_cache", "SDOT_JAX_CACHE", None),
                                   ("size_buckets", "SDOT_SIZE_BUCKETS", True)):
            value = environ.get(var) or default
            if attr == "framework":
                value = _detect_framework(environ, sys.modules)
            try:
                setattr(self, attr, value)
            except ValueError as err:
                raise ValueError(f"environment variable {var}: {err}") from None
        # the host's settings are the process's: set only by a variable that is there
        for attr, var, parse in (("threads", "SDOT_NUM_THREADS", _parse_count), ("compiled", "SDOT_COMPILED", _switch),
                                 ("host", "SDOT_HOST", _switch), ("direct_namespaces", "SDOT_DIRECT_NAMESPACES", _switch)):
            if environ.get(var) is not None:
                try:
                    setattr(self, attr, parse(environ[var]))
                except ValueError as err:
                    raise ValueError(f"environment variable {var}: {err}") from None

    framework = _Setting(_check_framework, "'numpy', 'torch', 'jax' or 'dask': where inputs "
                         "without a framework of their own go.")
    dtype = _Setting(_check_dtype, "'FP32' or 'FP64': the precision of the computation.")
    device = _Setting(_check_device, "None, 'cpu', 'cuda', 'cuda:N' or 'mps' (None: where "
                      "the inputs are, else the cpu).")
    jit_route = _Setting(_check_jit_route, "'callback' or 'compiled': how a solve runs under jax.jit on "
                         "the CPU (the NumPy core in one host callback, or the whole solve compiled).")
    jax_cache = _Setting(_check_jax_cache, "None (off), or the directory of JAX's persistent compilation "
                         "cache (True or '1': ~/.cache/sdot/jax/<hostname>).")
    size_buckets = _Setting(_check_size_buckets, "True or False: eager JAX solves that compile (off the host) "
                            "pad the Diracs to a few sizes.")

    host = _HostSetting("reachable", lambda value: _check_bool("host", value),
                        "True or False: torch and JAX arrays on the CPU use the host (False: a GPU's route).")
    compiled = _HostSetting("compiled", lambda value: _check_bool("compiled", value),
                            "True or False: the compiled host kernels (numba) run where they apply.")
    threads = _HostSetting("threads", lambda value: _check_count("threads", value),
                           "An integer >= 1: threads of the host's NumPy kernels.")

    @property
    def direct_namespaces(self):
        return namespaces.DIRECT

    @direct_namespaces.setter
    def direct_namespaces(self, value):
        namespaces.DIRECT = _check_bool("direct_namespaces", value)

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if name == "_jax_cache" and "jax" in sys.modules:
            from . import _jax_cache

            _jax_cache.apply(value)

    def __repr__(self):
        return (f"Driver(framework={self.framework!r}, dtype={self.dtype!r}, "
                f"device={self.device!r}, jit_route={self.jit_route!r}, jax_cache={self.jax_cache!r}, host={self.host!r}, "
                f"size_buckets={self.size_buckets!r}, compiled={self.compiled!r}, threads={self.threads!r})")


driver = Driver()

# ----------------------------------------------------------------- JAX hooks
_jax_hooks = []          # callables run once, when sdot first meets JAX
_jax_state = {"used": False, "warned": False}


def _use_jax():
    """Run the registered JAX hooks (pytree registration, the persistent cache) once."""
    if not _jax_state["used"]:
        _jax_state["used"] = True
        for hook in _jax_hooks:
            hook()


def _apply_jax_cache():
    from . import _jax_cache

    _jax_cache.apply(driver.jax_cache)


_jax_hooks.append(_apply_jax_cache)
_jax_hooks.append(_pytrees.register)


def _ensure_x64():
    """JAX x64 policy: turn ``jax_enable_x64`` on, saying so once."""
    import jax

    if not jax.config.jax_enable_x64:
        jax.config.update("jax_enable_x64", True)
        if not _jax_state["warned"]:
            _jax_state["warned"] = True
            warnings.warn(
                "sdot.driver.dtype is 'FP64' but JAX had jax_enable_x64 off (JAX would "
                "silently compute in float32): sdot turned it on. Put\n"
                '    import jax; jax.config.update("jax_enable_x64", True)\n'
                "at the top of your program to silence this warning, or set "
                "sdot.driver.dtype = 'FP32'.", UserWarning, stacklevel=_user_stacklevel())


def _user_stacklevel():
    """``stacklevel`` of the first caller outside sdot (for warnings)."""
    frame, level = sys._getframe(1), 1
    package = os.path.dirname(__file__)
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def is_tracer(x) -> bool:
    """True if ``x`` is a JAX tracer (inside ``jit``/``vmap``/``grad``)."""
    return is_traced(x)


def _check_mps(device):
    if driver.dtype == "FP64" and device is not None and str(device).startswith("mps"):
        raise ValueError("sdot.driver.dtype is 'FP64' but the device is 'mps', which has "
                         "no float64: set sdot.driver.dtype = 'FP32' or use another device")


# --------------------------------------------------------------- public API
def device_of(x):
    """Device of the array ``x`` (``array_api_compat.device``)."""
    return aac.device(x)


def namespace(*arrays):
    """Array-API namespace common to ``arrays`` (``None`` entries ignored).

    Raises
    ------
    TypeError
        If torch and JAX arrays are mixed, or the arrays have no common namespace.
    """
    arrays = [a for a in arrays if a is not None]
    if not arrays:
        raise TypeError("sdot: no array given to infer the framework from")
    if any(map(aac.is_torch_array, arrays)) and any(map(aac.is_jax_array, arrays)):
        raise TypeError("sdot cannot mix torch tensors and JAX arrays in one call: "
                        "convert the inputs to one framework (torch or JAX)")
    try:
        return namespace_of(*arrays)
    except TypeError as err:
        kinds = sorted({type(a).__module__.split(".")[0] for a in arrays})
        raise TypeError(f"sdot cannot mix arrays of {' and '.join(kinds)} in one call") from err


def compute_dtype(xp, device=None):
    """Floating dtype of ``xp`` matching ``driver.dtype``.

    Applies the JAX x64 policy (FP64 with ``jax_enable_x64`` off turns it on
    with one ``UserWarning``) and refuses FP64 on ``mps`` (``driver.device`` or
    ``device``) with a ``ValueError``.
    """
    _check_mps(driver.device)
    _check_mps(device)
    if aac.is_jax_namespace(xp):
        _use_jax()
        if driver.dtype == "FP64":
            _ensure_x64()
    return xp.float64 if driver.dtype == "FP64" else xp.float32


def _is_real_float(xp, dtype):
    return xp.isdtype(dtype, "real floating")


def to_array(x, name):
    """Convert the user input ``x`` (argument ``name``) to an array.

    Torch tensors, JAX arrays (tracers included) and other array-API arrays
    keep their framework, device and floating dtype (integer and bool arrays
    are cast to ``driver.dtype`` in their own framework). NumPy arrays, lists
    and scalars go to ``driver.framework``, ``driver.dtype`` and the driver's
    device, without a copy where possible.

    Raises
    ------
    TypeError
        If ``x`` is not numeric (strings, objects, complex numbers, ragged lists).
    """
    if aac.is_torch_array(x):
        _check_torch_layout(x, name)
    if aac.is_array_api_obj(x) and not aac.is_numpy_array(x):
        xp = aac.array_namespace(x)
        if aac.is_jax_array(x):
            _use_jax()
            if driver.dtype == "FP64":
                _ensure_x64()
        else:
            _check_mps(device_of(x))
        if _is_real_float(xp, x.dtype):
            return x
        if xp.isdtype(x.dtype, ("bool", "integral")):
            return xp.astype(x, compute_dtype(xp))
        raise TypeError(f"{name}: expected real numbers, got an array of dtype {x.dtype}")
    if isinstance(x, np.ma.MaskedArray) and np.ma.is_masked(x):
        raise TypeError(f"{name}: a masked array with masked entries; sdot would ignore the mask: "
                        "pass the entries to use (x.compressed(), or x[~x.mask] row by row) or x.filled(value)")
    try:
        host = np.asarray(x)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name}: expected an array of numbers, got {type(x).__name__} "
                        f"({err})") from err
    if host.dtype.kind not in "biuf":
        raise TypeError(f"{name}: expected an array of real numbers, got "
                        f"{type(x).__name__} of dtype {host.dtype}")
    return _from_numpy(host, driver.framework, driver.device)


def _check_torch_layout(x, name):
    """Refuse torch tensors without values to compute with: sparse layouts and the ``meta``
    device."""
    import torch

    if x.layout != torch.strided:
        raise TypeError(f"{name}: a torch tensor of layout {x.layout}; sdot computes on dense tensors: "
                        f"pass {name}.to_dense()")
    if x.device.type == "meta":
        raise ValueError(f"{name}: a torch tensor on the 'meta' device holds no values to compute with; "
                         "create it on a real device (cpu, cuda...)")


def _from_numpy(host, framework, device):
    """NumPy array -> ``framework`` in ``driver.dtype`` on ``device`` (zero-copy if possible)."""
    _check_mps(device)
    np_dtype = np.float64 if driver.dtype == "FP64" else np.float32
    host = np.asarray(host, dtype=np_dtype)
    if framework in ("numpy", "dask"):     # dask: the public functions distribute the positions
        if device not in (None, "cpu") and str(device) != "cpu":
            raise ValueError(f"sdot.driver.device = {device!r} is not available with the "
                             f"{framework!r} framework (its arrays are on the cpu)")
        return host
    if framework == "torch":
        import torch

        if not host.flags.writeable or any(s < 0 for s in host.strides):
            host = host.copy()  # torch.from_numpy needs writeable, positive strides
        return torch.from_numpy(host).to(_torch_device(device))
    import jax

    compute_dtype(jax.numpy)
    return jax.device_put(host, _jax_device(device))


def _unavailable(device, framework, detail):
    return ValueError(f"sdot.driver.device = {device!r} is not available to {framework} ({detail}): set "
                      "sdot.driver.device to None (where the inputs are) or 'cpu'")


def _torch_device(device):
    """A ``torch.device`` for a driver device string (None: the cpu), checked to exist.

    Raises
    ------
    ValueError
        Naming the setting, if torch has no such device (a CUDA device on a machine or a
        torch build without CUDA, an index beyond ``torch.cuda.device_count()``, mps
        without ``torch.backends.mps.is_available()``).
    """
    import torch

    dev = torch.device(device or "cpu")
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (dev.index or 0) >= count:
            raise _unavailable(device, "torch", f"torch.cuda.is_available() is {count > 0}, "
                                                f"torch.cuda.device_count() is {count}")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise _unavailable(device, "torch", "torch.backends.mps.is_available() is False")
    return dev


def _jax_device(device):
    """A ``jax.Device`` for a driver device string (None: the default, if cpu)."""
    import jax

    if device is None:
        return None if jax.default_backend() == "cpu" else jax.devices("cpu")[0]
    if not isinstance(device, str):
        return device
    kind, _, index = device.partition(":")
    platform = {"cuda": "gpu", "mps": "METAL"}.get(kind, kind)
    try:
        return jax.devices(platform)[int(index or 0)]
    except (RuntimeError, IndexError) as err:
        raise _unavailable(device, "JAX", f"jax.devices({platform!r}): {err}") from err


def convert_like(x, like):
    """Move the converted array ``x`` to the framework and device of ``like``.

    Used to bring arrays that sdot converted from NumPy/lists (rule 2) next to
    arrays that came with a framework of their own (rule 1). Goes through the
    host; keeps the floating dtype of ``x``.
    """
    if type(x) is type(like):
        if device_of(x) == device_of(like):
            return x
        if not is_tracer(like):             # one framework: device to device, not via the host
            return aac.to_device(x, device_of(like))
    if aac.is_jax_array(x) and aac.is_jax_array(like) and (is_tracer(x) or is_tracer(like)):
        return x                            # traced (a constant under jax.jit, or another level): JAX lifts it
    host = _to_host(x)
    if aac.is_numpy_array(like):
        return host
    if aac.is_torch_array(like):
        import torch

        return torch.from_numpy(np.array(host)).to(like.device)
    if aac.is_jax_array(like):
        import jax

        device = None if is_tracer(like) else next(iter(like.devices()))
        return jax.device_put(host, device)
    xp = aac.array_namespace(like)
    return xp.asarray(host, device=device_of(like))


def host_views(*arrays):
    """NumPy views (no copy) of the concrete CPU ``arrays`` (cut from any autodiff graph), or
    None if one has none (traced, on a GPU, array_api_strict)."""
    views = [host_view(detach(a)) for a in arrays]
    return None if any(v is None for v in views) else views


def checkable(*arrays):
    """``(namespace, arrays)`` to check the values of ``arrays`` with: NumPy and views where
    all have one (JAX would compile every check for every shape), else their namespace."""
    views = host_views(*arrays)
    return (np, views) if views is not None else (namespace(*arrays), [detach(a) for a in arrays])


@contextlib.contextmanager
def quiet_int64():
    """A context in which JAX's warnings that int64 is truncated to int32 (its default, without
    ``jax_enable_x64``) are not shown: the core asks for int64 indices, and int32 serves them
    (fewer than 2^31 entries). Nothing changes elsewhere, or when x64 is on."""
    jax = sys.modules.get("jax")
    if jax is None or jax.config.jax_enable_x64:
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Explicitly requested dtype int64 requested in",
                                category=UserWarning)
        yield


@contextlib.contextmanager
def one_thread(xp):
    """A context in which torch (if ``xp`` is torch's) runs its operations on one thread: the
    solver's are many and small, where torch's intra-op threads cost more than they give (1e3
    Diracs with two busy processes beside, 2 cores: 0.60 s with torch's default 2 threads,
    0.27 s with one; idle at 1e5: 6.85 s and 6.59 s). The caller's setting is restored after."""
    if not aac.is_torch_namespace(xp):
        yield
        return
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def same_framework(a, b) -> bool:
    """True if ``a`` and ``b`` are both torch tensors or both JAX arrays (tracers included)."""
    return (aac.is_torch_array(a) and aac.is_torch_array(b)) or (aac.is_jax_array(a) and aac.is_jax_array(b))


def _to_host(x):
    """A NumPy array with the values of the concrete array ``x``: an explicit copy to the host
    (for :class:`Cell` objects, plots, error messages, foreign inputs), never on a solve's path."""
    if aac.is_torch_array(x):
        return x.detach().cpu().numpy()
    if aac.is_numpy_array(x) or aac.is_jax_array(x):
        return np.asarray(x)
    try:                                    # a copy from any device (DLPack 2023.12)
        return np.from_dlpack(x, device="cpu")
    except (TypeError, BufferError, NotImplementedError):
        return np.from_dlpack(x)


#: Default stopping tolerance on the max absolute cell-mass error (masses normalised to 1).
TOLERANCE = {"FP64": 1e-10, "FP32": 1e-5}


def default_tolerance(dtype=None):
    """Default tolerance for ``dtype`` ("FP64" or "FP32"; default: the driver's)."""
    return TOLERANCE[dtype or driver.dtype]
