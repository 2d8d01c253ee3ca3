"""Cell integrals of a constant density (one pixel: the closed form of
``contour.uniform_integrals``) against hand-computed values and against the pixel
walk of the general path on a constant grid of several pixels, on every backend."""
import array_api_compat.numpy as npx
import numpy as np
import pytest

from sdot._core import planar
from sdot._core.planar import contour, integrate
from sdot._core.planar.polygons import Cells
from sdot._host import threads


def on_backend(b, cells):
    return Cells(*(b.asarray(getattr(cells, f), dtype=np.asarray(getattr(cells, f)).dtype)
                   for f in Cells._fields))


def integrals(b, seeds, cells, density, lo, hi):
    args = [b.asarray(a) for a in (seeds, density, lo, hi)]
    out = b.run(lambda s, c, d, l, h: integrate.cell_integrals(b.xp, s, c, d, l, h),
                args[0], on_backend(b, cells), *args[1:])
    return tuple(b.to_numpy(a) for a in out)


def rectangle_cell(seed):
    """The cell ``[0.2, 0.6] x [0.1, 0.3]`` of ``seed`` (1, 2): its corners relative to the
    seed and its :class:`Cells` (one cell, 6 vertex slots, the box's sides as labels)."""
    corners = np.array([[0.2, 0.1], [0.6, 0.1], [0.6, 0.3], [0.2, 0.3]]) - seed
    vertices = np.zeros((1, 6, 2))
    vertices[0, :4] = corners
    return corners, Cells(vertices, np.array([[-1, -2, -3, -4, -1, -1]]), np.array([4]), np.array([False]),
                          np.array(True))


def test_rectangle_cell_by_hand(backend):
    """A cell ``[0.2, 0.6] x [0.1, 0.3]`` (seed at (0.3, 0.2)) of density 1.5: mass
    1.5 * 0.08, first moments about the seed 1.5 * 0.08 * (0.1, 0), second moment
    1.5 * int (u^2 + v^2) = 1.5 * (0.2 * 0.028 / 3 + 0.4 * 0.002 / 3), edges 1.5 * length."""
    seed = np.array([[0.3, 0.2]])
    corners, cells = rectangle_cell(seed)
    moments, facet = integrals(backend, seed, cells, np.full((1, 1), 1.5), np.zeros(2), np.ones(2))
    # int u^2 over u in [-0.1, 0.3] = (0.027 + 0.001) / 3; int v^2 over v in [-0.1, 0.1] = 0.002 / 3
    m2 = 0.2 * 0.028 / 3 + 0.4 * 0.002 / 3
    np.testing.assert_allclose(moments, [[1.5 * 0.08, 1.5 * 0.008, 0.0, 1.5 * m2]], atol=1e-15)
    np.testing.assert_allclose(facet, [[0.6, 0.3, 0.6, 0.3, 0.0, 0.0]], atol=1e-15)


def exact_polygon_moments(vertices, c):
    """Mass, first moments and second moment of density ``c`` on the polygon of the given
    float vertices (relative to the seed), in exact rational arithmetic: the ground truth of
    the cell the floats describe, rounding of the input included."""
    from fractions import Fraction as F

    v = [(F(float(x)), F(float(y))) for x, y in vertices]
    m = mx = my = m2 = F(0)
    for (ax, ay), (bx, by) in zip(v, v[1:] + v[:1]):
        w = ax * by - ay * bx
        m += w / 2
        mx += w * (ax + bx) / 6
        my += w * (ay + by) / 6
        m2 += w * (ax * ax + ax * bx + bx * bx + ay * ay + ay * by + by * by) / 12
    return [float(F(c) * t) for t in (m, mx, my, m2)]


@pytest.mark.parametrize("shape", [(1, 1), (4, 4)], ids=["closed-form", "pixel-walk"])
def test_cell_far_from_its_seed(backend, shape):
    """The cell ``[0.2, 0.6] x [0.1, 0.3]`` of a seed at (1e6, 1e6), density 1.5: about the
    seed, the closed forms cancel terms of 1e12 (the mass came out 2e-4 off and a solve with
    one Dirac at 1e6 stalled); integrated about the cell, the moments are those of the
    polygon the (rounded) vertices describe, to 1e-12."""
    seed = np.array([[1e6, 1e6]])
    corners, cells = rectangle_cell(seed)
    moments, facet = integrals(backend, seed, cells, np.full(shape, 1.5), np.zeros(2), np.ones(2))
    np.testing.assert_allclose(moments[0], exact_polygon_moments(corners, 1.5), rtol=1e-12)
    np.testing.assert_allclose(facet[0, :4], 1.5 * np.array([0.4, 0.2, 0.4, 0.2]), rtol=1e-9)


@pytest.mark.parametrize("box", [((0.0, 0.0), (1.0, 1.0)), ((-1.0, 0.5), (2.0, 3.0))], ids=["unit", "shifted"])
def test_one_pixel_equals_the_pixel_walk_on_a_constant_grid(backend, box, monkeypatch, array_kernels):
    """A power diagram of 200 seeds (half of them hidden, the others of 3 to 13
    vertices, some on the box's sides): a (1, 1) density, integrated in closed form,
    gives the moments and edge integrals of a constant (3, 2) grid of the same value,
    whose edges are walked pixel by pixel."""
    rng = np.random.default_rng(5)
    lo, hi = np.asarray(box[0]), np.asarray(box[1])
    seeds = lo + (hi - lo) * rng.random((200, 2))
    psi = 0.02 * np.prod(hi - lo) * rng.random(200)
    cells = planar.power_cells(npx, seeds, psi, np.ones(200, bool), lo, hi)
    closed_form = contour.uniform_integrals
    calls = []
    monkeypatch.setattr(contour, "uniform_integrals", lambda *a: calls.append(1) or closed_form(*a))
    one = integrals(backend, seeds, cells, np.full((1, 1), 0.7), lo, hi)
    assert calls
    calls.clear()
    walked = integrals(backend, seeds, cells, np.full((3, 2), 0.7), lo, hi)
    assert not calls
    assert one[0][:, 0].sum() == pytest.approx(0.7 * np.prod(hi - lo), rel=1e-13)
    for a, b in zip(one, walked):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-14 * np.prod(hi - lo) ** 2)


@pytest.mark.parametrize("box", [((0.0, 0.0), (1.0, 1.0)), ((-1.0, 0.5), (2.0, 3.0))], ids=["unit", "shifted"])
def test_cells_in_one_pixel_integrated_apart(backend, box, monkeypatch, array_kernels):
    """2000 seeds on a 16x12 grid of random values (with zero pixels): eagerly, the cells
    that lie in one pixel are integrated in closed form, apart from the pixel walk of the
    others. Each such cell's moments are those of its polygon (exact rational arithmetic)
    times its pixel's value; all moments and edge integrals equal the walk's of every cell,
    and the masses sum to the density's total."""
    rng = np.random.default_rng(7)
    lo, hi = np.asarray(box[0]), np.asarray(box[1])
    image = rng.random((16, 12)) * (rng.random((16, 12)) > 0.2)
    seeds = lo + (hi - lo) * rng.random((2000, 2))
    cells = planar.power_cells(npx, seeds, 1e-4 * np.prod(hi - lo) * rng.random(2000), np.ones(2000, bool), lo, hi)
    apart = contour._polygon_integrals
    calls = []
    monkeypatch.setattr(contour, "_polygon_integrals", lambda *a: calls.append(a[1].shape[0]) or apart(*a))
    fast = integrals(backend, seeds, cells, image, lo, hi)
    if backend.static:
        assert not calls                # with static shapes every cell is walked
    else:
        assert sum(calls) > 500         # about a third of the cells lie in one pixel
    with threads.host_settings(one_pixel_share=2.0):         # never enough cells in one pixel
        walked = integrals(backend, seeds, cells, image, lo, hi)
    area = np.prod(hi - lo)
    assert fast[0][:, 0].sum() == pytest.approx(image.mean() * area, rel=1e-12)
    for a, b in zip(fast, walked):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-14 * area ** 2)
    pixel = contour._pixel_of_cells(npx, seeds, cells.vertices, cells.count, lo, hi, image.shape)
    for i in np.flatnonzero(pixel >= 0)[:5]:
        c = image.reshape(-1)[pixel[i]]
        want = exact_polygon_moments(cells.vertices[i, :cells.count[i]], c)
        np.testing.assert_allclose(fast[0][i], want, rtol=1e-12, atol=1e-16 * area ** 2)
