"""The derivatives of the plan (barycentres, Brenier potential, cell masses, W2^2) for a
``PolynomialGrid`` of Bernstein degree p > 0, by implicit differentiation.

Ground truth that does not come from the code under test: the facet and axis moments of the
density against an independent quadrature (scipy's Laguerre cells clipped to every grid cell,
each edge cut at the grid lines, Gauss rules of high order on the density evaluated from its
definition, :mod:`reference`); the constant-cell kernels (all coefficients equal: the pixel
grid, itself checked in test_sensitivity_integrals.py); degree elevation (the same density
written with degree p + 1); central finite differences of the solver's outputs; the
transposition identity between the two modes; torch's gradcheck; torch == JAX.
"""
from __future__ import annotations


import array_api_compat.numpy as npx
import numpy as np
import pytest

import reference
import sdot
from sdot._core import plan as core_plan
from sdot._core.density import BernsteinDensity, PixelDensity

torch = pytest.importorskip("torch")
jax = pytest.importorskip("jax")
jnp = jax.numpy

TOL = 1e-13
OUTPUTS = ("distance", "barycenters", "brenier_potential", "cell_masses")


# ------------------------------------------------------------------ ground truth
def edge_moments(a, b, seed, coefficients, lo, hi, order=8):
    """``(f0, f1 (2,), f2 (2, 2))`` of the segment ``a -> b``: cut at every grid line, Gauss-Legendre
    of ``order`` points on each part, the density from its definition (:func:`reference.bernstein_density`)."""
    n0, n1, _ = coefficients.shape
    d = b - a
    cuts = [0.0, 1.0]
    for axis, count in ((0, n0), (1, n1)):
        if d[axis] != 0:
            t = (np.linspace(lo[axis], hi[axis], count + 1) - a[axis]) / d[axis]
            cuts += list(t[(t > 0) & (t < 1)])
    cuts = np.sort(cuts)
    x, w = np.polynomial.legendre.leggauss(order)
    size = (hi - lo) / [n0, n1]
    f0, f1, f2 = 0.0, np.zeros(2), np.zeros((2, 2))
    for t0, t1 in zip(cuts[:-1], cuts[1:]):
        pts = a + (t0 + (t1 - t0) * 0.5 * (x[:, None] + 1.0)) * d
        cell_lo = lo + np.floor((a + 0.5 * (t0 + t1) * d - lo) / size) * size
        rho = reference.bernstein_density(np.clip(pts, cell_lo, cell_lo + size), coefficients, lo, hi)
        weight = 0.5 * w * rho * (t1 - t0) * np.linalg.norm(d)
        u = pts - seed
        f0, f1, f2 = f0 + weight.sum(), f1 + weight @ u, f2 + (weight[:, None] * u).T @ u
    return f0, f1, f2


def axis_moments(poly, seed, coefficients, lo, hi, order=8):
    """``int (x_a - y_a)^2 rho`` (2,) over the polygon: clipped to every grid cell, fans of
    triangles, a collapsed Gauss rule (as :func:`reference.bernstein_cell_moments`)."""
    n0, n1, _ = coefficients.shape
    ex, ey = np.linspace(lo[0], hi[0], n0 + 1), np.linspace(lo[1], hi[1], n1 + 1)
    nodes, weights = reference._triangle_rule(order)
    out = np.zeros(2)
    for i in range(n0):
        column = reference._clip(reference._clip(poly, 0, ex[i], False), 0, ex[i + 1], True)
        for j in range(n1 if len(column) >= 3 else 0):
            piece = reference._clip(reference._clip(column, 1, ey[j], False), 1, ey[j + 1], True)
            for k in range(1, len(piece) - 1):
                p0, p1, p2 = piece[0], piece[k], piece[k + 1]
                jac = (p1[0] - p0[0]) * (p2[1] - p0[1]) - (p1[1] - p0[1]) * (p2[0] - p0[0])
                pts = p0 + nodes[:, :1] * (p1 - p0) + nodes[:, 1:] * (p2 - p0)
                rho = reference.bernstein_density(np.clip(pts, [ex[i], ey[j]], [ex[i + 1], ey[j + 1]]), coefficients,
                                                  lo, hi)
                out += (weights * rho * jac) @ (pts - seed) ** 2
    return out


def elevated(coefficients, dim):
    """The same density with Bernstein degree p + 1 per axis (degree elevation, exact):
    ``c'_k = k / (p + 1) c_(k-1) + (1 - k / (p + 1)) c_k`` along each axis."""
    q = round(coefficients.shape[-1] ** (1 / dim))
    grid = coefficients.shape[:-1]
    c = coefficients.reshape(grid + (q,) * dim)
    for axis in range(dim):
        c = np.moveaxis(c, len(grid) + axis, -1)
        k = np.arange(q + 1) / q
        padded = np.concatenate([np.zeros(c.shape[:-1] + (1,)), c, np.zeros(c.shape[:-1] + (1,))], axis=-1)
        c = np.moveaxis(k * padded[..., :-1] + (1 - k) * padded[..., 1:], -1, len(grid) + axis)
    return c.reshape(grid + ((q + 1) ** dim,))


def diagram(seeds, psi, lo, hi):
    """The cells of ``(seeds, psi)`` in the box, on NumPy (the geometry is not under test here)."""
    ones = np.ones((1,) * seeds.shape[1])
    return core_plan.diagram(npx, seeds, psi, PixelDensity(ones, lo, hi)).cells


def on_backend(b, cells):
    return type(cells)(*(b.asarray(getattr(cells, f), dtype=np.asarray(getattr(cells, f)).dtype)
                         for f in type(cells)._fields))


def kernels(b, seeds, cells, coefficients, lo, hi):
    """The facet moments and axis second moments of the Bernstein density on backend ``b``."""
    def run(s, c, k, l, h):
        density = BernsteinDensity(k, l, h)
        return density.facet_moments(b.xp, s, c) + (density.axis_second_moments(b.xp, s, c),)
    args = [b.asarray(a) for a in (seeds, coefficients, lo, hi)]
    return [b.to_numpy(a) for a in b.run(run, args[0], on_backend(b, cells), *args[1:])]


# ------------------------------------------------------------------ the kernels
def test_facet_and_axis_moments_against_independent_quadrature(backend):
    """A random degree-2 density with a zero grid cell, cells across several grid cells and a
    Dirac outside the box: per edge ``int rho (1, u, u u^T)``, per cell ``int (x_a - y_a)^2 rho``,
    to 1e-12 of the largest."""
    rng = np.random.default_rng(3)
    lo, hi = np.array([-0.5, 0.25]), np.array([1.5, 1.0])
    seeds = lo + (hi - lo) * rng.random((7, 2))
    seeds[0] = [1.9, 0.5]
    psi = 0.05 * rng.random(7)
    coefficients = 0.2 + rng.random((3, 3, 9))
    coefficients[1, 1] = 0.0
    cells = diagram(seeds, psi, lo, hi)
    f0, f1, f2, axes = kernels(backend, seeds, cells, coefficients, lo, hi)
    want = [np.zeros_like(f0), np.zeros_like(f1), np.zeros_like(f2)]
    for i in range(len(seeds)):
        k = int(cells.count[i])
        for s in range(k):
            a, b = seeds[i] + cells.vertices[i, s], seeds[i] + cells.vertices[i, (s + 1) % k]
            for out, value in zip(want, edge_moments(a, b, seeds[i], coefficients, lo, hi)):
                out[i, s] = value
    polys = reference.laguerre_cells(seeds, psi, lo, hi)
    want_axes = np.array([axis_moments(p, seeds[i], coefficients, lo, hi) if p is not None else np.zeros(2)
                          for i, p in enumerate(polys)])
    for got, ref in zip((f0, f1, f2, axes), want + [want_axes]):
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12 * np.abs(ref).max())


@pytest.mark.parametrize("dim", [1, 2, 3])
def test_equal_coefficients_are_the_constant_cells_and_elevation_changes_nothing(dim):
    """All coefficients of a grid cell equal: the facet moments, the polynomial integrals (summed
    over the basis) and the axis second moments of the pixel grid of their value, to 1e-13; a
    degree-1 density and its degree-2 elevation give the same facet and axis moments."""
    rng = np.random.default_rng(dim)
    shape = {1: (5,), 2: (3, 4), 3: (2, 3, 2)}[dim]
    lo, hi = np.array([-0.5, 0.0, 0.2][:dim]), np.array([1.0, 1.2, 1.0][:dim])
    seeds = lo + (hi - lo) * rng.random((9, dim))
    cells = diagram(seeds, 0.02 * rng.random(9), lo, hi)
    values = 0.2 + rng.random(shape)
    values[(0,) * dim] = 0.0
    coef = rng.normal(size=(9, dim + 2))
    pixel = PixelDensity(values, lo, hi)
    constant = BernsteinDensity(np.broadcast_to(values[..., None], shape + (3 ** dim,)).copy(), lo, hi)
    for got, want in zip(constant.facet_moments(npx, seeds, cells), pixel.facet_moments(npx, seeds, cells)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-13 * np.abs(want).max())
    np.testing.assert_allclose(constant.axis_second_moments(npx, seeds, cells), pixel.axis_second_moments(npx, seeds, cells),
                               rtol=1e-13)
    per_basis = constant.polynomial_integrals(npx, seeds, cells, coef)
    np.testing.assert_allclose(per_basis.sum(axis=-1), pixel.polynomial_integrals(npx, seeds, cells, coef),
                               rtol=0, atol=1e-13 * np.abs(per_basis).sum())
    linear = BernsteinDensity(0.2 + rng.random(shape + (2 ** dim,)), lo, hi)
    quadratic = BernsteinDensity(elevated(linear.coefficients, dim), lo, hi)
    for got, want in zip(quadratic.facet_moments(npx, seeds, cells), linear.facet_moments(npx, seeds, cells)):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-13 * np.abs(want).max())
    np.testing.assert_allclose(quadratic.axis_second_moments(npx, seeds, cells),
                               linear.axis_second_moments(npx, seeds, cells), rtol=1e-12)


# ------------------------------------------------------------------ NumPy's jvp and vjp
def problem(dim, p, seed=0):
    """Diracs, weights, Bernstein coefficients of degree ``p`` with a zero region (a grid slice and
    the last cells of every row), and a non-unit domain."""
    rng = np.random.default_rng(seed)
    n = {1: 8, 2: 14, 3: 9}[dim]
    shape = {1: (6,), 2: (5, 4), 3: (3, 3, 2)}[dim]
    lo, hi = np.array([-1.0, 0.5, 0.0][:dim]), np.array([2.0, 1.5, 2.0][:dim])
    x = lo + (hi - lo) * rng.uniform(0.15, 0.85, (n, dim))
    w = rng.uniform(0.5, 1.5, n)
    c = rng.uniform(0.2, 1.5, shape + ((p + 1) ** dim,))
    c[0] = 0.0
    if dim > 1:
        c[..., -1, :] = 0.0
    return x, w, c, (lo, hi)


def solve(x, w, c, domain):
    return sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(x, w), sdot.PolynomialGrid(c, domain=domain), tol=TOL)


def directions(x, w, c, rng):
    """Random tangents of every input; the coefficients' only where they are positive (the
    density stays nonnegative)."""
    d = x.shape[1]
    return dict(positions=rng.normal(size=x.shape), weights=rng.normal(size=w.shape),
                values=rng.normal(size=c.shape) * (c > 0), domain=(0.05 * rng.normal(size=d), 0.05 * rng.normal(size=d)))


def central(x, w, c, domain, which, t, h=1e-6):
    def moved(s):
        lo, hi = domain
        args = dict(positions=x, weights=w, values=c, domain=(lo, hi))
        base = args[which]
        args[which] = (base[0] + s * t[0], base[1] + s * t[1]) if which == "domain" else base + s * t
        return solve(args["positions"], args["weights"], args["values"], args["domain"])
    plus, minus = moved(h), moved(-h)
    return {k: (np.asarray(getattr(plus, k)) - np.asarray(getattr(minus, k))) / (2 * h) for k in OUTPUTS}


@pytest.mark.parametrize("dim, p", [(2, 1), (2, 2), (1, 2), (3, 1)])
def test_numpy_jvp_matches_finite_differences(sdot_driver, dim, p):
    """Along the positions, the weights, the coefficients and the domain, the tangents of every
    output against central differences of the solver (FP64, tol 1e-13, h = 1e-6), to 1e-5 of the
    largest entry (1e-3 floor)."""
    sdot_driver.framework = "numpy"
    x, w, c, domain = problem(dim, p)
    plan = solve(x, w, c, domain)
    for which, t in directions(x, w, c, np.random.default_rng(1)).items():
        got = plan.jvp(**{which: t})
        want = central(x, w, c, domain, which, t)
        for k in OUTPUTS:
            scale = max(np.max(np.abs(want[k])), 1e-3)
            assert np.max(np.abs(got[k] - want[k])) <= 1e-5 * scale, (which, k)


@pytest.mark.parametrize("dim", [2, 3])
def test_numpy_vjp_is_the_transpose_of_jvp(sdot_driver, dim):
    """``<c, J t> == <J^T c, t>`` for random input tangents ``t`` and output cotangents ``c``, to 1e-10."""
    sdot_driver.framework = "numpy"
    x, w, c, domain = problem(dim, 2 if dim == 2 else 1, seed=4)
    plan = solve(x, w, c, domain)
    rng = np.random.default_rng(5)
    t = directions(x, w, c, rng)
    cots = dict(distance=rng.normal(), barycenters=rng.normal(size=x.shape), brenier_potential=rng.normal(size=w.shape),
                cell_masses=rng.normal(size=w.shape))
    forward = plan.jvp(**t)
    backward = plan.vjp(**cots)
    lhs = sum(float(np.sum(cots[k] * forward[k])) for k in OUTPUTS)
    rhs = sum(float(np.sum(backward[k] * t[k])) for k in ("positions", "weights", "values")) \
        + float(np.sum(backward["domain"][0] * t["domain"][0]) + np.sum(backward["domain"][1] * t["domain"][1]))
    assert lhs == pytest.approx(rhs, rel=1e-10, abs=1e-12)


def test_equal_coefficients_give_the_constant_cell_derivatives(sdot_driver):
    """A degree-2 grid whose coefficients are equal per cell: every output tangent (positions,
    weights, values summed over the basis, domain) equals the constant-cell grid's to 1e-9."""
    sdot_driver.framework = "numpy"
    x, w, c, domain = problem(2, 0, seed=6)
    values = c[..., 0]
    poly = solve(x, w, np.broadcast_to(values[..., None], values.shape + (9,)).copy(), domain)
    grid = solve(x, w, values, domain)
    t = directions(x, w, values, np.random.default_rng(7))
    for which in ("positions", "weights", "domain"):
        got, want = poly.jvp(**{which: t[which]}), grid.jvp(**{which: t[which]})
        for k in OUTPUTS:
            np.testing.assert_allclose(got[k], want[k], rtol=0, atol=1e-9 * max(np.abs(want[k]).max(), 1.0))
    got = poly.jvp(values=np.broadcast_to(t["values"][..., None], values.shape + (9,)))
    want = grid.jvp(values=t["values"])
    for k in OUTPUTS:
        np.testing.assert_allclose(got[k], want[k], rtol=0, atol=1e-9 * max(np.abs(want[k]).max(), 1.0))


# ------------------------------------------------------------------ torch and JAX
def tiny():
    rng = np.random.default_rng(3)
    return rng.uniform(0.1, 0.9, (6, 2)), 0.3 + rng.random((3, 2, 4))


def test_torch_gradcheck_of_the_barycenters():
    """torch's backward of the barycentres (positions and degree-1 coefficients) against its
    finite differences (fast mode: random projections of the Jacobian); the derivative of W2^2's
    gradient (its Hessian, through the differentiable barycentres) likewise."""
    x, c = tiny()
    args = [torch.tensor(a, requires_grad=True) for a in (x, c)]

    def bary(x, c):
        return sdot.barycenters(sdot.SumOfDiracs(x), sdot.PolynomialGrid(c), tol=TOL)
    assert torch.autograd.gradcheck(bary, args, eps=1e-6, atol=1e-5, rtol=1e-4, nondet_tol=1e-10, fast_mode=True)

    def grad_w2(x):
        (g,) = torch.autograd.grad(sdot.distance(sdot.SumOfDiracs(x), sdot.PolynomialGrid(args[1].detach()), tol=TOL),
                                   x, create_graph=True)
        return g
    assert torch.autograd.gradcheck(grad_w2, (args[0],), eps=1e-6, atol=1e-5, rtol=1e-4, nondet_tol=1e-10, fast_mode=True)


def test_jax_grad_of_the_barycenters_eager_and_jit_equals_torch(sdot_driver):
    """``jax.grad`` of a barycentre loss with respect to positions and coefficients, eagerly and under
    ``jax.jit`` (the default route), equals torch's backward to 1e-10."""
    x, c = tiny()
    weights = np.random.default_rng(8).normal(size=x.shape)
    args = [torch.tensor(a, requires_grad=True) for a in (x, c)]
    (sdot.barycenters(sdot.SumOfDiracs(args[0]), sdot.PolynomialGrid(args[1]), tol=TOL) * torch.tensor(weights)).sum() \
        .backward()
    want = [a.grad.numpy() for a in args]

    def loss(x, c):
        return jnp.sum(sdot.barycenters(sdot.SumOfDiracs(x), sdot.PolynomialGrid(c), tol=TOL) * weights)
    eager = jax.grad(loss, argnums=(0, 1))(jnp.asarray(x), jnp.asarray(c))
    jitted = jax.jit(jax.grad(loss, argnums=(0, 1)))(jnp.asarray(x), jnp.asarray(c))
    for got in (eager, jitted):
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), w, rtol=0, atol=1e-10)


@pytest.mark.only_backends("strict-static", "jax-jit",
                           reason="eager: the code of test_equal_coefficients_...[3] in another namespace")
def test_3d_kernels_on_every_backend(backend):
    """The 3D facet moments and axis second moments of a degree-1 density (a zero voxel) in the
    backend's namespace (the static pieces under array_api_strict without data-dependent shapes
    and under ``jax.jit``) equal NumPy's, checked above against the constant voxels and degree
    elevation, and through the plan's finite differences. (The eager backends run the kernels of
    the NumPy route: only the traced routes are new here; JAX compiles each kernel once.)"""
    rng = np.random.default_rng(11)
    lo, hi = np.array([-0.5, 0.0, 0.2]), np.array([1.0, 1.2, 1.0])
    seeds = lo + (hi - lo) * rng.random((6, 3))
    cells = diagram(seeds, 0.02 * rng.random(6), lo, hi)
    coefficients = 0.2 + rng.random((2, 3, 2, 8))
    coefficients[0, 1, 1] = 0.0
    density = BernsteinDensity(coefficients, lo, hi)
    want = density.facet_moments(npx, seeds, cells) + (density.axis_second_moments(npx, seeds, cells),)
    for got, ref in zip(kernels(backend, seeds, cells, coefficients, lo, hi), want):
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12 * np.abs(ref).max())
