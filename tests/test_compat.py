"""Row-selection primitives of ``_compat`` on every backend, against their meaning
written out in NumPy (each backend takes its own code path: NumPy and torch the indices
of the true entries, JAX, whose sorts are slow on the CPU, prefix sums and a scatter,
array_api_strict a stable argsort); the namespaces; the rule of the host package."""
import re

import numpy as np
import pytest

from sdot._core import _compat


@pytest.mark.parametrize("share", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("size", [1, 37, 300, 1000])
def test_select_puts_the_true_entries_first_in_order(backend, size, share):
    mask = np.random.default_rng(1).random(1000) < share
    expected = np.concatenate([np.flatnonzero(mask), np.flatnonzero(~mask)])[:size]
    xp = backend.xp
    order, valid = backend.run(lambda m: _compat.select(xp, m, size), backend.asarray(mask, bool))
    np.testing.assert_array_equal(backend.to_numpy(order), expected)
    np.testing.assert_array_equal(backend.to_numpy(valid), mask[expected])


@pytest.mark.parametrize("width", [3, 12, 16])
def test_first_columns_keeps_the_kept_entries_of_each_row_in_order(backend, width):
    rng = np.random.default_rng(2)
    values, keep = rng.integers(0, 1000, (50, 12)), rng.random((50, 12)) < 0.5
    keep[0], keep[1] = False, True                      # a row with none, a row with all
    expected = np.full((50, width), -1)
    for r in range(50):
        kept = values[r][keep[r]][:width]
        expected[r, :kept.size] = kept
    xp = backend.xp
    out = backend.run(lambda k, v: _compat.first_columns(xp, k, v, width, -1),
                      backend.asarray(keep, bool), backend.asarray(values, np.int64))
    np.testing.assert_array_equal(backend.to_numpy(out), expected)


@pytest.mark.parametrize("k", [1, 7, 21])
def test_the_brute_force_k_nearest_are_scipy_s(backend, k):
    """The k nearest of the GPU route (no host: distances in blocks, a selection per row:
    ``torch.topk``, ``jax.lax.top_k``, an argmin, an argsort) against scipy's k-d tree, in 2D
    and 3D, on points in general position (no ties)."""
    from scipy.spatial import cKDTree

    from sdot._core.seed_neighbours import _knn_brute_force

    for dim in (2, 3):
        points = np.random.default_rng(dim).random((300, dim))
        expected = cKDTree(points).query(points, k)[1].reshape(300, k)
        xp = backend.xp
        out = backend.run(lambda p: _knn_brute_force(xp, p, k, p), backend.asarray(points))
        np.testing.assert_array_equal(backend.to_numpy(out), expected)


@pytest.mark.parametrize("layout", ["uniform", "clustered"])
def test_the_grid_k_nearest_are_scipy_s(backend, layout):
    """The k nearest of the GPU route in eager torch (without a host), by a grid: each point's
    candidates are the points of the cells around its own, and the rows whose k-th lies
    beyond them take the brute force. Against scipy's k-d tree: 2000 points in 2D (k = 21),
    8000 in 3D (k = 32), uniform; with half of them in a cluster a thousandth as wide the grid
    declines (one cell would give every row a quarter of the points) and the brute force
    answers."""
    from scipy.spatial import cKDTree

    from sdot._core import seed_neighbours

    if backend.static or backend.framework == "jax":
        pytest.skip("traced, or immutable arrays: the brute force (test_the_brute_force_k_nearest_are_scipy_s)")
    xp = backend.xp
    for dim, k, n in ((2, 21, 2000), (3, 32, 8000)):
        rng = np.random.default_rng(dim)
        points = rng.random((n, dim))
        if layout == "clustered":
            points[:n // 2] = 0.5 + 1e-3 * rng.random((n // 2, dim))
        grid = seed_neighbours._knn_by_grid(xp, backend.asarray(points), k)
        if layout == "clustered":
            assert grid is None
            points = points[:2000]                  # the brute force: small
            grid = seed_neighbours.knn(xp, backend.asarray(points), k)
        np.testing.assert_array_equal(backend.to_numpy(grid), cKDTree(points).query(points, k)[1])


def test_torch_namespace_calls_torch_directly():
    """On torch the solver's namespace has direct ``take``, ``take_along_axis`` and
    ``where`` that give array_api_compat's results (``where`` promotes mixed dtypes
    like it); every other name is array_api_compat's; other frameworks get theirs."""
    import array_api_compat as aac
    torch = pytest.importorskip("torch")

    x = torch.arange(12, dtype=torch.float64).reshape(4, 3)
    base, xp = aac.array_namespace(x), _compat.namespace(x)
    assert xp is not base and xp.sum is base.sum and xp.__name__ == base.__name__
    assert xp.take is not base.take and xp.where is not base.where
    idx = torch.tensor([3, 0, 0, 2])
    cols = torch.tensor([[2, 0], [1, 1], [0, 2], [2, 2]])
    cond = torch.tensor([[True, False, True]] * 4)
    single = torch.ones((4, 3), dtype=torch.float32)
    pairs = [(xp.take(x, idx, axis=0), base.take(x, idx, axis=0)),
             (xp.take(x[:, 0], idx), base.take(x[:, 0], idx)),
             (xp.take_along_axis(x, cols, axis=1), base.take_along_axis(x, cols, axis=1)),
             (xp.where(cond, x, -1.0), base.where(cond, x, -1.0)),
             (xp.where(cond, x, 2 * x), base.where(cond, x, 2 * x)),
             (xp.where(cond, single, x), base.where(cond, single, x))]
    for got, expected in pairs:
        assert got.dtype == expected.dtype and torch.equal(got, expected)
    assert _compat.namespace(np.zeros(3)).take is not xp.take


def test_jax_namespace_gathers_without_index_normalisation():
    """On JAX the solver's ``take``, ``take_along_axis``, :func:`_compat.remainder` and
    :func:`_compat.set_rows` give jax.numpy's values on non-negative indices in bounds, each
    traced to its one primitive (``gather``, ``rem``, ``scatter``) without the wrap of negative
    indices and the fill beyond the bounds (``lt``, ``add``, ``select_n``...): the traced solve
    at 1e3 Diracs had 35,835 equations, 27,749 without them, and compiled in 55 s, then 37 to 42 s."""
    jax = pytest.importorskip("jax")
    import jax.extend
    jnp = jax.numpy
    x = jnp.arange(12.0).reshape(4, 3)
    xp, base = _compat.namespace(x), jnp
    idx, cols = jnp.asarray([3, 0, 0, 2]), jnp.asarray([[2, 0], [1, 1], [0, 2], [2, 2]])
    a, b = jnp.asarray([[0, 5, 7]]), jnp.asarray([[1], [3], [4]])
    pairs = [(xp.take(x, idx, axis=0), base.take(x, idx, axis=0)), (xp.take(x[:, 0], idx), base.take(x[:, 0], idx)),
             (xp.take_along_axis(x, cols, axis=1), base.take_along_axis(x, cols, axis=1)),
             (_compat.remainder(a, b), a % b)]
    for got, expected in pairs:
        assert got.dtype == expected.dtype and bool(jnp.all(got == expected))

    def primitives(f, *args):
        names = set()

        def walk(jaxpr):
            for eqn in jaxpr.eqns:
                names.add(eqn.primitive.name)
                for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                    walk(sub)
        walk(jax.make_jaxpr(f)(*args).jaxpr)
        return names - {"pjit", "jit", "broadcast_in_dim", "convert_element_type", "reshape"}
    assert primitives(lambda x, i: xp.take(x, i, axis=0), x, idx) == {"gather"}
    assert primitives(lambda x, i: xp.take_along_axis(x, i, axis=1), x, cols) == {"gather"}
    assert primitives(_compat.remainder, a, b) == {"rem"}
    rows, values = jnp.asarray([3, 1]), jnp.ones((2, 3))
    assert bool(jnp.all(_compat.set_rows(xp, x, rows, values) == x.at[rows].set(values)))
    assert primitives(lambda x, i, v: _compat.set_rows(xp, x, i, v), x, rows, values) == {"scatter"}
    assert primitives(lambda i: _compat.hits(xp, i, 5), idx) <= {"scatter", "ge", "select_n", "slice"}
    assert "select_n" in primitives(lambda x, i: base.take(x, i, axis=0), x, idx)      # what is avoided


def test_numpy_namespace_matches_array_api_compat():
    """On plain NumPy arrays the solver's namespace calls the array methods or NumPy
    directly; each of those names gives array_api_compat's values, dtypes and errors
    (``copy`` handed to it); every other name is array_api_compat's, and other inputs
    (NumPy scalars, array_api_strict) get the namespace array_api_compat finds."""
    import array_api_compat as aac

    f = np.array([[0.5, np.nan, -2.0], [3.0, 1.0, 0.0]])
    s = f.astype(np.float32)
    b = np.array([[True, False, False], [False, False, False]])
    i = np.array([[4, -1, 0], [2, 7, 1]], dtype=np.int32)
    base, xp = aac.array_namespace(f), _compat.namespace(f, b)
    direct = ("reshape", "asarray", "take", "arange", "zeros", "ones", "full", "astype", "nonzero",
              "sum", "max", "min", "any", "all", "argmax")
    assert all(getattr(xp, name) is not getattr(base, name) for name in direct)
    assert xp.concat is base.concat and xp.where is base.where and xp.__name__ == base.__name__
    assert _compat.namespace(np.float64(1.0)) is base
    assert _compat.namespace(np.zeros(2), np.float64(1.0)) is base
    idx = np.array([1, 0, 1])
    calls = [("reshape", (f, (3, 2)), {}), ("reshape", (f, (-1,)), {"copy": True}),
             ("asarray", ([1, 2],), {}), ("asarray", (1.5,), {"dtype": base.float32}),
             ("asarray", (f,), {"copy": True}), ("asarray", (True,), {"device": "cpu"}),
             ("take", (f, idx), {"axis": 0}), ("take", (f, idx), {"axis": 1}), ("take", (f[0], idx), {}), ("take", (f, idx), {}),
             ("arange", (5,), {}), ("arange", (2, 9, 3), {"dtype": base.int64}), ("arange", (1.5, 4.0), {}),
             ("zeros", ((2, 3),), {"dtype": base.bool}), ("ones", (4,), {}),
             ("full", ((2,), 7), {}), ("full", ((2,), True), {}), ("full", ((2, 2), 1.5), {"dtype": base.float32}),
             ("astype", (b, base.int8), {}), ("astype", (f, base.float32), {"copy": False}),
             ("nonzero", (b,), {}), ("nonzero", (b[0],), {})]
    for x in (f, s, b, i):
        for kwargs in ({}, {"axis": 1}, {"axis": 0, "keepdims": True}, {"keepdims": True}):
            calls += [(name, (x,), kwargs) for name in ("sum", "max", "min", "any", "all", "argmax")]
    calls += [("sum", (i,), {"dtype": base.int64}), ("sum", (s,), {"axis": 1, "dtype": base.float64})]
    for name, args, kwargs in calls:
        got, expected = getattr(xp, name)(*args, **kwargs), getattr(base, name)(*args, **kwargs)
        for g, e in zip(got, expected) if name == "nonzero" else [(got, expected)]:
            assert type(g) is type(e) and g.dtype == e.dtype and g.shape == e.shape, (name, args, kwargs)
            np.testing.assert_array_equal(g, e, err_msg=f"{name}{args}{kwargs}")
    assert not np.shares_memory(xp.reshape(f, (6,), copy=True), f)
    assert np.shares_memory(xp.reshape(f, (6,)), f) and np.shares_memory(xp.asarray(f), f)
    for name, args in [("zeros", ((2,),)), ("arange", (3,)), ("asarray", (1.0,))]:
        for namespace in (xp, base):
            with pytest.raises(ValueError):
                getattr(namespace, name)(*args, device="cuda")


def test_torch_namespace_extrema_any_and_reshape_match_array_api_compat():
    """The direct ``maximum``/``minimum`` (tensors of one dtype, a clamp by a scalar of the
    tensor's kind, NaN kept), ``any`` and ``reshape`` give array_api_compat's values and
    dtypes, also in the cases they hand to it (mixed dtypes, a float scalar with an integer
    tensor, ``keepdims`` without an axis, non-boolean ``any``, ``copy=True``)."""
    import array_api_compat as aac
    torch = pytest.importorskip("torch")

    f = torch.tensor([[0.5, float("nan"), -2.0], [3.0, 1.0, 0.0]], dtype=torch.float64)
    i = torch.tensor([[4, -1, 0], [2, 7, 1]])
    b = torch.tensor([[True, False, False], [False, False, False]])
    base, xp = aac.array_namespace(f), _compat.namespace(f)
    assert all(getattr(xp, name) is not getattr(base, name) for name in ("maximum", "minimum", "any", "reshape"))
    for name in ("maximum", "minimum"):
        for x1, x2 in [(f, 1.0), (1.0, f), (f, 1), (i, 1), (1, i), (i, 2.5), (b, 1), (f, f.flip(0)),
                       (i, i.flip(1)), (f, f.to(torch.float32)), (i, f)]:
            got, expected = getattr(xp, name)(x1, x2), getattr(base, name)(x1, x2)
            assert got.dtype == expected.dtype and torch.equal(got.isnan(), expected.isnan())
            assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(expected)), (name, x1, x2)
    for x in (b, i):
        for kwargs in ({}, {"axis": 1}, {"axis": 0, "keepdims": True}, {"keepdims": True}):
            got, expected = xp.any(x, **kwargs), base.any(x, **kwargs)
            assert got.dtype == expected.dtype == torch.bool and torch.equal(got, expected)
    view, copied = xp.reshape(f, (3, 2)), xp.reshape(f, (3, 2), copy=True)
    assert view.data_ptr() == f.data_ptr() and copied.data_ptr() != f.data_ptr()
    assert torch.equal(torch.nan_to_num(view), torch.nan_to_num(base.reshape(f, (3, 2))))


@pytest.mark.parametrize("width", [1, 8, 16, 17])
def test_row_reductions_match_their_meaning(backend, width):
    """``row_sum``, ``row_max``, ``row_min``, ``row_any``, ``row_all``: NumPy folds up to
    16 columns (17: its own reductions), NaN propagates, and a row's sum does not depend
    on the rows around it (the blocked kernels must match the whole bit for bit)."""
    rng = np.random.default_rng(3)
    values = rng.standard_normal((40, width)) * 10.0 ** rng.integers(-8, 8, (40, width))
    values[5, 0] = np.nan
    flags = rng.random((40, width)) < 0.5
    flags[0], flags[1] = False, True
    xp = backend.xp
    reduce = {"sum": _compat.row_sum, "max": _compat.row_max, "min": _compat.row_min}
    for name, fn in reduce.items():
        out = backend.to_numpy(backend.run(lambda v: fn(xp, v), backend.asarray(values)))
        expected = getattr(np, name)(values, axis=1)
        scale = np.nansum(np.abs(values), axis=1) * width * np.finfo(np.float64).eps  # any summation order
        ok = np.isnan(expected) | (np.abs(out - expected) <= (scale if name == "sum" else 0.0))
        assert ok.all(), (name, out[~ok], expected[~ok])
        assert np.isnan(out[5]), name
        part = backend.to_numpy(backend.run(lambda v: fn(xp, v), backend.asarray(values[3:17])))
        np.testing.assert_array_equal(part, out[3:17], err_msg=name)
    for name, fn in {"any": _compat.row_any, "all": _compat.row_all}.items():
        out = backend.run(lambda f: fn(xp, f), backend.asarray(flags, bool))
        np.testing.assert_array_equal(backend.to_numpy(out), getattr(np, name)(flags, axis=1), err_msg=name)


def test_previous_and_next_slots_read_cyclically_within_the_count(backend):
    """``previous_slots`` / ``next_slots`` give slot ``k - 1`` / ``k + 1`` of each row modulo its
    count (the polygon's vertices around), for values (n, V) and vertices (n, V, 2)."""
    from sdot._core.planar import polygons

    rng = np.random.default_rng(4)
    count = np.array([0, 1, 2, 3, 7, 8, 5])
    values, verts = rng.integers(-5, 100, (7, 8)), rng.random((7, 8, 2))
    xp = backend.xp

    def run(v, p, c):
        return (polygons.previous_slots(xp, v, c), polygons.next_slots(xp, v, c), polygons.previous_slots(xp, p, c))

    got = [backend.to_numpy(a) for a in backend.run(run, backend.asarray(values, np.int64), backend.asarray(verts),
                                                   backend.asarray(count, np.int64))]
    for r, c in enumerate(count):
        ring = np.arange(c)
        np.testing.assert_array_equal(got[0][r, :c], values[r, (ring - 1) % c])
        np.testing.assert_array_equal(got[1][r, :c], values[r, (ring + 1) % c])
        np.testing.assert_array_equal(got[2][r, :c], verts[r, (ring - 1) % c])


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_direct_namespaces_change_no_result(sdot_driver, framework):
    """The direct namespaces only skip argument handling: with the switch off
    (``sdot.driver.direct_namespaces = False``: array_api_compat's namespaces as they are) a
    whole solve on a zero background gives the same weights, masses and W2^2, bit for bit."""
    import sdot

    pytest.importorskip(framework)
    sdot_driver.framework = framework
    rng = np.random.default_rng(1)
    x, img = rng.random((60, 2)), np.zeros((16, 16))
    img[3:12, 4:14] = 1.0

    def solve():
        plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(x), sdot.Grid(img))
        return [np.asarray(a) for a in (plan.brenier_potential, plan.cell_masses, plan.distance)]
    direct = solve()
    sdot_driver.direct_namespaces = False
    assert type(_compat.namespace(np.zeros(2))).__name__ == "module"
    for a, b in zip(direct, solve()):
        np.testing.assert_array_equal(a, b)


def _imports(path):
    """The top-level packages ``path`` imports absolutely, and its relative imports' levels."""
    import ast

    absolute, levels = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            absolute |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                absolute.add(node.module.split(".")[0])
            levels.add(node.level)
    return absolute, levels


def test_only_the_compat_shim_of_the_core_imports_a_framework():
    """DESIGN rule 1: outside ``_core/_compat`` the core imports no framework or host library
    (numpy, scipy, torch, jax), only the standard library and array_api_compat's type tests."""
    import sys
    from pathlib import Path

    import sdot._core as core

    root = Path(core.__file__).parent
    allowed = set(sys.stdlib_module_names) | {"array_api_compat"}
    for path in root.rglob("*.py"):
        if "_compat" not in path.relative_to(root).parts:
            absolute, _ = _imports(path)
            assert absolute <= allowed, (str(path.relative_to(root)), sorted(absolute - allowed))


def test_compiled_kernels_import_only_the_standard_library_numpy_scipy_and_numba():
    """The rule of ``sdot._host.compiled`` (DESIGN rule 7): host kernels, NumPy in and out; its
    modules import the standard library, numpy, scipy and numba, each other, the host's threads
    and the unit cube's table of the core (plain Python), never a framework (array_api_compat, torch, jax)."""
    import sys
    from pathlib import Path

    import sdot._host.compiled as compiled

    allowed = set(sys.stdlib_module_names) | {"numpy", "scipy", "numba"}
    for path in Path(compiled.__file__).parent.glob("*.py"):
        absolute, levels = _imports(path)
        if "sdot" in absolute:         # only the unit cube's table, in the layout of the core's cells
            assert set(re.findall(r"from (sdot[.\w]*) import", path.read_text())) == {"sdot._core.cube"}, path.name
        assert absolute - {"sdot"} <= allowed, (path.name, sorted(absolute - allowed))
        assert levels <= {0, 1, 2}, path.name


def test_host_modules_import_only_the_standard_library_numpy_and_scipy():
    """The rule of ``sdot._host``: its modules import the standard library,
    numpy, scipy, cvxopt (CHOLMOD) and each other, never a framework (array_api_compat, torch,
    jax); the rest of ``_compat`` reaches the host through them."""
    import sys
    from pathlib import Path

    import sdot._host as host

    allowed = set(sys.stdlib_module_names) | {"numpy", "scipy", "cvxopt"}
    for path in Path(host.__file__).parent.glob("*.py"):
        absolute, levels = _imports(path)
        assert absolute <= allowed, (path.name, sorted(absolute - allowed))
        assert levels <= {0, 1}, path.name                       # relative: within the package only


def test_an_eager_loop_lets_its_first_state_go():
    """``while_loop_taking`` holds no state but the current one: the first is freed once the body
    has replaced it (a Newton solve's first diagram, 5.6 GB at 1e6 3D seeds, stayed alive to the
    end while the caller held it as an argument)."""
    import gc
    import weakref

    from sdot._core import _compat

    class State:
        def __init__(self, k):
            self.k = k

    first = State(0)
    gone = weakref.ref(first)
    seen = []

    def body(state):
        gc.collect()
        seen.append(gone() is None)
        return State(state.k + 1)
    held = [first]
    del first
    last = _compat.while_loop_taking(lambda s: s.k < 3, body, held)
    assert last.k == 3 and held == [] and seen == [False, True, True]


def _import_graph():
    """``{module: modules of sdot it imports}``, imports inside functions included."""
    import ast
    from pathlib import Path

    import sdot

    root = Path(sdot.__file__).parent
    modules = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or "" if node.level == 0 else ".".join(
                    package[:len(package) - node.level + 1] + ([node.module] if node.module else []))
                deps |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def test_no_import_cycles():
    """No module of sdot imports one that imports it back, directly or through others (imports
    inside functions included). (``PowerDiagram.adjust_weights`` solves by the function the public
    layer gives it, not by an import.)"""
    graph = _import_graph()
    done, on_path = set(), []

    def visit(module):
        on_path.append(module)
        for dep in sorted(graph[module]):
            assert dep not in on_path, " -> ".join(on_path[on_path.index(dep):] + [dep])
            if dep not in done:
                visit(dep)
        on_path.pop()
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module)
