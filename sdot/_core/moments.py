"""Cell moments in any dimension: taken about a vertex of a far cell, moved to the seeds.

A cell far from its seed (a Dirac outside the domain, at 1e6) has vertices at ``|u| ~ 1e6``
relative to it: integrands of size ``|u|^2`` cancel to nothing. Its integrals are taken
about one of its own vertices, ``o``, and moved to the seed after (:func:`about_seeds`).
"""
from __future__ import annotations

from . import _compat

#: Distance from a seed (in domain sides, the solver's normalised units) beyond which a cell
#: is "far" and integrated about one of its vertices (a Dirac at 1e6 stalled before).
FAR = 2.0


@_compat.jit_on_jax()
def about_seeds(xp, moments, origin):
    """Moments ``(mass, M_1 (d columns), M_2)`` about ``origin`` (n, d) (relative to the
    seeds) moved to the seeds: ``M_1 + m o`` and ``M_2 + 2 o . M_1 + m |o|^2``."""
    d = origin.shape[1]
    m, m1 = moments[:, :1], moments[:, 1:1 + d]
    m2 = moments[:, 1 + d:] + 2.0 * _compat.dot(origin, m1)[:, None] + m * _compat.dot(origin, origin)[:, None]
    return xp.concat([m, m1 + m * origin, m2], axis=1)
