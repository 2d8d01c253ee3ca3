"""Analytic gradients of ``W = W2^2`` at the optimum (``docs/gradients.md``).

With masses ``m`` and density ``rho`` of equal total mass, optimal weights
``psi`` and ``phi(x) = min_i |x - y_i|^2 - psi_i``:

- ``dW/dy_i = 2 m_i (y_i - b_i) = -2 int_{L_i} (x - y_i) rho``;
- ``dW/dm_i = psi_i`` (Kantorovich duality, ``W = sum m_i psi_i + int phi rho``);
  for a Dirac of zero mass, whose cell is empty, the one-sided derivative
  ``psi^c_i = min_x |x - y_i|^2 - phi(x)`` over the domain (its cell opens there);
- ``dW/drho = phi``, integrated over each pixel.

The weights are taken with the plan's convention (mean 0 over the Diracs of
positive mass): a constant added to ``psi`` changes the mass and density
gradients by terms that the normalisation of both measures projects out.
Duplicates share their group's cell in proportion to their masses.
"""
from __future__ import annotations

from typing import NamedTuple

import array_api_compat as aac

from . import _compat, geometry


class GradientState(NamedTuple):
    """What the gradients need from a solve: the ``cells`` and cell ``moments`` at
    the optimum, the centred weights ``psi``, and the duplicate groups (``rep``,
    ``active``, ``targets`` of :func:`sdot._core.evaluation.group_duplicates`); on a periodic
    domain the ``sites`` of the cells and the seed of each (``owner``, :mod:`.periodic`)."""

    cells: object
    moments: object
    psi: object
    rep: object
    active: object
    targets: object
    sites: object = None
    owner: object = None


def gradients(xp, seeds, masses, density, state, needs=(True, True, True)):
    """``(dW/dy (n, d), dW/dm (n,), dW/drho)`` (the last of the shape of the parameters of
    ``density``, a kind of :mod:`.density`); None where not ``needs``."""
    gy = position_gradient(xp, masses, state) if needs[0] else None
    gm = mass_gradient(xp, seeds, density.lo, density.hi, state) if needs[1] else None
    grho = None
    if needs[2]:
        grho = (density.potential_integrals(xp, seeds, state.cells, state.psi) if state.sites is None else
                density.potential_integrals(xp, state.sites, state.cells, xp.take(state.psi, state.owner)))
    return gy, gm, grho


@_compat.jit_on_jax()
def position_gradient(xp, masses, state):
    """``dW/dy`` of shape (n, d)."""
    group_mass = xp.take(state.targets, state.rep)
    share = xp.where(group_mass > 0, masses / xp.where(group_mass > 0, group_mass, 1.0), 0.0)
    return -2.0 * share[:, None] * xp.take(state.moments[:, 1:-1], state.rep, axis=0)


def mass_gradient(xp, seeds, lo, hi, state):
    """``dW/dm`` of shape (n,): the group's weight, or ``psi^c`` for Diracs of zero mass."""
    empty = ~xp.take(state.active, state.rep)
    own = xp.take(state.psi, state.rep)
    return _compat.cond(xp.any(empty), lambda: xp.where(empty, _c_transform(xp, seeds, state), own), lambda: own)


def _c_transform(xp, seeds, state):
    """``psi^c`` of every Dirac (:func:`c_transform_at_vertices`); on a periodic domain the
    smallest over each Dirac's sites."""
    if state.sites is None:
        return geometry.of_seeds(seeds).c_transform(xp, seeds, state.cells, state.psi)
    n = seeds.shape[0]
    at_sites = geometry.of_seeds(seeds).c_transform(xp, state.sites, state.cells, xp.take(state.psi, state.owner))
    out, owner, images = at_sites[:n], state.owner[n:], at_sites[n:]
    order = xp.argsort(owner, stable=True)          # each seed's images, one rank at a time (at most 26)
    owner, images = xp.take(owner, order), xp.take(images, order)
    first = xp.searchsorted(owner, owner, side="left")
    rank = xp.arange(owner.shape[0], dtype=first.dtype, device=aac.device(owner)) - first
    for r in range(int(xp.max(rank)) + 1 if owner.shape[0] else 0):
        at = xp.nonzero(rank == r)[0]
        ids = xp.take(owner, at)
        out = _compat.put_rows(xp, out, ids, xp.minimum(xp.take(out, ids), xp.take(images, at)))
    return out


@_compat.jit_on_jax()
def c_transform_at_vertices(xp, seeds, vertices, live, psi):
    """``psi^c_i = min_x |x - y_i|^2 - phi(x)`` over the domain for every Dirac i, shape (n,),
    from the cells' ``vertices`` (n, V, d) (relative to the seeds; ``live`` (n, V) the slots
    in use): ``|x - y_i|^2 - phi(x)`` is affine on each cell, so the minimum is at a vertex.
    ``O(n x vertices)`` work, in blocks of Diracs."""
    n, cap, d = vertices.shape
    phi = xp.reshape(xp.where(live, _compat.dot(vertices, vertices) - psi[:, None], -xp.inf), (-1,))
    points = xp.reshape(vertices + seeds[:, None, :], (n * cap, d))
    block = max(1, min(n, int(2 ** 22 // max(n * cap, 1))))

    def body(b, out):
        idx = xp.minimum(b * block + xp.arange(block, dtype=xp.int64, device=aac.device(seeds)), n - 1)
        gap = points[None, :, :] - xp.take(seeds, idx, axis=0)[:, None, :]
        return _compat.put_rows(xp, out, idx, xp.min(_compat.dot(gap, gap) - phi[None, :], axis=1))
    return _compat.fori_loop(0, -(-n // block), body, xp.zeros((n,), dtype=seeds.dtype, device=aac.device(seeds)))
