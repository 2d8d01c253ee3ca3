"""Inputs the dtype or the framework cannot take are refused at the boundary, before any
work, with an error that names the argument (found by the fuzzing of issue 63)."""
from __future__ import annotations

import time

import numpy as np
import pytest

import sdot

X = np.random.default_rng(0).random((10, 2))
IMG = np.ones((8, 8))


@pytest.fixture
def numpy_inputs(sdot_driver):
    sdot_driver.framework = "numpy"


def test_power_diagram_names_nan_weights(numpy_inputs):
    w = np.zeros(10)
    w[3] = np.nan
    with pytest.raises(ValueError, match="weights contains NaN"):
        sdot.PowerDiagram(X, weights=w)


@pytest.mark.parametrize("make, match", [
    (lambda: (sdot.SumOfWeightedDiracs(X, np.full(10, 1.5e308)), sdot.Grid(IMG)), "weights: .*sum of the weights overflows"),
    (lambda: (sdot.SumOfWeightedDiracs(X, np.full(10, 5e-324)), sdot.Grid(IMG)), "weights: .*too small to divide by"),
    (lambda: (sdot.SumOfDiracs(X), sdot.Grid(np.full((8, 8), 1.7e308))), "values: .*their sum overflows"),
    (lambda: (sdot.SumOfDiracs(X), sdot.Grid(np.full((8, 8), 5e-324))), "values: .*too small to divide by"),
    (lambda: (sdot.SumOfDiracs(X * 1e-300), sdot.Grid(IMG, domain=([0, 0], [1e-300, 1e-300]))),
     "domain: sides of 1e-300 .*too small for float64"),
])
def test_magnitudes_the_dtype_cannot_hold(numpy_inputs, make, match):
    """Before: 'the source has mass 0.0', 'mass inf', or a solve that stalled at a residual of
    5e-2 or NaN after 300 steps."""
    source, target = make()
    start = time.perf_counter()
    with pytest.raises(ValueError, match=match):
        sdot.distance(source, target)
    assert time.perf_counter() - start < 1.0


def test_a_far_dirac_is_named(numpy_inputs):
    """A Dirac 1e100 domain sides away passes the range check (the dtype squares it) but its
    cell cannot be placed: the failure says which Dirac, and why."""
    x = X.copy()
    x[4] = [1e100, 0.5]
    with pytest.raises(sdot.OtNotConverged, match=r"empty cells \(index 4 at \[1e\+100, 0.5\]\); Dirac 4 lies 1e\+100 "
                                                  r"domain sides from the domain"):
        sdot.distance(sdot.SumOfDiracs(x), sdot.Grid(IMG))


def test_torch_tensors_without_values(sdot_driver):
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="values: a torch tensor of layout torch.sparse_coo.*values.to_dense()"):
        sdot.Grid(torch.tensor(IMG).to_sparse())
    start = time.perf_counter()
    with pytest.raises(ValueError, match="positions: a torch tensor on the 'meta' device holds no values"):
        sdot.SumOfDiracs(torch.tensor(X, device="meta"))
    assert time.perf_counter() - start < 1.0


def test_torch_bfloat16_computes_in_the_driver_dtype(sdot_driver):
    """As float16 does (docs/backends.md, rule 3): the result in the driver's dtype, the
    gradient in the input's."""
    torch = pytest.importorskip("torch")
    x = torch.tensor(X, dtype=torch.bfloat16, requires_grad=True)
    d = sdot.distance(sdot.SumOfDiracs(x), sdot.Grid(torch.tensor(IMG)))
    assert d.dtype == torch.float64
    exact = sdot.distance(sdot.SumOfDiracs(torch.tensor(x.detach().to(torch.float64))), sdot.Grid(torch.tensor(IMG)))
    assert float(d.detach()) == pytest.approx(float(exact), rel=1e-12)
    d.backward()
    assert x.grad.dtype == torch.bfloat16 and bool(torch.all(torch.isfinite(x.grad)))


def test_torch_values_with_a_jax_domain_is_a_type_error(sdot_driver):
    torch = pytest.importorskip("torch")
    jnp = pytest.importorskip("jax").numpy
    with pytest.raises(TypeError, match="cannot mix torch tensors and JAX arrays"):
        sdot.Grid(torch.tensor(IMG), domain=(jnp.zeros(2), jnp.ones(2)))
