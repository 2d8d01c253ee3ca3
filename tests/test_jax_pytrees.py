"""``OtPlan`` and ``PowerDiagram`` are JAX pytrees (a jitted function returns them), and the cells
of a traced diagram are refused with a clear error."""
from __future__ import annotations

import numpy as np
import pytest

import sdot

jax = pytest.importorskip("jax")
jnp = jax.numpy


def _problem():
    x = jnp.asarray(np.random.default_rng(3).random((20, 2)))
    return x, sdot.Grid(np.ones((4, 4)))


def _same(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-12)


def test_jit_returns_a_plan_and_its_diagram(sdot_driver):
    x, target = _problem()
    eager = sdot.optimal_transport_plan(sdot.SumOfDiracs(x), target)
    solve = jax.jit(lambda p: sdot.optimal_transport_plan(sdot.SumOfDiracs(p), target))
    plan = solve(x)
    assert isinstance(plan, sdot.OtPlan) and plan._linearization is None and plan._normalisation is None
    for name in ("distance", "barycenters", "cell_masses", "brenier_potential", "converged", "status"):
        _same(getattr(plan, name), getattr(eager, name))
    diagram = plan.power_diagram
    assert isinstance(diagram, sdot.PowerDiagram)
    _same(diagram.weights, eager.power_diagram.weights)
    for got, want in zip(diagram.cells, eager.power_diagram.cells):       # concrete again: cells work
        _same(got.measure, want.measure)
        _same(np.sort(np.asarray(got.vertices), axis=0), np.sort(np.asarray(want.vertices), axis=0))

    alone = jax.jit(lambda p: sdot.optimal_transport_plan(sdot.SumOfDiracs(p), target).power_diagram)(x)
    assert isinstance(alone, sdot.PowerDiagram)
    _same(alone.positions, x)
    _same(alone.weights, eager.brenier_potential)
    _same(alone.cells[5].barycenter, eager.barycenters[5])


def test_tree_map_over_a_plan(sdot_driver):
    x, target = _problem()
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(x), target)
    shapes = jax.tree_util.tree_map(lambda a: np.shape(a), plan)
    assert isinstance(shapes, sdot.OtPlan) and shapes.barycenters == (20, 2) and shapes.distance == ()
    assert isinstance(shapes.power_diagram, sdot.PowerDiagram) and shapes.power_diagram.positions == (20, 2)
    leaves, tree = jax.tree_util.tree_flatten(plan)
    again = jax.tree_util.tree_unflatten(tree, leaves)
    _same(again.barycenters, plan.barycenters)
    assert len(again.power_diagram.cells) == 20
    voronoi = sdot.PowerDiagram(x)
    doubled = jax.tree_util.tree_map(lambda a: 2 * a, voronoi)
    _same(doubled.positions, 2 * x)


def test_jit_returns_a_power_diagram_to_compute_outside(sdot_driver):
    x, _ = _problem()
    w = jnp.linspace(0.0, 0.01, 20)
    diagram = jax.jit(lambda p, w: sdot.PowerDiagram(p, w))(x, w)
    want = sdot.PowerDiagram(x, w).cells
    for got, ref in zip(diagram.cells, want):
        _same(got.measure, ref.measure)


def test_cells_under_jit_say_to_call_them_outside(sdot_driver):
    x, target = _problem()
    with pytest.raises(TypeError, match="PowerDiagram.cells needs concrete arrays.*outside"):
        jax.jit(lambda p: len(sdot.PowerDiagram(p).cells))(x)
    with pytest.raises(TypeError, match="PowerDiagram.cells needs concrete arrays"):
        jax.jit(lambda p: sdot.optimal_transport_plan(sdot.SumOfDiracs(p), target).power_diagram.cells[0].measure)(x)


def test_importing_sdot_does_not_import_jax():
    import subprocess
    import sys

    code = "import sys, numpy as np, sdot; assert 'jax' not in sys.modules; import jax; from sdot import _pytrees; " \
           "assert not _pytrees._registered; sdot.PowerDiagram(np.zeros((2, 2)) + [[0.2], [0.7]]); " \
           "assert sdot.OtPlan in _pytrees._registered and sdot.PowerDiagram in _pytrees._registered"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(__import__("os").environ, SDOT_FRAMEWORK="numpy"))
    assert done.returncode == 0, done.stderr[-2000:]
