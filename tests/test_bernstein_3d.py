"""3D solves against Bernstein voxel grids (``PolynomialGrid`` with ``values`` (n0, n1, n2, (p+1)^3)):
exact identities that hold whatever the kernels do inside. Equal coefficients are the
constant voxel grid; a degree-1 (trilinear) grid refined by subdivision is the same density;
the gradient with respect to the coefficients matches central differences."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import sdot


@pytest.fixture
def numpy_driver(sdot_driver):
    sdot_driver.framework = "numpy"
    return sdot_driver


def trilinear_refined(c):
    """The degree-1 coefficients (n0, n1, n2, 8) ``c`` of each voxel split into 2 x 2 x 2: the
    corner values of each sub-voxel, evaluated from its parent's trilinear function."""
    n0, n1, n2, _ = c.shape
    corners = c.reshape(n0, n1, n2, 2, 2, 2)             # corners[.., a, b, e]: value at t = (a, b, e)
    out = np.empty((2 * n0, 2 * n1, 2 * n2, 2, 2, 2))
    for o in itertools.product((0, 1), repeat=3):          # the sub-voxel's offset in its parent
        for k in itertools.product((0, 1), repeat=3):      # the sub-voxel's corner
            t = [(oi + ki) / 2 for oi, ki in zip(o, k)]
            w = [np.array([1 - ti, ti]) for ti in t]
            value = np.einsum("xyzabe,a,b,e->xyz", corners, *w)
            out[o[0]::2, o[1]::2, o[2]::2, k[0], k[1], k[2]] = value
    return out.reshape(2 * n0, 2 * n1, 2 * n2, 8)


def test_equal_coefficients_are_the_constant_voxel_grid(numpy_driver):
    rng = np.random.default_rng(0)
    x, v = rng.uniform(0.05, 0.95, (120, 3)), rng.uniform(0.5, 1.5, (3, 3, 3))
    want = sdot.optimal_transport_plan(sdot.SumOfDiracs(x), sdot.Grid(v), tol=1e-12)
    for p in (1, 2):
        got = sdot.optimal_transport_plan(sdot.SumOfDiracs(x), sdot.PolynomialGrid(
            np.repeat(v[..., None], (p + 1) ** 3, axis=-1)), tol=1e-12)
        assert float(got.distance) == pytest.approx(float(want.distance), rel=1e-11)
        np.testing.assert_allclose(got.barycenters, want.barycenters, atol=1e-10)


def test_subdivided_trilinear_grid_is_the_same_density(numpy_driver):
    rng = np.random.default_rng(1)
    x, c = rng.uniform(0.05, 0.95, (100, 3)), rng.uniform(0.2, 1.5, (2, 2, 2, 8))
    coarse = sdot.optimal_transport_plan(sdot.SumOfDiracs(x), sdot.PolynomialGrid(c), tol=1e-12)
    fine = sdot.optimal_transport_plan(sdot.SumOfDiracs(x), sdot.PolynomialGrid(trilinear_refined(c)), tol=1e-12)
    assert float(fine.distance) == pytest.approx(float(coarse.distance), rel=1e-10)
    np.testing.assert_allclose(fine.barycenters, coarse.barycenters, atol=1e-9)


def test_gradient_wrt_coefficients_matches_finite_differences_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    x, c = rng.uniform(0.05, 0.95, (60, 3)), rng.uniform(0.3, 1.5, (2, 2, 2, 8))

    def w2(coefficients):
        return sdot.distance(sdot.SumOfDiracs(torch.tensor(x)), sdot.PolynomialGrid(coefficients), tol=1e-12)
    ct = torch.tensor(c, requires_grad=True)
    (g,) = torch.autograd.grad(w2(ct), ct)
    dc, eps = rng.standard_normal(c.shape), 1e-5
    fd = (float(w2(torch.tensor(c + eps * dc))) - float(w2(torch.tensor(c - eps * dc)))) / (2 * eps)
    assert float((g * torch.tensor(dc)).sum()) == pytest.approx(fd, rel=1e-5, abs=1e-9)
