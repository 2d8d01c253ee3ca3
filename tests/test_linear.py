"""1D: the sorted closed form against independent ground truth, on every backend.

Ground truth that is not the code under test: closed forms and hand computations, and
:func:`exact`, the transport computed in exact rational arithmetic (``fractions``) by the
quantile formula ``W2^2 = int_0^1 (F^-1(t) - Q(t))^2 dt`` (F the density's cumulative
distribution, Q the Diracs' quantile function): an integral over the masses ``t``, where the
solver integrates over positions ``x``. Gradients against central finite differences of the
value in FP64, and torch against JAX.
"""
import functools
from fractions import Fraction

import numpy as np
import pytest

import sdot

PLAN_FIELDS = ("distance", "barycenters", "cell_masses", "brenier_potential", "residual", "converged",
               "iterations", "status")


# ---------------------------------------------------------------- the reference
def exact(y, masses, values, lo=0, hi=1):
    """W2^2, and per Dirac the mass and barycentre of its cell, in rationals: the Diracs at
    ``y`` of ``masses`` (normalised to 1; exact duplicates share their cell in proportion to
    their masses) against the density ``values`` on ``[lo, hi]`` (normalised to 1)."""
    y, masses, values = ([Fraction(v) for v in a] for a in (y, masses, values))
    masses = [m / sum(masses) for m in masses]
    lo, hi = Fraction(lo), Fraction(hi)
    width = (hi - lo) / len(values)
    c = [v / (sum(values) * width) for v in values]
    positions = sorted(set(yi for yi, mi in zip(y, masses) if mi > 0))
    group = {p: sum(m for yi, m in zip(y, masses) if yi == p) for p in positions}
    ends, acc = [], Fraction(0)                        # cumulative masses of the Diracs, by position
    for p in positions:
        acc += group[p]
        ends.append(acc)
    levels, acc = [Fraction(0)], Fraction(0)          # the density's cumulative masses at the edges
    for ck in c:
        acc += ck * width
        levels.append(acc)
    cuts = sorted(set(ends) | set(levels))
    w2, moment = Fraction(0), {p: Fraction(0) for p in positions}
    for t0, t1 in zip(cuts[:-1], cuts[1:]):
        k = max(i for i in range(len(c)) if levels[i] <= t0)        # the segment of F^-1 on (t0, t1)
        while c[k] == 0:
            k += 1
        p = positions[min(i for i, e in enumerate(ends) if e >= t1)]   # the Dirac of Q on (t0, t1)

        def x(t):
            return lo + k * width + (t - levels[k]) / c[k]
        mid = (t0 + t1) / 2
        w2 += (t1 - t0) * ((x(t0) - p) ** 2 + 4 * (x(mid) - p) ** 2 + (x(t1) - p) ** 2) / 6   # Simpson: exact
        moment[p] += (t1 - t0) * (x(t0) + x(t1)) / 2
    bary = [moment[yi] / group[yi] if yi in group else yi for yi in y]
    return w2, masses, bary


def test_the_reference_itself():
    """Hand values: one Dirac at 1/2 on U[0, 1] (1/12); two equal Diracs at 0 and 1 against
    the density 1 on [0, 1/2], 3 on [1/2, 1]: boundary 2/3, W2^2 = 1/8, barycentres 5/12, 5/6."""
    assert exact([Fraction(1, 2)], [1], [1, 1, 1])[0] == Fraction(1, 12)
    w2, share, bary = exact([0, 1], [1, 1], [1, 3])
    assert (w2, share, bary) == (Fraction(1, 8), [Fraction(1, 2)] * 2, [Fraction(5, 12), Fraction(5, 6)])


# ------------------------------------------------------------------ helpers
def plan_of(backend, y, values, weights=None, domain=None):
    """The plan's arrays (NumPy) of Diracs at ``y`` (n,) against ``Grid(values, domain)`` on
    ``backend`` (under ``jax.jit`` for "jax-jit")."""
    args = [backend.asarray(y), backend.asarray(values)] + ([] if weights is None else [backend.asarray(weights)])
    out = backend.run(_solver(domain), *args)
    return {f: backend.to_numpy(a) for f, a in zip(PLAN_FIELDS, out)}


@functools.cache
def _solver(domain):
    """One function per domain: ``jax.jit`` compiles it once per shape."""
    def run(y, values, *w):
        src = sdot.SumOfDiracs1d(y) if not w else sdot.SumOfWeightedDiracs(y[:, None], w[0])
        plan = sdot.optimal_transport_plan(src, sdot.Grid(values, domain=domain))
        return tuple(getattr(plan, f) for f in PLAN_FIELDS)
    return run


def check_exact(plan, y, weights, values, lo=0, hi=1, rtol=1e-13):
    weights = np.ones(len(y)) if weights is None else np.asarray(weights)
    w2, share, bary = exact([Fraction(v) for v in y], [Fraction(v) for v in weights],
                            [Fraction(v) for v in values], Fraction(lo), Fraction(hi))
    assert float(plan["distance"]) == pytest.approx(float(w2), rel=rtol)
    np.testing.assert_allclose(plan["cell_masses"], [float(s) for s in share], rtol=0, atol=5e-15)
    np.testing.assert_allclose(plan["barycenters"][:, 0], [float(b) for b in bary], rtol=0, atol=1e-13 * (hi - lo))
    assert bool(plan["converged"]) and int(plan["iterations"]) == 0 and int(plan["status"]) == 0
    assert float(plan["residual"]) <= 1e-14


def power_argmin(x, y, psi):
    """The Dirac whose power function ``(x - y_i)^2 - psi_i`` is smallest at each ``x``."""
    return np.argmin((x[:, None] - y[None, :]) ** 2 - psi[None, :], axis=1)


# --------------------------------------------------------------- closed forms
@pytest.mark.parametrize("y, expected", [(0.5, 1 / 12), (0.0, 1 / 3), (2.0, 7 / 3)])
def test_one_dirac(backend, y, expected):
    """W2^2 of one Dirac = the second moment of U[0, 1] about it."""
    plan = plan_of(backend, [y], np.ones(3))
    assert float(plan["distance"]) == pytest.approx(expected, rel=1e-14)
    np.testing.assert_allclose(plan["barycenters"], [[0.5]], atol=1e-15)
    assert float(plan["brenier_potential"][0]) == 0.0 and int(plan["iterations"]) == 0


def test_cell_centres_of_the_uniform_density(backend):
    """n Diracs at (2k + 1) / (2n), in reverse order: W2^2 = 1 / (12 n^2), barycentres the
    Diracs, equal weights (mean 0: all 0)."""
    n = 10
    y = ((2 * np.arange(n) + 1) / (2 * n))[::-1]
    plan = plan_of(backend, y, np.ones(7))
    assert float(plan["distance"]) == pytest.approx(1 / (12 * n * n), rel=1e-13)
    np.testing.assert_allclose(plan["barycenters"][:, 0], y, atol=1e-15)
    np.testing.assert_allclose(plan["brenier_potential"], 0.0, atol=1e-15)
    np.testing.assert_allclose(plan["cell_masses"], 1 / n, atol=1e-16)


def test_hand_computed_non_uniform(backend):
    """Density 1 on [0, 1/2], 3 on [1/2, 1] (normalised: 1/2 and 3/2), Diracs at 0 and 1:
    boundary 2/3, W2^2 = 1/8, barycentres 5/12 and 5/6, weights +-1/6 (``psi_1 - psi_0 =
    (1 - 0) ((1 - 2/3) + (0 - 2/3))``)."""
    plan = plan_of(backend, [1.0, 0.0], [1.0, 3.0])
    assert float(plan["distance"]) == pytest.approx(1 / 8, rel=1e-14)
    np.testing.assert_allclose(plan["barycenters"][:, 0], [5 / 6, 5 / 12], rtol=1e-14)
    np.testing.assert_allclose(plan["brenier_potential"], [-1 / 6, 1 / 6], rtol=1e-14)


# -------------------------------------------------------- against the reference
def rational_case(seed, n, n0):
    """Random positions in [-0.25, 1.25] on a grid of 1/64 (exact in binary), weights and
    values small integers with zeros, a duplicate pair."""
    rng = np.random.default_rng(seed)
    y = rng.integers(-16, 81, n) / 64
    y[1] = y[0]
    weights = rng.integers(0, 5, n).astype(float)
    weights[[0, 1, 2]] = [1.0, 2.0, 3.0]
    values = rng.integers(0, 4, n0).astype(float)
    values[n0 // 2] = 0.0
    values[n0 // 3] = 2.0
    return y, weights, values


def test_against_exact_rationals(backend):
    """Unsorted, outside the domain, duplicates, zero weights and zero-density segments."""
    for seed in (0, 1):
        y, weights, values = rational_case(seed, 12, 9)
        check_exact(plan_of(backend, y, values, weights), y, weights, values)


def test_against_exact_rationals_larger_and_elsewhere():
    """More Diracs and segments, on the domain [-3, 5]."""
    rng = np.random.default_rng(7)
    y = rng.integers(-4 * 64, 6 * 64, 200) / 64
    weights = rng.integers(0, 9, 200).astype(float)
    values = rng.integers(0, 5, 57).astype(float)
    plan = plan_of(_numpy(), y, values, weights, domain=(-3.0, 5.0))
    check_exact(plan, y, weights, values, -3, 5, rtol=1e-12)


def _numpy():
    from conftest import Backend

    return Backend("numpy")


def test_weights_are_the_power_diagram_of_the_cells(eager_backend):
    """The reported weights ``psi`` put every point of positive density in the cell of its
    Dirac (the power functions' argmin), and Kantorovich duality holds with equality:
    ``W2^2 = sum_i m_i psi_i + int phi rho``, ``phi = min_i (x - y_i)^2 - psi_i``
    (fine midpoint sums), including across a zero-density gap (any boundary in it works)."""
    y = np.array([0.9, 0.1, 0.15, 0.45, 0.55, 1.4])
    values = np.array([1.0, 0.0, 0.0, 1.0, 1.0])     # a gap [0.2, 0.6] at the level 1/3
    plan = plan_of(eager_backend, y, values)
    psi, bary = plan["brenier_potential"], plan["barycenters"][:, 0]
    x = (np.arange(200000) + 0.5) / 200000
    rho = np.repeat(values / values.mean(), 40000)
    owner = power_argmin(x, y, psi)
    for i in range(len(y)):          # each Dirac's cell holds its mass, with its barycentre
        inside = (owner == i) & (rho > 0)
        assert np.mean(rho * (owner == i)) == pytest.approx(1 / len(y), abs=3e-5)
        assert np.sum(x[inside] * rho[inside]) / np.sum(rho[inside]) == pytest.approx(bary[i], abs=3e-5)
    phi = np.min((x[:, None] - y[None, :]) ** 2 - psi[None, :], axis=1)
    assert float(np.mean(psi)) == pytest.approx(0.0, abs=1e-15)
    assert np.mean(psi) + np.mean(phi * rho) == pytest.approx(float(plan["distance"]), abs=1e-9)


def test_gap_boundary_is_the_midpoint_clamped_into_the_gap(eager_backend):
    """Density 1, 0, 1 on thirds, equal Diracs on either side of the gap: the boundary is
    their midpoint (equal weights) if it is in the gap, else the nearest end of the gap."""
    for y, boundary in (([0.1, 0.9], 0.5), ([0.1, 0.5], 1 / 3), ([0.5, 0.95], 2 / 3)):
        psi = plan_of(eager_backend, y, [1.0, 0.0, 1.0])["brenier_potential"]
        a, b = y
        # at the boundary the two power functions are equal
        assert (boundary - a) ** 2 - psi[0] == pytest.approx((boundary - b) ** 2 - psi[1], abs=1e-15)
    # a gap the input means, whose level the Diracs' and the density's cumulative sums reach
    # only up to rounding (0.5 and 0.49999999999999994): still the midpoint 1/2
    y = np.linspace(0.05, 0.95, 10)
    psi = plan_of(eager_backend, y, [1.0] * 5 + [0.0] + [1.0] * 5)["brenier_potential"]
    assert (0.5 - y[4]) ** 2 - psi[4] == pytest.approx((0.5 - y[5]) ** 2 - psi[5], abs=1e-15)


def test_duplicates_and_zero_masses(eager_backend):
    """Exact duplicates share their cell (mass in proportion, same barycentre and weight);
    a zero-mass Dirac has an empty cell, barycentre its position, and a weight below the
    others (the 2D convention); neither changes W2^2."""
    y = np.array([0.2, 0.7, 0.2, 0.4])
    plan = plan_of(eager_backend, y, np.array([1.0, 2.0]), [1.0, 2.0, 3.0, 0.0])
    merged = plan_of(eager_backend, [0.2, 0.7], np.array([1.0, 2.0]), [4.0, 2.0])
    assert float(plan["distance"]) == pytest.approx(float(merged["distance"]), rel=1e-14)
    np.testing.assert_allclose(plan["cell_masses"], [1 / 6, 2 / 6, 3 / 6, 0.0], atol=1e-15)
    bary, psi = plan["barycenters"][:, 0], plan["brenier_potential"]
    assert bary[0] == bary[2] and bary[3] == 0.4 and psi[0] == psi[2] and psi[3] < min(psi[:3])
    np.testing.assert_allclose(bary[[0, 1]], merged["barycenters"][:, 0], atol=1e-15)


def test_far_outside_and_all_on_one_side(eager_backend):
    """Diracs far left of the domain all: the order is kept, the masses exact."""
    y = np.array([-1e3, -2e3, -1.5e3])
    plan = plan_of(eager_backend, y, np.ones(4))
    np.testing.assert_allclose(plan["barycenters"][:, 0], [5 / 6, 1 / 6, 1 / 2], atol=1e-12)
    np.testing.assert_allclose(plan["cell_masses"], 1 / 3, atol=1e-15)


def test_translation_and_permutation(eager_backend):
    rng = np.random.default_rng(3)
    y, values = rng.random(30) * 1.2 - 0.1, 0.2 + rng.random(11)
    base = plan_of(eager_backend, y, values)
    shift = 12.375
    moved = plan_of(eager_backend, y + shift, values, domain=(shift, shift + 1.0))
    assert float(moved["distance"]) == pytest.approx(float(base["distance"]), rel=1e-11)
    np.testing.assert_allclose(moved["barycenters"] - shift, base["barycenters"], atol=1e-13)
    perm = rng.permutation(30)
    permuted = plan_of(eager_backend, y[perm], values)
    assert float(permuted["distance"]) == pytest.approx(float(base["distance"]), rel=1e-14)
    for f in ("barycenters", "cell_masses", "brenier_potential"):
        np.testing.assert_allclose(permuted[f], base[f][perm], atol=1e-14)


def test_rounding_does_not_accumulate(sdot_driver):
    """The last cell's mass is the total less the cumulative masses of the others: prefix
    sums in blocks keep its error to rounding (sequential sums: 2e-12 at 1e5 Diracs in FP64,
    9e-6 at 1000 in FP32)."""
    sdot_driver.framework = "numpy"
    rng = np.random.default_rng(6)
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs1d(rng.random(100000)), sdot.Grid(rng.random(1000)))
    assert float(plan.residual) <= 1e-14
    sdot_driver.dtype = "FP32"
    y, values = rng.random(1000).astype(np.float32), rng.random(50).astype(np.float32)
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs1d(y), sdot.Grid(values))
    assert plan.distance.dtype == np.float32 and float(plan.residual) <= 1e-6


def test_sum_of_diracs_1d_is_sum_of_diracs_on_a_line(eager_backend):
    x = eager_backend.asarray(np.random.default_rng(4).random(9))
    g = sdot.Grid(eager_backend.asarray([1.0, 2.0, 0.5]))
    one = sdot.distance(sdot.SumOfDiracs1d(x), g)
    two = sdot.distance(sdot.SumOfDiracs(eager_backend.xp.reshape(x, (9, 1))), g)
    assert float(one) == float(two)
    b = sdot.barycenters(sdot.SumOfDiracs1d(x), g)
    assert tuple(b.shape) == (9, 1)
    assert float(sdot.distance(sdot.SumOfDiracs1d(x), sdot.Grid(eager_backend.asarray([1.0, 2.0, 0.5]),
                                                                   domain=((0.0,), (1.0,))))) == float(one)


def test_batches(backend):
    """``distances`` of a batch (b, n, 1) is the loop over the items."""
    rng = np.random.default_rng(5)
    xb, values = rng.random((3, 6, 1)), 0.5 + rng.random(4)

    def run(xb, values):
        return sdot.distances(sdot.BatchOfSumOfDiracs(xb), sdot.Grid(values))
    d = backend.to_numpy(backend.run(run, backend.asarray(xb), backend.asarray(values)))
    for i in range(3):
        assert d[i] == pytest.approx(float(plan_of(_numpy(), xb[i, :, 0], values)["distance"]), rel=1e-14)


def test_plan_and_diagram(eager_backend, capsys):
    """Every ``OtPlan`` field, ``verbose``, and the plan's ``PowerDiagram`` (intervals)."""
    y = eager_backend.asarray([0.8, 0.2, 0.5])
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs1d(y), sdot.Grid(eager_backend.asarray([1.0, 1.0])),
                                       verbose=True)
    assert "sdot newton step   0" in capsys.readouterr().out
    assert bool(plan.converged) and int(plan.iterations) == 0 and int(plan.status) == 0
    cells = plan.power_diagram.cells
    ends = [np.asarray(c.vertices, float)[:, 0].tolist() for c in cells]
    np.testing.assert_allclose(ends, [[2 / 3, 1.0], [0.0, 1 / 3], [1 / 3, 2 / 3]], atol=1e-15)
    assert [[f[0] for f in c.facets] for c in cells] == [[2, -2], [-1, 2], [1, 0]]
    np.testing.assert_allclose([float(c.measure) for c in cells], 1 / 3, atol=1e-15)
    np.testing.assert_allclose([float(c.barycenter[0]) for c in cells], [5 / 6, 1 / 6, 1 / 2], atol=1e-15)


def test_input_errors():
    x = sdot.SumOfDiracs1d([0.2, 0.6])
    with pytest.raises(ValueError, match="values must have 1 axes"):
        sdot.distance(x, sdot.Grid(np.ones((2, 2))))
    with pytest.raises(ValueError, match="dimension"):
        sdot.distance(x, sdot.Grid(np.ones(3), domain=((0.0, 0.0), (1.0, 1.0))))
    with pytest.raises(ValueError, match="zero or negative volume"):
        sdot.Grid(np.ones(3), domain=(1.0, 1.0))
    with pytest.raises(ValueError, match="zero or negative volume"):
        sdot.Grid(np.ones(3), domain=((2.0,), (1.0,)))
    # a degree-1 grid is solved (test_linear_bernstein.py): here the uniform density
    assert float(sdot.distance(x, sdot.PolynomialGrid(np.ones((3, 2))))) == pytest.approx(
        float(sdot.distance(x, sdot.Grid(np.ones(3)))), rel=1e-14)
    with pytest.raises(NotImplementedError, match="dimension 4"):
        sdot.distance(sdot.SumOfDiracs(np.zeros((2, 4))), sdot.Grid(np.ones((2, 2, 2, 2))))
    with pytest.raises(NotImplementedError, match="heavier than the target"):
        sdot.distance(sdot.SumOfDiracs1d([0.2, 0.6], mass=2.0), sdot.Grid(np.ones(3)))


# ------------------------------------------------------------------ power diagrams
def test_power_diagram_against_the_argmin(eager_backend):
    """``PowerDiagram`` on a line with arbitrary weights (hidden seeds, seeds outside the
    domain): each cell is the set of sample points where its power function is the
    smallest; labels name the neighbours."""
    rng = np.random.default_rng(8)
    y = rng.random(25) * 3.0 - 1.0
    w = rng.normal(size=25) * 0.5
    pd = sdot.PowerDiagram(eager_backend.asarray(y), eager_backend.asarray(w), domain=(0.0, 1.0))
    x = (np.arange(100000) + 0.5) / 100000
    owner = power_argmin(x, y, w)
    cells = pd.cells
    assert 0 < sum(len(c.vertices) == 0 for c in cells) < 24
    ends = [np.asarray(c.vertices, float)[:, 0] for c in cells]
    for i, c in enumerate(cells):
        mine = x[owner == i]
        if len(c.vertices) == 0:
            assert len(mine) == 0
            continue
        a, b = ends[i]
        if len(mine):
            assert a == pytest.approx(mine.min(), abs=1e-5) and b == pytest.approx(mine.max(), abs=1e-5)
        else:
            assert b - a < 1e-5
        assert float(c.measure) == pytest.approx(b - a, abs=1e-15)
        left, right = c.facets[0][0], c.facets[1][0]
        assert (left == -1) == (a == 0.0) and (right == -2) == (b == 1.0)
        assert left == -1 or ends[left][1] == pytest.approx(a, abs=1e-14)
        assert right == -2 or ends[right][0] == pytest.approx(b, abs=1e-14)


def test_power_diagram_adjust_weights_and_plot(eager_backend):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pd = sdot.PowerDiagram(eager_backend.asarray([0.1, 0.5, 0.6, 0.9]), domain=(-1.0, 2.0))
    np.testing.assert_allclose([np.asarray(c.vertices, float)[:, 0] for c in pd.cells],
                               [[-1, 0.3], [0.3, 0.55], [0.55, 0.75], [0.75, 2]], atol=1e-15)
    plan = pd.adjust_weights(eager_backend.asarray(np.full(4, 0.25)),
                             sdot.Grid(eager_backend.asarray(np.ones(3)), domain=(-1.0, 2.0)))
    np.testing.assert_allclose([np.asarray(c.vertices, float)[:, 0] for c in pd.cells],
                               [[-1, -0.25], [-0.25, 0.5], [0.5, 1.25], [1.25, 2]], atol=1e-14)
    again = sdot.PowerDiagram(eager_backend.asarray([0.1, 0.5, 0.6, 0.9]), plan.brenier_potential, domain=(-1.0, 2.0))
    np.testing.assert_allclose([float(c.measure) for c in again.cells], 0.75, atol=1e-14)
    try:
        assert pd.plot() is plt.gca() and pd.cells[0].plot() is plt.gca()
    finally:
        plt.close("all")


# ----------------------------------------------------------------------- gradients
EPS = 1e-6


def gradient_problem():
    """Six Diracs (one outside the domain, one of zero mass), eight positive segments."""
    rng = np.random.default_rng(11)
    y = np.array([0.13, 0.71, -0.2, 0.45, 1.3, 0.33])
    w = np.array([1.0, 2.0, 1.5, 0.5, 1.0, 0.0])
    return y, w, 0.3 + rng.random(8)


def w2(y, w, v, domain=(-0.5, 1.0)):
    return sdot.distance(sdot.SumOfWeightedDiracs(y[:, None], w), sdot.Grid(v, domain=domain))


@pytest.fixture(scope="module")
def finite_differences():
    """Central differences of W (NumPy) in every position, mass and value; for the zero mass,
    a forward difference (W is defined for masses >= 0 only)."""
    from sdot._driver import driver

    saved, driver.framework = driver.framework, "numpy"
    try:
        args = gradient_problem()
        out = []
        for a in range(3):
            g = np.zeros_like(args[a])
            for i in range(len(g)):
                plus = [x.copy() for x in args]
                minus = [x.copy() for x in args]
                plus[a][i] += EPS
                if a == 1 and args[a][i] == 0:
                    g[i] = (float(w2(*plus)) - float(w2(*args))) / EPS
                    continue
                minus[a][i] -= EPS
                g[i] = (float(w2(*plus)) - float(w2(*minus))) / (2 * EPS)
            out.append(g)
        return out
    finally:
        driver.framework = saved


def test_core_gradients_match_finite_differences(sdot_driver, finite_differences):
    """NumPy (no autodiff): the core's gradients, chained by hand through the normalisations
    ``m = w / sum(w)`` and ``rho = v / int(v)``."""
    from sdot import _checks
    from sdot._core import gradients, plan

    sdot_driver.framework = "numpy"
    y, w, v = gradient_problem()
    src, tgt = _checks.check_pair(sdot.SumOfWeightedDiracs(y[:, None], w), sdot.Grid(v, domain=(-0.5, 1.0)))
    xp, prob = _checks.problem(src, tgt)
    state = plan.solve_plan(xp, prob, 1e-12, 10)["state"]
    gy, gm, grho = gradients.gradients(xp, prob.seeds, prob.masses, prob.density, state)
    gw = (gm - np.sum(gm * prob.masses)) / w.sum()
    cell = 1.5 / len(v)
    gv = (grho - cell * np.sum(grho * prob.density.values)) / (v.sum() * cell)
    for got, want in zip((gy[:, 0], gw, gv), finite_differences):
        close(got, want)


def close(got, want):
    """Agreement with the finite differences; the forward difference of the zero mass
    (the last entry of the masses) is only first-order accurate."""
    if len(got) == 6 and want is not None:
        np.testing.assert_allclose(got[5:], want[5:], rtol=0, atol=2e-5)
    np.testing.assert_allclose(got[:5], want[:5], rtol=1e-6, atol=1e-8)


def torch_gradients(y, w, v):
    torch = pytest.importorskip("torch")
    args = [torch.tensor(a, requires_grad=True) for a in (y, w, v)]
    value = w2(*args)
    value.backward()
    return value.detach().numpy(), [a.grad.numpy() for a in args]


def jax_gradients(y, w, v):
    jax = pytest.importorskip("jax")
    value, grads = jax.value_and_grad(w2, argnums=(0, 1, 2))(*map(jax.numpy.asarray, (y, w, v)))
    return np.asarray(value), [np.asarray(g) for g in grads]


def test_torch_and_jax_gradients_match_finite_differences(finite_differences):
    problem = gradient_problem()
    tv, tg = torch_gradients(*problem)
    jv, jg = jax_gradients(*problem)
    assert float(tv) == pytest.approx(float(jv), rel=1e-14)
    for t, j, want in zip(tg, jg, finite_differences):
        close(t, want)
        np.testing.assert_allclose(t, j, rtol=0, atol=1e-10)


def test_one_dirac_gradient_closed_form():
    """One Dirac at y on U[0, 1]: W = (y - 1/2)^2 + 1/12, dW/dy = 2 (y - 1/2)."""
    torch = pytest.importorskip("torch")
    y = torch.tensor([0.3], dtype=torch.float64, requires_grad=True)
    value = sdot.distance(sdot.SumOfDiracs1d(y), sdot.Grid(torch.ones(5, dtype=torch.float64)))
    value.backward()
    assert float(value.detach()) == pytest.approx(0.04 + 1 / 12, rel=1e-14)
    assert float(y.grad[0]) == pytest.approx(-0.4, rel=1e-13)


def test_jax_grad_under_jit_and_vmap():
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    y, w, v = map(jnp.asarray, gradient_problem())
    grad = jax.grad(w2, argnums=(0, 1, 2))
    eager = grad(y, w, v)
    jitted = jax.jit(grad)(y, w, v)
    for a, b in zip(eager, jitted):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-13)
    ys = jnp.stack([y, y + 0.05, y[::-1]])
    batched = jax.jit(jax.vmap(lambda yy: grad(yy, w, v)[0]))(ys)
    for k in range(3):
        np.testing.assert_allclose(np.asarray(batched[k]), np.asarray(grad(ys[k], w, v)[0]), rtol=0, atol=1e-13)
