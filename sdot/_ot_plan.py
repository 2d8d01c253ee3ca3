"""The plan object: :class:`OtPlan` (a JAX pytree, NumPy's ``jvp`` and ``vjp``) and
:class:`OtNotConverged`."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import _differentiable, _driver
from ._pytrees import JaxPytree


class OtNotConverged(RuntimeError):
    """The Newton solve did not reach the tolerance within ``max_iter`` steps.

    ``plan`` holds the partial :class:`OtPlan` (``plan.converged`` is False).
    """

    def __init__(self, message, plan):
        super().__init__(message)
        self.plan = plan


@dataclass
class OtPlan(JaxPytree):
    """The solution of a semi-discrete transport problem.

    Attributes are arrays of the framework of the inputs (rule 1) or of the
    driver (rule 2): ``distance`` (W2^2), ``barycenters`` ``(n, d)``,
    ``cell_masses`` ``(n,)``, ``brenier_potential`` ``(n,)`` (the Laguerre
    weights psi, mean 0 over the Diracs of positive mass; in partial transport the radii
    squared of the balls, no gauge), ``transported_mass`` (the sum of ``cell_masses``), ``power_diagram``
    (a :class:`PowerDiagram` at the optimal weights), and how the solve went:
    ``converged``, ``iterations``, ``residual`` (max absolute cell-mass error) and
    ``status`` (0: converged; 1: ``max_iter`` reached; 2: stalled, no admissible step;
    3: the last diagram could not be certified). A partial plan's masses, barycentres
    and distance are those of its weights' diagram against the density itself.
    In 1D the plan is the sorted closed form: no Newton step (``iterations`` 0), exact up
    to rounding (``residual`` is that rounding).

    ``converged``, ``iterations``, ``residual`` and ``status`` are 0-d arrays of the
    plan's framework, on its device, of one dtype on every framework (eager or under
    ``jax.jit``): ``converged`` bool, ``iterations`` and ``status`` int64 (int32 on JAX
    without ``jax_enable_x64``, which sdot turns on in FP64), ``residual`` the computation
    dtype (float64 in FP64, float32 in FP32). NumPy: ``numpy.ndarray`` of shape ``()``
    (not NumPy scalars); torch: ``torch.Tensor``; JAX: ``jax.Array`` (tracers under
    ``jit``); array_api_strict: its ``Array``. ``bool()``, ``int()`` and ``float()`` read
    them eagerly.

    The plan of a batch (:func:`optimal_transport_plan` with a batch of sources, of targets
    or both, of ``b`` items) is the plans of the items stacked: every array above has a
    leading axis ``b`` (``converged``... have shape ``(b,)``) and ``power_diagram`` is a
    tuple of ``b`` :class:`PowerDiagram`.
    """

    distance: object
    barycenters: object
    cell_masses: object
    brenier_potential: object
    power_diagram: object
    converged: object
    iterations: object
    residual: object
    status: object
    _linearization: object = field(default=None, repr=False, compare=False)
    _normalisation: object = field(default=None, repr=False, compare=False)

    @property
    def transported_mass(self):
        """The mass moved: the sum of ``cell_masses`` (per item for a batch), the source's mass;
        less than the target's in partial transport."""
        xp = _driver.namespace(self.cell_masses)
        return xp.sum(self.cell_masses, axis=-1)

    def jvp(self, positions=None, weights=None, values=None, domain=None):
        """NumPy's forward-mode derivative: the tangents of ``distance``, ``barycenters``,
        ``brenier_potential`` and ``cell_masses`` (a dict) along tangents of the inputs (None
        for zero): the Dirac ``positions`` (n, d), their ``weights`` (n,) (the masses before
        normalisation; SumOfDiracs has none), the grid's ``values`` (a SplineGrid's own,
        through its linear map) and its ``domain`` ``(lo, hi)``, each of shape (d,). By implicit differentiation: one sparse solve.
        torch and JAX users differentiate the plan's arrays directly. A partial transport plan
        gives the tangent of ``distance`` alone (its other arrays are not differentiable yet), and
        none along the domain (``NotImplementedError``)."""
        norm = self._normaliser("jvp")
        lo, hi = (None, None) if domain is None else (np.asarray(domain[0], float), np.asarray(domain[1], float))
        given = [None if t is None else np.asarray(t, dtype=norm.lin.seeds.dtype) for t in (positions, weights, values)]
        shapes = (tuple(norm.lin.seeds.shape), None if norm.weights is None else tuple(norm.weights.shape),
                  tuple(norm.user_values_shape))
        for name, t, shape in zip(("positions", "weights", "values"), given, shapes):
            if t is not None and shape is None:
                raise ValueError("OtPlan.jvp: the source has no weights (SumOfDiracs); pass weights=None")
            if t is not None and tuple(t.shape) != shape:
                raise ValueError(f"OtPlan.jvp: the tangent of {name} must have the shape of {name}, {shape}, "
                                 f"got {tuple(t.shape)}")
        tangents = norm.forward(*given, lo, hi)
        rule = self._rules()
        return dict(zip(rule.outputs, rule.jvp(norm.lin, tangents)))

    def vjp(self, distance=None, barycenters=None, brenier_potential=None, cell_masses=None):
        """NumPy's reverse-mode derivative: the cotangents of the inputs (a dict: ``positions``,
        ``weights``, ``values``, ``domain`` as ``(lo, hi)``) of cotangents of the outputs (None
        for zero); see :meth:`jvp`. Of a partial transport plan: of a cotangent of ``distance``
        alone, and ``domain`` None (not computed yet), as on a periodic domain (``metric=PeriodicMetric``)."""
        norm = self._normaliser("vjp")
        lin = norm.lin
        zero = lambda shape: np.zeros(shape, dtype=lin.seeds.dtype)        # noqa: E731
        n, d = lin.seeds.shape
        cts = [np.asarray(c, dtype=lin.seeds.dtype) if c is not None else zero(shape)
               for c, shape in zip((barycenters, brenier_potential, cell_masses, distance), ((n, d), (n,), (n,), ()))]
        rule = self._rules()
        # (the domain's derivative of a partial plan, or on a periodic domain: not yet)
        no_domain = getattr(self.power_diagram, "capped", False) or getattr(lin, "sites", None) is not None
        grads = rule.vjp(lin, (cts[3],) + tuple(cts[:3]), (True,) * 3 + (not no_domain,) * 2)
        positions, weights, values, lo, hi = norm.backward(*grads)
        return dict(positions=positions, weights=weights, values=values, domain=None if no_domain else (lo, hi))

    def _normaliser(self, what):
        if self._normalisation is None and getattr(self.distance, "ndim", 0) == 1:
            raise TypeError(f"OtPlan.{what} is for the plan of one source and one target: solve the "
                            "items of a batch one by one for NumPy's derivatives")
        if self._normalisation is None:
            raise TypeError(f"OtPlan.{what} is NumPy's: differentiate torch and JAX plans with their autodiff")
        return self._normalisation

    def _rules(self):
        """The rule of :meth:`jvp` and :meth:`vjp`, kept (with its facets and factors)."""
        if getattr(self, "_kept_rule", None) is None:
            self._kept_rule = _differentiable.PlanRule(("distance",) + _differentiable.PLAN_OUTPUTS)
        return self._kept_rule

    def _tree_flatten(self):
        """JAX pytree children: the public fields (the diagram is a pytree too). The state of
        NumPy's :meth:`jvp` and :meth:`vjp` is dropped: a rebuilt plan has none."""
        return tuple(getattr(self, name) for name in PLAN_FIELDS), None

    @classmethod
    def _tree_unflatten(cls, aux, children):
        return cls(*children)


#: The public fields of :class:`OtPlan`, in order: the children of its pytree.
PLAN_FIELDS = ("distance", "barycenters", "cell_masses", "brenier_potential", "power_diagram", "converged",
                "iterations", "residual", "status")


def zero_d(value):
    """A 0-d NumPy array for a NumPy scalar (NumPy's operations on 0-d arrays return scalars),
    so that :class:`OtPlan`'s ``iterations``... are 0-d arrays on every framework."""
    return np.asarray(value) if isinstance(value, np.generic) else value


#: The arrays of an :class:`OtPlan` besides the distance and the diagram.
PLAN_ARRAYS = ("barycenters", "cell_masses", "brenier_potential", "converged", "iterations", "residual",
                "status")
