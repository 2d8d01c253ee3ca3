"""Which images of the seeds left out of a periodic diagram could own a point of it (NumPy and
scipy's cKDTree): the local test behind :func:`sdot._core.periodic.margin_needed`.

Cell ``c`` (site ``y_c``, weight ``psi_c``, farthest vertex at ``R_c``) gives its points a power
at most ``R_c^2 - psi_c``; an image ``z`` (weight ``psi_z``) beats it at a point ``x`` of the cell
only if ``|x - z|^2 < R_c^2 - psi_c + psi_z``, so only if ``|z - y_c| < R_c + sqrt(R_c^2 - psi_c +
psi_z)`` and ``(b_z + g_c)^2 < R_c^2 - psi_c + psi_z`` (``b_z``: the image's distance beyond the
box, ``g_c >= s_c - R_c`` the cell's to the periodic sides, ``s_c`` its site's). The global bound takes the largest weight
and the farthest cell for every pair; here each cell is tested against the images near it, with
their own weights: in 2D at 1e5 Diracs the margin it certifies is 2 to 3 mean spacings instead
of 12 (the weights of a uniform density drift over the domain by many squared spacings).
"""
from __future__ import annotations

import itertools

import numpy as np


class DescentMemory:
    """What the tests of one problem's images keep for the next (:func:`descent_memory`), by
    image (a row of the problem's table of images): ``starts`` (m,) the cell where each image's
    last descent stopped (-1: none yet), at the next weights a start one or two cells away;
    ``tree`` a cKDTree of the sites of nonempty cells ``nonempty`` (a start for the images met
    for the first time); ``least`` (m,) a lower bound of each image's least power gap ``g`` over
    the box (:mod:`sdot._host.compiled.descent`) at the weights of the last test (-inf: none),
    with which an image is not descended again while the weights have not moved enough to make
    it negative (:meth:`drifted`)."""

    def __init__(self, m, anchor=None):
        self.starts = np.full(m, -1, np.int64)
        self.tree, self.nonempty = None, None
        self.least = np.full(m, -np.inf)
        self.last = None
        self.anchor = anchor                # what the key names, kept alive so that its id is not reused

    def drifted(self, psi_seeds, active_seeds, owner, active_sites, used_sites):
        """Lower ``least`` to the seeds' new weights ``psi_seeds`` (``active_seeds`` of them;
        ``owner`` (m,) the seed of each image) for a diagram of ``active_sites``, and remember
        them with its nonempty cells ``used_sites``. The power gap of an image ``z`` of seed
        ``s``, ``g(x) = |x - z|^2 - psi_s - min_c (|x - y_c|^2 - psi_c)`` over the other active
        sites ``c``, falls by at most ``d_s - min d`` where the weights move by ``d`` (the
        minimum over the active seeds), as long as the sites of the last diagram's nonempty cells
        are still active sites (the cells of the others were empty: they are not in the ``min``):
        else every bound is dropped."""
        last = self.last
        if (last is None or last[1].shape[0] > active_sites.shape[0] or not active_seeds.any()
                or not active_sites[:last[1].shape[0]][last[1]].all()):
            self.least[:] = -np.inf
        else:
            d = psi_seeds - last[0]
            self.least -= d[owner] - np.min(d[active_seeds])
        self.last = (psi_seeds.copy(), used_sites.copy())

    def nearest_cells(self, sites, used, points):
        """A nonempty cell near each of ``points``: of the sites of nonempty cells when the tree
        was built, the nearest still nonempty among the 8 nearest (the tree built again where
        none is)."""
        from scipy.spatial import cKDTree

        from .threads import settings

        found = np.full(points.shape[0], -1, np.int64)
        if self.tree is not None:           # of the 8 nearest, the first still nonempty
            near = self.nonempty[self.tree.query(points, k=min(8, self.nonempty.shape[0]),
                                                 workers=settings().threads)[1].reshape(points.shape[0], -1)]
            alive = used[near]
            first = np.argmax(alive, axis=1)
            found = np.where(alive.any(axis=1), near[np.arange(points.shape[0]), first], -1)
        if (found < 0).any():
            self.nonempty = np.flatnonzero(used)
            self.tree = cKDTree(sites[self.nonempty])
            lost = np.flatnonzero(found < 0)
            found[lost] = self.nonempty[self.tree.query(points[lost], k=1, workers=settings().threads)[1]]
        return found


_MEMORY = {}


def descent_memory(key, m, anchor=None):
    """The :class:`DescentMemory` of the ``m`` images named ``key`` (any hashable that names the
    seeds and images, ``anchor`` what it names by id; one key at a time)."""
    if key not in _MEMORY or _MEMORY[key].starts.shape[0] != m or _MEMORY[key].anchor is not anchor:
        _MEMORY.clear()
        _MEMORY[key] = DescentMemory(m, anchor)
    return _MEMORY[key]


def left_out_owners(sites, r2, psi_sites, used, side, images, psi_images, beyond, support=None, descend=None,
                    memory=None, groups=2, pairs=512, rows=None):
    """Which left-out images (``images`` (m, d), their weights, their distances ``beyond`` the
    box, nearest first) may own a point of a cell (``used`` ones, of ``sites`` with squared
    radii ``r2``, weights ``psi_sites`` and distances ``side`` to the periodic sides), (m,); None
    if the search would be too wide (weights that vary by many squared spacings) and there is no
    ``descend``. ``support(cells, directions)``: the cells'
    support functions (``max u . e`` over their vertices ``u``, relative to the site), with
    which the test is exact (``z`` beats the site of ``c`` at a vertex, where the difference of
    their powers, affine, is least); without it, the bounds of the module docstring.
    ``descend(images, weights, starts, ends, least)``: whether sites would own a point of the diagram, by a
    descent from the cells ``starts`` (:mod:`sdot._host.compiled.descent`), exact: where given,
    it tests the images when the balls are too wide (weights that vary by many squared spacings:
    a Gaussian density and 1e5 uniform Diracs on the torus, 0.1 s a test instead of the bound's
    twice as many sites; slower than the balls where they are narrow: 0.2-0.7 s on a 3D box
    instead of 0.04 s). ``memory``: a :class:`DescentMemory` of the same sites and images, the
    descents' starts (without it each test finds them by a cKDTree: 80 of its 110 ms at 1e5).
    ``groups``, ``pairs``: :attr:`sdot._core.options.DiagramOptions.periodic_groups` and
    ``periodic_pairs``. ``rows``: each image's row in ``memory`` (default: its index); the images
    whose least power gap there is positive are not descended (:meth:`DescentMemory.drifted`: at
    1e5 on a Gaussian, most of them near convergence)."""
    owners = np.zeros(images.shape[0], np.bool_)
    if images.shape[0] == 0 or not used.any():
        return owners
    from scipy.spatial import cKDTree

    from .threads import settings

    # z beats a cell only if beyond^2 < R_c^2 - psi_c + psi_z for some cell: the images to test
    worst = np.max(np.where(used, r2 - psi_sites, -np.inf))
    maybe = np.flatnonzero(beyond * beyond < worst + psi_images)
    if maybe.shape[0] == 0:
        return owners
    # by weight, so that a few heavy images do not widen every cell's search (a Gaussian density:
    # weights over hundreds of squared spacings)
    by_weight = _by_weight(maybe[np.argsort(psi_images[maybe])], psi_images, np.median(r2[used]), groups)
    # an image at ``b`` beyond the box is at least ``b + side`` from a site: the cells it may reach
    # (first with the largest weight, then each group's)
    radius = np.sqrt(r2) + np.sqrt(np.maximum(r2 - psi_sites + psi_images[maybe].max(), 0.0))
    reached = np.flatnonzero(used & (radius > side + beyond[maybe].min()))
    r2_reached, psi_reached, side_reached = r2[reached], psi_sites[reached], side[reached]
    c, z = [], []
    for group in by_weight:
        top = psi_images[group].max()
        radius = np.sqrt(r2_reached) + np.sqrt(np.maximum(r2_reached - psi_reached + top, 0.0))
        cells = np.flatnonzero(radius > side_reached + beyond[group].min())
        if cells.shape[0] == 0:
            continue
        # about as many images in each ball as seeds in its volume: a search too wide is left to
        # the descent (without it, to the global bound of :func:`sdot._core.periodic.margin_needed`)
        d = sites.shape[1]
        if len(sites) * np.sum(radius[cells] ** d) * (np.pi if d == 2 else 4.19) > pairs * cells.shape[0]:
            return None if descend is None else _descended(sites, used, images, psi_images, maybe, descend, memory,
                                                           rows)
        near = cKDTree(images[group]).query_ball_point(sites[reached[cells]], radius[cells], return_sorted=False,
                                                       workers=settings().threads)
        lengths = np.fromiter(map(len, near), dtype=np.int64, count=len(near))
        c.append(np.repeat(reached[cells], lengths))
        z.append(group[np.fromiter(itertools.chain.from_iterable(near), dtype=np.int64, count=int(lengths.sum()))])
    if not c or not sum(a.shape[0] for a in c):
        return owners
    c, z = np.concatenate(c), np.concatenate(z)
    e = images[z] - sites[c]
    gap2 = np.sum(e * e, axis=1)
    power = r2[c] - psi_sites[c] + psi_images[z]         # z beats c at x only if |x - z|^2 < this
    clear = np.maximum(side[c] - np.sqrt(r2[c]), 0.0)     # ... and |x - z| >= beyond + clear
    close = (np.sqrt(gap2) < np.sqrt(r2[c]) + np.sqrt(np.maximum(power, 0.0))) & ((beyond[z] + clear) ** 2 < power)
    if support is not None and close.any():
        # at a vertex x = y_c + u: |x - z|^2 - psi_z - |u|^2 + psi_c = |e|^2 - 2 u.e - psi_z + psi_c
        pick = np.flatnonzero(close)
        h = support(c[pick], e[pick])
        close[pick] = gap2[pick] - 2.0 * h - psi_images[z[pick]] + psi_sites[c[pick]] < 0.0
    owners[z[close]] = True
    return owners


def _descended(sites, used, images, psi_images, maybe, descend, memory=None, rows=None):
    """The ``owners`` of :func:`left_out_owners` by ``descend`` from where each image's last
    descent stopped (``memory``, at the ``rows``), or from the nonempty cell of the site nearest
    it; not for the images whose least power gap there is positive."""
    memory = DescentMemory(images.shape[0]) if memory is None else memory
    rows = np.arange(images.shape[0]) if rows is None else rows
    maybe = maybe[~(memory.least[rows[maybe]] > 0.0)]
    at = rows[maybe]
    starts = memory.starts[at]
    valid = (starts >= 0) & (starts < used.shape[0])
    valid[valid] = used[starts[valid]]
    unknown = np.flatnonzero(~valid)
    if unknown.shape[0]:
        starts[unknown] = memory.nearest_cells(sites, used, images[maybe[unknown]])
    ends = np.empty(maybe.shape[0], np.int64)
    least = np.empty(maybe.shape[0])
    owners = np.zeros(images.shape[0], np.bool_)
    owners[maybe] = descend(images[maybe], psi_images[maybe], starts, ends, least)
    memory.starts[at] = ends
    memory.least[at] = least
    return owners


def _by_weight(images, psi_images, span, groups):
    """The ``images`` (sorted by weight) in groups of weights within ``span`` of the group's
    least (each group's search widens the balls by its largest weight: within a cell's squared
    radius, by at most sqrt(2)), or in ``groups`` groups of as many images where that would
    take more."""
    w = psi_images[images]
    bins = np.floor((w - w[0]) / max(span, np.finfo(w.dtype).tiny))
    cuts = np.flatnonzero(bins[1:] != bins[:-1]) + 1
    if cuts.shape[0] < groups:
        return np.split(images, cuts)
    return np.array_split(images, min(groups, images.shape[0]))
