"""Why a solve did not converge: the message of :class:`OtNotConverged` (close Diracs, the
density's separate pieces, empty cells, far Diracs), from the failed plan, with SciPy."""
from __future__ import annotations

import numpy as np

from . import _autodiff, _driver


STATUS = {0: "converged", 1: "max_iter", 2: "stalled", 3: "uncertified"}


def _near_duplicates(prob, tol):
    """A sentence on the closest distinct Diracs, when the dtype cannot resolve their cells.

    One rounding of the weights (``eps`` times the domain's size squared) moves the facet
    between Diracs ``delta`` apart by ``eps L^2 / delta``, so their cells' masses are only
    known to about ``eps L^2 rho h / delta`` (``h`` a cell's size, ``rho`` the density):
    below ``tol`` only if ``delta`` is above about that divided by ``tol``."""
    from scipy.spatial import cKDTree

    seeds = _driver._to_host(_autodiff.detach(prob.seeds))
    keep = _driver._to_host(_autodiff.detach(prob.masses)) > 0
    pts = np.unique(seeds[keep], axis=0)
    if len(pts) < 2:
        return "the Diracs are all at one point"
    dist, idx = cKDTree(pts).query(pts, k=2)
    k = int(np.argmin(dist[:, 1]))
    lo, hi = (_driver._to_host(_autodiff.detach(a)) for a in (prob.lo, prob.hi))
    side = float(np.max(hi - lo))
    dens = _driver._to_host(_autodiff.detach(prob.density.values))
    contrast = float(dens.max() / max(dens.mean(), np.finfo(float).tiny))
    eps = float(np.finfo(seeds.dtype).eps)
    resolved = 4.0 * eps * contrast / (np.sqrt(len(pts)) * tol) * side
    closest = float(dist[k, 1])
    if closest > resolved:
        return "no two Diracs are too close for the dtype to resolve their cells at this tol"
    return (f"the closest Diracs, at {pts[k].tolist()} and {pts[idx[k, 1]].tolist()}, are {closest:.3g} apart: "
            f"{prob.seeds.dtype} resolves the masses of cells to tol={tol:.1e} only for Diracs about "
            f"{resolved:.1g} or more apart; merge such Diracs (exact duplicates are merged) or raise tol")


def _support_pieces(prob):
    """How many separate pieces the density's support has: its positive grid cells, joined
    across the sides they share (not across corners)."""
    from scipy import ndimage

    values = _driver._to_host(_autodiff.detach(prob.density.values))
    dim = prob.seeds.shape[1]
    positive = values > 0
    while positive.ndim > dim:                  # a polynomial's coefficients per grid cell
        positive = positive.any(axis=-1)
    return int(ndimage.label(positive)[1])


#: Distance from the domain, in its sides, up to which the tests solve a far Dirac (FP64).
_TESTED_REACH = 1e6


def _empty_cells(prob, empty):
    """A sentence on the Diracs of positive mass whose cells are empty (``empty`` (n,)): how
    many, the first few by index and position, and those too far from the domain."""
    seeds = _driver._to_host(_autodiff.detach(prob.seeds))
    lo, hi = (_driver._to_host(_autodiff.detach(a)) for a in (prob.lo, prob.hi))
    side = float(np.max(hi - lo))
    reach = np.max(np.maximum(np.maximum(lo - seeds, seeds - hi), 0.0), axis=1) / side
    which = np.flatnonzero(empty)
    named = ", ".join(f"{i} at {seeds[i].tolist()}" for i in which[:3]) + (", ..." if len(which) > 3 else "")
    sentence = f"{len(which)} Diracs of positive mass have empty cells (index {named})"
    far = which[reach[which] > _TESTED_REACH]
    if len(far):
        sentence += (f"; Dirac {int(far[0])} lies {float(reach[far[0]]):.3g} domain sides from the domain: "
                     f"{seeds.dtype} places the facets of so far a Dirac only to about its eps times that "
                     f"distance (tested to {_TESTED_REACH:.0e} sides): move it closer, or drop it")
    return sentence


def failure(plan, stop, tol, max_iter, prob, options):
    """Why a solve did not converge (with the Newton ``options``), for :class:`OtNotConverged`."""
    status = STATUS[int(plan.status)]
    width, damping = (float(_autodiff.detach(a)) for a in stop)
    masses = _driver._to_host(_autodiff.detach(plan.cell_masses))
    wanted = _driver._to_host(_autodiff.detach(prob.masses)) > 0
    empty = int(((masses <= 0) & wanted).sum())
    lines = [f"no convergence: residual {float(plan.residual):.3e} > tol {tol:.1e} after "
             f"{int(plan.iterations)} Newton steps"]
    if status == "max_iter":
        lines.append(f"max_iter={max_iter} reached" + (
            f", the continuation still at width {width:.3g} of the domain (raise max_iter)" if width > 0 else ""))
    elif status == "stalled":
        lines.append(f"stalled: no step length of at least {options.stall_step:g} kept every cell above its floor and reduced "
                     f"the residual (last accepted damping {damping:.3g})")
        lines.append(_near_duplicates(prob, tol))
        pieces = _support_pieces(prob)
        if pieces > 1:
            lines.append(f"the density's support has {pieces} separate pieces (zero between them): their masses "
                         "balance only through cells that reach across the gaps, which the damped Newton steps did "
                         "not find (a known limit with many small pieces)")
    else:
        lines.append("the last power diagram could not be certified (its cells may overlap or leave gaps): "
                     "its masses need not sum to the total")
    if empty:
        lines.append(_empty_cells(prob, (masses <= 0) & wanted))
    return "; ".join(lines) + ". The partial plan is the exception's .plan (converged=False)."
