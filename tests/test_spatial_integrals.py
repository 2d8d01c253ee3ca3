"""Exact integrals of a voxel density over 3D cells given as boundary triangle soups
(``sdot._core.spatial.faces``), on every backend, against ground truth that does not
come from the code under test (:mod:`spatial_cells`): power cells built with scipy
(``HalfspaceIntersection``) and clipped by every voxel, and boxes in closed form."""
from __future__ import annotations

import functools
from fractions import Fraction

import numpy as np
import pytest

import spatial_cells as sc
from sdot._core.spatial import faces as integrate

LO, HI = np.array([-0.5, 0.2, 1.0]), np.array([0.7, 1.4, 1.9])
SHAPE = (4, 5, 3)


@functools.lru_cache(maxsize=None)
def _kernels(name, F, shape):
    """The two functions under test, one object per backend and static arguments (so that
    ``jax.jit`` compiles each once per shape)."""
    from conftest import Backend

    xp = Backend(name).xp

    def cells(seeds, tri, slot, valid, values, lo, hi):
        return integrate.cell_integrals_of_triangles(xp, seeds, tri, slot, valid, F, values, lo, hi)

    def potential(seeds, tri, valid, psi, lo, hi):
        return integrate.potential_integrals_of_triangles(xp, seeds, tri, valid, psi, shape, lo, hi)
    return cells, potential


def cell_integrals(b, seeds, tri, slot, valid, F, values, lo=LO, hi=HI, dtype=None):
    cells, _ = _kernels(b.name, F, None)
    out = b.run(cells, b.asarray(seeds, dtype), b.asarray(tri, dtype), b.asarray(slot, np.int64),
                b.asarray(valid, bool), b.asarray(values, dtype), b.asarray(lo, dtype), b.asarray(hi, dtype))
    return tuple(b.to_numpy(a) for a in out)


def potential_integrals(b, seeds, tri, valid, psi, shape, lo=LO, hi=HI):
    _, potential = _kernels(b.name, None, tuple(shape))
    out = b.run(potential, b.asarray(seeds), b.asarray(tri), b.asarray(valid, bool), b.asarray(psi),
                b.asarray(lo), b.asarray(hi))
    return b.to_numpy(out)


def close(actual, expected, rtol, what):
    """To ``rtol`` of the largest entry (of each column for a matrix: per moment, per facet slot)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    scale = np.max(np.abs(expected), axis=0, keepdims=True) if expected.ndim == 2 else np.max(np.abs(expected))
    err = np.max(np.abs(actual - expected) / np.maximum(scale, 1e-300))
    assert err <= rtol, f"{what}: relative error {err:.2e} > {rtol:.0e}"


# ----------------------------------------------------------------------------- power cells

@pytest.fixture(scope="module")
def power_cells():
    """24 power cells in the box ``[LO, HI]`` (three seeds outside it, one far), their
    triangles, the voxel values of a 4 x 5 x 3 grid and the ground truth: moments, facet
    integrals and per-voxel potential integrals, from the cells clipped by every voxel."""
    rng = np.random.default_rng(7)
    n = 24
    seeds = LO + (HI - LO) * rng.random((n, 3))
    seeds[:3] = [[-0.55, 0.8, 1.4], [0.9, 0.3, 1.2], [0.1, 3.0, 1.5]]    # outside the box
    psi = 0.03 * rng.random(n)
    psi[:3] += [0.02, 0.08, 2.8]                                         # their cells are not empty
    tri, slot, valid, F, info = sc.power_cells(seeds, psi, LO, HI)
    assert valid.sum(1).min() > 0
    junk = 1e3 * rng.standard_normal((int((~valid).sum()), 3, 3))          # in the unused slots
    junk[::2] = np.nan
    tri[~valid] = junk
    values = 0.5 + rng.random(SHAPE)
    pieces = sc.piece_moments(seeds, info, SHAPE, LO, HI)
    moments = np.einsum("ijklm,jkl->im", pieces, values)
    facets = sc.facet_integrals(info, values, LO, HI, F)
    potential = np.einsum("ijkl,i->jkl", pieces[..., 4], np.ones(n)) - np.einsum("ijkl,i->jkl", pieces[..., 0], psi)
    return dict(seeds=seeds, psi=psi, tri=tri, slot=slot, valid=valid, F=F, values=values, moments=moments,
                facets=facets, potential=potential, volumes=pieces[..., 0].sum((1, 2, 3)))


def test_power_cells_against_clipped_pieces(backend, power_cells):
    """Masses, first and second moments about the seeds and facet integrals of 24 power
    cells (some seeds outside the box, junk and NaN in the unused triangle slots) on a
    4 x 5 x 3 grid: those of the cells clipped by every voxel, to 1e-12."""
    c = power_cells
    moments, facet = cell_integrals(backend, c["seeds"], c["tri"], c["slot"], c["valid"], c["F"], c["values"])
    close(moments, c["moments"], 1e-12, "moments")
    close(facet, c["facets"], 1e-12, "facet integrals")
    assert moments[:, 0].sum() == pytest.approx(c["values"].mean() * np.prod(HI - LO), rel=1e-13)


def test_potential_integrals_against_clipped_pieces(backend, power_cells):
    """Per voxel ``int phi``, ``phi = |x - y_i|^2 - psi_i`` on cell i: the sum over the cells
    of their clipped pieces' second moments minus ``psi_i`` times their volumes."""
    c = power_cells
    grad = potential_integrals(backend, c["seeds"], c["tri"], c["valid"], c["psi"], SHAPE)
    close(grad, c["potential"], 1e-12, "potential integrals")


def test_uniform_closed_form_equals_the_voxel_walk(backend, power_cells):
    """A (1, 1, 1) grid, integrated in closed form (no splitting), gives the moments and facet
    integrals of a constant 4 x 5 x 3 grid of the same value, split voxel by voxel; both are
    those of the clipped cells."""
    c = power_cells
    one = cell_integrals(backend, c["seeds"], c["tri"], c["slot"], c["valid"], c["F"], np.full((1, 1, 1), 0.7))
    walked = cell_integrals(backend, c["seeds"], c["tri"], c["slot"], c["valid"], c["F"], np.full(SHAPE, 0.7))
    for a, b in zip(one, walked):
        close(a, b, 1e-13, "closed form against the walk")
    assert one[0][:, 0] == pytest.approx(0.7 * c["volumes"], rel=1e-12)


@pytest.mark.parametrize("values", ["uniform", "grid"])
def test_chunks_and_blocks(power_cells, values):
    """Eagerly, in chunks of 7 triangles and blocks of 5 cells (on 2 threads), the
    integrals are those of one chunk and one block, to rounding."""
    from conftest import Backend
    from sdot._host import threads

    c = power_cells
    b = Backend("numpy")
    grid = np.full((1, 1, 1), 0.7) if values == "uniform" else c["values"]
    args = (b, c["seeds"], c["tri"], c["slot"], c["valid"], c["F"], grid)
    whole = cell_integrals(*args)
    gradient = potential_integrals(b, c["seeds"], c["tri"], c["valid"], c["psi"], SHAPE)
    with threads.host_settings(block=5, min_block=1, threads=2, triangle_chunk=7, uniform_triangle_chunk=7):
        parts = cell_integrals(*args)
        gradient_parts = potential_integrals(b, c["seeds"], c["tri"], c["valid"], c["psi"], SHAPE)
    for a, p in zip(whole, parts):
        close(p, a, 1e-14, "in chunks and blocks")
    close(gradient_parts, gradient, 1e-13, "potential integrals in chunks and blocks")


@pytest.mark.skip_backends("jax", "jax-jit", reason="the static path is exercised by strict-static")
def test_no_cells_and_empty_cells(backend):
    """No cells at all, and cells with no valid triangle: zero integrals (eager and static
    paths; JAX runs the static path, as strict-static)."""
    tri = np.zeros((2, 12, 3, 3))
    for values in (np.ones((1, 1, 1)), np.ones(SHAPE)):
        for n in (0, 2):
            moments, facet = cell_integrals(backend, np.zeros((n, 3)), tri[:n], np.zeros((n, 12), np.int64),
                                            np.zeros((n, 12), bool), 6, values)
            assert moments.shape == (n, 5) and facet.shape == (n, 6)
            assert not moments.any() and not facet.any()
    grad = potential_integrals(backend, np.zeros((2, 3)), tri, np.zeros((2, 12), bool), np.zeros(2), SHAPE)
    assert grad.shape == SHAPE and not grad.any()


def test_float32(power_cells):
    """In FP32 (NumPy), the integrals agree with the FP64 ground truth to FP32 accuracy."""
    from conftest import Backend

    c = power_cells
    b = Backend("numpy")
    moments, facet = cell_integrals(b, c["seeds"], c["tri"], c["slot"], c["valid"], c["F"], c["values"],
                                    dtype=np.float32)
    assert moments.dtype == np.float32 and facet.dtype == np.float32
    close(moments, c["moments"], 2e-5, "FP32 moments")
    close(facet, c["facets"], 2e-5, "FP32 facet integrals")


# ----------------------------------------------------------------------------- boxes

def box_cells(boxes):
    """Cells that are boxes ``(p, q, seed)``: triangles (n, 12, 3, 3), slots, valid."""
    tri, slot = zip(*(sc.box_triangles(np.asarray(p, float), np.asarray(q, float), np.asarray(s, float))
                      for p, q, s in boxes))
    seeds = np.array([s for _, _, s in boxes], dtype=float)
    return seeds, np.stack(tri), np.stack(slot), np.ones((len(boxes), 12), bool)


#: Cells in the unit box whose integrals have closed forms: the unit cube (seed at its
#: centre, then at a corner) and a box whose seed is at (1e6, -2e6, 3e6).
UNIT_BOXES = [(np.zeros(3), np.ones(3), [0.5, 0.5, 0.5]), (np.zeros(3), np.ones(3), [1.0, 1.0, 1.0]),
              ([0.2, 0.55, 0.1], [0.6, 0.8, 0.9], [1e6, -2e6, 3e6])]


@pytest.fixture(scope="module")
def unit_box_results():
    """Per backend and grid, the integrals of :data:`UNIT_BOXES` (computed once)."""
    return {}


def unit_box_integrals(backend, shape, results):
    key = (backend.name, shape)
    if key not in results:
        seeds, tri, slot, valid = box_cells(UNIT_BOXES)
        results[key] = cell_integrals(backend, seeds, tri, slot, valid, 6, np.full(shape, 1.5), np.zeros(3), np.ones(3))
    return results[key]


@pytest.mark.parametrize("shape", [(1, 1, 1), (4, 4, 4)], ids=["closed-form", "voxel-walk"])
def test_unit_cube(backend, unit_box_results, shape):
    """The unit cube as one cell, seed at its centre, density 1.5 (uniform, and a constant
    4 x 4 x 4 grid): mass 1.5, first moments 0, second moment 1.5 / 4, each face 1.5; seed
    at a corner: first moments -1.5 / 2, second moment 1.5."""
    moments, facet = unit_box_integrals(backend, shape, unit_box_results)
    np.testing.assert_allclose(moments[:2], 1.5 * np.array([[1, 0, 0, 0, 0.25], [1, -0.5, -0.5, -0.5, 1.0]]),
                               atol=1e-15)
    np.testing.assert_allclose(facet[:2], np.full((2, 6), 1.5), atol=1e-15)


def exact_box(p, q, seed, c):
    """Mass, first and second moments about ``seed`` of density ``c`` on the box whose
    corners relative to the seed are the floats ``p - seed``, ``q - seed``, exactly."""
    P = [Fraction(float(a)) for a in np.asarray(p) - seed]
    Q = [Fraction(float(a)) for a in np.asarray(q) - seed]
    L = [b - a for a, b in zip(P, Q)]
    vol = L[0] * L[1] * L[2]
    first = [vol / L[a] * (Q[a] ** 2 - P[a] ** 2) / 2 for a in range(3)]
    second = sum(vol / L[a] * (Q[a] ** 3 - P[a] ** 3) / 3 for a in range(3))
    return [float(Fraction(c) * t) for t in [vol] + first + [second]]


@pytest.mark.parametrize("shape", [(1, 1, 1), (4, 4, 4)], ids=["closed-form", "voxel-walk"])
def test_cell_far_from_its_seed(backend, unit_box_results, shape):
    """A box cell whose seed is at (1e6, -2e6, 3e6), density 1.5 (uniform, and a constant
    4 x 4 x 4 grid): about the seed, terms of 1e13 cancel; integrated about the cell, the
    moments are those of the box its (rounded) corners describe, to 1e-12."""
    p, q, s = UNIT_BOXES[2]
    moments, facet = unit_box_integrals(backend, shape, unit_box_results)
    np.testing.assert_allclose(moments[2], exact_box(p, q, np.array(s), 1.5), rtol=1e-12)
    np.testing.assert_allclose(facet[2], 1.5 * np.array([0.2, 0.2, 0.32, 0.32, 0.1, 0.1]), rtol=1e-9)


#: Boxes ``(p, q, seed)`` on the grid ``[LO, HI]``, ``SHAPE``: the cells of the tests below.
BOXES = {
    "many voxels": ([-0.41, 0.27, 1.07], [0.66, 1.31, 1.85], [0.1, 0.9, 1.5]),
    "tiny": ([-0.2 - 4e-5, 0.44 - 6e-5, 1.3 - 3e-5], [-0.2 + 5e-5, 0.44 + 3e-5, 1.3 + 7e-5], [-0.2, 0.44, 1.3]),
    "tiny, seed off": ([0.1 - 1e-6, 0.68 - 1e-6, 1.6 - 2e-6], [0.1 + 2e-6, 0.68 + 1e-6, 1.6 + 1e-6],
                       [0.1003, 0.6799, 1.6]),
    "far seed": ([-0.3, 0.5, 1.1], [0.2, 0.9, 1.7], [1e6, -2e6, 3e6]),
    "seed outside": ([0.35, 1.0, 1.2], [0.7, 1.4, 1.5], [1.6, 1.2, 0.7]),
    "faces on voxel planes": ([-0.2, 0.44, 1.3], [0.1, 0.92, 1.6], [-0.1, 0.6, 1.4]),
    "its neighbour": ([0.1, 0.44, 1.3], [0.4, 0.92, 1.6], [0.2, 0.6, 1.4]),
    "neighbour above": ([-0.2, 0.92, 1.3], [0.1, 1.16, 1.6], [-0.1, 1.0, 1.4]),
    "neighbour on top": ([-0.2, 0.44, 1.6], [0.1, 0.92, 1.9], [-0.1, 0.6, 1.7]),
}


@pytest.fixture(scope="module")
def boxes():
    """The :data:`BOXES` as cells, random voxel values, and their integrals in closed form."""
    rng = np.random.default_rng(3)
    values = 0.5 + rng.random(SHAPE)
    seeds, tri, slot, valid = box_cells(list(BOXES.values()))
    truth = [sc.box_truth(np.array(p), np.array(q), np.array(s), values, LO, HI) for p, q, s in BOXES.values()]
    return dict(seeds=seeds, tri=tri, slot=slot, valid=valid, values=values, names=list(BOXES),
                moments=np.array([t[0] for t in truth]), facets=np.array([t[1] for t in truth]),
                pieces=np.array([t[2] for t in truth]))


@pytest.fixture(scope="module")
def box_results(boxes):
    """Per backend name, the integrals of the boxes (computed once)."""
    return {}


def box_integrals(backend, boxes, box_results):
    if backend.name not in box_results:
        c = boxes
        box_results[backend.name] = cell_integrals(backend, c["seeds"], c["tri"], c["slot"], c["valid"], 6,
                                                   c["values"])
    return box_results[backend.name]


@pytest.mark.parametrize("name, rtol", [("many voxels", 1e-12), ("tiny", 1e-11), ("tiny, seed off", 1e-10),
                                        ("seed outside", 1e-12), ("faces on voxel planes", 1e-12)])
def test_box_cells(backend, boxes, box_results, name, rtol):
    """A box spanning most voxels of the grid, tiny boxes (1e-4 and 3e-6 wide, across voxel
    planes, the second 100 widths from its seed), a box whose seed is outside the box of the
    grid, a box whose faces lie on voxel planes: moments and facet integrals in closed form
    (a face on a voxel plane takes the voxel above it). The voxel planes are known to 1e-16
    about the tiny boxes, so their moments to about 1e-16 / width."""
    k = boxes["names"].index(name)
    moments, facet = box_integrals(backend, boxes, box_results)
    for m, (actual, expected) in enumerate(zip(moments[k], boxes["moments"][k])):
        assert actual == pytest.approx(expected, rel=rtol), f"{name}: moment {m}"
    if not backend.host:
        # array_api_strict: the pure array-API scatter-add (prefix sums over all the facets of
        # the call, then differences) is exact to 1e-16 of their sum, not of each
        rtol = max(rtol, 1e-15 * np.sum(boxes["facets"]) / np.max(boxes["facets"][k]))
    close(facet[k], boxes["facets"][k], rtol, f"{name}: facets")


def test_facets_on_voxel_planes_agree_across_cells(backend, boxes, box_results):
    """Two boxes sharing a face on a voxel plane (x, y and z in turn) see the same density on
    it: the face integral of one equals the other's (the voxel above the plane on both sides)."""
    names = boxes["names"]
    _, facet = box_integrals(backend, boxes, box_results)
    me = facet[names.index("faces on voxel planes")]
    for other, mine, theirs in (("its neighbour", 1, 0), ("neighbour above", 3, 2), ("neighbour on top", 5, 4)):
        assert me[mine] == pytest.approx(facet[names.index(other)][theirs], rel=1e-13), other


def test_cell_far_from_its_seed_on_a_grid(backend, boxes, box_results):
    """The far box on the random grid: its corners, rounded relative to a seed at 1e6, are
    only known to about 1e-10, so are its mass and facet integrals (to 1e-9 relative)."""
    k = boxes["names"].index("far seed")
    moments, facet = box_integrals(backend, boxes, box_results)
    np.testing.assert_allclose(moments[k][0], boxes["moments"][k][0], rtol=1e-9)
    np.testing.assert_allclose(facet[k], boxes["facets"][k], rtol=1e-9)


@pytest.mark.skip_backends("jax", "jax-jit", reason="JAX runs the static path of strict-static (compiling costs 2 s); "
                           "jax and jit: the power cells")
def test_box_potential_integrals(backend, boxes):
    """Per voxel ``int phi`` over the boxes (they overlap: the sum of each one's; the far one
    left out, as an invalid cell), against the closed forms."""
    psi = np.linspace(-0.1, 0.2, len(BOXES))
    keep = np.array([name != "far seed" for name in boxes["names"]])
    valid = boxes["valid"] & keep[:, None]
    grad = potential_integrals(backend, boxes["seeds"], boxes["tri"], valid, psi, SHAPE)
    pieces = boxes["pieces"][keep]
    truth = pieces[..., 4].sum(0) - np.einsum("kijl,k->ijl", pieces[..., 0], psi[keep])
    close(grad, truth, 1e-12, "potential integrals of the boxes")
