"""Under ``jax.jit``, ``tol`` and ``max_iter`` may be traced arguments: changing them compiles
nothing again, and the solves obey them."""
import numpy as np
import pytest

import sdot

jax = pytest.importorskip("jax")
jnp = jax.numpy


def test_traced_tol_and_max_iter_do_not_recompile(sdot_driver):
    """The default route (a host callback; the compiled route: tests/test_jax_jit_host.py)."""
    sdot_driver.framework = "jax"
    rng = np.random.default_rng(0)
    x, img = jnp.asarray(rng.random((40, 2))), jnp.asarray(0.5 + rng.random((6, 6)))

    @jax.jit
    def solve(x, tol, max_iter):
        plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(x), sdot.Grid(img), tol=tol, max_iter=max_iter,
                                           raise_on_failure=False)
        return plan.residual, plan.converged, plan.distance
    loose, tight, cut = solve(x, 1e-4, 300), solve(x, 1e-12, 300), solve(x, 1e-12, 1)
    assert solve._cache_size() == 1                                  # one compile for the three
    assert 1e-12 < float(loose[0]) <= 1e-4 and float(tight[0]) <= 1e-12
    assert not bool(cut[1]) and float(cut[0]) > 1e-12               # one step: not converged
    eager = sdot.distance(sdot.SumOfDiracs(x), sdot.Grid(img), tol=1e-12)
    assert abs(float(tight[2]) - float(eager)) <= 1e-12 * float(eager)
    with pytest.raises(TypeError, match="tol"):
        jax.jit(lambda t: sdot.distance(sdot.SumOfDiracs(x), sdot.Grid(img), tol=t))(jnp.ones(2))
