"""The differentiable plan (implicit differentiation): barycentres, Brenier potentials, cell
masses and W2^2 with respect to positions, weights, grid values and domain, in 1D, 2D and 3D;
second derivatives of W2^2. Ground truth: central finite differences of the solver itself at
a tight tolerance (a derivative is the limit of the solver's own outputs), closed forms
(translation, scaling), and transposition identities between the two modes."""
from __future__ import annotations

import numpy as np
import pytest

import sdot

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = jax.numpy

TOL = 1e-13
OUTPUTS = ("distance", "barycenters", "brenier_potential", "cell_masses")


def problem(dim, n=None, seed=0, zero_background=False):
    """Diracs, weights, grid values and a non-unit domain in dimension ``dim``."""
    rng = np.random.default_rng(seed)
    n = n or {1: 9, 2: 16, 3: 10}[dim]
    shape = {1: (7,), 2: (5, 4), 3: (3, 3, 2)}[dim]
    lo, hi = np.array([-1.0, 0.5, 0.0][:dim]), np.array([2.0, 1.5, 2.0][:dim])
    x = lo + (hi - lo) * rng.uniform(0.15, 0.85, (n, dim))
    w = rng.uniform(0.5, 1.5, n)
    values = rng.uniform(0.5, 1.5, shape)
    if zero_background:
        values[0] = 0.0
        values[..., -1] = 0.0
    return x, w, values, (lo, hi)


def solve(x, w, values, domain):
    return sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(x, w), sdot.PolynomialGrid(values, domain=domain),
                                       tol=TOL)


def directions(x, w, values, domain, rng, which):
    t = dict(positions=rng.normal(size=x.shape), weights=rng.normal(size=w.shape), values=rng.normal(size=values.shape),
             domain=(0.05 * rng.normal(size=x.shape[1]), 0.05 * rng.normal(size=x.shape[1])))
    return {k: t[k] for k in which}


def moved(x, w, values, domain, t, h):
    lo, hi = domain
    dlo, dhi = t.get("domain", (0.0, 0.0))
    return (x + h * t.get("positions", 0.0), w + h * t.get("weights", 0.0), values + h * t.get("values", 0.0),
            (lo + h * dlo, hi + h * dhi))


def central(x, w, values, domain, t, h=1e-6):
    plus, minus = solve(*moved(x, w, values, domain, t, h)), solve(*moved(x, w, values, domain, t, -h))
    return {k: (np.asarray(getattr(plus, k)) - np.asarray(getattr(minus, k))) / (2 * h) for k in OUTPUTS}


def assert_close(got, want, rtol=1e-5):
    scale = max(np.max(np.abs(want)), 1e-3)
    assert np.max(np.abs(np.asarray(got) - want)) <= rtol * scale, (np.max(np.abs(np.asarray(got) - want)), scale)


@pytest.mark.parametrize("dim", [1, 2, 3])
@pytest.mark.parametrize("which", [("positions",), ("weights",), ("values",), ("domain",)])
def test_numpy_jvp_matches_finite_differences(sdot_driver, dim, which):
    sdot_driver.framework = "numpy"
    x, w, values, domain = problem(dim)
    t = directions(x, w, values, domain, np.random.default_rng(1), which)
    got = solve(x, w, values, domain).jvp(**t)
    want = central(x, w, values, domain, t)
    for k in OUTPUTS:
        assert_close(got[k], want[k])


@pytest.mark.parametrize("dim", [1, 2, 3])
def test_numpy_vjp_is_the_transpose_of_jvp(sdot_driver, dim):
    sdot_driver.framework = "numpy"
    x, w, values, domain = problem(dim, zero_background=dim > 1)
    plan = solve(x, w, values, domain)
    rng = np.random.default_rng(2)
    t = directions(x, w, values, domain, rng, ("positions", "weights", "values", "domain"))
    c = dict(distance=rng.normal(), barycenters=rng.normal(size=x.shape), brenier_potential=rng.normal(size=w.shape),
             cell_masses=rng.normal(size=w.shape))
    forward, backward = plan.jvp(**t), plan.vjp(**c)
    lhs = sum(np.sum(forward[k] * c[k]) for k in OUTPUTS)
    rhs = (np.sum(backward["positions"] * t["positions"]) + np.sum(backward["weights"] * t["weights"])
           + np.sum(backward["values"] * t["values"]) + sum(np.sum(a * b) for a, b in zip(backward["domain"], t["domain"])))
    assert abs(lhs - rhs) <= 1e-10 * max(abs(lhs), 1.0)


def test_numpy_jvp_refuses_tangents_of_the_wrong_shape(sdot_driver):
    """A tangent must have its input's shape (a SplineGrid's own values, 1D positions (n, 1)),
    and a SumOfDiracs has no weights to perturb: clear ValueErrors, not IndexErrors."""
    sdot_driver.framework = "numpy"
    rng = np.random.default_rng(3)
    x = rng.random((12, 2))
    spline = sdot.SplineGrid(0.5 + rng.random((4, 5)), continuity=1)
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(x), spline)
    assert np.isfinite(plan.jvp(values=np.ones((4, 5)))["distance"])
    with pytest.raises(ValueError, match="tangent of values must have the shape of values, \\(4, 5\\)"):
        plan.jvp(values=np.ones((4, 5, 9)))                     # the Bernstein layout is not the spline's
    with pytest.raises(ValueError, match="no weights"):
        plan.jvp(weights=np.ones(12))
    line = sdot.optimal_transport_plan(sdot.SumOfDiracs1d(x[:, 0]), sdot.Grid(np.ones(4)))
    with pytest.raises(ValueError, match="positions must have the shape of positions, \\(12, 1\\)"):
        line.jvp(positions=np.ones(12))


def test_hard_inputs_zero_background_duplicates_and_an_empty_cell(sdot_driver):
    """A zero background, two exact duplicates moved together and a zero-mass Dirac: the
    derivatives along smooth directions still match the solver's finite differences."""
    sdot_driver.framework = "numpy"
    x, w, values, domain = problem(2, n=14, seed=3, zero_background=True)
    x[1] = x[0]
    w[5] = 0.0
    rng = np.random.default_rng(4)
    t = directions(x, w, values, domain, rng, ("positions", "values"))
    t["positions"][1] = t["positions"][0]
    t["values"] = t["values"] * (values > 0)                         # the zero pixels stay zero
    want = central(x, w, values, domain, t)
    got = solve(x, w, values, domain).jvp(**t)
    for k in OUTPUTS:
        assert_close(got[k], want[k])
    assert_close(got["barycenters"][5], t["positions"][5])        # an empty cell's barycentre is its Dirac


def test_tiny_and_huge_scales_and_a_far_dirac(sdot_driver):
    """The derivative of the barycentres is scale-free (a problem scaled by 1e-6 or 1e6 gives the
    same, to rounding), and a Dirac far outside the support (its cell reaches across the
    zero background) still matches the finite differences."""
    sdot_driver.framework = "numpy"
    x, w, values, (lo, hi) = problem(2, n=14, seed=3, zero_background=True)
    rng = np.random.default_rng(4)
    dx = rng.normal(size=x.shape)
    base = solve(x, w, values, (lo, hi)).jvp(positions=dx)
    for s in (1e-6, 1e6):
        out = solve(x * s, w, values, (lo * s, hi * s)).jvp(positions=dx * s)
        np.testing.assert_allclose(out["barycenters"] / s, base["barycenters"], atol=1e-12)
        assert abs(out["distance"] / s ** 2 - base["distance"]) <= 1e-12 * abs(base["distance"]) + 1e-14
    x[2] = [50.0, -40.0]
    t = dict(positions=dx, values=rng.normal(size=values.shape) * (values > 0))
    want = central(x, w, values, (lo, hi), t)
    got = solve(x, w, values, (lo, hi)).jvp(**t)
    for k in OUTPUTS:
        assert_close(got[k], want[k])


def test_translation_and_scaling_of_seeds_and_domain(sdot_driver):
    """Moving the Diracs and the domain together translates the barycentres (derivative: the
    translation) and keeps W2^2; scaling both by s scales the barycentres by s and W2^2 by s^2."""
    sdot_driver.framework = "numpy"
    x, w, values, domain = problem(2)
    plan = solve(x, w, values, domain)
    a = np.array([0.3, -0.7])
    out = plan.jvp(positions=np.broadcast_to(a, x.shape), domain=(a, a))
    np.testing.assert_allclose(out["barycenters"], np.broadcast_to(a, x.shape), atol=1e-9)
    assert abs(out["distance"]) < 1e-10
    np.testing.assert_allclose(out["cell_masses"], 0.0, atol=1e-10)
    out = plan.jvp(positions=x, domain=domain)                      # d/ds at s = 1 of s (x, domain)
    np.testing.assert_allclose(out["barycenters"], plan.barycenters, atol=1e-9)
    np.testing.assert_allclose(out["distance"], 2 * plan.distance, rtol=1e-9)
    out = plan.jvp(positions=np.random.default_rng(5).normal(size=x.shape))
    np.testing.assert_allclose(out["cell_masses"], 0.0, atol=1e-10)   # balanced: the masses are the targets
    assert abs(np.mean(out["brenier_potential"])) < 1e-12              # the gauge (mean 0) is kept
    assert np.max(np.abs(out["brenier_potential"])) > 1e-3


def _torch_problem(dim=2, n=None):
    x, w, values, (lo, hi) = problem(dim, n=n)
    return [torch.tensor(a, requires_grad=True) for a in (x, w, values, lo, hi)]


def _torch_plan(x, w, values, lo, hi):
    return sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(x, w), sdot.PolynomialGrid(values, domain=(lo, hi)),
                                       tol=TOL)


def test_torch_gradcheck_of_the_plan():
    args = _torch_problem(n=8)

    def outputs(*a):
        plan = _torch_plan(*a)
        return plan.barycenters, plan.brenier_potential, plan.cell_masses
    assert torch.autograd.gradcheck(outputs, args, eps=1e-6, atol=1e-5, rtol=1e-4)


def test_torch_forward_mode_and_double_backward():
    """Forward-mode AD of the barycentres; Hessian-vector products of W2^2 (double backward)
    against finite differences of its gradient; a third derivative raises."""
    import torch.autograd.forward_ad as fwAD

    x, w, values, lo, hi = _torch_problem()
    rng = np.random.default_rng(6)
    dx = torch.tensor(rng.normal(size=tuple(x.shape)))
    with fwAD.dual_level():
        plan = _torch_plan(fwAD.make_dual(x.detach(), dx), w.detach(), values.detach(), lo.detach(), hi.detach())
        tangent = fwAD.unpack_dual(plan.barycenters).tangent
    want = central(*(a.detach().numpy() for a in (x, w, values)), (lo.detach().numpy(), hi.detach().numpy()),
                   dict(positions=dx.numpy()))
    assert_close(tangent.numpy(), want["barycenters"])

    def grad(x, values):
        return torch.autograd.grad(_torch_plan(x, w, values, lo, hi).distance, (x, values), create_graph=True)
    gx, gv = grad(x, values)
    dv = torch.tensor(rng.normal(size=tuple(values.shape)))
    hx, hv = torch.autograd.grad((gx * dx).sum() + (gv * dv).sum(), (x, values), create_graph=True)
    h = 1e-6

    def grad_at(s):
        xs = (x + s * dx).detach().requires_grad_()
        vs = (values + s * dv).detach().requires_grad_()
        return torch.autograd.grad(_torch_plan(xs, w, vs, lo, hi).distance, (xs, vs))
    (px, pv), (mx, mv) = grad_at(h), grad_at(-h)
    assert_close(hx.detach().numpy(), ((px - mx) / (2 * h)).numpy())
    assert_close(hv.detach().numpy(), ((pv - mv) / (2 * h)).numpy())
    assert float(hx.detach().abs().max()) > 1e-2                        # not the silent zeros of before
    with pytest.raises(NotImplementedError, match="third derivatives"):
        torch.autograd.grad((hx * dx).sum(), x)


def _jax_plan(x, w, values, lo, hi):
    return sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(x, w), sdot.PolynomialGrid(values, domain=(lo, hi)),
                                       tol=TOL)


def _jax_problem(n=10):
    x, w, values, (lo, hi) = problem(2, n=n)
    return tuple(jnp.asarray(a) for a in (x, w, values, lo, hi))


def test_jax_check_grads_hessian_and_what_is_not_there():
    """Eagerly: ``check_grads`` of the barycentres in both modes; the Hessian of W2^2 against
    finite differences of its gradient; third derivatives NaN; domain second derivatives raise."""
    from jax.test_util import check_grads

    x, w, values, lo, hi = _jax_problem()
    bary = lambda x, values: _jax_plan(x, w, values, lo, hi).barycenters      # noqa: E731
    check_grads(bary, (x, values), order=1, modes=("fwd", "rev"), eps=1e-6, atol=1e-5, rtol=1e-4)
    dist = lambda x: _jax_plan(x, w, values, lo, hi).distance       # noqa: E731
    hess = jax.hessian(dist)(x)
    dx = jnp.asarray(np.random.default_rng(7).normal(size=x.shape))
    grad = jax.grad(dist)
    h = 1e-6
    want = (grad(x + h * dx) - grad(x - h * dx)) / (2 * h)
    assert_close(np.asarray(jnp.einsum("iajb,jb->ia", hess, dx)), np.asarray(want))
    assert float(jnp.max(jnp.abs(hess))) > 1e-2                     # not the silent zeros of before
    assert bool(jnp.all(jnp.isnan(jax.jacfwd(jax.hessian(dist))(x))))      # third derivatives: NaN, not 0
    with pytest.raises(NotImplementedError, match="domain"):
        jax.hessian(lambda lo: _jax_plan(x, w, values, lo, hi).distance)(lo)


def test_jax_under_jit_vmap_and_scan_equals_eager_and_torch():
    """One compiled program: a ``lax.scan`` of gradient steps of a barycentre loss, ``vmap``-ed
    over a batch, and the Hessian of W2^2; equal to the eager host path, and torch's gradient
    equals JAX's to 1e-10."""
    x, w, values, lo, hi = _jax_problem()
    c = jnp.asarray(np.random.default_rng(8).normal(size=x.shape))
    loss = lambda x: jnp.sum(_jax_plan(x, w, values, lo, hi).barycenters * c)     # noqa: E731
    dist = lambda x: _jax_plan(x, w, values, lo, hi).distance       # noqa: E731

    def program(batch):
        def step(batch, _):
            value, grad = jax.vmap(jax.value_and_grad(loss))(batch)
            return batch - 1e-3 * grad, (value, grad)
        _, (values, grads) = jax.lax.scan(step, batch, None, 2)
        return values, grads[0], jax.hessian(dist)(batch[0])
    batch = jnp.stack([x, x * 0.9 + 0.05])
    losses, grads, hess = jax.jit(program)(batch)
    np.testing.assert_allclose(grads[1], jax.grad(loss)(batch[1]), atol=1e-9)
    np.testing.assert_allclose(hess, jax.hessian(dist)(x), atol=1e-8)
    assert np.all(losses[1] < losses[0])                     # gradient steps on the loss
    xt = torch.tensor(np.asarray(x), requires_grad=True)
    plan = _torch_plan(xt, *(torch.tensor(np.asarray(a)) for a in (w, values, lo, hi)))
    (plan.barycenters * torch.tensor(np.asarray(c))).sum().backward()
    np.testing.assert_allclose(xt.grad.numpy(), np.asarray(grads[0]), atol=1e-10)


def _core_products(xp, x, m, values, lo, hi, t, c):
    """The core's tangents and cotangents (:mod:`sdot._core.sensitivity`) of one solve in ``xp``."""
    from sdot import _differentiable
    from sdot._core import evaluation, plan
    from sdot._core.density import PixelDensity

    prob = evaluation.Problem(x, m, PixelDensity(values, lo, hi))
    res = plan.solve_plan(xp, prob, 1e-13, 100)
    lin = _differentiable.linearization(prob, res)
    rule = _differentiable.PlanRule(("distance", "barycenters", "brenier_potential", "cell_masses", "potential"))
    return rule.jvp(lin, t), rule.vjp(lin, c, (True,) * 5)


@pytest.mark.parametrize("dim", [2, 3])
@pytest.mark.skip_backends("jax-jit", reason="compiled: test_jax_under_jit_vmap_and_scan_equals_eager_and_torch")
@pytest.mark.skip_backends("jax", reason="eager JAX solves on the host's NumPy core and compiles each operation here "
                           "(40 s): JAX runs these products under jit in test_jax_jit_host.py::test_the_callback_and_"
                           "the_compiled_route_agree (2D) and test_bernstein_plan_derivatives.py::test_3d_kernels_on_"
                           "every_backend (3D)")
def test_core_products_on_every_backend(backend, dim):
    """The tangent map and its transpose in the backend's namespace (array_api_strict with and
    without data-dependent shapes, torch) equal NumPy's."""
    x, w, values, (lo, hi) = problem(dim, n=8)
    m = w / w.sum()
    values = values / (values.sum() * np.prod((hi - lo) / values.shape))
    rng = np.random.default_rng(9)
    dm = rng.normal(size=m.shape)
    t = (rng.normal(size=x.shape), dm - dm.mean(), rng.normal(size=values.shape), rng.normal(size=lo.shape) * 0.1,
         rng.normal(size=hi.shape) * 0.1)
    c = (np.asarray(rng.normal()), rng.normal(size=x.shape), rng.normal(size=m.shape), rng.normal(size=m.shape),
         rng.normal(size=values.shape))
    want = _core_products(np, x, m, values, lo, hi, t, c)
    with backend.shapes():
        got = _core_products(backend.xp, *(backend.asarray(a) for a in (x, m, values, lo, hi)),
                             tuple(backend.asarray(a) for a in t), tuple(backend.asarray(a) for a in c))
    for g, w_ in zip(got[0] + got[1], want[0] + want[1]):
        np.testing.assert_allclose(backend.to_numpy(g), w_, rtol=1e-9, atol=1e-11)
