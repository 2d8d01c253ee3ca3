"""The 3D integrals the implicit differentiation of the transport plan asks of a voxel density
(``sdot._core.spatial.integrate``: ``facet_moments``, ``polynomial_integrals``,
``axis_second_moments``), on every backend, against ground truth that does not come from the
code under test (:mod:`spatial_cells`: power cells built with scipy, clipped by every voxel,
their facet polygons clipped by every voxel; boxes in exact arithmetic), and the adjoint
identity of ``polynomial_integrals`` with ``cell_integrals``."""
from __future__ import annotations

import functools
from fractions import Fraction

import numpy as np
import pytest

import spatial_cells as sc
from sdot._core.spatial import faces, integrate, sensitivity
from sdot._core.spatial.polyhedra import Cells

LO, HI = np.array([-0.5, 0.2, 1.0]), np.array([0.7, 1.4, 1.9])
SHAPE = (3, 4, 5)
UNIFORM = 0.7


@functools.lru_cache(maxsize=None)
def _kernels(name, shape):
    """The functions under test on one backend, one object per static shape (so that
    ``jax.jit`` compiles each once)."""
    from conftest import Backend

    xp = Backend(name).xp

    def facets(seeds, cells, values, lo, hi):
        return integrate.facet_moments(xp, seeds, cells, values, lo, hi)

    def axes(seeds, cells, values, lo, hi):
        return integrate.axis_second_moments(xp, seeds, cells, values, lo, hi)

    def polynomial(seeds, cells, coefficients, lo, hi):
        return integrate.polynomial_integrals(xp, seeds, cells, coefficients, lo, hi, shape)

    def potential(seeds, cells, psi, lo, hi):
        return integrate.potential_integrals(xp, seeds, cells, psi, lo, hi, shape)
    return dict(facets=facets, axes=axes, polynomial=polynomial, potential=potential)


def on(b, cells):
    """The cells (NumPy) as arrays of backend ``b``."""
    return Cells(*(b.asarray(a, a.dtype) for a in cells))


def skip_eager_jax(backend, grid="voxels"):
    """Eager JAX runs the kernels of the voxel grids jitted, as ``jax-jit`` does (compiling
    them again costs seconds): only the uniform density there."""
    if backend.jitted_kernels and not backend.jit and grid == "voxels":
        pytest.skip("eager JAX runs the jitted kernels of jax-jit")


def run(b, what, seeds, cells, arg, shape=None, lo=LO, hi=HI):
    out = b.run(_kernels(b.name, shape)[what], b.asarray(seeds), on(b, cells), b.asarray(arg), b.asarray(lo),
                b.asarray(hi))
    return tuple(b.to_numpy(a) for a in out) if isinstance(out, tuple) else b.to_numpy(out)


def close(actual, expected, rtol, what):
    """To ``rtol`` of the largest entry."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    err = np.max(np.abs(actual - expected)) / max(np.max(np.abs(expected)), 1e-300)
    assert err <= rtol, f"{what}: relative error {err:.2e} > {rtol:.0e}"


# ----------------------------------------------------------------------------- power cells

def in_slots(truth, cells, info):
    """The per-facet ground truth ``(n, F_scipy, ...)`` put in the facet slots of ``cells`` (by
    the label of each facet: the neighbour, or the box's side); slots with no facet: zero."""
    labels, count = cells.labels, cells.count
    out = np.zeros(labels.shape + truth.shape[2:])
    for i, cell in enumerate(info):
        mine = {int(labels[i, s]): s for s in range(int(count[i]))}
        assert len(mine) == int(count[i])
        for k, label in cell["labels"].items():
            out[i, mine[int(label)]] = truth[i, k]
    return out


@pytest.fixture(scope="module")
def problem():
    """30 power cells in the box ``[LO, HI]`` (two seeds outside it) from ``plan.diagram``, a
    3 x 4 x 5 grid of random values (some zero), and the ground truth from scipy: the cells'
    pieces in every voxel (moments and axis moments), their facets' moments."""
    import array_api_compat as aac

    from sdot._core import plan
    from sdot._core.density import PixelDensity

    xp = aac.array_namespace(np.zeros(1))
    rng = np.random.default_rng(5)
    n = 30
    seeds = LO + (HI - LO) * rng.random((n, 3))
    seeds[:2] = [[-0.55, 0.8, 1.4], [0.9, 0.3, 1.2]]
    psi = 0.03 * rng.random(n)
    psi[:2] += [0.02, 0.08]
    values = 0.5 + rng.random(SHAPE)
    values[rng.random(SHAPE) < 0.15] = 0.0
    cells = plan.diagram(xp, seeds, psi, PixelDensity(values, LO, HI)).cells
    cells = Cells(*(np.asarray(a) for a in cells))
    _, _, _, F, info = sc.power_cells(seeds, psi, LO, HI)
    pieces = sc.piece_moments(seeds, info, SHAPE, LO, HI, axes=True)                 # (n, n0, n1, n2, 8)
    facets = [in_slots(t, cells, info) for t in sc.facet_moments(seeds, info, values, LO, HI, F)]
    ones = [in_slots(t, cells, info) for t in sc.facet_moments(seeds, info, np.ones((1, 1, 1)), LO, HI, F)]
    rho = rng.standard_normal(SHAPE)
    # cell_integrals (tested by test_spatial_integrals.py) on NumPy, to compare with
    return dict(seeds=seeds, psi=psi, values=values, cells=cells, pieces=pieces, facets=facets,
                uniform_facets=[UNIFORM * t for t in ones], rho=rho,
                rho_moments=integrate.cell_integrals(xp, seeds, cells, rho, LO, HI)[0],
                facet=integrate.cell_integrals(xp, seeds, cells, values, LO, HI)[1],
                uniform_facet=integrate.cell_integrals(xp, seeds, cells, np.full((1, 1, 1), UNIFORM), LO, HI)[1],
                uniform_second=integrate.cell_integrals(xp, seeds, cells, np.full((1, 1, 1), UNIFORM), LO, HI)[0][:, 4],
                second=integrate.cell_integrals(xp, seeds, cells, values, LO, HI)[0][:, 4])


@pytest.mark.parametrize("grid", ["voxels", "uniform"])
def test_facet_moments(backend, problem, grid):
    """``int rho``, ``int rho u``, ``int rho u u^T`` over every facet (box sides included) of 30
    power cells, on a 3 x 4 x 5 grid and on the uniform density: those of the facet polygons
    clipped by every voxel, to 1e-12; ``f0`` is ``cell_integrals``' facet (NumPy's); zero on
    unused slots."""
    skip_eager_jax(backend, grid)
    c = problem
    values = c["values"] if grid == "voxels" else np.full((1, 1, 1), UNIFORM)
    truth = c["facets"] if grid == "voxels" else c["uniform_facets"]
    f0, f1, f2 = run(backend, "facets", c["seeds"], c["cells"], values)
    F = c["cells"].labels.shape[1]
    assert f0.shape == (30, F) and f1.shape == (30, F, 3) and f2.shape == (30, F, 3, 3)
    for name, actual, expected in zip(("f0", "f1", "f2"), (f0, f1, f2), truth):
        close(actual, expected, 1e-12, name)
    np.testing.assert_array_equal(f2, np.swapaxes(f2, 2, 3))
    unused = np.arange(F)[None, :] >= c["cells"].count[:, None]
    assert not f0[unused].any() and not f1[unused].any() and not f2[unused].any()
    close(f0, c["facet" if grid == "voxels" else "uniform_facet"], 1e-13, "f0 against cell_integrals")


def test_polynomial_integrals(backend, problem):
    """Per voxel ``sum_i int_{L_i & voxel} (a_i + b_i . u + c_i |u|^2)``: the clipped pieces'
    moments against the coefficients; the transpose of ``cell_integrals`` (``<P(coef), rho> =
    sum(coef * moments(rho))`` for random ``coef`` and ``rho``, to 1e-12, NumPy's moments); on a
    (1, 1, 1) grid, the sum over the cells; ``potential_integrals`` is the case
    ``(-psi, 0, 0, 0, 1)`` (not compiled again under ``jax.jit``)."""
    skip_eager_jax(backend)
    c = problem
    rng = np.random.default_rng(2)
    coef = rng.standard_normal((30, 5))
    P = run(backend, "polynomial", c["seeds"], c["cells"], coef, SHAPE)
    truth = np.einsum("ijklm,im->jkl", c["pieces"][..., :5], coef)
    close(P, truth, 1e-12, "polynomial integrals")
    lhs, rhs = np.sum(P * c["rho"]), np.sum(coef * c["rho_moments"])
    assert abs(lhs - rhs) <= 1e-12 * np.sum(np.abs(P * c["rho"])), (lhs, rhs)
    one = run(backend, "polynomial", c["seeds"], c["cells"], coef, (1, 1, 1))
    assert one.shape == (1, 1, 1)
    close(one, np.sum(np.einsum("ijklm,im->i", c["pieces"][..., :5], coef)), 1e-12, "one voxel")
    if not backend.jit:
        potential = run(backend, "potential", c["seeds"], c["cells"], c["psi"], SHAPE)
        close(potential, c["pieces"][..., 4].sum(0) - np.einsum("ijkl,i->jkl", c["pieces"][..., 0], c["psi"]),
              1e-12, "potential integrals")


@pytest.mark.parametrize("grid", ["voxels", "uniform"])
def test_axis_second_moments(backend, problem, grid):
    """``int (x_a - y_ia)^2 rho`` per cell and axis: the clipped pieces', to 1e-12; their sum is
    ``cell_integrals``' second moment (NumPy's)."""
    skip_eager_jax(backend, grid)
    c = problem
    values = c["values"] if grid == "voxels" else np.full((1, 1, 1), UNIFORM)
    axes = run(backend, "axes", c["seeds"], c["cells"], values)
    weights = c["values"] if grid == "voxels" else np.full(SHAPE, UNIFORM)
    close(axes, np.einsum("ijkla,jkl->ia", c["pieces"][..., 5:], weights), 1e-12, "axis second moments")
    close(axes.sum(1), c["second" if grid == "voxels" else "uniform_second"], 1e-13, "their sum")


# ----------------------------------------------------------------------------- a far box

#: A box cell ``(p, q)`` in the unit box whose seed is at (1e6, -2e6, 3e6).
FAR_BOX = (np.array([0.2, 0.55, 0.1]), np.array([0.6, 0.8, 0.9]), np.array([1e6, -2e6, 3e6]))


def exact_box_faces(p, q, seed, c):
    """Per face of the box (0: x = p, 1: x = q, 2: y = p, ...) ``int c``, ``int c u`` and
    ``int c u u^T`` over it, and ``int c u_a^2`` over the box, exactly, the corners relative to
    the seed being the floats ``p - seed``, ``q - seed``."""
    P = [Fraction(float(a)) for a in p - seed]
    Q = [Fraction(float(a)) for a in q - seed]
    c = Fraction(c)
    m0 = [b - a for a, b in zip(P, Q)]
    m1 = [(b * b - a * a) / 2 for a, b in zip(P, Q)]
    m2 = [(b ** 3 - a ** 3) / 3 for a, b in zip(P, Q)]
    f0, f1, f2 = np.zeros(6), np.zeros((6, 3)), np.zeros((6, 3, 3))
    for a in range(3):
        for side, x in enumerate((P[a], Q[a])):
            def moment(powers):
                out = c
                for b in range(3):
                    out *= x ** powers[b] if b == a else (m0, m1, m2)[powers[b]][b]
                return out
            f0[2 * a + side] = float(moment((0, 0, 0)))
            for b in range(3):
                f1[2 * a + side, b] = float(moment(tuple(int(d == b) for d in range(3))))
                for d in range(3):
                    f2[2 * a + side, b, d] = float(moment(tuple(int(e == b) + int(e == d) for e in range(3))))
    axes = [float(c * m2[a] * m0[(a + 1) % 3] * m0[(a + 2) % 3]) for a in range(3)]
    return f0, f1, f2, np.array(axes)


@pytest.mark.parametrize("shape", [(1, 1, 1), (4, 4, 4)], ids=["closed-form", "voxel-walk"])
@pytest.mark.skip_backends("jax", "jax-jit", reason="the static path is exercised by strict-static; jax and jit: "
                           "the power cells")
def test_far_box(backend, shape):
    """A box cell whose seed is at (1e6, -2e6, 3e6), density 1.5 (uniform, and a constant
    4 x 4 x 4 grid): its facet moments and axis second moments about the seed (terms of 1e13
    cancel about the seed) are those of the box its rounded corners describe, to 1e-12; the
    polynomial integrals sum to ``sum(coef * moments)``. Not on JAX: the static kernels of
    strict-static, compiled again for this shape (5 s)."""
    p, q, s = FAR_BOX
    tri, slot = sc.box_triangles(p, q, s)
    seeds, tri, slot, valid = s[None, :], tri[None], slot[None], np.ones((1, 12), bool)
    values = np.full(shape, 1.5)
    lo, hi = np.zeros(3), np.ones(3)
    xp = backend.xp

    def kernels(seeds, tri, slot, valid, values, coef, lo, hi):
        facets = sensitivity.facet_moments_of_triangles(xp, seeds, tri, slot, valid, 6, values, lo, hi)
        axes = sensitivity.axis_second_moments_of_triangles(xp, seeds, tri, valid, values, lo, hi)
        moments = faces.cell_integrals_of_triangles(xp, seeds, tri, slot, valid, 6, values, lo, hi)[0]
        poly = faces.polynomial_integrals_of_triangles(xp, seeds, tri, valid, coef, (4, 4, 4), lo, hi)
        return facets + (axes, moments, poly)

    coef = np.array([[0.3, -1e-6, 2e-6, 1e-7, 1e-12]])
    b = backend
    out = b.run(kernels, b.asarray(seeds), b.asarray(tri), b.asarray(slot, np.int64), b.asarray(valid, bool),
                b.asarray(values), b.asarray(coef), b.asarray(lo), b.asarray(hi))
    f0, f1, f2, axes, moments, poly = (b.to_numpy(a) for a in out)
    t0, t1, t2, taxes = exact_box_faces(p, q, s, 1.5)
    for name, actual, expected in zip(("f0", "f1", "f2"), (f0[0], f1[0], f2[0]), (t0, t1, t2)):
        np.testing.assert_allclose(actual, expected, rtol=1e-12, err_msg=name)
    np.testing.assert_allclose(axes[0], taxes, rtol=1e-12)
    ones = moments / 1.5
    close(np.sum(poly), np.sum(coef * ones), 1e-12, "polynomial integrals of the far box")


@pytest.mark.parametrize("grid", ["voxels", "uniform"])
def test_chunks_and_blocks(problem, grid):
    """Eagerly, in chunks of 7 triangles and blocks of 4 cells (on 2 threads), the integrals
    are those of one chunk and one block, to rounding."""
    from conftest import Backend
    from sdot._host import threads

    c = problem
    b = Backend("numpy")
    values = c["values"] if grid == "voxels" else np.full((1, 1, 1), UNIFORM)
    coef = np.random.default_rng(4).standard_normal((30, 5))

    def everything():
        return (run(b, "facets", c["seeds"], c["cells"], values) + (run(b, "axes", c["seeds"], c["cells"], values),)
                + (run(b, "polynomial", c["seeds"], c["cells"], coef, SHAPE),))

    whole = everything()
    with threads.host_settings(block=4, min_block=1, threads=2, triangle_chunk=7, uniform_triangle_chunk=7):
        parts = everything()
    for name, a, p in zip(("f0", "f1", "f2", "axes", "polynomial"), whole, parts):
        close(p, a, 1e-14, f"{name} in chunks and blocks")
