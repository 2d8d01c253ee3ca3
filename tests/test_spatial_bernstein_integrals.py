"""The 3D integrals of a Bernstein voxel density (``sdot._core.spatial.integrate``:
``bernstein_cell_integrals``, ``bernstein_potential_integrals``), on the backends, against
ground truth that does not come from the code under test: the piecewise-constant path on
constant polynomials; the cells clipped by every voxel with scipy (:mod:`spatial_cells`) and
integrated by a tensor Gauss rule on their tetrahedra (exact for the degree); the facet
polygons clipped likewise; the grid refined by de Casteljau subdivision (the same density);
the domain's totals by Bernstein means; the Newton matrix's identity between facets and
the derivative of the masses; the transpose identity of the potential integrals."""
from __future__ import annotations

import functools
import math

import numpy as np
import pytest

import spatial_cells as sc
from sdot._core.spatial import integrate
from sdot._core.spatial.polyhedra import Cells

LO, HI = np.array([-0.5, 0.2, 1.0]), np.array([0.7, 1.4, 1.9])
SHAPE = (4, 2, 3)
N = 12


@functools.lru_cache(maxsize=None)
def _kernels(name, shape):
    """The functions under test on one backend (one object per static shape: ``jax.jit``
    compiles each once)."""
    from conftest import Backend

    xp = Backend(name).xp

    def cells(seeds, cells, coefficients, lo, hi):
        return integrate.bernstein_cell_integrals(xp, seeds, cells, coefficients, lo, hi)

    def potential(seeds, cells, psi, lo, hi):
        return integrate.bernstein_potential_integrals(xp, seeds, cells, psi, lo, hi, shape)

    def constant(seeds, cells, values, lo, hi):
        return integrate.cell_integrals(xp, seeds, cells, values, lo, hi)
    return dict(cells=cells, potential=potential, constant=constant)


def run(b, what, seeds, cells, arg, shape=None, lo=LO, hi=HI):
    cells = Cells(*(b.asarray(a, a.dtype) for a in cells))
    out = b.run(_kernels(b.name, shape)[what], b.asarray(seeds), cells, b.asarray(arg), b.asarray(lo),
                b.asarray(hi))
    return tuple(b.to_numpy(a) for a in out) if isinstance(out, tuple) else b.to_numpy(out)


def close(actual, expected, rtol, what):
    """To ``rtol`` of the largest entry."""
    err = np.max(np.abs(actual - expected)) / max(np.max(np.abs(expected)), 1e-300)
    assert err <= rtol, f"{what}: relative error {err:.2e} > {rtol:.0e}"


#: Eager JAX runs the kernels jitted (as jax-jit, compiled again); strict-device1 is
#: array_api_strict again.
SKIP_SLOW = pytest.mark.skip_backends("jax", "strict-device1", reason="the same kernels as jax-jit / array_api_strict")


# ----------------------------------------------------------------------------- Bernstein, by hand

def basis(t, p):
    """``B_k(t)`` of degree ``p`` at the points ``t`` ``(..., p + 1)``."""
    t = np.asarray(t)[..., None]
    k = np.arange(p + 1)
    return np.array([math.comb(p, int(j)) for j in k]) * t ** k * (1.0 - t) ** (p - k)


def density(coefficients, idx, t):
    """The density of voxel ``idx`` at its coordinates ``t`` ``(Q, 3)``."""
    p = round(coefficients.shape[-1] ** (1 / 3)) - 1
    c = coefficients[idx].reshape(p + 1, p + 1, p + 1)
    return np.einsum("abc,qa,qb,qc->q", c, basis(t[:, 0], p), basis(t[:, 1], p), basis(t[:, 2], p))


def tetra_rule(n):
    """A Gauss rule on the unit tetrahedron ``(0, e0, e1, e2)`` by the collapsed
    coordinates, exact to degree ``2 n - 4``: barycentric points ``(Q, 3)``, weights
    summing to 1."""
    x, w = np.polynomial.legendre.leggauss(n)
    x, w = 0.5 * (x + 1.0), 0.5 * w
    a, b, c = np.meshgrid(x, x, x, indexing="ij")
    wa, wb, wc = np.meshgrid(w, w, w, indexing="ij")
    l1, l2, l3 = a * (1 - b) * (1 - c), b * (1 - c), c
    weight = wa * wb * wc * (1 - b) * (1 - c) ** 2 * 6.0
    return np.stack([l1.ravel(), l2.ravel(), l3.ravel()], axis=1), weight.ravel()


def triangle_rule(n):
    """A Gauss rule on the unit triangle by collapsed coordinates, exact to ``2 n - 2``."""
    x, w = np.polynomial.legendre.leggauss(n)
    x, w = 0.5 * (x + 1.0), 0.5 * w
    a, b = np.meshgrid(x, x, indexing="ij")
    wa, wb = np.meshgrid(w, w, indexing="ij")
    return np.stack([(a * (1 - b)).ravel(), b.ravel()], axis=1), (wa * wb * (1 - b) * 2.0).ravel()


def piece_truth(seeds, info, densities, lo, hi):
    """Per density of ``densities`` (coefficients on one grid) and per cell ``(mass, M_u, M_v,
    M_w, M_2)`` about the seed: each cell clipped by each voxel (scipy), the pieces cut into
    tetrahedra from their centroid, each integrated by :func:`tetra_rule` (exact to the
    degree ``3 p + 2`` of ``rho |u|^2``)."""
    shape = densities[0].shape[:3]
    p = max(round(c.shape[-1] ** (1 / 3)) - 1 for c in densities)
    bary, weight = tetra_rule((3 * p + 2 + 4 + 1) // 2)
    h = (hi - lo) / np.array(shape)
    out = np.zeros((len(densities), len(seeds), 5))
    for i, cell in enumerate(info):
        if not cell["polygons"]:
            continue
        for idx, a, b in sc.voxels(np.ones(shape), lo, hi):
            piece = sc.polytope(np.concatenate([cell["halfspaces"], sc.box_halfspaces(a, b)]), 1e-12)
            if piece is None:
                continue
            hull = sc.ConvexHull(piece)
            centre = piece[hull.vertices].mean(0)
            for s in hull.simplices:
                corners = piece[s] - centre
                vol = abs(np.linalg.det(corners)) / 6.0
                x = centre + bary @ corners                              # (Q, 3)
                u = x - seeds[i]
                for d, coefficients in enumerate(densities):
                    rho = density(coefficients, idx, (x - a) / h) * weight * vol
                    out[d, i] += [rho.sum(), *(rho @ u), rho @ (u * u).sum(1)]
    return out


def facet_truth(info, coefficients, lo, hi, F):
    """Per cell and scipy facet, the density over the facet polygon clipped by each voxel (a
    facet on a voxel plane: the voxel above), by :func:`triangle_rule` on its fan."""
    shape = coefficients.shape[:3]
    p = round(coefficients.shape[-1] ** (1 / 3)) - 1
    bary, weight = triangle_rule(3 * p // 2 + 2)
    h = (hi - lo) / np.array(shape)
    out = np.zeros((len(info), F))
    for i, k, idx, poly in sc.facet_pieces(info, np.ones(shape), lo, hi):
        poly = np.asarray(poly)
        for m in range(1, len(poly) - 1):
            e1, e2 = poly[m] - poly[0], poly[m + 1] - poly[0]
            area = 0.5 * np.linalg.norm(np.cross(e1, e2))
            x = poly[0] + bary[:, :1] * e1 + bary[:, 1:] * e2
            t = (x - (lo + h * np.array(idx))) / h
            out[i, k] += area * weight @ density(coefficients, idx, t)
    return out


def refined(coefficients):
    """The same density on the grid of twice the voxels along each axis: each voxel's
    coefficients split at ``t = 1/2`` by de Casteljau, axis by axis."""
    n0, n1, n2, K = coefficients.shape
    p = round(K ** (1 / 3)) - 1
    c = coefficients.reshape(n0, n1, n2, p + 1, p + 1, p + 1)
    for axis in range(3):
        rows = np.moveaxis(c, 3 + axis, -1)                 # the coefficients along the axis last
        left, right = [rows[..., 0]], [rows[..., p]]
        for _ in range(p):
            rows = 0.5 * (rows[..., :-1] + rows[..., 1:])
            left.append(rows[..., 0])
            right.insert(0, rows[..., -1])
        halves = np.stack([np.stack(left, -1), np.stack(right, -1)], axis=axis + 1)   # voxel 2 i + half
        shape = list(halves.shape)
        halves = halves.reshape(shape[:axis] + [2 * shape[axis]] + shape[axis + 2:])
        c = np.moveaxis(halves, -1, 3 + axis)
    return c.reshape(2 * n0, 2 * n1, 2 * n2, K)


def totals(coefficients, lo, hi):
    """``int rho`` and ``int x rho`` over the box, by the Bernstein means
    ``int B_k = 1 / (p + 1)``, ``int t B_k = (k + 1) / ((p + 1)(p + 2))``."""
    shape = np.array(coefficients.shape[:3])
    p = round(coefficients.shape[-1] ** (1 / 3)) - 1
    h = (hi - lo) / shape
    c = coefficients.reshape(tuple(shape) + (p + 1,) * 3)
    mass = c.sum() * np.prod(h) / (p + 1) ** 3
    first = np.zeros(3)
    k = np.arange(p + 1)
    for a in range(3):
        weights = [np.full((shape[b], p + 1), h[b] / (p + 1)) for b in range(3)]      # int B_k over a side
        left = lo[a] + h[a] * np.arange(shape[a])
        weights[a] = h[a] * (left[:, None] / (p + 1) + h[a] * (k[None, :] + 1) / ((p + 1) * (p + 2)))
        first[a] = np.einsum("ijkabc,ia,jb,kc->", c, *weights)
    return mass, first


# ----------------------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def problem():
    """12 power cells in the box (one seed outside it) on a 4 x 2 x 3 grid (pieces with whole
    columns between them and their cells' origins), random positive densities of degree 2
    and 1 (``coefficients``, ``coefficients_1``) and the ground truth of :func:`piece_truth`
    and :func:`facet_truth` (``moments``, ``facets``; ``moments_1``, ``facets_1``)."""
    import array_api_compat as aac

    from sdot._core import plan
    from sdot._core.density import PixelDensity
    from test_spatial_sensitivity_integrals import in_slots

    xp = aac.array_namespace(np.zeros(1))
    rng = np.random.default_rng(7)
    seeds = LO + (HI - LO) * rng.random((N, 3))
    seeds[0] = [-0.55, 0.8, 1.4]
    psi = 0.03 * rng.random(N)
    values = 0.5 + rng.random(SHAPE)
    cells = plan.diagram(xp, seeds, psi, PixelDensity(values, LO, HI)).cells
    cells = Cells(*(np.asarray(a) for a in cells))
    densities = [0.2 + rng.random(SHAPE + (27,)), 0.2 + rng.random(SHAPE + (8,))]
    _, _, _, F, info = sc.power_cells(seeds, psi, LO, HI)
    moments = piece_truth(seeds, info, densities, LO, HI)
    facets = [in_slots(facet_truth(info, c, LO, HI, F)[..., None], cells, info)[..., 0] for c in densities]
    return dict(seeds=seeds, psi=psi, values=values, cells=cells, coefficients=densities[0],
                moments=moments[0], facets=facets[0], coefficients_1=densities[1], moments_1=moments[1],
                facets_1=facets[1])


#: The static pieces (strict-static, jax-jit) run on the density of degree 1 (their cost
#: grows as (p + 1)^2 (3 p + 4)^2 per fan; the kernels are those of degree 2 eagerly).
STATIC_DEGREE = 1


# ----------------------------------------------------------------------------- tests

@pytest.mark.parametrize("p", [0, 1, 2])
@SKIP_SLOW
def test_constant_polynomials(backend, problem, p):
    """A constant polynomial per voxel (``values`` repeated: every coefficient equal) gives the
    integrals of the piecewise-constant path (NumPy's), to 1e-13; and the potential integrals
    summed over the basis (the Bernstein basis sums to 1) its potential integrals."""
    if backend.static and (not backend.jit or p != STATIC_DEGREE):
        pytest.skip("the static pieces: one degree under jax.jit (one compile), test_random_density")
    c = problem
    from conftest import Backend

    coefficients = np.repeat(c["values"][..., None], (p + 1) ** 3, axis=-1)
    moments, facet = run(backend, "cells", c["seeds"], c["cells"], coefficients)
    expected = run(Backend("numpy"), "constant", c["seeds"], c["cells"], c["values"])
    close(moments, expected[0], 1e-13, "moments")
    close(facet, expected[1], 1e-13, "facets")
    if not backend.static:             # on the static pieces: test_potential_transpose
        potential = run(backend, "potential", c["seeds"], c["cells"], c["psi"], coefficients.shape)
        constant = integrate.potential_integrals(np, c["seeds"], c["cells"], c["psi"], LO, HI, SHAPE)
        assert potential.shape == coefficients.shape
        close(potential.sum(-1), constant, 1e-13, "potential integrals")


@SKIP_SLOW
def test_random_density(backend, problem):
    """A random density of degree 2 (1 on the static pieces): the cells' moments are the
    clipped pieces' (scipy, exact tetrahedral Gauss rule) to 1e-12, the facet integrals the
    clipped facet polygons' to 1e-12 (box sides included, unused slots zero)."""
    c = problem
    suffix = "_1" if backend.static else ""
    moments, facet = run(backend, "cells", c["seeds"], c["cells"], c["coefficients" + suffix])
    close(moments, c["moments" + suffix], 1e-12, "moments")
    close(facet, c["facets" + suffix], 1e-12, "facets")
    unused = np.arange(facet.shape[1])[None, :] >= c["cells"].count[:, None]
    assert not facet[unused].any()


def test_refined_grid_and_totals(problem):
    """The density refined by de Casteljau subdivision (2x per axis, then 4x: columns of
    whole voxels crossed by the x-primitive) has the same cell integrals, to 1e-13; the
    masses sum to the density's mass and the first moments about the origin to its first
    moment (Bernstein means), to 1e-13."""
    c = problem
    xp = np
    coarse = integrate.bernstein_cell_integrals(xp, c["seeds"], c["cells"], c["coefficients"], LO, HI)
    fine = refined(c["coefficients"])
    twice = refined(fine)
    for grid in (fine, twice):
        moments, facet = integrate.bernstein_cell_integrals(xp, c["seeds"], c["cells"], grid, LO, HI)
        close(moments, coarse[0], 1e-13, f"moments on {grid.shape[:3]}")
        close(facet, coarse[1], 1e-13, f"facets on {grid.shape[:3]}")
    mass, first = totals(c["coefficients"], LO, HI)
    moments = coarse[0]
    assert abs(moments[:, 0].sum() - mass) <= 1e-13 * mass
    close((moments[:, 1:4] + moments[:, :1] * c["seeds"]).sum(0), first, 1e-13, "first moments")


def test_facets_are_mass_derivatives(problem):
    """The Newton matrix's identity ``d mass_i / d psi_j = -facet_ij / (2 |y_i - y_j|)`` for
    neighbours ``j != i``: central differences of the cells' masses (diagrams rebuilt at
    ``psi_j +- 1e-5``), to 1e-6 of the largest entry."""
    import array_api_compat as aac

    from sdot._core import plan
    from sdot._core.density import PixelDensity

    c = problem
    xp = aac.array_namespace(np.zeros(1))
    seeds, psi, coefficients = c["seeds"], c["psi"], c["coefficients"]
    cells = c["cells"]
    facet = integrate.bernstein_cell_integrals(xp, seeds, cells, coefficients, LO, HI)[1]
    matrix = np.zeros((N, N))
    for i in range(N):
        for s in range(int(cells.count[i])):
            j = int(cells.labels[i, s])
            if j >= 0:
                matrix[i, j] -= facet[i, s] / (2.0 * np.linalg.norm(seeds[i] - seeds[j]))
    eps = 1e-5
    for j in (1, 5, 9):
        masses = []
        for sign in (1.0, -1.0):
            moved = psi.copy()
            moved[j] += sign * eps
            cells_j = plan.diagram(xp, seeds, moved, PixelDensity(c["values"], LO, HI)).cells
            masses.append(integrate.bernstein_cell_integrals(xp, seeds, cells_j, coefficients, LO, HI)[0][:, 0])
        derivative = (masses[0] - masses[1]) / (2.0 * eps)
        others = np.arange(N) != j
        assert np.any(matrix[others, j] != 0.0)
        close(derivative[others], matrix[others, j], 1e-6, f"column {j}")
        close(derivative[j], -matrix[others, j].sum(), 1e-6, f"diagonal {j}")


@SKIP_SLOW
def test_potential_transpose(backend, problem):
    """``<potential_integrals(psi), coefficients> = sum_i (M_2,i - psi_i mass_i)`` for random
    coefficients (of either sign; degree 2, 1 on the static pieces), to 1e-12, the moments
    NumPy's; and on the grid refined by de Casteljau (whole columns crossed)."""
    c = problem
    rng = np.random.default_rng(3)
    coefficients = rng.standard_normal(SHAPE + ((STATIC_DEGREE + 1) ** 3 if backend.static else 27,))
    P = run(backend, "potential", c["seeds"], c["cells"], c["psi"], coefficients.shape)
    assert P.shape == coefficients.shape
    moments = integrate.bernstein_cell_integrals(np, c["seeds"], c["cells"], coefficients, LO, HI)[0]
    lhs, rhs = np.sum(P * coefficients), np.sum(moments[:, 4] - c["psi"] * moments[:, 0])
    assert abs(lhs - rhs) <= 1e-12 * np.sum(np.abs(P * coefficients)), (lhs, rhs)
    if not backend.native:              # (refined coefficients, once)
        fine = refined(coefficients)
        P_fine = integrate.bernstein_potential_integrals(np, c["seeds"], c["cells"], c["psi"], LO, HI, fine.shape)
        assert abs(np.sum(P_fine * fine) - rhs) <= 1e-12 * np.sum(np.abs(P_fine * fine))


def test_slices_chunks_and_blocks(problem):
    """Eagerly, in slices of 16 pieces, chunks of 50 triangles and blocks of 4 cells (on 2
    threads), the cell and potential integrals are those of one pass, to rounding."""
    from sdot._host import threads

    c = problem

    def both():
        moments, facet = integrate.bernstein_cell_integrals(np, c["seeds"], c["cells"], c["coefficients"], LO, HI)
        potential = integrate.bernstein_potential_integrals(np, c["seeds"], c["cells"], c["psi"], LO, HI,
                                                            c["coefficients"].shape)
        return moments, facet, potential

    whole = both()
    with threads.host_settings(block=4, min_block=1, threads=2, triangle_chunk=50, piece_slice=16):
        parts = both()
    for name, a, b in zip(("moments", "facets", "potential"), whole, parts):
        close(b, a, 1e-14, f"{name} in slices, chunks and blocks")
