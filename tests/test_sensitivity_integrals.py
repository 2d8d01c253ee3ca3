"""The integrals of the plan's implicit differentiation (``facet_moments``,
``polynomial_integrals``, ``axis_second_moments`` of :mod:`sdot._core.planar.sensitivity`
and :mod:`sdot._core.linear.integrate`) on every backend, against ground truth that does
not use sdot's integrators: each cell polygon clipped to each pixel (Sutherland-Hodgman)
and the vertex formulas of polygon moments, each edge cut at the grid lines and
integrated exactly piece by piece; a far cell in exact rational arithmetic."""
from __future__ import annotations

import functools
from fractions import Fraction

import array_api_compat.numpy as npx
import numpy as np
import pytest

from sdot._core import linear, plan
from sdot._core.density import PixelDensity
from sdot._core.linear import integrate as integrate_1d
from sdot._core.planar import integrate
from sdot._core.planar.polygons import Cells

# ----------------------------------------------------------------------------- ground truth


def clip(poly, axis, value, keep_below):
    """The part of the polygon (a list of points, floats or fractions) on one side of the
    line ``x[axis] = value``."""
    out = []
    for k in range(len(poly)):
        p, q = poly[k], poly[(k + 1) % len(poly)]
        inside_p = p[axis] <= value if keep_below else p[axis] >= value
        inside_q = q[axis] <= value if keep_below else q[axis] >= value
        if inside_p:
            out.append(p)
        if inside_p != inside_q:
            t = (value - p[axis]) / (q[axis] - p[axis])
            out.append(tuple(a + t * (b - a) for a, b in zip(p, q)))
    return out


def polygon_moments(poly, seed):
    """``(mass, M_x, M_y, M_xx, M_yy)`` of the unit density on the polygon, about ``seed``."""
    zero = seed[0] - seed[0]
    m = [zero] * 5
    rel = [(x - seed[0], y - seed[1]) for x, y in poly]
    for (ax, ay), (bx, by) in zip(rel, rel[1:] + rel[:1]):
        w = ax * by - ay * bx
        m[0] += w / 2
        m[1] += w * (ax + bx) / 6
        m[2] += w * (ay + by) / 6
        m[3] += w * (ax * ax + ax * bx + bx * bx) / 12
        m[4] += w * (ay * ay + ay * by + by * by) / 12
    return m


def grid_lines(lo, hi, shape, num=float):
    return [[num(lo[a]) + (num(hi[a]) - num(lo[a])) * k / shape[a] for k in range(shape[a] + 1)] for a in range(2)]


def pixel_moments(poly, seed, lo, hi, shape, num=float):
    """``{(ix, iy): (mass, M_x, M_y, M_xx, M_yy)}`` of the polygon clipped to each pixel."""
    lines = grid_lines(lo, hi, shape, num)
    out = {}
    for ix in range(shape[0]):
        for iy in range(shape[1]):
            part = poly
            for axis, k in ((0, ix), (1, iy)):
                part = clip(part, axis, lines[axis][k], False) if part else part
                part = clip(part, axis, lines[axis][k + 1], True) if part else part
            if len(part) >= 3:
                out[ix, iy] = polygon_moments(part, seed)
    return out


def edge_moments(a, b, seed, values, lo, hi, num=float):
    """``(f0, f1 (2,), f2 (2, 2))`` of the edge ``a -> b`` (absolute points): cut at every grid
    line, each piece integrated exactly (``int_0^1 u(t) u(t)^T dt = (p p^T + q q^T) / 3 +
    (p q^T + q p^T) / 6`` for ``u = p + t (q - p)``)."""
    shape = values.shape
    lines = grid_lines(lo, hi, shape, num)
    ts = {num(0), num(1)}
    for axis in range(2):
        if a[axis] != b[axis]:
            for x in lines[axis]:
                t = (x - a[axis]) / (b[axis] - a[axis])
                if 0 < t < 1:
                    ts.add(t)
    ts = sorted(ts)
    f0, f1, f2 = 0.0, np.zeros(2), np.zeros((2, 2))
    for t0, t1 in zip(ts[:-1], ts[1:]):
        p = [a[i] + t0 * (b[i] - a[i]) - seed[i] for i in range(2)]
        q = [a[i] + t1 * (b[i] - a[i]) - seed[i] for i in range(2)]
        mid = [float(a[i] + (t0 + t1) / 2 * (b[i] - a[i])) for i in range(2)]
        pix = [min(max(int(np.floor((mid[i] - lo[i]) / (hi[i] - lo[i]) * shape[i])), 0), shape[i] - 1)
               for i in range(2)]
        length = float(sum((q[i] - p[i]) ** 2 for i in range(2))) ** 0.5
        c = values[pix[0], pix[1]] * length
        f0 += c
        f1 += c * np.array([float((p[i] + q[i]) / 2) for i in range(2)])
        f2 += c * np.array([[float((p[i] * p[j] + q[i] * q[j]) / 3 + (p[i] * q[j] + q[i] * p[j]) / 6)
                             for j in range(2)] for i in range(2)])
    return f0, f1, f2


def reference(seeds, cells, values, lo, hi, coefficients, num=float):
    """Ground truth of the three functions (and the cell moments) for the cells (NumPy)."""
    n, cap, _ = cells.vertices.shape
    moments = np.zeros((n, 5))
    poly_grid = np.zeros(values.shape)
    f0, f1, f2 = np.zeros((n, cap)), np.zeros((n, cap, 2)), np.zeros((n, cap, 2, 2))
    for i in range(n):
        k = int(cells.count[i])
        if not k:
            continue
        seed = [num(float(s)) for s in seeds[i]]
        poly = [tuple(seed[j] + num(float(cells.vertices[i, s, j])) for j in range(2)) for s in range(k)]
        a, bx, by, c = coefficients[i]
        for (ix, iy), m in pixel_moments(poly, seed, lo, hi, values.shape, num).items():
            m = [float(t) for t in m]
            moments[i] += values[ix, iy] * np.array(m)
            poly_grid[ix, iy] += a * m[0] + bx * m[1] + by * m[2] + c * (m[3] + m[4])
        for s in range(k):
            f0[i, s], f1[i, s], f2[i, s] = edge_moments(poly[s], poly[(s + 1) % k], seed, values, lo, hi, num)
    return dict(moments=moments, polynomial=poly_grid, f0=f0, f1=f1, f2=f2)


def close(actual, expected, rtol, what):
    """To ``rtol`` of the largest entry of ``expected``."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    err = np.max(np.abs(actual - expected)) / max(np.max(np.abs(expected)), 1e-300)
    assert err <= rtol, f"{what}: relative error {err:.2e} > {rtol:.0e}"


# ----------------------------------------------------------------------------- runs


def on_backend(b, cells):
    return type(cells)(*(b.asarray(getattr(cells, f), dtype=np.asarray(getattr(cells, f)).dtype)
                         for f in cells._fields))


@functools.lru_cache(maxsize=None)
def _kernels(name, shape, dim=2):
    """The functions under test for one backend and grid shape (one object each, so that
    ``jax.jit`` compiles once per shape)."""
    from conftest import Backend

    xp = Backend(name).xp
    module = integrate if dim == 2 else integrate_1d

    def run(seeds, cells, values, coefficients, lo, hi):
        return (module.facet_moments(xp, seeds, cells, values, lo, hi),
                module.polynomial_integrals(xp, seeds, cells, coefficients, lo, hi, shape),
                module.axis_second_moments(xp, seeds, cells, values, lo, hi),
                module.cell_integrals(xp, seeds, cells, values, lo, hi))
    return run


def run_all(b, seeds, cells, values, coefficients, lo, hi, dim=2):
    """``(f0, f1, f2), polynomial, axis, (moments, facet)`` on backend ``b``, as NumPy."""
    run = _kernels(b.name, tuple(values.shape), dim)
    out = b.run(run, b.asarray(seeds), on_backend(b, cells), b.asarray(values), b.asarray(coefficients),
                b.asarray(lo), b.asarray(hi))
    (f0, f1, f2), poly, axis, (moments, facet) = out
    return tuple(b.to_numpy(a) for a in (f0, f1, f2)), b.to_numpy(poly), b.to_numpy(axis), \
        (b.to_numpy(moments), b.to_numpy(facet))


# ----------------------------------------------------------------------------- 2D

LO, HI = np.array([-1.0, 0.5]), np.array([2.0, 1.5])


@functools.lru_cache(maxsize=None)
def problem(shape):
    """30 power cells in ``[LO, HI]`` (some hidden), pixel values with zeros on ``shape``,
    coefficients, and their ground truth."""
    rng = np.random.default_rng(3)
    n = 30
    seeds = LO + (HI - LO) * rng.random((n, 2))
    seeds[0] = [2.0, 1.0]                       # a seed on the box's side
    psi = 0.05 * rng.random(n)
    values = 0.5 + rng.random(shape)
    if shape != (1, 1):
        values[rng.random(shape) < 0.2] = 0.0
    cells = plan.diagram(npx, seeds, psi, PixelDensity(values, LO, HI)).cells
    coefficients = rng.standard_normal((n, 4))
    return seeds, cells, values, coefficients, reference(seeds, cells, values, LO, HI, coefficients)


@pytest.mark.parametrize("shape", [(5, 7), (1, 1)], ids=["grid", "uniform"])
def test_against_clipped_pixels(backend, shape):
    """All three, and the adjoint identity, on 30 cells of a non-unit box."""
    seeds, cells, values, coefficients, ref = problem(shape)
    assert np.sum(np.asarray(cells.count) == 0) < 30 and values.shape == shape
    (f0, f1, f2), poly, axis, (moments, facet) = run_all(backend, seeds, cells, values, coefficients, LO, HI)
    close(f0, ref["f0"], 1e-13, "f0")
    close(f1, ref["f1"], 1e-13, "f1")
    close(f2, ref["f2"], 1e-13, "f2")
    np.testing.assert_array_equal(f2, np.swapaxes(f2, -1, -2))
    close(f0, facet, 1e-15, "f0 against the facet of cell_integrals")
    close(poly, ref["polynomial"], 1e-13, "polynomial_integrals")
    close(axis, ref["moments"][:, 3:], 1e-13, "axis_second_moments")
    close(moments[:, :3], ref["moments"][:, :3], 1e-13, "cell moments")
    # adjoint: <polynomial_integrals(coefficients), values> = sum(coefficients * moments)
    lhs, terms = np.sum(poly * values), coefficients * moments
    assert abs(lhs - terms.sum()) <= 1e-12 * np.abs(terms).sum()
    unused = np.arange(f0.shape[1])[None, :] >= np.asarray(cells.count)[:, None]
    assert not f0[unused].any() and not f1[unused].any() and not f2[unused].any()
    assert (np.asarray(cells.labels)[~unused] < 0).any() and f0[(np.asarray(cells.labels) < 0) & ~unused].any()


def test_adjoint_identity_on_random_vectors(eager_backend):
    """``<polynomial_integrals(coefficients), values> == sum(coefficients * moments(values))``
    for random values and coefficients of both signs (cells of another density)."""
    b = eager_backend
    seeds, cells, _, _, _ = problem((5, 7))
    rng = np.random.default_rng(11)
    shape = (6, 4)
    for _ in range(2):
        values, coefficients = rng.standard_normal(shape), rng.standard_normal((seeds.shape[0], 4))
        _, poly, _, (moments, _) = run_all(b, seeds, cells, values, coefficients, LO, HI)
        lhs, terms = np.sum(poly * values), coefficients * moments
        assert abs(lhs - terms.sum()) <= 1e-12 * np.abs(terms).sum()


def test_potential_integrals_is_the_polynomial_of_minus_psi(eager_backend):
    """``potential_integrals(psi)`` is ``polynomial_integrals((-psi, 0, 0, 1))``."""
    b = eager_backend
    seeds, cells, values, _, ref = problem((5, 7))
    psi = np.linspace(-0.1, 0.2, seeds.shape[0])
    coefficients = np.stack([-psi, 0 * psi, 0 * psi, 1 + 0 * psi], axis=1)
    args = b.asarray(seeds), on_backend(b, cells), b.asarray(psi), b.asarray(LO), b.asarray(HI)
    got = b.to_numpy(integrate.potential_integrals(b.xp, *args, values.shape))
    want = reference(seeds, cells, values, LO, HI, coefficients)["polynomial"]
    close(got, want, 1e-13, "potential_integrals")


@pytest.mark.parametrize("shape", [(4, 4), (1, 1)], ids=["grid", "uniform"])
def test_far_cell_in_exact_arithmetic(backend, shape):
    """The cell ``[0.2, 0.6] x [0.1, 0.3]`` of a seed at (1e6, -1e6): about the seed, terms of
    1e12 would cancel; integrated about the cell, the results are those of exact rational
    arithmetic on the same (rounded) vertices."""
    seed = np.array([[1e6, -1e6]])
    corners = np.array([[0.2, 0.1], [0.6, 0.1], [0.6, 0.3], [0.2, 0.3]]) - seed
    vertices = np.zeros((1, 8, 2))
    vertices[0, :4] = corners
    cells = Cells(vertices, np.array([[-1, 1, 2, -4, -1, -1, -1, -1]]), np.array([4]), np.array([False]),
                  np.array(True))
    values = np.arange(1.0, 1.0 + np.prod(shape)).reshape(shape)
    lo, hi = np.zeros(2), np.ones(2)
    t = seed[0] + [0.3, 0.25]                      # the polynomial |u - t|^2, of size 0.1 on the cell
    coefficients = np.array([[t @ t, -2 * t[0], -2 * t[1], 1.0]])
    (f0, f1, f2), poly, axis, _ = run_all(backend, seed, cells, values, coefficients, lo, hi)
    ref = reference(seed, cells, values, lo, hi, coefficients, num=Fraction)
    close(axis, ref["moments"][:, 3:], 1e-12, "axis_second_moments")
    close(f1, ref["f1"], 1e-12, "f1")
    close(f2, ref["f2"], 1e-12, "f2")
    # terms of 1e12 cancel in the (rounded) coefficients themselves: to the size of the terms
    exact = {}
    poly_seed = [Fraction(float(s)) for s in seed[0]]
    square = [tuple(Fraction(float(s)) + Fraction(float(c)) for s, c in zip(seed[0], v)) for v in corners]
    a, bx, by, c = (Fraction(float(t)) for t in coefficients[0])
    for key, m in pixel_moments(square, poly_seed, lo, hi, shape, Fraction).items():
        exact[key] = float(a * m[0] + bx * m[1] + by * m[2] + c * (m[3] + m[4]))
    want = np.zeros(shape)
    for key, value in exact.items():
        want[key] = value
    scale = np.abs(coefficients[0]) @ np.array([1.0, 1e6, 1e6, 2e12]) * 0.08 / np.prod(shape) * values.max()
    assert np.max(np.abs(poly - want)) <= 1e-12 * scale


# ----------------------------------------------------------------------------- 1D

LO1, HI1 = np.array([-0.5]), np.array([1.0])


def interval_reference(seeds, cells, values, coefficients):
    """Per segment ``sum_i int (a_i + b_i u + c_i u^2)`` over cell i, and the cell moments
    (exact polynomial integrals on each overlap of a cell and a segment)."""
    n0 = values.shape[0]
    edges = LO1[0] + (HI1[0] - LO1[0]) * np.arange(n0 + 1) / n0
    poly, moments = np.zeros(n0), np.zeros((len(seeds), 3))
    for i in range(len(seeds)):
        if not cells.count[i]:
            continue
        left, right = seeds[i, 0] + cells.vertices[i, :, 0]
        for k in range(n0):
            p, q = max(left, edges[k]) - seeds[i, 0], min(right, edges[k + 1]) - seeds[i, 0]
            if q <= p:
                continue
            m = np.array([q - p, (q * q - p * p) / 2, (q ** 3 - p ** 3) / 3])
            poly[k] += coefficients[i] @ m
            moments[i] += values[k] * m
    return poly, moments


def test_intervals(backend):
    """1D: f0 is the facet of cell_integrals (the density at each end), f1 and f2 are f0
    times ``u`` and ``u^2``; polynomial_integrals against exact integrals and its adjoint
    identity; the axis second moment is the second moment."""
    rng = np.random.default_rng(2)
    n, n0 = 12, 9
    seeds = LO1 + (HI1 - LO1) * rng.random((n, 1))
    seeds[3] = 1.2                                  # outside the domain
    psi = 0.05 * rng.random(n)
    values = 0.5 + rng.random(n0)
    values[[2, 5]] = 0.0
    cells = linear.power_cells(npx, seeds, psi, np.ones(n, bool), LO1, HI1)
    coefficients = rng.standard_normal((n, 3))
    (f0, f1, f2), poly, axis, (moments, facet) = run_all(backend, seeds, cells, values, coefficients, LO1, HI1, 1)
    assert f1.shape == (n, 2, 1) and f2.shape == (n, 2, 1, 1) and axis.shape == (n, 1)
    np.testing.assert_array_equal(f0, facet)
    u = np.asarray(cells.vertices)[:, :, 0]
    np.testing.assert_allclose(f1[..., 0], facet * u, rtol=1e-15)
    np.testing.assert_allclose(f2[..., 0, 0], facet * u * u, rtol=1e-15)
    want_poly, want_moments = interval_reference(seeds, cells, values, coefficients)
    close(poly, want_poly, 1e-13, "polynomial_integrals")
    close(moments, want_moments, 1e-13, "moments")
    np.testing.assert_array_equal(axis[:, 0], moments[:, 2])
    lhs, terms = np.sum(poly * values), coefficients * moments
    assert abs(lhs - terms.sum()) <= 1e-12 * np.abs(terms).sum()
    # the density at an end inside a segment is that segment's value
    ends = seeds + np.asarray(cells.vertices)[:, :, 0]
    k = np.clip(np.floor((ends - LO1[0]) / (HI1[0] - LO1[0]) * n0).astype(int), 0, n0 - 1)
    inside = np.repeat(np.asarray(cells.count)[:, None] > 0, 2, axis=1)
    np.testing.assert_array_equal(f0[inside], values[k][inside])
