"""The public route of partial transport: a target heavier than the source (see
:mod:`._core.partial`).

The solve runs eagerly on the arrays' framework (NumPy and torch through the array API;
concrete JAX arrays on NumPy views, the results converted back). What it does not solve yet
is refused before any work by :func:`check`.
"""
from __future__ import annotations

import array_api_compat as aac
import numpy as np

from . import _driver
from ._core import _compat, newton, partial, plan
from ._core.density import PixelDensity

#: Relative difference of total masses below which the transport is balanced.
BALANCED = 1e-6


def is_partial(total_source, total_target):
    """Whether a target of mass ``total_target`` is heavier than the source beyond rounding;
    a heavier source raises ``NotImplementedError``."""
    if total_source > total_target * (1.0 + BALANCED):
        raise NotImplementedError(f"the source (mass {total_source}) is heavier than the target (mass "
                                  f"{total_target}): only a source lighter than the target (partial transport: "
                                  "each Dirac takes its mass from the density near it) or of equal mass is solved")
    return total_source < total_target * (1.0 - BALANCED)


def check(prob):
    """Raise ``NotImplementedError`` for the partial transport not solved yet (see
    :func:`._core.partial.check_supported`), including differentiated inputs."""
    arrays = (prob.seeds, prob.masses) + tuple(prob.density)
    differentiated = any(_driver.is_tracer(a) or bool(getattr(a, "requires_grad", False)) for a in arrays)
    partial.check_supported(prob.seeds.shape[1], isinstance(prob.density, PixelDensity))
    if _compat.static_shapes(prob.seeds):
        raise NotImplementedError("partial transport is solved eagerly, with data-dependent shapes: not under "
                                  "jax.jit with jit_route='compiled' or on a static-shape namespace yet")
    if differentiated:
        raise NotImplementedError("partial transport is not differentiable yet: solve it on arrays outside "
                                  "autodiff (torch.no_grad() or detached tensors; outside jax.grad/jit)")


def solve_arrays(xp, prob, tol, max_iter, log=None):
    """The plan's arrays (a dict, see :class:`sdot.OtPlan`) and the solution, in ``prob``'s units."""
    rep, active, targets = newton.group_duplicates(xp, prob.seeds, prob.masses)
    unit, scale = plan.normalised(xp, prob)
    sol = partial.solve(xp, unit, tol, max_iter, active, targets, log=log)
    sol = sol._replace(psi=sol.psi * (scale * scale), evaluation=plan._in_units(xp, sol.evaluation, scale))
    out = plan._plan_arrays(xp, prob, sol.evaluation.moments, sol.psi, rep, active, targets)
    lives = xp.take(active, rep)
    out["brenier_potential"] = xp.where(lives, xp.take(sol.psi, rep), 0.0)   # fixed by the balls: no gauge
    del out["psi"]
    return dict(out, residual=sol.residual, iterations=sol.iterations, converged=sol.converged,
                status=sol.status), sol, active


def plan_of(xp, prob, tol, max_iter, log):
    """``(fields, solution, active, host problem)`` of the partial plan of ``prob``: on NumPy
    views for JAX arrays (converted back), else in ``xp``."""
    if not aac.is_jax_namespace(xp):
        out, sol, active = solve_arrays(xp, prob, tol, max_iter, log)
        return out, sol, active, prob
    views = _driver.host_views(prob.seeds, prob.masses, *prob.density)
    host = newton.Problem(views[0], views[1], type(prob.density)(*views[2:]))
    out, sol, active = solve_arrays(_compat.namespace(host.seeds), host, tol, max_iter, log)
    like = prob.seeds
    return {k: _driver.convert_like(np.asarray(v), like) for k, v in out.items()}, sol, active, host
