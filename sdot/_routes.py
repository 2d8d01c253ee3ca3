"""The execution routes of one solve: eager (NumPy, torch, array_api_strict), concrete JAX on
the host (NumPy views), traced JAX (one callback or one compiled program), and ``torch.func``
transforms (per item); each attaches the analytic derivatives of its framework."""
from __future__ import annotations

import functools

import array_api_compat as aac
import numpy as np

from . import _autodiff, _differentiable, _driver, _jax_host
from ._core import _compat, evaluation, plan
from ._core.density import grid_density
from ._diagram import PowerDiagram
from ._host.threads import settings as host_settings
from ._checks import check_values
from ._diagnosis import failure
from ._ot_plan import OtNotConverged, OtPlan, PLAN_ARRAYS, zero_d


@functools.cache
def jax_solve_plan(reachable=True):
    """:func:`plan.solve_plan` under one ``jax.jit`` (compiled once per shape, inlined
    in the caller's trace). JAX compiles every eager operation separately: one
    program for the whole solve is faster, and eager and traced calls share it. One per
    setting of ``HostSettings.reachable`` (their traces differ: host callbacks or none)."""
    import jax

    def run(prob, tol, max_iter, log, capacity, options):
        return plan.solve_plan(_driver.namespace(prob.seeds), prob, tol, max_iter, log, capacity, options)
    return jax.jit(run, static_argnames=("log", "capacity", "options"))


def solve(xp, prob, tol, max_iter, log, nan_on_failure, options):
    """Solve with the Newton ``options`` (a :class:`._core.options.NewtonOptions`) on inputs
    cut from the autodiff graph, then attach the analytic gradients. An eager JAX solve that
    compiles is padded to :func:`bucket_size` (``sdot.driver.size_buckets``)."""
    with _driver.quiet_int64(), _driver.one_thread(xp):
        n = prob.seeds.shape[0]
        size = bucket_size(n) if _compiles_eagerly(xp, prob) and _driver.driver.size_buckets else n
        padded = _padded(xp, prob, size) if size > n else None
        if padded is None:
            return _solve_quietly(xp, prob, tol, max_iter, log, nan_on_failure, options)
        out, stop = _solve_quietly(xp, padded, tol, max_iter, log, nan_on_failure, options)
        return _first_rows(xp, out, n, prob.density), stop


def bucket_size(n):
    """The size an eager compiled JAX solve of ``n`` Diracs runs at: the least ``m 2^e >= n``
    with ``8 <= m <= 16`` (``n`` itself up to 16), at most ``n / 8`` more. Sizes a few percent
    apart share it, and so one compiled program (:func:`jax_solve_plan`)."""
    if n <= 16:
        return n
    step = 1 << ((n - 1).bit_length() - 4)
    return -(-n // step) * step


def _compiles_eagerly(xp, prob):
    """Whether ``prob`` (concrete JAX arrays) is solved by the compiled :func:`jax_solve_plan`:
    not on the host (a GPU, or ``sdot.driver.host`` False), not under ``jit`` (``grad`` may wrap it)."""
    if not aac.is_jax_namespace(xp):
        return False
    cut = _detached(prob)
    return not any(map(_driver.is_tracer, (cut.seeds, cut.masses, *cut.density))) and _jax_on_host(xp, cut) is None


#: Where the padding Diracs sit, as a fraction of the domain along each axis: a point no
#: user is likely to put a Dirac on (a collision is checked for: then no padding).
PAD_AT = (0.6180339887498949, 0.4142135623730951, 0.7320508075688772)


def _padded(xp, prob, size):
    """``prob`` with ``size - n`` Diracs of zero mass at one point inside the domain
    (constants): a group of zero mass, which takes no cell, no share of the potential's mean
    and leaves the box of the seeds as it was. None if a Dirac sits on that point."""
    n, d = prob.seeds.shape
    dev = aac.device(prob.masses)
    lo, hi = (_autodiff.detach(a) for a in (prob.lo, prob.hi))
    point = lo + (hi - lo) * xp.asarray(PAD_AT[:d], dtype=lo.dtype, device=dev)
    if bool(xp.any(xp.all(_autodiff.detach(prob.seeds) == point[None, :], axis=1))):
        return None
    pads = xp.broadcast_to(point[None, :], (size - n, d))
    zeros = xp.zeros((size - n,), dtype=prob.masses.dtype, device=dev)
    return evaluation.Problem(xp.concat([prob.seeds, pads]), xp.concat([prob.masses, zeros]), prob.density)


def _first_rows(xp, out, n, density):
    """The plan ``out`` of a :func:`_padded` problem, cut to its first ``n`` Diracs; its
    diagram's cells are computed when asked."""
    arrays = {k: getattr(out, k)[:n, ...] for k in _differentiable.PLAN_OUTPUTS}
    diagram = PowerDiagram._at_weights(_autodiff.detach(out.power_diagram.positions[:n, :]),
                                       _autodiff.detach(arrays["brenier_potential"]), density)
    return OtPlan(distance=out.distance, power_diagram=diagram,
                  **arrays, **{k: getattr(out, k) for k in PLAN_ARRAYS if k not in arrays})


def _detached(prob):
    """``prob`` with its arrays cut from the autodiff graph."""
    return prob._replace(seeds=_autodiff.detach(prob.seeds), masses=_autodiff.detach(prob.masses),
                         density=type(prob.density)(*(_autodiff.detach(a) for a in prob.density)))


def _solve_quietly(xp, prob, tol, max_iter, log, nan_on_failure, options):
    cut = _detached(prob)
    host = None if _driver.is_tracer(tol) or _driver.is_tracer(max_iter) else _jax_on_host(xp, cut)
    if host is not None:
        return solve_on_host(xp, prob, host, tol, max_iter, log, options)
    if _jax_host.takes(xp, cut):                # traced JAX on the CPU: the NumPy core in one callback
        fields, stop = _jax_host.solve(prob, cut, tol, max_iter, log, nan_on_failure, options)
        return OtPlan(**fields), stop
    if cut.period is not None and (aac.is_jax_namespace(xp) or _compat.static_shapes(cut.seeds)):
        raise NotImplementedError("metric=PeriodicMetric is solved on the host only, not on the compiled route yet "
                                  "(jit_route='compiled', a JAX device other than the CPU, sdot.driver.host = False)")
    if aac.is_jax_namespace(xp) or _compat.static_shapes(cut.seeds):
        solve = (jax_solve_plan(host_settings().reachable) if aac.is_jax_namespace(xp)
                 else functools.partial(plan.solve_plan, xp))
        if aac.is_jax_namespace(xp):            # traced, not static: a new tol or max_iter compiles nothing
            tol, max_iter = xp.asarray(tol, dtype=cut.seeds.dtype), xp.asarray(max_iter)
        res = plan.grown_until_fits(lambda capacity: solve(cut, tol=tol, max_iter=max_iter, log=log,
                                                           capacity=capacity, options=options),
                                    lambda res: res["overflow"], cut.seeds.shape[1])
    else:
        with _autodiff.without_autodiff(xp):
            res = plan.solve_plan(xp, cut, tol, max_iter, log=log, options=options)
        res.update({k: _autodiff.released(res[k]) for k in PLAN_ARRAYS + ("distance",)})
    lin = _differentiable.linearization(cut, res)
    inputs = (prob.seeds, prob.masses, prob.density.values, prob.lo, prob.hi)
    kept = _differentiable.Kept()
    outputs = _autodiff.attach_linear(tuple(res[k] for k in _differentiable.PLAN_OUTPUTS), inputs, lin,
                                      _differentiable.PlanRule(_differentiable.PLAN_OUTPUTS, kept))
    distance = _autodiff.attach(res["distance"], inputs, (lin, res["barycenters"], res["brenier_potential"]),
                                functools.partial(_differentiable.distance_gradients,
                                                  functools.partial(_differentiable.PlanRule, kept=kept)))
    if nan_on_failure and _driver.is_tracer(res["converged"]):
        distance = xp.where(res["converged"], distance, xp.nan)
    sol = res["solution"]
    diagram = PowerDiagram._from_solution(cut, _autodiff.released(sol.psi), sol.evaluation.cells,
                                          sol.evaluation.moments, res["active"], *_sites(res))
    arrays = dict(zip(_differentiable.PLAN_OUTPUTS, outputs))
    arrays.update({k: zero_d(res[k]) for k in PLAN_ARRAYS if k not in arrays})
    out = OtPlan(distance=distance, power_diagram=diagram, _linearization=lin, **arrays)
    out._kept_rule = _differentiable.PlanRule(("distance",) + _differentiable.PLAN_OUTPUTS, kept)
    return out, (sol.width, sol.damping)


def check_depth(prob, orders):
    """Raise if ``torch.func`` transforms nest deeper around the problem ``prob`` than the rules
    differentiate (``orders``: 2 for W2^2, 1 for the plan's arrays): the rules' products are
    computed outside the transforms, which would take a further derivative of them as zero."""
    depth = _autodiff.differentiation_depth(prob.seeds, prob.masses, *prob.density)
    if depth > orders:
        what = ("third derivatives of W2^2" if orders == 2 else
                "second derivatives of the plan's arrays (third derivatives of W2^2; for the Hessian of "
                "W2^2 under torch.func, differentiate sdot.distance)")
        raise NotImplementedError(f"sdot: {what} are not implemented ({depth} nested torch.func "
                                  "derivative transforms)")


class _ItemSolves(_autodiff.ItemState):
    """The solves of one call under ``torch.func`` transforms, one per item (of a ``vmap``),
    each kept under the values of its inputs (seeds, masses, density values, lo, hi): the
    transforms' products find the solve of their item there (or solve it again)."""

    def __init__(self, tol, max_iter, log, raise_on_failure, options, period=None):
        self.tol, self.max_iter, self.log, self.options = tol, max_iter, log, options
        self.raise_on_failure, self.items, self.period = raise_on_failure, {}, period

    def solve(self, seeds, masses, values, lo, hi, total_rho=None):
        """The plan's arrays (:data:`_ITEM_ARRAYS`) of one item (plain tensors), solved and kept."""
        xp = _driver.namespace(seeds)
        period = None if self.period is None else xp.asarray(self.period, dtype=seeds.dtype, device=aac.device(seeds))
        prob = evaluation.Problem(seeds, masses, grid_density(values, lo, hi), period)
        if total_rho is not None and check_values(xp, prob, total_rho):
            raise NotImplementedError("partial transport (a target heavier than the source) is solved eagerly, "
                                      "not under torch.func transforms yet")
        with _autodiff.without_autodiff(xp):
            res = plan.solve_plan(xp, prob, self.tol, self.max_iter, log=self.log, options=self.options)
        res.update({k: _autodiff.released(res[k]) for k in PLAN_ARRAYS + ("distance",)})
        lin = _differentiable.linearization(prob, res)
        self.items[self.key((seeds, masses, values, lo, hi))] = (lin, res, _differentiable.Kept())
        if self.raise_on_failure and not bool(res["converged"]):
            partial = OtPlan(distance=res["distance"], power_diagram=None, **{k: res[k] for k in PLAN_ARRAYS})
            stop = (res["solution"].width, res["solution"].damping)
            raise OtNotConverged(failure(partial, stop, self.tol, self.max_iter, prob, self.options), partial)
        return tuple(xp.asarray(res[k]) for k in _ITEM_ARRAYS)

    def of(self, inputs):
        """The :class:`._core.sensitivity.Linearization` of the item of ``inputs``."""
        return self.item(inputs)[0]

    def item(self, inputs):
        """``(linearization, solve result, Kept)`` of the item of ``inputs``."""
        key = self.key(inputs)
        if key not in self.items:
            self.solve(*inputs)
        return self.items[key]


#: The arrays of an item of :class:`_ItemSolves`, in this order.
_ITEM_ARRAYS = ("distance", "barycenters", "brenier_potential", "cell_masses", "converged", "iterations",
                "residual", "status")


def solve_per_item(prob, total_rho, tol, max_iter, log, raise_on_failure, options):
    """The plan of a problem of tensors wrapped by ``torch.func`` transforms: every item (of a
    ``vmap``) solved on its values (:class:`_ItemSolves`), the derivatives attached by the
    torch rules, per item. The power diagram is that of a lone item (None under ``vmap``)."""
    solves = _ItemSolves(tol, max_iter, log, raise_on_failure, options, prob.period)
    inputs = (prob.seeds, prob.masses, prob.density.values, prob.lo, prob.hi)
    xp = _driver.namespace(prob.seeds)
    total = total_rho if aac.is_torch_array(total_rho) else xp.asarray(float(total_rho), dtype=prob.seeds.dtype)
    res = dict(zip(_ITEM_ARRAYS, _autodiff.host_map(solves.solve, *inputs, total)))
    outputs = _autodiff.attach_linear(tuple(res[k] for k in _differentiable.PLAN_OUTPUTS), inputs, solves,
                                      _differentiable.PlanRule(_differentiable.PLAN_OUTPUTS))
    distance = _autodiff.attach(res["distance"], inputs, solves, functools.partial(_gradients_per_item, solves))
    arrays = dict(zip(_differentiable.PLAN_OUTPUTS, outputs))
    arrays.update({k: res[k] for k in PLAN_ARRAYS if k not in arrays})
    lin, diagram = None, None
    if len(solves.items) == 1:
        (lin, item, _), = solves.items.values()
        sol = item["solution"]
        diagram = PowerDiagram._from_solution(lin_problem(lin)._replace(period=solves.period), sol.psi,
                                              sol.evaluation.cells, sol.evaluation.moments, item["active"],
                                              *_sites(item))
    return OtPlan(distance=distance, power_diagram=diagram, _linearization=lin, **arrays)


def lin_problem(lin):
    """The (plain) problem of the linearization ``lin``."""
    return evaluation.Problem(lin.seeds, lin.masses, grid_density(lin.values, lin.lo, lin.hi))


def _gradients_per_item(solves, inputs, _, needs):
    """The gradient rule of W2^2 under ``torch.func`` (see :func:`solve_per_item`): the values
    per item (:func:`._differentiable.first_derivatives`), made differentiable by the plan's
    rules (second derivatives)."""
    def values(*plain):
        lin, res, kept = solves.item(plain)
        rule_for = functools.partial(_differentiable.PlanRule, kept=kept)
        return (*_differentiable.first_derivatives(lin, rule_for, needs), res["barycenters"],
                res["brenier_potential"])
    *grads, barycenters, potential = _autodiff.host_map(values, *inputs)
    rule_of = lambda outputs: (solves, _differentiable.PlanRule(outputs))     # noqa: E731
    return _differentiable.recorded(inputs, grads, barycenters, potential, rule_of, needs)


def _sites(res):
    """The sites of a solve's cells and the seed of each on a periodic domain, else ``(None, None)``."""
    if "state" not in res:
        return None, None
    return res["state"].sites, res["state"].owner


def _jax_on_host(xp, cut):
    """NumPy views (no copy) of the problem ``cut`` if its arrays are concrete JAX arrays on
    the CPU (eager calls, ``jax.grad`` and ``jax.jvp`` outside ``jit``), else None."""
    views = _driver.host_views(cut.seeds, cut.masses, *cut.density) if aac.is_jax_namespace(xp) else None
    if views is None:
        return None
    period = None if cut.period is None else np.asarray(cut.period)
    return evaluation.Problem(views[0], views[1], type(cut.density)(*views[2:]), period)


def solve_on_host(xp, prob, host, tol, max_iter, log, options):
    """The eager NumPy solve of the concrete JAX problem ``host`` (NumPy views): nothing
    compiles. The plan's arrays come back as JAX arrays; the solver's state stays on the
    host, in the bounded store of :mod:`._jax_host` under a token, and the derivative rules
    reach it through callbacks (:class:`._jax_host.CallbackRule`), as under ``jit``: JAX's
    caches of those rules then hold the token, never the state."""
    res = plan.solve_plan(_compat.namespace(host.seeds), host, tol, max_iter, log=log, options=options)
    like = _autodiff.detach(prob.seeds)
    to_jax = lambda a: _driver.convert_like(np.asarray(a), like)      # noqa: E731 (jax.device_put)
    lin = _differentiable.linearization(host, res)
    spec = _jax_host.Spec(*host.seeds.shape, tuple(host.density.values.shape), type(host.density),
                          np.dtype(host.seeds.dtype))
    token = _jax_host.STORE.put(_jax_host.Entry(lin, _differentiable.Kept()))
    detached = (like, _autodiff.detach(prob.masses)) + tuple(_autodiff.detach(a) for a in prob.density)
    state = (_driver.convert_like(np.asarray(token, dtype=np.int32), like),) + detached + (to_jax(lin.psi),)
    inputs = (prob.seeds, prob.masses, prob.density.values, prob.lo, prob.hi)
    plan_arrays = tuple(to_jax(res[k]) for k in _differentiable.PLAN_OUTPUTS)
    outputs = _autodiff.attach_linear(plan_arrays, inputs, state,
                                      _jax_host.CallbackRule(_differentiable.PLAN_OUTPUTS, spec))
    barycenters, potential = (plan_arrays[_differentiable.PLAN_OUTPUTS.index(k)]
                              for k in ("barycenters", "brenier_potential"))
    distance = _autodiff.attach(to_jax(res["distance"]), inputs, (state, barycenters, potential),
                                functools.partial(_jax_host._distance_gradients, spec))
    sol = res["solution"]
    diagram = PowerDiagram._from_solution(evaluation.Problem(prob.seeds, None, host.density, host.period),
                                          to_jax(sol.psi),
                                          sol.evaluation.cells, sol.evaluation.moments, res["active"], *_sites(res))
    arrays = dict(zip(_differentiable.PLAN_OUTPUTS, outputs))
    arrays.update({k: to_jax(res[k]) for k in PLAN_ARRAYS if k not in arrays})
    return OtPlan(distance=distance, power_diagram=diagram, _linearization=lin, **arrays), (sol.width, sol.damping)
