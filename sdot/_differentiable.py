"""The derivatives of a solve, attached to its outputs (the differentiable plan).

:class:`PlanRule` turns :mod:`._core.sensitivity` (the implicit differentiation of the
optimality condition: one sparse solve per product) into the rule of
:func:`._autodiff.attach_linear`: the plan's barycentres, Brenier potential and cell masses
are differentiable with respect to the Dirac positions and masses and the grid's values and
domain, in torch and JAX. W2^2 keeps its closed-form first derivatives; its second
derivatives follow from the differentiable barycentres, potentials and pixel integrals of
``phi`` (:func:`distance_gradients`). NumPy users call :meth:`sdot.OtPlan.jvp` and
:meth:`sdot.OtPlan.vjp`, which chain the rule with the normalisation of the masses and of
the density (:class:`Normalisation`).
"""
from __future__ import annotations

import array_api_compat as aac
import numpy as np

from . import _autodiff, _driver
from ._core import _compat, gradients, sensitivity
from ._core.density import grid_density
from ._core.options import DEFAULT

#: The differentiable outputs of :class:`sdot.OtPlan`, in this order.
PLAN_OUTPUTS = ("barycenters", "brenier_potential", "cell_masses")
#: What the second derivatives of W2^2 need.
GRADIENT_OUTPUTS = ("barycenters", "brenier_potential", "potential")
INPUTS = ("seeds", "masses", "values", "lo", "hi")


class Kept:
    """What the rules of one solve share eagerly: the facets of its cells (computed at the
    first product) and a linear solver, whose factors of the Newton matrix at the optimum serve
    every product. (Not the Newton steps' solver: its last factors, of the step before, as the
    preconditioner of a solve to 1e-13 made a backward at 1e5 twice as slow.)"""

    def __init__(self):
        self.solver, self.lin, self.facets = DEFAULT.linear.solver(), None, None


class PlanRule:
    """The rule of :func:`._autodiff.attach_linear` for the ``outputs`` (names of
    :class:`._core.sensitivity.Tangents`) of a solve whose state is a
    :class:`._core.sensitivity.Linearization`; ``kept``: a :class:`Kept` shared by the rules
    of the solve (eagerly, its facets and factors serve every product)."""

    def __init__(self, outputs, kept=None):
        self.outputs = tuple(outputs)
        self.kept = Kept() if kept is None else kept

    def _prepared(self, lin):
        xp = _driver.namespace(lin.seeds)
        kept = self.kept
        if _compat.is_traced(lin.seeds):
            return xp, sensitivity.facets(xp, lin), DEFAULT.linear.solver(), True
        fresh = kept.lin is not lin             # later products reuse the factors of the first
        if fresh:
            kept.lin, kept.facets = lin, sensitivity.facets(xp, lin)
        return xp, kept.facets, kept.solver, fresh

    def jvp(self, lin, tangents):
        """The output tangents along the input tangents (a tuple of :data:`INPUTS`, None for zero)."""
        with _driver.quiet_int64(), _driver.one_thread(_driver.namespace(lin.seeds)):
            return self._jvp(lin, tangents)

    def vjp(self, lin, cotangents, needs):
        """The input cotangents (None where not ``needs``) of the output cotangents."""
        with _driver.quiet_int64(), _driver.one_thread(_driver.namespace(lin.seeds)):
            return self._vjp(lin, cotangents, needs)

    def _jvp(self, lin, tangents):
        xp, fac, solver, fresh = self._prepared(lin)
        wanted = sensitivity.Tangents(**{k: True for k in self.outputs})
        out = sensitivity.tangents(xp, lin, fac, sensitivity.Inputs(*tangents), solver, wanted, fresh=fresh)
        return tuple(getattr(out, k) for k in self.outputs)

    def _vjp(self, lin, cotangents, needs):
        xp, fac, solver, fresh = self._prepared(lin)
        ct = sensitivity.Tangents(**dict(zip(self.outputs, cotangents)))
        wanted = sensitivity.Inputs(*(True if need else None for need in needs))
        return tuple(sensitivity.cotangents(xp, lin, fac, ct, solver, wanted, fresh=fresh))


def linearization(cut, res):
    """The :class:`._core.sensitivity.Linearization` of the solve ``res`` (of
    :func:`._core.plan.solve_plan`) of the detached problem ``cut``."""
    st = res["state"]
    return sensitivity.Linearization(cut.seeds, cut.masses, cut.density.values, cut.lo, cut.hi, st.cells,
                                     st.moments, res["solution"].evaluation.facet, st.psi, st.rep, st.active,
                                     st.targets, st.sites, st.owner)


def distance_gradients(rule_for, inputs, state, needs):
    """``dW/d(seeds, masses, values, lo, hi)`` (None where not ``needs``), for
    :func:`._autodiff.attach`; ``state``: the :class:`._core.sensitivity.Linearization` and
    the plan's barycentres and Brenier potential; ``rule_for(outputs)`` makes the rule of
    the ``outputs`` (a :class:`PlanRule`)."""
    lin, barycenters, potential = state
    with _driver.quiet_int64():
        grads = first_derivatives(lin, rule_for, needs)
    return recorded(inputs, grads, barycenters, potential, lambda outputs: (lin, rule_for(outputs)), needs)


def first_derivatives(lin, rule_for, needs):
    """The values of ``dW/d(seeds, masses, values, lo, hi)`` (:mod:`._core.gradients`; the
    domain's by :func:`._core.sensitivity.cotangents`), a list, None where not ``needs``."""
    xp = _driver.namespace(lin.seeds)
    gstate = gradients.GradientState(lin.cells, lin.moments, lin.psi, lin.rep, lin.active, lin.targets,
                                     lin.sites, lin.owner)
    density = grid_density(lin.values, lin.lo, lin.hi)
    out = list(gradients.gradients(xp, lin.seeds, lin.masses, density, gstate, needs[:3])) + [None, None]
    if needs[3] or needs[4]:
        one = xp.ones((), dtype=lin.seeds.dtype, device=aac.device(lin.seeds))
        out[3:] = rule_for(("distance",)).vjp(lin, (one,), (False, False, False, needs[3], needs[4]))[3:]
    return out


def recorded(inputs, grads, barycenters, potential, rule_of, needs):
    """The gradient values ``grads`` made differentiable where autodiff records (torch's
    double backward, JAX): the position, mass and value gradients are built from the
    barycentres, potentials and pixel integrals of ``phi`` attached to ``inputs`` by the
    rule ``rule_of(outputs) -> (state, rule)``, so that they can be differentiated again
    (``2 m (y - b)``, ``psi``, ``int phi``); the domain's only to first order (a derivative
    of it raises)."""
    out = list(grads)
    what = "W2^2's gradient with respect to the grid's domain"
    out[3:] = [None if g is None else _autodiff.first_order(g, inputs, what) for g in grads[3:]]
    if not (_records(inputs) and any(needs[:3])):
        return tuple(out)
    names = ("barycenters", "brenier_potential") + (("potential",) if needs[2] else ())
    values = (barycenters, potential) + ((grads[2],) if needs[2] else ())
    state, rule = rule_of(names)
    attached = _autodiff.attach_linear(values, inputs, state, rule)
    seeds, masses = inputs[0], inputs[1]
    if needs[0]:
        out[0] = 2.0 * masses[:, None] * (seeds - attached[0])
    if needs[1]:
        out[1] = attached[1] + (grads[1] - potential)      # a zero-mass Dirac's c-transform: first order
    if needs[2]:
        out[2] = attached[2]
    return tuple(out)


def _records(inputs):
    """Whether a derivative of the gradients can be asked: JAX (always), torch while
    recording (``create_graph=True``) or under ``torch.func``."""
    return _autodiff.recording(inputs[0])


class Normalisation:
    """The map from the user's parameters (positions, weights, grid values, domain) to the
    problem's (positions, normalised masses, density, box) and its derivatives, for NumPy's
    :meth:`sdot.OtPlan.jvp` and :meth:`sdot.OtPlan.vjp`: ``m = w M / sum(w)`` (``M`` the
    source's mass; ``w`` as given if ``M`` is None) and ``rho = v M' / (sum(v) |cell|)``
    (``M'`` the target's mass, ``|cell|`` the volume of a grid cell). For a ``spline``
    (the :class:`sdot.SplineGrid` that ``target`` is the Bernstein form of), the user's values
    are the spline's: ``v = T s`` with ``T`` its linear map, so tangents of ``s`` go through
    ``T`` before the normalisation and cotangents come back through ``T^T`` after it."""

    def __init__(self, source, target, lin, spline=None):
        self.lin, self.spline = lin, spline
        self.weights = None if source._weights is None else np.asarray(source._weights, dtype=lin.seeds.dtype)
        self.mass = source._mass
        self.values = np.asarray(target.values, dtype=lin.seeds.dtype)
        self.user_values_shape = tuple((target if spline is None else spline).values.shape)
        self.target_mass = target._mass

    def forward(self, positions, weights, values, lo, hi):
        """Tangents of the problem's inputs from those of the user's (None for zero)."""
        lin = self.lin
        dm = None
        if weights is not None:
            w = self.weights
            dm = weights if self.mass is None else self.mass / w.sum() * (weights - w * weights.sum() / w.sum())
        rate = None if lo is None and hi is None else (_or0(hi, lin.hi) - _or0(lo, lin.lo)) / (lin.hi - lin.lo)
        if self.spline is not None and values is not None:
            values = self.spline.bernstein_tangent(values)
        drho = None
        if self.target_mass is not None:
            v = self.values
            if values is not None:
                drho = self.target_mass / self._integral() * (values - v * values.sum() / v.sum())
            if rate is not None:
                drho = (0.0 if drho is None else drho) - lin.values * rate.sum()
        elif values is not None:
            drho = values
        return positions, dm, drho, lo, hi

    def backward(self, c_seeds, c_masses, c_values, c_lo, c_hi):
        """Cotangents of the user's parameters from those of the problem's inputs."""
        lin = self.lin
        c_w = None
        if c_masses is not None:
            w = self.weights
            if w is None:
                c_w = c_masses if self.mass is None else None
            else:
                c_w = c_masses if self.mass is None else self.mass / w.sum() * (c_masses - (c_masses * w).sum() / w.sum())
        c_v = c_values
        if self.target_mass is not None and c_values is not None:
            v = self.values
            c_v = self.target_mass / self._integral() * (c_values - (c_values * v).sum() / v.sum())
            c_tr = -(c_values * lin.values).sum()
            c_lo = (np.zeros_like(lin.lo) if c_lo is None else c_lo) - c_tr / (lin.hi - lin.lo)
            c_hi = (np.zeros_like(lin.hi) if c_hi is None else c_hi) + c_tr / (lin.hi - lin.lo)
        if self.spline is not None and c_v is not None:
            c_v = self.spline.values_cotangent(c_v)
        return c_seeds, c_w, c_v, c_lo, c_hi

    def _integral(self):
        lin = self.lin
        d = lin.seeds.shape[1]
        cell = np.prod((lin.hi - lin.lo) / np.asarray(self.values.shape[:d], dtype=lin.lo.dtype))
        per_cell = np.prod(self.values.shape[d:], dtype=int)       # Bernstein coefficients: their mean
        return self.values.sum() * cell / per_cell


def _or0(x, like):
    return np.zeros_like(like) if x is None else x
