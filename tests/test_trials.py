"""Damping trials: placed below the step that certainly hides a seed, and abandoned
(eagerly) as soon as a cell is known to be empty.

Ground truth: a seed inside a hexagon of seeds with equal weights is hidden
exactly when its weight is below ``-r^2`` (closed form), and the Newton solve
run without the shortcuts.
"""
import dataclasses
from pathlib import Path

import numpy as np
import pytest
from conftest import Backend, solve_with

import sdot
from sdot._core import evaluation, newton, options, planar, starts
from sdot._core.planar import integrate
from sdot._core.density import PixelDensity

DATA = Path(__file__).parent / "data"
LO, HI = np.zeros(2), np.ones(2)
ANGLES = np.pi / 3 * np.arange(6) + 0.1
HEXAGON = np.concatenate([[[0.5, 0.5]], 0.5 + 0.3 * np.stack([np.cos(ANGLES), np.sin(ANGLES)], 1)])


def trial_evaluations(backend, psi):
    """The evaluations at ``psi`` of the hexagon, from its Voronoi cells, as a trial and not."""
    xp = backend.xp

    def run(seeds, psi, lo, hi):
        dev = backend.device
        active = xp.ones((7,), dtype=xp.bool, device=dev)
        prob = evaluation.Problem(seeds, None, PixelDensity(xp.ones((1, 1), dtype=seeds.dtype, device=dev), lo, hi))
        start = planar.power_cells(xp, seeds, xp.zeros_like(psi), active, lo, hi)
        cap = start.labels.shape[1]
        return tuple(evaluation.evaluate(xp, prob, psi, active, capacity=cap, previous=start, trial=trial)
                     for trial in (xp.asarray(True, device=dev), None))
    return backend.run(run, *(backend.asarray(a) for a in (HEXAGON, psi, LO, HI)))


@pytest.mark.parametrize("psi0", [-0.095, -0.085], ids=["hidden", "visible"])
def test_a_trial_with_a_hidden_seed_is_abandoned(backend, psi0):
    """Centre weight -0.095 < -0.3^2 hides the centre: eagerly the trial is abandoned
    (uncertified, no integrals), which the damping rejects like the complete diagram
    (where the centre has no mass; under ``jax.jit`` the trial is that diagram). At
    -0.085 the centre keeps a small cell and the trial is the complete diagram."""
    psi = np.array([psi0] + [0.0] * 6)
    trial, full = trial_evaluations(backend, psi)
    mass = backend.to_numpy(full.moments)[:, 0]
    assert bool(backend.to_numpy(full.cells.certified))
    if psi0 < -0.09 and not backend.static:
        assert mass[0] == 0.0
        assert not bool(backend.to_numpy(trial.cells.certified))
        assert not np.any(backend.to_numpy(trial.moments))
    else:
        assert (0 < mass[0] < 1e-2) == (psi0 > -0.09)
        assert bool(backend.to_numpy(trial.cells.certified))
        np.testing.assert_array_equal(backend.to_numpy(trial.moments), backend.to_numpy(full.moments))


def gaussian_plan(backend, n, newton_options=options.DEFAULT, log=None):
    """The plan of ``n`` points to the Gaussian image (tol 1e-10) with the Newton options."""
    x = backend.asarray(np.load(DATA / "points_2d_1000.npy")[:n])
    img = backend.asarray(np.load(DATA / "image_gauss64.npy"))
    return solve_with(newton_options, sdot.SumOfDiracs(x), sdot.Grid(img), 1e-10, log)


def counted(monkeypatch, calls, module, name):
    """Record the calls of ``module.name`` in ``calls``; returns the original."""
    fn = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append(name) or fn(*a, **k))
    return fn


@pytest.mark.parametrize("n", [300, 1000])
def test_abandoned_trials_leave_the_solve_unchanged(eager_backend, n, monkeypatch):
    """On the Gaussian image, with the first trials at ``min(1, 4 t)`` alone (not capped
    by the hiding step), some damping trials have an empty cell, which the kinetic update
    finds: abandoning them changes neither the steps nor the result (bit for bit)."""
    uncapped = dataclasses.replace(options.DEFAULT, hiding_margin=np.inf)
    calls = []
    evaluate = counted(monkeypatch, calls, newton, "evaluate")      # the steps' diagrams
    counted(monkeypatch, calls, starts, "evaluate")                 # the start's
    counted(monkeypatch, calls, integrate, "cell_integrals")
    fast = gaussian_plan(eager_backend, n, uncapped)
    if eager_backend.host and not eager_backend.jitted_kernels:     # (JAX solves under jit: one trace)
        assert calls.count("cell_integrals") < calls.count("evaluate"), "an abandoned trial has no integrals"
    monkeypatch.setattr(newton, "evaluate", lambda *a, trial=None, **k: evaluate(*a, **k))
    slow = gaussian_plan(eager_backend, n, uncapped)
    assert int(fast.iterations) == int(slow.iterations)
    for name in ("distance", "cell_masses", "barycenters"):
        np.testing.assert_allclose(eager_backend.to_numpy(getattr(fast, name)),
                                   eager_backend.to_numpy(getattr(slow, name)), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["numpy", "torch"])
def test_first_trials_stay_below_the_hiding_step(name, sdot_driver, monkeypatch):
    """The step that certainly hides a seed is found at the first step and after every
    damped one (not after a full step at the density itself), and the step then accepted
    is at most ``hiding_margin`` (of the default options) of it; on the Gaussian image
    (1000 points) the solve evaluates fewer diagrams than by shrinking ``t`` from ``min(1,
    4 t)`` alone (``hiding_margin`` infinite), in no more steps. (Eager backends, where the
    steps can be read on the host.)"""
    backend = Backend(name)
    sdot_driver.framework = backend.framework
    limits, steps = [], []
    step_of = planar.hiding_step

    def hiding_step(*args):
        out = step_of(*args)
        limits.append(float(backend.to_numpy(out)))
        return out
    monkeypatch.setattr(planar, "hiding_step", hiding_step)
    log = lambda it, err, t, width: steps.append(float(backend.to_numpy(t)))
    calls, runs = [], {}
    counted(monkeypatch, calls, newton, "evaluate")
    default = options.DEFAULT.hiding_margin
    for margin in (np.inf, default):
        calls.clear(), limits.clear(), steps.clear()
        newton_options = dataclasses.replace(options.DEFAULT, hiding_margin=margin)
        plan = gaussian_plan(backend, 1000, newton_options, log)
        assert bool(plan.converged)
        runs[margin] = (int(plan.iterations), len(calls))
    assert len(steps) - 1 == int(plan.iterations)
    bounded = [t for k, t in enumerate(steps[1:]) if k == 0 or steps[k] < 1.0]
    assert len(limits) == len(bounded) < int(plan.iterations)
    assert all(t <= default * h for t, h in zip(bounded, limits))
    assert runs[default][0] <= runs[np.inf][0]
    assert runs[default][1] < runs[np.inf][1], runs
