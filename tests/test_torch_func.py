"""``torch.func`` transforms (``grad``, ``vmap``, ``jvp``, ``jacrev``, ``jacfwd``, ``hessian``) of
W2^2 and of the differentiable plan: each solve runs on the plain values (per item under
``vmap``); the derivatives are the autograd ones, the NumPy ``OtPlan.jvp`` and finite
differences."""
from __future__ import annotations

import numpy as np
import pytest

import sdot

torch = pytest.importorskip("torch")
func = torch.func

TOL = 1e-12


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    img = torch.tensor(rng.uniform(0.5, 1.5, (8, 8)))
    x = torch.tensor(rng.uniform(0.1, 0.9, (20, 2)))
    return x, img


def w2(img):
    return lambda x: sdot.distance(sdot.SumOfDiracs(x), sdot.Grid(img), tol=TOL)


def bary(img):
    return lambda x: sdot.barycenters(sdot.SumOfDiracs(x), sdot.Grid(img), tol=TOL)


def test_grad_matches_autograd(data):
    x, img = data
    g = func.grad(w2(img))(x)
    xr = x.clone().requires_grad_(True)
    (ref,) = torch.autograd.grad(w2(img)(xr), xr)
    assert not g.requires_grad
    torch.testing.assert_close(g, ref, rtol=0, atol=1e-12)


def test_grad_and_value_and_weights(data):
    x, img = data
    w = torch.linspace(0.5, 1.5, x.shape[0], dtype=x.dtype)
    f = lambda x, w: sdot.distance(sdot.SumOfWeightedDiracs(x, w), sdot.Grid(img), tol=TOL)   # noqa: E731
    (gx, gw), value = func.grad_and_value(f, argnums=(0, 1))(x, w)
    xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    out = f(xr, wr)
    ref = torch.autograd.grad(out, (xr, wr))
    torch.testing.assert_close(value, out.detach(), rtol=0, atol=1e-14)
    torch.testing.assert_close(gx, ref[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(gw, ref[1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("vmap", [func.vmap, torch.vmap])
def test_vmap_of_grad_is_a_loop(data, vmap):
    x, img = data
    xs = torch.stack([x, 0.8 * x + 0.1])
    g = vmap(func.grad(w2(img)))(xs)
    values = vmap(w2(img))(xs)
    for k in range(2):
        torch.testing.assert_close(g[k], func.grad(w2(img))(xs[k]), rtol=0, atol=1e-12)
        torch.testing.assert_close(values[k], w2(img)(xs[k]), rtol=0, atol=1e-14)


def test_vmap_plan_has_no_diagram(data):
    x, img = data
    xs = torch.stack([x, 0.8 * x + 0.1])

    def outputs(x):
        plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(x), sdot.Grid(img), tol=TOL)
        assert plan.power_diagram is None
        return plan.barycenters, plan.cell_masses, plan.converged
    b, m, ok = func.vmap(outputs)(xs)
    assert b.shape == (2, 20, 2) and bool(ok.all())
    torch.testing.assert_close(b[1], bary(img)(xs[1]), rtol=0, atol=1e-14)
    torch.testing.assert_close(m.sum(1), torch.ones(2, dtype=x.dtype), rtol=0, atol=1e-10)


def test_jacrev_jacfwd_barycenters_match_numpy_jvp(data, sdot_driver):
    x, img = data
    sdot_driver.framework = "numpy"
    jr = func.jacrev(bary(img))(x)
    jf = func.jacfwd(bary(img))(x)
    assert jr.shape == (20, 2, 20, 2)
    torch.testing.assert_close(jr, jf, rtol=0, atol=1e-8)
    dx = np.random.default_rng(0).standard_normal(x.shape)
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(x.numpy()), sdot.Grid(img.numpy()), tol=TOL)
    ref = plan.jvp(positions=dx)["barycenters"]
    along = torch.einsum("iajb,jb->ia", jr, torch.tensor(dx)).numpy()
    np.testing.assert_allclose(along, ref, rtol=0, atol=1e-8)
    _, tangent = func.jvp(bary(img), (x,), (torch.tensor(dx),))
    np.testing.assert_allclose(tangent.numpy(), ref, rtol=0, atol=1e-8)


def test_potential_and_masses_jacrev(data):
    x, img = data

    def outputs(x):
        plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(x), sdot.Grid(img), tol=TOL)
        return plan.brenier_potential, plan.cell_masses
    jr = func.jacrev(outputs)(x)
    jf = func.jacfwd(outputs)(x)
    for a, b in zip(jr, jf):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-8)
    torch.testing.assert_close(jr[1].sum(0), torch.zeros(20, 2, dtype=x.dtype), rtol=0, atol=1e-9)


def test_hessian_matches_finite_differences(data):
    x, img = data
    h = func.hessian(w2(img))(x)
    h2 = func.jacfwd(func.grad(w2(img)))(x)
    h3 = func.jacrev(func.grad(w2(img)))(x)
    torch.testing.assert_close(h, h2, rtol=0, atol=1e-8)
    torch.testing.assert_close(h, h3, rtol=0, atol=1e-8)
    grad = func.grad(w2(img))
    eps = 1e-6
    for i, a in ((0, 0), (7, 1)):
        e = torch.zeros_like(x)
        e[i, a] = eps
        fd = (grad(x + e) - grad(x - e)) / (2 * eps)
        torch.testing.assert_close(h[:, :, i, a], fd, rtol=0, atol=1e-5)


def test_jvp_of_distance_matches_autograd(data):
    x, img = data
    dx = torch.tensor(np.random.default_rng(1).standard_normal(x.shape))
    value, tangent = func.jvp(w2(img), (x,), (dx,))
    xr = x.clone().requires_grad_(True)
    (ref,) = torch.autograd.grad(w2(img)(xr), xr)
    torch.testing.assert_close(tangent, (ref * dx).sum(), rtol=0, atol=1e-12)


def test_third_derivative_raises(data):
    x, img = data
    with pytest.raises(NotImplementedError, match="sdot: the derivative|third derivatives"):
        func.jacrev(func.grad(lambda x: func.grad(w2(img))(x)[0, 0]))(x)


@pytest.mark.parametrize("third", [
    lambda f: func.jacrev(func.jacrev(func.grad(f))),
    lambda f: func.jacfwd(func.jacfwd(func.grad(f))),
    lambda f: func.jacfwd(func.jacrev(func.grad(f))),
    lambda f: func.jacrev(func.hessian(f)),
], ids=["rev-rev-grad", "fwd-fwd-grad", "fwd-rev-grad", "rev-hessian"])
def test_every_third_derivative_composition_raises(data, third):
    """Nestings of three derivative transforms raise instead of returning zeros (the rules'
    products are computed outside the transforms, which would take them as constants)."""
    x, img = data
    with pytest.raises(NotImplementedError, match="third derivatives of W2"):
        third(w2(img))(x[:6])


def test_second_derivatives_of_the_plan_raise_and_unrelated_outer_transforms_do_not(data):
    x, img = data
    with pytest.raises(NotImplementedError, match="second derivatives of the plan"):
        func.jacfwd(func.jacrev(bary(img)))(x[:6])
    # an outer grad over a parameter the solve does not see is no derivative of the plan
    t = torch.tensor(2.0, dtype=x.dtype)
    g = func.grad(lambda t: t * func.jacrev(bary(img))(x).sum())(t)
    torch.testing.assert_close(g, func.jacrev(bary(img))(x).sum(), rtol=0, atol=1e-12)


def test_no_convergence_raises_per_item(data):
    x, img = data
    with pytest.raises(sdot.OtNotConverged):
        func.grad(lambda x: sdot.distance(sdot.SumOfDiracs(x), sdot.Grid(img), max_iter=0))(x)


def test_mass_mismatch_raises_per_item(data):
    x, img = data
    f = lambda x: sdot.distance(sdot.SumOfDiracs(x, mass=2.0), sdot.Grid(img, mass=1.0))   # noqa: E731
    with pytest.raises(NotImplementedError, match="heavier than the target"):
        func.grad(f)(x)
    with pytest.raises(NotImplementedError, match="heavier than the target"):
        func.vmap(f)(torch.stack([x, x]))


def test_periodic_domains(data):
    """On the torus (and the circle): grad equals autograd, vmap the items, jacrev of the
    barycentres autograd's rows, the Hessian is symmetric and its product central differences of
    the gradient; each item is solved on its plain values with the metric's periods."""
    from sdot.metrics import Norm2, PeriodicMetric

    x, img = data
    torus = PeriodicMetric(Norm2(), [1.0, 1.0])
    x = torch.remainder(x + 0.35, 1.0)                  # cells across the sides
    w = lambda x: sdot.distance(sdot.SumOfDiracs(x), sdot.Grid(img), metric=torus, tol=TOL)      # noqa: E731
    b = lambda x: sdot.barycenters(sdot.SumOfDiracs(x), sdot.Grid(img), metric=torus, tol=TOL)   # noqa: E731
    xr = x.clone().requires_grad_(True)
    (ref,) = torch.autograd.grad(w(xr), xr)
    torch.testing.assert_close(func.grad(w)(x), ref, rtol=0, atol=1e-12)
    batch = torch.stack([x, torch.remainder(x + 0.5, 1.0)])
    torch.testing.assert_close(func.vmap(w)(batch), torch.stack([w(a) for a in batch]), rtol=1e-13, atol=0)
    row = torch.autograd.grad(b(xr)[3, 0], xr)[0]
    torch.testing.assert_close(func.jacrev(b)(x)[3, 0], row, rtol=0, atol=1e-12)
    h = func.hessian(w)(x).reshape(40, 40)
    torch.testing.assert_close(h, h.T, rtol=0, atol=1e-10)
    dy = torch.tensor(np.random.default_rng(5).standard_normal((20, 2)))
    step = 1e-6
    fd = (func.grad(w)(x + step * dy) - func.grad(w)(x - step * dy)) / (2 * step)
    torch.testing.assert_close((h @ dy.reshape(-1)).reshape(20, 2), fd, rtol=1e-4, atol=1e-6 * float(fd.abs().max()))
    circle = PeriodicMetric(Norm2(), [1.0])
    c = lambda y: sdot.distance(sdot.SumOfDiracs1d(y), sdot.Grid(img[:, 0]), metric=circle)      # noqa: E731
    yr = x[:, 0].clone().requires_grad_(True)
    torch.testing.assert_close(func.grad(c)(x[:, 0]), torch.autograd.grad(c(yr), yr)[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("periodic", [False, True])
def test_partial_transport(data, periodic):
    """A target heavier than the source (the masses given as numbers): grad of W2^2 with
    respect to the positions and the pixels equals autograd's, vmap the items, jacfwd the
    gradient; the Hessian, and jacrev of the barycentres, raise (first order only); jacfwd of
    the barycentres is NaN, never a silent zero. On the torus too."""
    from sdot.metrics import Norm2, PeriodicMetric

    x, img = data
    metric = PeriodicMetric(Norm2(), [1.0, 1.0]) if periodic else None
    w = lambda x: sdot.distance(sdot.SumOfDiracs(x), sdot.Grid(img, mass=1.8), metric=metric)      # noqa: E731
    xr = x.clone().requires_grad_(True)
    (ref,) = torch.autograd.grad(w(xr), xr)
    torch.testing.assert_close(func.grad(w)(x), ref, rtol=0, atol=1e-14)
    torch.testing.assert_close(func.jacfwd(w)(x), ref, rtol=0, atol=1e-14)
    batch = torch.stack([x, torch.flip(x, (0,))])
    torch.testing.assert_close(func.vmap(w)(batch), torch.stack([w(a) for a in batch]), rtol=1e-13, atol=0)
    v = lambda values: sdot.distance(sdot.SumOfDiracs(x), sdot.Grid(values, mass=1.8), metric=metric)  # noqa: E731
    vr = img.clone().requires_grad_(True)
    torch.testing.assert_close(func.grad(v)(img), torch.autograd.grad(v(vr), vr)[0], rtol=0, atol=1e-14)
    with pytest.raises(NotImplementedError, match="not implemented"):
        func.hessian(w)(x)
    b = lambda x: sdot.barycenters(sdot.SumOfDiracs(x), sdot.Grid(img, mass=1.8), metric=metric)   # noqa: E731
    with pytest.raises(NotImplementedError, match="partial plan's barycenters"):
        func.jacrev(b)(x)
    assert torch.isnan(func.jacfwd(b)(x)).all()
