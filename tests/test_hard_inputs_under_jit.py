"""Hard inputs of 400 Diracs for the traced solve (``jax.jit``, the compiled route): copies
of a few Diracs, Diracs on the sides of the domain. Apart from test_hard_densities.py so that
the test runner's two workers share its compiles out (these two share one: same shapes)."""
from __future__ import annotations

import numpy as np
import pytest

from test_hard_densities import solve


def test_many_copies_of_few_diracs_under_jax(sdot_driver):
    """40 Diracs repeated 10 times (the traced first diagram takes the nearest seeds: copies
    filled 9 of each seed's 20 candidates, no repair could certify the cells, and the solve
    returned a residual of 0.9): converged, and the W2^2 of the 40 distinct Diracs."""
    from conftest import Backend

    backend = Backend("jax-jit")      # the traced solve (eager JAX solves on the host)
    sdot_driver.framework, sdot_driver.jit_route = backend.framework, "compiled"
    distinct = np.random.default_rng(0).random((40, 2))
    img = np.ones((1, 1))
    plan = solve(backend, np.repeat(distinct, 10, axis=0), img)
    assert bool(plan.converged) and float(plan.residual) <= 1e-10
    once = solve(Backend("numpy"), distinct, img)
    # masses within 1e-10 move W2^2 by at most max|psi| * sum |dm| (about 4e-10 here)
    assert float(plan.distance) == pytest.approx(float(once.distance), rel=1e-7)


def test_diracs_on_the_sides_of_the_square_under_jax(sdot_driver):
    """400 Diracs on the sides of the unit square (the 20 nearest of each lie on its own
    side, and a traced first diagram built from them could not be certified: status 3):
    the traced solve starts from the Delaunay neighbours and converges to NumPy's W2^2."""
    from conftest import Backend

    t = np.random.default_rng(4).random(100)
    pts = np.concatenate([np.stack([t, 0 * t], 1), np.stack([1 + 0 * t, t], 1),
                          np.stack([t, 1 + 0 * t], 1), np.stack([0 * t, t], 1)])
    backend = Backend("jax-jit")      # the traced solve (eager JAX solves on the host)
    sdot_driver.framework, sdot_driver.jit_route = backend.framework, "compiled"
    plan = solve(backend, pts, np.ones((1, 1)))
    assert bool(plan.converged) and float(plan.residual) <= 1e-10
    sdot_driver.framework = "numpy"
    eager = solve(Backend("numpy"), pts, np.ones((1, 1)))
    assert float(plan.distance) == pytest.approx(float(eager.distance), rel=1e-7)
