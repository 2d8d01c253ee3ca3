"""Jitted JAX solves on the CPU as one host callback of the NumPy core (``driver.jit_route =
"callback"``, the default).

Under ``jax.jit`` (``vmap``, ``scan``...) the arrays are tracers: their values exist only
when the compiled program runs. On the CPU the program can still call the host, so the whole
solve is one ``jax.pure_callback`` of the NumPy core, as eagerly (``_routes.solve_on_host``):
the user's program holds a callback instead of the traced solve, compiles in well under a
second at every size, and runs at the NumPy core's speed.

The derivative rules cannot close over the host state of the solve (at trace time it does
not exist). The forward callback keeps it (the :class:`._core.sensitivity.Linearization` and
the :class:`._differentiable.Kept` factors) in :data:`STORE`, a bounded LRU, under an integer
token that it returns with the plan; the derivative callbacks take the token (a data
dependency: they run after the forward one) with the inputs and the solve's weights ``psi``.
On a miss (evicted, another process) they rebuild the state from those: one power-diagram
evaluation at ``psi`` (:func:`._core.plan.evaluation_at`), no Newton step. The answers never
depend on the store, only their cost.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import threading
from typing import NamedTuple

import array_api_compat as aac
import numpy as np

from . import _autodiff, _differentiable, _driver
from ._core import _compat, evaluation, periodic, plan, sensitivity
from ._host.threads import HOST_THREAD, settings as host_settings


def takes(xp, cut) -> bool:
    """Whether the solve of the detached problem ``cut`` (not taken by the eager host path)
    runs as a host callback: JAX arrays on the CPU and ``driver.jit_route == "callback"``."""
    if not aac.is_jax_namespace(xp) or _driver.driver.jit_route != "callback" or not host_settings().reachable:
        return False
    import jax

    if jax.default_backend() != "cpu":
        return False
    leaves = (cut.seeds, cut.masses) + tuple(cut.density)
    return all(_compat.is_traced(a) or all(d.platform == "cpu" for d in a.devices()) for a in leaves)


class Entry(NamedTuple):
    """The host state of one solve: its linearization and the factors its products share."""

    lin: object
    kept: object


class HostStore:
    """The host states of the last solves (an LRU keyed by integer tokens, thread-safe): at
    most ``entries`` of them and, beyond the most recent one, at most ``nbytes`` of arrays
    (cells, integrals, facets, LU factors: a state of 1e4 Diracs on a 64x64 image is about
    17 MB once differentiated, of 1e5 about 210 MB)."""

    def __init__(self, entries=32, nbytes=256 << 20):
        self.entries, self.nbytes = entries, nbytes
        self._items = collections.OrderedDict()
        self._lock = threading.Lock()
        self._last = 0
        self.hits = self.misses = 0

    def put(self, entry, token=None) -> int:
        """Keep ``entry`` (under ``token``, or a new one); its token."""
        with self._lock:
            if token is None:
                self._last = self._last % (2 ** 31 - 1) + 1
                token = self._last
            self._items[token] = entry
            self._items.move_to_end(token)
            self._trim()
        return token

    def get(self, token):
        """The entry of ``token`` (now the most recent), or None."""
        with self._lock:
            entry = self._items.get(token)
            if entry is None:
                self.misses += 1
                return None
            self.hits += 1
            self._items.move_to_end(token)
            self._trim()                    # its facets and factors may have grown since
            return entry

    def clear(self):
        with self._lock:
            self._items.clear()

    @contextlib.contextmanager
    def bounded(self, entries):
        """Within the ``with`` block, an empty store of at most ``entries`` states, its counts
        of hits and misses from 0 (tests and measurements); emptied and as it was after."""
        saved = self.entries, self.hits, self.misses
        self.clear()
        self.entries, self.hits, self.misses = entries, 0, 0
        try:
            yield self
        finally:
            self.clear()
            self.entries, self.hits, self.misses = saved

    def __len__(self):
        return len(self._items)

    def _trim(self):
        while len(self._items) > max(self.entries, 0):
            self._items.popitem(last=False)
        size = sum(map(_nbytes, self._items.values()))
        while len(self._items) > 1 and size > self.nbytes:
            size -= _nbytes(self._items.popitem(last=False)[1])


#: The host states of the solves run by callbacks in this process.
STORE = HostStore()


def _nbytes(obj) -> int:
    """The bytes of the NumPy arrays in ``obj`` (nested tuples, an :class:`Entry`), and of the
    LU factors its linear solver keeps (``nnz`` values and row indices)."""
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, tuple):
        return sum(map(_nbytes, obj))
    if isinstance(obj, _differentiable.Kept):
        lu = getattr(getattr(obj.solver, "cache", None), "lu", None)
        return _nbytes(obj.facets) + (0 if lu is None else int(lu.nnz) * 12)
    return 0


class Spec(NamedTuple):
    """What the callbacks of one traced solve need to know statically: the number ``n`` of
    Diracs, the dimension ``d``, the ``values`` shape and kind of the density, the dtype, the
    periods of a periodic domain (:mod:`._core.periodic`) or None."""

    n: int
    d: int
    values: tuple
    kind: type
    dtype: object
    period: tuple = None

    def problem(self, seeds, masses, density):
        """The host problem of these NumPy arrays."""
        period = None if self.period is None else np.asarray(self.period, dtype=self.dtype)
        return evaluation.Problem(np.array(seeds), np.array(masses), self.kind(*map(np.array, density)), period)

    def shape(self, name):
        return {"barycenters": (self.n, self.d), "brenier_potential": (self.n,), "cell_masses": (self.n,),
                "distance": (), "potential": self.values}[name]

    def input_shapes(self):
        return [(self.n, self.d), (self.n,), self.values, (self.d,), (self.d,)]


def solve(prob, cut, tol, max_iter, log, nan_on_failure, options):
    """The traced solve of ``prob`` (``cut``: detached) as one host callback: the fields of
    :class:`sdot.OtPlan` (a dict) and the stop state (None, None: nothing is raised under
    a trace)."""
    import jax
    import jax.numpy as jnp

    n, d = cut.seeds.shape
    dtype = np.dtype(cut.seeds.dtype)
    index = np.dtype(np.int64 if jax.config.jax_enable_x64 else np.int32)
    period = None if cut.period is None else tuple(np.asarray(cut.period).tolist())
    spec = Spec(n, d, tuple(cut.density.values.shape), type(cut.density), dtype, period)
    leaves = (cut.seeds, cut.masses) + tuple(cut.density)
    shapes = [((), dtype), ((n, d), dtype), ((n,), dtype), ((n,), dtype), ((), np.bool_), ((), index),
              ((), dtype), ((), index), ((n,), dtype), ((n,), dtype), ((), np.int32)]
    out = _callback(functools.partial(_forward, spec, log, options), shapes, *leaves,
                    jnp.asarray(tol, dtype=dtype), jnp.asarray(max_iter))
    distance, barycenters, cell_masses, potential, converged, iterations, residual, status, weights, psi, token = out
    state = (token,) + leaves + (psi,)
    inputs = (prob.seeds, prob.masses, prob.density.values, prob.lo, prob.hi)
    outputs = _autodiff.attach_linear((barycenters, potential, cell_masses), inputs, state,
                                      CallbackRule(_differentiable.PLAN_OUTPUTS, spec))
    distance = _autodiff.attach(distance, inputs, (state, barycenters, potential),
                                functools.partial(_distance_gradients, spec))
    if nan_on_failure:
        distance = jnp.where(converged, distance, jnp.nan)
    from ._diagram import PowerDiagram

    fields = dict(zip(_differentiable.PLAN_OUTPUTS, outputs))
    fields.update(distance=distance, converged=converged, iterations=iterations, residual=residual, status=status,
                  power_diagram=PowerDiagram._at_weights(cut.seeds, weights, cut.density, spec.period))
    return fields, (None, None)


def _callback(fn, shapes, *args, on_host_thread=True):
    """``fn(*args)`` on the host (NumPy in, NumPy out) by ``jax.pure_callback``, its results
    of ``shapes`` (pairs of shape and dtype), one item after the other under ``vmap``;
    ``on_host_thread``: on :data:`HOST_THREAD` (what builds cells: Qhull, cKDTree), else on
    JAX's callback thread (the derivative products: linear algebra on a stored state; run on
    the host thread, their allocations made the resident memory grow by ~0.7 MiB per eager
    ``jax.grad`` of the barycentres at N = 300).

    The callback is the same Python object for the same ``fn`` and ``shapes``
    (:func:`_host_function`): JAX keys its caches of compiled callbacks (eager calls compile
    one program per primitive) by it, so a new solve of the same sizes compiles nothing and
    the caches do not grow."""
    import jax

    specs = tuple(jax.ShapeDtypeStruct(s, t) for s, t in shapes)
    return jax.pure_callback(_host_function(fn, tuple(shapes), on_host_thread), specs, *args,
                             vmap_method="sequential")


@functools.lru_cache(maxsize=1024)
def _host_function(fn, shapes, on_host_thread):
    """The host side of :func:`_callback` (``fn``: a hashable partial of static arguments)."""
    def on_host(*host_args):
        args = tuple(map(np.asarray, host_args))
        results = HOST_THREAD.submit(fn, *args).result() if on_host_thread else fn(*args)
        return tuple(np.asarray(r, dtype=t).reshape(s) for r, (s, t) in zip(results, shapes))
    return on_host


class _Static(functools.partial):
    """A ``functools.partial`` of static (hashable) arguments that compares by value, so that
    equal rules of two solves give one callback (:func:`_host_function`)."""

    def __eq__(self, other):
        return (type(other) is type(self) and self.func is other.func and self.args == other.args
                and self.keywords == other.keywords)

    def __hash__(self):
        return hash((self.func, self.args, tuple(sorted(self.keywords.items()))))


def _forward(spec, log, options, seeds, masses, *rest):
    """The host solve: the plan's arrays, the solve's weights and the token of its state."""
    *density, tol, max_iter = rest
    prob = spec.problem(seeds, masses, density)
    res = plan.solve_plan(_compat.namespace(prob.seeds), prob, float(tol), int(max_iter), log=log, options=options)
    lin = _differentiable.linearization(prob, res)
    token = STORE.put(Entry(lin, _differentiable.Kept()))
    return (res["distance"], res["barycenters"], res["cell_masses"], res["brenier_potential"], res["converged"],
            res["iterations"], res["residual"], res["status"], _diagram_weights(prob, res), lin.psi, token)


def _diagram_weights(prob, res):
    """The weights of the plan's power diagram: the solve's, and for the Diracs without a cell of
    their own (zero masses, duplicates after the first) ``min(psi) - D^2`` (``D`` the diameter
    of the Diracs and the box), which leaves their cells empty, as in the plan."""
    psi, active = res["solution"].psi, res["active"]
    if not active.any():
        return psi
    span = np.concatenate([prob.seeds, prob.lo[None, :], prob.hi[None, :]])
    diameter2 = np.sum((span.max(axis=0) - span.min(axis=0)) ** 2)
    return np.where(active, psi, psi[active].min() - diameter2)


def _entry(spec, token, seeds, masses, *rest):
    """The host state of the solve of ``token``, from :data:`STORE` or rebuilt from its inputs
    and weights ``psi`` (the last of ``rest``) and kept again."""
    entry = STORE.get(int(token))
    if entry is not None:
        return entry
    return HOST_THREAD.submit(_rebuilt, spec, token, seeds, masses, *rest).result()


def _rebuilt(spec, token, seeds, masses, *rest):
    """:func:`_entry` on a miss: the state rebuilt (cells: on :data:`HOST_THREAD`) and kept."""
    *density, psi = rest
    prob = spec.problem(seeds, masses, density)
    xp = _compat.namespace(prob.seeds)
    on_torus = prob.seeds if prob.period is None else periodic.fold_onto(xp, prob.seeds, prob.lo, prob.period)
    rep, active, targets = evaluation.group_duplicates(xp, on_torus, prob.masses)
    ev, sites = plan.evaluation_at(xp, prob, np.array(psi), active, with_sites=True)
    dens = prob.density
    lin = sensitivity.Linearization(prob.seeds, prob.masses, dens.values, dens.lo, dens.hi, ev.cells, ev.moments,
                                    ev.facet, np.array(psi), rep, active, targets, *sites)
    entry = Entry(lin, _differentiable.Kept())
    STORE.put(entry, int(token))
    return entry


class CallbackRule:
    """The rule of :func:`._autodiff.attach_linear` for the ``outputs`` of a solve run by
    :func:`solve`: its products by callbacks on the host state; ``state`` (traced) is the
    token, the detached inputs and the weights (:func:`_entry`)."""

    def __init__(self, outputs, spec):
        self.outputs, self.spec = tuple(outputs), spec

    #: Equal rules share JAX's compiled tangent maps (:mod:`._autodiff._jax`).
    shared_by_value = True

    def __eq__(self, other):
        return type(other) is type(self) and (self.outputs, self.spec) == (other.outputs, other.spec)

    def __hash__(self):
        return hash((self.outputs, self.spec))

    def jvp(self, state, tangents):
        needs = tuple(t is not None for t in tangents)
        live = [t for t in tangents if t is not None]
        shapes = [(self.spec.shape(k), self.spec.dtype) for k in self.outputs]
        return _callback(_Static(_jvp_on_host, self.spec, self.outputs, len(state), needs), shapes,
                         *state, *live, on_host_thread=False)

    def vjp(self, state, cotangents, needs):
        shapes = [(s, self.spec.dtype) for s, need in zip(self.spec.input_shapes(), needs) if need]
        if not shapes:
            return (None,) * len(needs)
        out = iter(_callback(_Static(_vjp_on_host, self.spec, self.outputs, len(state), tuple(needs)),
                             shapes, *state, *cotangents, on_host_thread=False))
        return tuple(next(out) if need else None for need in needs)


def _jvp_on_host(spec, outputs, size, needs, *args):
    entry = _entry(spec, *args[:size])
    live = iter(args[size:])
    tangents = tuple(next(live) if need else None for need in needs)
    return _differentiable.PlanRule(outputs, entry.kept).jvp(entry.lin, tangents)


def _vjp_on_host(spec, outputs, size, needs, *args):
    entry = _entry(spec, *args[:size])
    grads = _differentiable.PlanRule(outputs, entry.kept).vjp(entry.lin, tuple(args[size:]), needs)
    return [g for g in grads if g is not None]


def _distance_gradients(spec, inputs, state, needs):
    """The gradient rule of W2^2 (:func:`._autodiff.attach`) of a solve run by :func:`solve`:
    the values by a callback, made differentiable (second derivatives) by
    :func:`._differentiable.recorded` with :class:`CallbackRule`."""
    host_state, barycenters, potential = state
    shapes = [(s, spec.dtype) for s, need in zip(spec.input_shapes(), needs) if need]
    values = iter(_callback(_Static(_gradients_on_host, spec, len(host_state), tuple(needs)), shapes,
                            *host_state, on_host_thread=False) if shapes else ())
    grads = [next(values) if need else None for need in needs]
    rule_of = lambda outputs: (host_state, CallbackRule(outputs, spec))        # noqa: E731
    return _differentiable.recorded(inputs, grads, barycenters, potential, rule_of, needs)


def _gradients_on_host(spec, size, needs, *args):
    entry = _entry(spec, *args[:size])
    rule_for = functools.partial(_differentiable.PlanRule, kept=entry.kept)
    return [g for g in _differentiable.first_derivatives(entry.lin, rule_for, needs) if g is not None]
