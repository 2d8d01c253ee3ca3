"""``PowerDiagram`` and ``Cell`` against an independent slow computation, on every eager backend.

Ground truth (no sdot code): the Laguerre cell

    L_i = {x in box : |x - y_i|^2 - w_i <= |x - y_j|^2 - w_j  for all j}

as a ``scipy.spatial.HalfspaceIntersection`` (interior point: the centre of
the largest inscribed disc, by ``scipy.optimize.linprog``; a cell whose disc
has radius ~0 is empty), then a ``ConvexHull`` for the area, the centroid and
the length of the boundary on the line of each constraint. Densities on a
pixel grid are integrated exactly by intersecting each cell with each pixel
(the same construction with the pixel as the box).
"""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from scipy.optimize import linprog  # noqa: E402
from scipy.spatial import ConvexHull, HalfspaceIntersection  # noqa: E402

import sdot  # noqa: E402

ATOL = 1e-10
N = 40            # one size everywhere: JAX compiles its kernels once per shape
UNIT = ((0.0, 0.0), (1.0, 1.0))
SHIFTED = ((-1.0, 0.5), (2.0, 3.0))


# ------------------------------------------------------------- reference (scipy)
def constraints(seeds, weights, i, lo, hi):
    """Rows ``[a, b]`` of the half-planes ``a . x + b <= 0`` of cell i, and their labels.

    Neighbour j (label j): ``2 (y_j - y_i) . x <= |y_j|^2 - |y_i|^2 - w_j + w_i``.
    Box sides (labels -1 - side; 0: y = lo, 1: x = hi, 2: y = hi, 3: x = lo).
    Returns ``None`` when an exact duplicate of larger weight empties the cell.
    """
    y, w = np.asarray(seeds, float), np.asarray(weights, float)
    (x0, y0), (x1, y1) = lo, hi
    rows = [[0.0, -1.0, y0], [1.0, 0.0, -x1], [0.0, 1.0, -y1], [-1.0, 0.0, x0]]
    labels = [-1, -2, -3, -4]
    for j in range(len(y)):
        if j == i:
            continue
        d = y[j] - y[i]
        if not d.any():                      # same seed: 0 <= w_i - w_j
            if w[j] > w[i]:
                return None
            continue
        rows.append([2 * d[0], 2 * d[1], -(y[j] @ y[j] - y[i] @ y[i] - w[j] + w[i])])
        labels.append(j)
    return np.array(rows), np.array(labels)


def reference_cell(seeds, weights, i, lo=UNIT[0], hi=UNIT[1]):
    """Area, centroid, CCW vertices and ``{label: facet length}`` of cell i (``None`` if empty)."""
    found = constraints(seeds, weights, i, lo, hi)
    if found is None:
        return None
    h, labels = found
    a, b = h[:, :2], h[:, 2]
    norm = np.linalg.norm(a, axis=1)
    # Chebyshev centre: max r  s.t.  a . x + r |a| <= -b.
    lp = linprog([0.0, 0.0, -1.0], A_ub=np.column_stack([a, norm]), b_ub=-b,
                 bounds=[(None, None), (None, None), (0.0, None)], method="highs")
    assert lp.status in (0, 2), lp.message   # 2: infeasible, no point at all
    if lp.status == 2 or lp.x[2] < 1e-9:
        return None
    hull = ConvexHull(HalfspaceIntersection(h, lp.x[:2]).intersections)
    v = hull.points[hull.vertices]           # counter-clockwise in 2D
    area, centroid = polygon_area_centroid(v)
    assert area == pytest.approx(hull.volume, abs=1e-13)
    dist = (v @ a.T + b) / norm              # signed distances vertex x constraint
    facets = {}
    for k, label in enumerate(labels):
        on = v[np.abs(dist[:, k]) < 1e-9]
        if len(on) >= 2:
            length = np.max(np.linalg.norm(on[:, None, :] - on[None, :, :], axis=-1))
            facets[int(label)] = facets.get(int(label), 0.0) + length
    return dict(area=area, centroid=centroid, vertices=v, facets=facets)


def polygon_area_centroid(v):
    """Signed area (> 0 counter-clockwise) and centroid of the polygon ``v`` (shoelace)."""
    v = np.asarray(v, float)
    nxt = np.roll(v, -1, axis=0)
    cross = v[:, 0] * nxt[:, 1] - nxt[:, 0] * v[:, 1]
    area = cross.sum() / 2
    centroid = ((v + nxt) * cross[:, None]).sum(axis=0) / (6 * area)
    return area, centroid


def power(seeds, weights, x):
    """``|x - y_j|^2 - w_j`` for every point of ``x`` (m, 2) and seed j: (m, n)."""
    return ((x[:, None, :] - seeds[None, :, :]) ** 2).sum(-1) - weights[None, :]


# ---------------------------------------------------------------------- checks
def facet_lengths(cell):
    out = {}
    for label, (start, end) in cell.facets:
        out[label] = out.get(label, 0.0) + float(np.linalg.norm(np.asarray(end) - np.asarray(start)))
    return out


def check_cell(cell, ref, seeds, weights, i, lo, hi, relabel=None):
    """One sdot cell against its reference (``ref`` None: empty)."""
    verts = np.asarray(cell.vertices, dtype=float)
    assert cell.index == i
    if ref is None:
        assert float(cell.measure) == 0.0, f"cell {i} should be empty"
        assert verts.shape[0] == 0 and cell.facets == []
        np.testing.assert_allclose(cell.barycenter, seeds[i], atol=0)
        return
    where = f"cell {i}"
    assert float(cell.measure) == pytest.approx(ref["area"], abs=ATOL), where
    np.testing.assert_allclose(cell.barycenter, ref["centroid"], atol=ATOL, err_msg=where)
    # Vertices as a polygon: counter-clockwise, same area and centroid, ...
    assert verts.ndim == 2 and verts.shape[1] == 2 and len(verts) >= 3, where
    area, centroid = polygon_area_centroid(verts)
    assert area == pytest.approx(ref["area"], abs=ATOL), where
    np.testing.assert_allclose(centroid, ref["centroid"], atol=ATOL, err_msg=where)
    # ... every vertex in the box and of least power for seed i, ...
    assert np.all(verts >= np.asarray(lo) - ATOL) and np.all(verts <= np.asarray(hi) + ATOL), where
    pw = power(seeds, weights, verts)
    assert np.all(pw[:, i] <= pw.min(axis=1) + ATOL), where
    # ... and every corner of the reference polygon is one of them.
    gap = np.linalg.norm(ref["vertices"][:, None, :] - verts[None, :, :], axis=-1).min(axis=1)
    assert gap.max() <= ATOL, where
    # Facet length per neighbour (or domain side).
    got = facet_lengths(cell)
    expected = ref["facets"] if relabel is None else {relabel.get(k, k): v for k, v in ref["facets"].items()}
    for label in set(got) | set(expected):
        assert got.get(label, 0.0) == pytest.approx(expected.get(label, 0.0), abs=ATOL), \
            f"{where}, facet with {label}: got {got.get(label, 0.0)}, expected {expected.get(label, 0.0)}"


def random_diagram(rng, n, domain, scale):
    lo, hi = np.asarray(domain[0]), np.asarray(domain[1])
    seeds = lo + (hi - lo) * rng.random((n, 2))
    return seeds, scale * np.prod(hi - lo) * rng.random(n)


def build(backend, seeds, weights, domain=None):
    return sdot.PowerDiagram(backend.asarray(seeds), backend.asarray(weights), domain=domain)


# ---------------------------------------------------------------------- tests
@pytest.mark.parametrize("domain", [None, SHIFTED], ids=["unit", "shifted"])
def test_cells_match_scipy(eager_backend, domain):
    rng = np.random.default_rng(7)
    seeds, weights = random_diagram(rng, N, domain or UNIT, 0.02)
    lo, hi = domain or UNIT
    refs = [reference_cell(seeds, weights, i, lo, hi) for i in range(len(seeds))]
    assert sum(r is None for r in refs) >= 1, "the test needs at least one empty cell"
    pd = build(eager_backend, seeds, weights, domain)
    cells = pd.cells
    assert len(cells) == len(seeds)
    for i, (cell, ref) in enumerate(zip(cells, refs)):
        check_cell(cell, ref, seeds, weights, i, lo, hi)
    box = np.prod(np.subtract(hi, lo))
    assert sum(float(c.measure) for c in cells) == pytest.approx(box, abs=ATOL)


@pytest.mark.parametrize("pair", ["equal", "first_heavier"])
def test_duplicate_seeds(eager_backend, pair):
    """Exact duplicates 3 and 11: the first keeps the cell, the second is empty.

    With equal weights both cells are, by the definition, the same region: the
    convention gives it to the first (reference: the diagram without seed 11).
    """
    rng = np.random.default_rng(11)
    seeds, weights = random_diagram(rng, N, UNIT, 0.01)
    seeds[11] = seeds[3]
    weights[11] = weights[3] - (0.0 if pair == "equal" else 0.004)
    keep = [k for k in range(N) if k != 11]
    sub = [reference_cell(seeds[keep], weights[keep], a) for a in range(N - 1)]
    refs = sub[:11] + [None] + sub[11:]
    relabel = {b: a for b, a in enumerate(keep)}       # indices of seeds[keep] -> of seeds
    assert refs[3] is not None
    if pair == "first_heavier":                        # the definition itself empties cell 11
        assert reference_cell(seeds, weights, 11) is None
    pd = build(eager_backend, seeds, weights)
    cells = pd.cells
    for i, (cell, ref) in enumerate(zip(cells, refs)):
        check_cell(cell, ref, seeds, weights, i, *UNIT, relabel=relabel)
        assert 11 not in facet_lengths(cell)


def test_duplicate_seeds_lighter_first(eager_backend):
    """Duplicates 3 and 11 with w_3 < w_11: by the definition of the class
    (``|x - y_i|^2 - w_i <= |x - y_j|^2 - w_j`` for all j), cell 3 is empty and
    cell 11 is the cell of that seed with the weight w_11."""
    rng = np.random.default_rng(11)
    seeds, weights = random_diagram(rng, N, UNIT, 0.01)
    seeds[11] = seeds[3]
    weights[11] = weights[3] + 0.004
    refs = [reference_cell(seeds, weights, i) for i in range(N)]
    assert refs[3] is None and refs[11] is not None
    cells = build(eager_backend, seeds, weights).cells
    for i, (cell, ref) in enumerate(zip(cells, refs)):
        check_cell(cell, ref, seeds, weights, i, *UNIT)


def reference_moments(seeds, weights, img, lo=UNIT[0], hi=UNIT[1]):
    """Mass and barycentre of each cell under the density ``img`` normalised to mass 1."""
    img = np.asarray(img, float)
    nx, ny = img.shape
    ex, ey = np.linspace(lo[0], hi[0], nx + 1), np.linspace(lo[1], hi[1], ny + 1)
    pixel = (ex[1] - ex[0]) * (ey[1] - ey[0])
    rho = img / (img.sum() * pixel)
    mass, bary = np.zeros(len(seeds)), np.array(seeds, float)
    for i in range(len(seeds)):
        whole = reference_cell(seeds, weights, i, lo, hi)
        if whole is None:
            continue
        vmin, vmax = whole["vertices"].min(axis=0), whole["vertices"].max(axis=0)
        first = np.zeros(2)
        for a in range(nx):
            for b in range(ny):
                if ex[a + 1] <= vmin[0] or ex[a] >= vmax[0] or ey[b + 1] <= vmin[1] or ey[b] >= vmax[1]:
                    continue
                piece = reference_cell(seeds, weights, i, (ex[a], ey[b]), (ex[a + 1], ey[b + 1]))
                if piece is not None:
                    mass[i] += rho[a, b] * piece["area"]
                    first += rho[a, b] * piece["area"] * piece["centroid"]
        if mass[i] > 0:
            bary[i] = first / mass[i]
    return mass, bary


def test_adjust_weights(eager_backend):
    rng = np.random.default_rng(3)
    n = N
    seeds = rng.random((n, 2))
    masses = rng.random(n) + 0.2
    img = 0.2 + rng.random((5, 4))
    pd = sdot.PowerDiagram(eager_backend.asarray(seeds))
    plan = pd.adjust_weights(eager_backend.asarray(masses), sdot.Grid(eager_backend.asarray(img)))
    assert bool(plan.converged)
    assert type(pd.weights) is type(eager_backend.asarray([1.0]))
    w = eager_backend.to_numpy(pd.weights)
    assert w.shape == (n,)
    cells = pd.cells
    got = np.array([float(c.measure) for c in cells])
    np.testing.assert_allclose(got, masses / masses.sum(), atol=1e-9)
    np.testing.assert_allclose(eager_backend.to_numpy(plan.cell_masses), got, atol=1e-12)
    # The cells of the returned weights, integrated independently under the density.
    ref_mass, ref_bary = reference_moments(seeds, w, img)
    np.testing.assert_allclose(got, ref_mass, atol=ATOL)
    np.testing.assert_allclose(ref_mass, masses / masses.sum(), atol=1e-9)
    np.testing.assert_allclose(np.array([c.barycenter for c in cells]), ref_bary, atol=ATOL)
    for i, cell in enumerate(cells):
        ref = reference_cell(seeds, w, i)
        area, centroid = polygon_area_centroid(np.asarray(cell.vertices, float))
        assert area == pytest.approx(ref["area"], abs=ATOL)
        np.testing.assert_allclose(centroid, ref["centroid"], atol=ATOL)


def test_plot(eager_backend):
    rng = np.random.default_rng(7)
    seeds, weights = random_diagram(rng, N, UNIT, 0.02)
    pd = build(eager_backend, seeds, weights)
    cells = pd.cells
    empty = [c for c in cells if len(c.vertices) == 0]
    full = [c for c in cells if len(c.vertices) > 0]
    assert empty and full
    try:
        fig, ax = plt.subplots()
        assert pd.plot(ax=ax) is ax
        segments = ax.collections[-1].get_segments()
        assert len(segments) == sum(len(c.facets) for c in cells)
        expected = np.array([[s, e] for c in cells for _, (s, e) in c.facets])
        np.testing.assert_allclose(np.array(segments), expected, atol=1e-14)
        assert full[0].plot(ax=ax, color="r") is ax
        line = ax.lines[-1].get_xydata()
        np.testing.assert_allclose(line, np.concatenate([full[0].vertices, full[0].vertices[:1]]))
        n_lines = len(ax.lines)
        assert empty[0].plot(ax=ax) is ax and len(ax.lines) == n_lines
        plt.figure()
        ax2 = pd.plot(points=False)
        assert isinstance(ax2, Axes) and ax2 is not ax
        assert isinstance(full[0].plot(), Axes) and isinstance(empty[0].plot(), Axes)
    finally:
        plt.close("all")


def test_cell_with_more_vertices_than_the_default_capacity(eager_backend):
    """A seed ringed by 24 others: its Voronoi cell is a regular 24-gon (capacity 16 overflows)."""
    k, r = 24, 0.2
    angles = 2 * np.pi * np.arange(k) / k
    ring = 0.5 + r * np.stack([np.cos(angles), np.sin(angles)], 1)
    seeds = np.concatenate([[[0.5, 0.5]], ring])
    cell = sdot.PowerDiagram(eager_backend.asarray(seeds)).cells[0]
    apothem = r / 2
    assert len(cell.vertices) == k
    assert float(cell.measure) == pytest.approx(k * apothem**2 * np.tan(np.pi / k), rel=1e-12)


def test_capacity_grows_on_overflow(eager_backend):
    """The 24-gon cell clipped by 12 nearest-seed candidates overflows the default
    16 vertex slots: the diagram is rebuilt wider (1.5 times, 24) and the cell is whole
    (with static shapes the overflow is reported, and the caller retries)."""
    from sdot._core import planar

    k, r = 24, 0.2
    angles = 2 * np.pi * np.arange(k) / k
    seeds = np.concatenate([[[0.5, 0.5]], 0.5 + r * np.stack([np.cos(angles), np.sin(angles)], 1)])
    near = np.argsort(((seeds[:, None] - seeds[None]) ** 2).sum(-1), axis=1)[:, 1:13]
    near[0] = np.arange(1, 13)      # only half the ring: the repair finds the rest
    xp, b = eager_backend.xp, eager_backend
    cells = planar.power_cells(xp, b.asarray(seeds), b.asarray(np.zeros(k + 1)), b.asarray(np.ones(k + 1), bool),
                                 b.asarray([0.0, 0.0]), b.asarray([1.0, 1.0]), b.asarray(near, np.int64))
    if b.static:        # no growth with static shapes: the overflow is reported
        assert cells.labels.shape[1] == 16 and b.to_numpy(cells.overflow)[0]
        return
    assert cells.labels.shape[1] == 24
    assert int(b.to_numpy(cells.count)[0]) == k
    assert not b.to_numpy(cells.overflow).any() and bool(b.to_numpy(cells.certified))


@pytest.mark.parametrize("spread", [0.0, 0.004])
def test_cells_within_the_security_radius_are_exact(backend, spread):
    """Cells of 80 seeds clipped by their 8 nearest seeds only (weights 0, or of random
    sign): every active cell that ``beyond_security`` does not flag equals scipy's
    cell (no seed outside its candidates can cut it), and the flagged ones include
    every cell that is not exact (measured: 10 to 15 cells unflagged, 31 to 35 not exact)."""
    from sdot._core import seed_neighbours
    from sdot._core.planar import diagram, polygons

    rng = np.random.default_rng(8)
    n = 80
    seeds, psi = rng.random((n, 2)), spread * rng.standard_normal(n)
    active = rng.random(n) > 0.1
    xp, b = backend.xp, backend

    def run(y, w, lo, hi):
        act = b.asarray(active, bool)
        near = seed_neighbours.knn(xp, y, 9)
        cells = polygons.clip_by(xp, y, w, act, polygons.box_cells(xp, y, lo, hi, act, 16),
                                 xp.arange(n, dtype=xp.int64, device=b.device), near)
        return cells.vertices, cells.count, diagram.beyond_security(xp, y, w, act, cells, near)
    verts, count, flagged = (b.to_numpy(a) for a in backend.run(
        run, *(b.asarray(a) for a in (seeds, psi, [0.0, 0.0], [1.0, 1.0]))))
    exact = np.ones(n, bool)
    for i in np.flatnonzero(active):
        ref = reference_cell(seeds[active], psi[active], int(np.sum(active[:i])))
        area = polygon_area_centroid(verts[i, :count[i]])[0] if count[i] else 0.0
        exact[i] = abs(area - (0.0 if ref is None else ref["area"])) < 1e-12
    assert not flagged[~active].any()
    assert np.all(exact[active & ~flagged]), "an unflagged cell is not exact"
    assert (active & ~exact).any() and (active & ~flagged).sum() >= 10, "both kinds occur"
