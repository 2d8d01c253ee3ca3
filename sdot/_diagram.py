"""``PowerDiagram``: a Laguerre diagram to inspect, plot, and fit to target masses."""
from __future__ import annotations

import sys

import numpy as np

import array_api_compat as aac

from . import _diagram3d, _driver
from ._core._compat import namespace as namespace_of
from ._driver import _to_host as _to_numpy
from ._pytrees import JaxPytree
from ._core import evaluation, plan
from ._core.density import grid_density

__all__ = ["PowerDiagram", "Cell", "Facet"]

Facet = _diagram3d.Facet


class Cell:
    """One Laguerre cell (built on demand by :attr:`PowerDiagram.cells`).

    Attributes: ``index``; ``measure`` (mass of the density on the cell: the
    area for a diagram without target, the length in 1D); ``barycenter`` ``(d,)`` (the
    seed if the cell is empty); ``vertices`` ``(k, 2)`` counter-clockwise, absolute
    coordinates (in 1D ``(2, 1)``: the interval's ends, left then right; ``(0, 1)`` if
    empty); ``facets``: list of ``(neighbour, (start, end))`` where
    ``neighbour`` is the index of the adjacent seed, or ``-1 - side`` for a
    side of the domain (0: y = lo, 1: x = hi, 2: y = hi, 3: x = lo; in 1D, 0: lo,
    1: hi, and a facet is an end point: ``start`` and ``end`` are that point).
    In 3D ``vertices`` is ``(k, 3)`` (in no particular order) and ``facets`` a list of
    :class:`Facet` ``(neighbour, vertices (m, 3), area)``, the polygons counter-clockwise
    seen from outside (sides 0: x = lo, 1: x = hi, 2: y = lo, 3: y = hi, 4: z = lo, 5: z = hi).
    On a periodic domain (``metric=PeriodicMetric``) the cell is whole, next to its Dirac (its
    pieces in the domain moved back by whole periods), and ``neighbour`` names the Dirac across a
    facet (one of whose images is there); the sides of a periodic axis are no facets.
    """

    def __init__(self, index, measure, barycenter, vertices, labels, facets=None):
        self.index, self.measure, self.barycenter, self.vertices = index, measure, barycenter, vertices
        k = len(vertices)
        if facets is not None:              # a polyhedron
            self.facets = facets
        elif vertices.shape[-1] == 1:       # an interval: its two ends
            self.facets = [(int(labels[a]), (vertices[a], vertices[a])) for a in range(k)]
        else:
            self.facets = [(int(labels[a]), (vertices[a], vertices[(a + 1) % k])) for a in range(k)]

    def plot(self, ax=None, **style):
        """Draw the cell boundary with matplotlib (optional dependency); in 1D the
        interval, on the line y = 0; in 3D its facets, in a 3D axes (made if ``ax`` is None)."""
        import matplotlib.pyplot as plt

        v = _to_numpy(self.vertices)
        if len(v) and v.shape[1] == 3:
            from mpl_toolkits.mplot3d.art3d import Poly3DCollection

            ax = plt.figure().add_subplot(projection="3d") if ax is None else ax
            ax.add_collection3d(Poly3DCollection([f.vertices for f in self.facets],
                                                 **({"facecolors": "C0", "edgecolors": "k", "alpha": 0.3} | style)))
            ax.auto_scale_xyz(v[:, 0], v[:, 1], v[:, 2])
            return ax
        ax = plt.gca() if ax is None else ax
        if len(v) and v.shape[1] == 1:
            ax.plot(v[:, 0], [0.0, 0.0], **({"color": "k", "lw": 0.5, "marker": "|"} | style))
        elif len(v):
            closed = np.concatenate([v, v[:1]])
            ax.plot(closed[:, 0], closed[:, 1], **({"color": "k", "lw": 0.5} | style))
        return ax

    def __repr__(self):
        return f"Cell(index={self.index}, measure={float(self.measure):.6g}, vertices={len(self.vertices)})"


class PowerDiagram(JaxPytree):
    """The Laguerre (power) diagram of seeds ``positions`` with ``weights``.

    Cell i is ``{x in domain : |x - y_i|^2 - w_i <= |x - y_j|^2 - w_j for all j}``.

    Parameters
    ----------
    positions : array_like, shape (n, 2) or (n, 3), or (n, 1) or (n,) on a line
    weights : array_like, shape (n,), optional
        Default 0 (the Voronoi diagram).
    domain : pair (lo, hi), optional
        Default the unit square (the unit interval in 1D, the unit cube in 3D).
    metric : sdot.metrics.Norm2 or sdot.metrics.PeriodicMetric, optional
        ``PeriodicMetric``: the diagram on the torus (or cylinder) of the domain, whose cells may
        cross its sides (2D and 3D; :meth:`plot` draws them wrapped in the domain).
    """

    #: The solve of :meth:`adjust_weights`, :func:`sdot.optimal_transport_plan`: set by
    #: :mod:`sdot._api`, which builds the plans' diagrams (this module does not import it back).
    _solve = None

    def __init__(self, positions, weights=None, domain=None, metric=None):
        from . import metrics
        from ._grids import Grid
        from ._measures import SumOfDiracs, SumOfDiracs1d, _check_values

        on_line = getattr(positions, "ndim", None) == 1 or (
            not hasattr(positions, "ndim") and np.ndim(positions) == 1)
        src = SumOfDiracs1d(positions) if on_line else SumOfDiracs(positions)
        if src.dim not in (1, 2, 3):
            raise NotImplementedError(f"PowerDiagram is 1D, 2D or 3D; positions have dimension {src.dim}")
        xp = _driver.namespace(src.positions)
        dev = aac.device(src.positions)
        w = (xp.zeros((src.n,), dtype=src.positions.dtype, device=dev) if weights is None
             else _driver.to_array(weights, "weights"))
        if tuple(w.shape) != (src.n,):
            raise ValueError(f"weights must have shape ({src.n},), got {tuple(w.shape)}")
        _check_values(w, "weights", nonneg=False)
        self.positions, self.weights = src.positions, w
        self._target = Grid(xp.ones((1,) * src.dim, dtype=src.positions.dtype, device=dev), domain=domain,
                            mass=None).with_dim(src.dim)
        self._state = None
        if metric is not None and not isinstance(metric, metrics.Norm2):
            lo, hi = (np.asarray(_to_numpy(a), dtype=np.float64).tolist() for a in self._target.domain)
            self._period = tuple(metrics.periods(metric, lo, hi))

    #: The diagram of a partial transport plan: its cells are cut by the balls ``|x - y_i|^2 <=
    #: w_i`` (``measure`` and ``barycenter`` are those of the cut cells, ``vertices`` the Laguerre
    #: polygon's; :meth:`plot` draws the cut cells).
    capped = False

    def _tree_flatten(self):
        """JAX pytree children: the arrays, the target grid (a pytree) and the computed cells
        (and their pieces' seeds); the periods are static."""
        return (self.positions, self.weights, self._target, self._state, self._owner), (self._period,)

    @classmethod
    def _tree_unflatten(cls, aux, children):
        obj = object.__new__(cls)
        obj.positions, obj.weights, obj._target, obj._state, obj._owner = children
        obj._period = aux[0]
        return obj

    def _check_concrete(self, what):
        """Refuse ``what`` (which reads the cells on the host) on traced arrays, with a clear error."""
        if "jax" not in sys.modules:
            return
        import jax

        leaves = jax.tree_util.tree_leaves((self.positions, self.weights, self._target, self._state))
        if any(_driver.is_tracer(a) for a in leaves):
            raise TypeError(f"PowerDiagram.{what} needs concrete arrays, but this diagram's positions or weights are "
                            "traced (inside jax.jit, vmap, grad...): call it outside the transformation, e.g. on "
                            "the diagram or plan a jitted function returns")

    #: On a periodic domain (``metric=PeriodicMetric``), the period of each axis (0: not periodic),
    #: and once the cells are computed the seed of each of their pieces (the cells of the Diracs
    #: and of their images in the domain); else None.
    _period = None
    _owner = None

    @property
    def metric(self):
        """The diagram's ground metric: :class:`sdot.metrics.Norm2` or a
        :class:`sdot.metrics.PeriodicMetric`."""
        from . import metrics

        if self._period is None:
            return metrics.Norm2()
        return metrics.PeriodicMetric(metrics.Norm2(), [p if p > 0 else None for p in self._period])

    @classmethod
    def _from_solution(cls, prob, psi, cells, moments, active, sites=None, owner=None):
        """The diagram of a solve (on a periodic domain, of its ``sites`` and their ``owner``)."""
        obj = object.__new__(cls)
        obj.positions, obj.weights, obj._target = prob.seeds, psi, None
        if sites is not None:
            obj._period = tuple(np.asarray(_to_numpy(prob.period), dtype=np.float64).tolist())
            prob, obj._owner = prob._replace(seeds=sites), owner
        obj._state = (prob, cells, moments)
        return obj

    @classmethod
    def _at_weights(cls, positions, weights, density, period=None):
        """The diagram of a solve whose cells are computed when first asked (outside ``jax.jit``),
        their masses and barycentres under the solve's ``density`` (a kind of :mod:`._core.density`),
        on the torus of ``period`` (a tuple, or None)."""
        from ._grids import PolynomialGrid

        obj = object.__new__(cls)
        obj.positions, obj.weights, obj._state = positions, weights, None
        obj._period = period
        obj._target = PolynomialGrid(density.values, domain=(density.lo, density.hi),
                                     mass=None).with_dim(positions.shape[1])
        return obj

    def _compute(self):
        if self._state is None:
            lo, hi = self._target.domain
            xp = _driver.namespace(self.positions, self.weights, lo)
            dtype = _driver.compute_dtype(xp)
            seeds, psi, lo, hi, values = (xp.astype(a, dtype) for a in (self.positions, self.weights, lo, hi,
                                                                         self._target.density))
            dens = grid_density(values, lo, hi)     # a PowerDiagram's: ones, the uniform density
            core_xp, core = xp, (seeds, psi, dens)
            views = _driver.host_views(seeds, psi, *dens) if aac.is_jax_namespace(xp) else None
            if views is not None:           # concrete JAX on the CPU: the NumPy core, nothing compiles
                core_xp, core = namespace_of(views[0]), (views[0], views[1], type(dens)(*views[2:]))
            if self._period is None:
                cells, moments, _ = plan.diagram(core_xp, *core)
            else:
                (cells, moments, _), seeds, self._owner = plan.diagram_on_torus(core_xp, *core, np.asarray(self._period))
            self._state = (evaluation.Problem(seeds, None, dens), cells, moments)
        return self._state

    @property
    def cells(self):
        """List of :class:`Cell` (a Python object per cell: for inspection, not for speed).

        Raises
        ------
        TypeError
            Under ``jax.jit`` (or another JAX transformation) with traced positions or weights:
            the cells are Python objects of concrete arrays, read outside the transformation.
        """
        self._check_concrete("cells")
        prob, cells, moments = self._compute()
        if self._owner is not None:         # on a torus: each cell next to its Dirac, from its pieces
            from ._torus_cells import torus_cells

            host = type(cells)(*(None if a is None else _to_numpy(a) for a in cells))
            return torus_cells(Cell, np.asarray(_to_numpy(self.positions), dtype=np.float64),
                               _to_numpy(prob.seeds), _to_numpy(self._owner), host, _to_numpy(moments),
                               np.asarray(self._period, dtype=np.float64))
        seeds = _to_numpy(prob.seeds)
        verts, labels, count = (_to_numpy(a) for a in (cells.vertices, cells.labels, cells.count))
        mom = _to_numpy(moments)
        if seeds.shape[1] == 3:
            return [Cell(i, mom[i, 0], seeds[i] + (mom[i, 1:-1] / mom[i, 0] if mom[i, 0] > 0 else 0.0), v, None, f)
                    for i, (v, f) in enumerate(self._polyhedra())]
        out = []
        for i in range(seeds.shape[0]):
            k = int(count[i])
            bary = seeds[i] + (mom[i, 1:-1] / mom[i, 0] if mom[i, 0] > 0 else 0.0)
            out.append(Cell(i, mom[i, 0], bary, verts[i, :k] + seeds[i], labels[i, :k]))
        return out

    def _polyhedra(self):
        """Per 3D cell ``(vertices, facets)`` in absolute coordinates (see :class:`Cell`)."""
        prob, cells, _ = self._compute()
        seeds = _to_numpy(prob.seeds)
        verts, corners, adjacent, size, labels = (_to_numpy(a) for a in (cells.vertices, cells.corners, cells.adjacent,
                                                                          cells.size, cells.labels))
        live = (np.arange(verts.shape[1])[None, :] < size[:, None]) & (corners[..., 0] >= 0)
        out = []
        for i in range(seeds.shape[0]):
            v, facets = _diagram3d.polyhedron(verts[i] + seeds[i], corners[i], adjacent[i], live[i], labels[i])
            out.append((v, facets))
        return out

    def adjust_weights(self, dirac_masses, target_distribution, **options):
        """Solve for the weights that give cell ``i`` the mass ``dirac_masses[i]`` (on the
        diagram's :attr:`metric`).

        Stores the optimal weights in ``self.weights`` (and the target for
        :attr:`cells`) and returns the :class:`~sdot.OtPlan`. A target heavier than the
        masses (normalised to 1 as in ``SumOfWeightedDiracs``) is partial transport: the cells
        are then cut by the balls (:attr:`capped`).
        """
        from ._measures import SumOfWeightedDiracs

        result = PowerDiagram._solve(SumOfWeightedDiracs(self.positions, dirac_masses), target_distribution,
                                     **({} if self._period is None else dict(metric=self.metric)), **options)
        solved = result.power_diagram
        # the plan's cells, or (under jax.jit) the target to compute them from when asked
        self.weights, self._state, self._target = result.brenier_potential, solved._state, solved._target
        self._owner = solved._owner
        self.capped = solved.capped
        return result

    def plot(self, ax=None, points=True, section=None, **style):
        """Draw every cell (and the seeds) with matplotlib; returns the axes.

        In 3D the cells' edges in a 3D axes (made if ``ax`` is None), or with
        ``section=(axis, at)`` the section of the diagram by the plane ``x_axis = at``."""
        import matplotlib.pyplot as plt

        self._check_concrete("plot")
        prob, cells, _ = self._compute()
        seeds = _to_numpy(prob.seeds)
        if seeds.shape[1] == 3:
            polys = [f for _, f in self._polyhedra()]
            if section is not None:
                return _diagram3d.plot_section(plt.gca() if ax is None else ax, seeds, polys, *section, points, style)
            ax = plt.figure().add_subplot(projection="3d") if ax is None else ax
            return _diagram3d.plot_edges(ax, seeds, polys, points, style)
        ax = plt.gca() if ax is None else ax
        verts, count = _to_numpy(cells.vertices), _to_numpy(cells.count)
        if seeds.shape[1] == 1:
            labels = None if self._owner is None else _to_numpy(cells.labels)
            return _plot_intervals(ax, seeds[:, 0], verts[:, :, 0] + seeds, count > 0, points, style, labels,
                                   self.positions.shape[0])
        k = np.arange(verts.shape[1])
        nxt = np.where(k[None, :] + 1 < count[:, None], k[None, :] + 1, 0)
        a = verts + seeds[:, None, :]
        b = np.take_along_axis(a, nxt[..., None].repeat(2, axis=2), axis=1)
        valid = k[None, :] < count[:, None]
        if self._owner is not None:         # on a torus the box's sides are no edges
            valid &= _to_numpy(cells.labels) >= 0
        segs = np.stack([a[valid], b[valid]], axis=1)
        if self.capped:
            radii = np.sqrt(np.maximum(_to_numpy(self.weights), 0.0))
            if self._owner is not None:     # the ball of each site: its Dirac's
                radii = radii[_to_numpy(self._owner)]
            cut = [_cut_by_disc(verts[i, :count[i]], radii[i]) for i in range(len(seeds))]
            segs = np.concatenate([np.stack([c, np.roll(c, -1, axis=0)], axis=1) + seeds[i] for i, c in enumerate(cut)
                                   if len(c)] or [np.zeros((0, 2, 2))])
            if self._owner is not None:     # not along the sides of a periodic axis
                lo, hi = (_to_numpy(a) for a in (prob.density.lo, prob.density.hi))
                tol = 1e-12 * float(np.max(hi - lo))
                on_side = np.zeros(len(segs), bool)
                for axis in np.flatnonzero(np.asarray(self._period) > 0):
                    for side in (lo[axis], hi[axis]):
                        on_side |= np.all(np.abs(segs[:, :, axis] - side) <= tol, axis=1)
                segs = segs[~on_side]
        from matplotlib.collections import LineCollection

        ax.add_collection(LineCollection(segs, **({"colors": "k", "linewidths": 0.5} | style)))
        if points:                  # (on a periodic domain, the Diracs, not their images)
            shown = seeds if self._owner is None else seeds[:self.positions.shape[0]]
            ax.plot(shown[:, 0], shown[:, 1], ".", ms=2, color="C3")
        ax.set_aspect("equal")
        ax.autoscale_view()
        return ax

    def __repr__(self):
        return f"PowerDiagram(n={self.positions.shape[0]})"


def _cut_by_disc(polygon, radius, sides=180):
    """The polygon (counter-clockwise, relative to the disc's centre) cut by the disc of
    ``radius``, the disc drawn as a polygon of ``sides`` sides: for :meth:`PowerDiagram.plot`."""
    for k in range(sides):
        if len(polygon) < 3:
            return np.zeros((0, 2))
        angle = 2 * np.pi * (k + 0.5) / sides
        side = polygon @ np.array([np.cos(angle), np.sin(angle)]) - radius * np.cos(np.pi / sides)
        after, side_after = np.roll(polygon, -1, axis=0), np.roll(side, -1)
        kept = []
        for p, q, sp, sq in zip(polygon, after, side, side_after):
            if sp <= 0:
                kept.append(p)
            if sp * sq < 0:
                kept.append(p + sp / (sp - sq) * (q - p))
        polygon = np.array(kept).reshape(-1, 2)
    return polygon if len(polygon) >= 3 else np.zeros((0, 2))


def _plot_intervals(ax, seeds, ends, live, points, style, labels=None, n=None):
    """:meth:`PowerDiagram.plot` in 1D: the cells' ends as ticks on the line y = 0, each seed
    joined to its cell by a thin segment. On the circle (``labels`` of the cells of the sites,
    the ``n`` Diracs first): no tick at the domain's ends, and a piece whose site is an image
    joined to the side it comes through."""
    lo, hi = ends[live].min(), ends[live].max()
    ticks = ends[live] if labels is None else ends[live[:, None] & (labels >= 0)]
    ax.plot([lo, hi], [0.0, 0.0], **({"color": "k", "lw": 0.5} | style))
    ticks = np.sort(ticks.ravel())          # one tick per end (the two cells' within rounding)
    ticks = ticks[np.r_[True, np.diff(ticks) > 1e-12 * max(hi - lo, 1e-300)]]
    ax.plot(ticks, np.zeros(len(ticks)), "|", color="k", ms=12)
    if points:
        ax.plot(seeds[:n], np.full(len(seeds[:n]), 0.1), ".", ms=4, color="C3")
        mid = ends[live].mean(axis=1)
        start = np.clip(seeds[live], lo, hi)
        ax.plot(np.stack([start, mid]), np.stack([np.full(len(mid), 0.1), np.zeros(len(mid))]), color="C3", lw=0.3)
    ax.autoscale_view()
    return ax
