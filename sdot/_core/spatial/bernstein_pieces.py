"""The integrals of a Bernstein voxel density over the pieces of the cells' boundary
triangles (one voxel each): the face reduction of :mod:`.faces` with a polynomial
x-primitive, integrated by Gauss rules that are exact for its degree.

On the voxel ``(i, j, k)`` of sides ``h``, in its own coordinates ``t in [0, 1]^3``, the
density is ``rho = sum_(k0, k1, k2) c[k0, k1, k2] B_k0(t0) B_k1(t1) B_k2(t2)``
(``B_k(t) = C(p, k) t^k (1 - t)^(p - k)``). Along the row ``(j, k)`` of voxels, at a point
``(y, z)`` of it, ``rho(s, y, z) = sum_(k1, k2) B_k1(t1) B_k2(t2) r_(k1 k2)(s)`` with
``r_(k1 k2)`` a polynomial of degree ``p`` on each voxel of the row. The x-primitives
from the cell's origin ``o`` (its first vertex; ``u = x - o_x``),

    G_m(x, y, z) = int_(o_x)^x rho(s, y, z) (s - o_x)^m ds,        m = 0, 1, 2,

are the sum of three parts (as in :mod:`.faces`): the base column's (from ``o_x`` to its side
``E`` towards the piece) and the whole columns' between, ``K_m`` per ``(k1, k2)`` (from
:mod:`.bernstein_columns`), and the piece's own column's (from its side ``B`` to ``x``):

    G_m = sum_(k1 k2) B_k1(t1) B_k2(t2) K_m[k1 k2]
          + int_0^1 l rho(x_xi, y, z) (B + l xi)^m d xi,        l = u - B,

``x_xi`` the point at ``u = B + l xi`` (``B = 0`` in the base column itself). The moments
of the cell about ``o`` integrate ``G_0``, ``G_1``, ``v G_0``, ``w G_0`` and
``G_2 + (v^2 + w^2) G_0`` times ``n_x`` over its boundary; the facet integrals ``rho`` over
it. On a piece triangle these are polynomials of degree at most ``3 p + 3``: a collapsed
Gauss rule (Gauss-Legendre times Gauss-Jacobi) with ``ceil((3 p + 4) / 2)^2`` points is
exact, and the primitive's integral along ``xi`` (degree ``p + 2``) a Gauss-Legendre rule
of ``ceil((p + 3) / 2)`` points. The offsets are measured from the cell's origin and the
Bernstein arguments in the voxels' own coordinates: only the whole columns' part (from
tables relative to ``lo``, as in :mod:`.faces`) has terms of the grid's size.

The polynomial integrals (the transpose, :func:`piece_gradients`) take the same terms
coefficient by coefficient: the gradient with respect to the piece's voxel coefficients
and to ``K``, which :mod:`.bernstein_columns` takes to the base voxel and the tables.
"""
from __future__ import annotations

import functools
import math

import array_api_compat as aac

from .. import _compat
from ..quadrature import gauss_legendre


@functools.lru_cache(maxsize=None)
def line_rule(degree: int):
    """Gauss-Legendre on ``[0, 1]``, exact to ``degree``: ``(nodes, weights)`` (floats,
    weights summing to 1)."""
    return gauss_legendre(degree // 2 + 1)


@functools.lru_cache(maxsize=None)
def triangle_rule(degree: int):
    """A rule exact to ``degree`` on a triangle: ``(l1, l2, w)`` (floats), the point
    ``p0 + l1 (p1 - p0) + l2 (p2 - p0)``, weights summing to 1 (the mean over the
    triangle). Collapsed (Duffy): ``l1 = xi (1 - eta)``, ``l2 = eta``, Jacobian ``1 - eta``;
    Gauss-Legendre in ``xi`` (degree ``d``) and in ``eta`` (degree ``d + 1``, the Jacobian
    included in the integrand)."""
    xi, wxi = gauss_legendre(degree // 2 + 1)
    eta, weta = gauss_legendre((degree + 1) // 2 + 1)
    return tuple((a * (1.0 - e), e, 2.0 * wa * we * (1.0 - e))
                 for a, wa in zip(xi, wxi) for e, we in zip(eta, weta))


def bernstein(xp, t, p: int, axis: int = 0):
    """The Bernstein basis of degree ``p`` at ``t`` (any shape), stacked along ``axis``."""
    if p == 0:
        return xp.expand_dims(xp.ones_like(t), axis=axis)
    s = 1.0 - t
    tp, sp = [None, t], [None, s]
    for k in range(2, p + 1):
        tp.append(tp[-1] * t), sp.append(sp[-1] * s)
    terms = [sp[p]] + [tp[k] * sp[p - k] for k in range(1, p)] + [tp[p]]
    return xp.stack([math.comb(p, k) * b if 0 < k < p else b for k, b in enumerate(terms)], axis=axis)


class Layout:
    """Where the basis axes of the per-point vectors and matrices go.

    ``Layout(first=False)`` (eager): the basis axes first, the pieces last (``(k, P)``,
    ``(k, l, P)``): NumPy's loops run along long contiguous rows. ``Layout(first=True)``
    (static shapes): the pieces and their fans first, the basis axes last (``(S, E, k)``,
    ``(S, E, k, l)``): the contractions are batched matrix products (XLA's dot), not
    broadcast sums."""

    def __init__(self, first: bool):
        self.first = first

    def stack(self, xp, items):
        """A vector from its entries (per-point arrays)."""
        return xp.stack(items, axis=-1 if self.first else 0)

    def at(self, a, k):
        """Entry ``k`` of the vectors ``a``."""
        return a[..., k] if self.first else a[k, ...]

    def span(self, a, start, stop):
        """Entries ``start:stop`` of the vectors ``a``."""
        return a[..., start:stop] if self.first else a[start:stop, ...]

    def scalar(self, s):
        """Per-point values, to multiply vectors."""
        return s[..., None] if self.first else s[None, ...]

    def total(self, xp, a):
        """The sum of the entries of the vectors ``a``."""
        return xp.sum(a, axis=-1 if self.first else 0)

    def basis(self, xp, t, p: int):
        """The Bernstein basis at the per-point values ``t``: vectors."""
        return bernstein(xp, t, p, axis=-1 if self.first else 0)

    def bases(self, xp, t, p: int):
        """The Bernstein basis at each entry of the vectors ``t``: matrices ``(p + 1, n)``."""
        return bernstein(xp, t, p, axis=-2 if self.first else 0)

    def outer(self, xp, a, b):
        """The products ``a_k b_l`` flattened: vectors of ``k l`` entries (``k`` major)."""
        if self.first:
            m = a[..., :, None] * b[..., None, :]
            return xp.reshape(m, tuple(m.shape[:-2]) + (m.shape[-2] * m.shape[-1],))
        m = a[:, None, ...] * b[None, :, ...]
        return xp.reshape(m, (m.shape[0] * m.shape[1],) + tuple(m.shape[2:]))

    def matvec(self, xp, M, x):
        """``sum_l M[k, l] x[l]``: vectors."""
        if self.first:
            return xp.matmul(M, x[..., None])[..., 0]
        return xp.sum(M * x[None, ...], axis=1)

    def vecmat(self, xp, x, M):
        """``sum_k x[k] M[k, l]``: vectors."""
        if self.first:
            return xp.matmul(x[..., None, :], M)[..., 0, :]
        return xp.sum(x[:, None, ...] * M, axis=0)

    def add_outer(self, xp, total, a, b):
        """``total`` plus the products ``a_k b_l``, summed over the fans: ``(S, k, l)`` from
        vectors ``(S, E, k)`` and ``(S, E, l)``; eagerly ``(k, l, P)``."""
        if self.first:
            return total + xp.matmul(xp.permute_dims(a, (0, 2, 1)), b)
        return total + a[:, None, ...] * b[None, :, ...]


class Column:
    """What the pieces need of their voxels and rows, in a :class:`Layout`: per-point
    arrays of the pieces' triangles are ``(P,)`` eagerly, ``(S, E)`` for the fans of the
    static pieces, and per piece ``(P,)`` or ``(S, 1)``.

    Attributes: ``p``, ``layout``; ``rows``, matrices ``(p + 4, R)`` (``R = (p + 1)^2``, index
    ``k1 (p + 1) + k2``; eagerly ``(p + 4, R, P)``, else ``(S, 1, p + 4, R)``): the piece's voxel
    coefficients ``c[k0]`` for ``k0 <= p``, then ``K_0, K_1, K_2``, the base column's and the
    whole columns' parts of ``G_0, G_1, G_2`` (None for the transpose); ``B`` the side of the
    piece's column towards the origin (relative to it, 0 in the base column) and ``t_B`` its
    coordinate in the voxel; ``offset`` (2 arrays) and ``scale`` (3 numbers) the voxel
    coordinates ``t_a = offset_a + scale_a x_a`` across (a = 1, 2) of points ``x`` relative to
    the origin, and along x (``scale[0]``).
    """

    def __init__(self, p, layout, rows, B, t_B, offset, scale):
        self.p, self.layout, self.rows = p, layout, rows
        self.B, self.t_B, self.offset, self.scale = B, t_B, offset, scale

    def across(self, xp, v, w):
        """``B_k1(t1) B_k2(t2)`` at the points ``(v, w)`` relative to the origin: vectors of ``R``."""
        lay = self.layout
        return lay.outer(xp, lay.basis(xp, self.offset[0] + v * self.scale[1], self.p),
                         lay.basis(xp, self.offset[1] + w * self.scale[2], self.p))

    def along(self, xp, u, line):
        """At the points of abscissa ``u`` (relative to the origin): the length ``l = u - B``
        of the piece's column part, the offsets ``U_g = B + xi_g l`` of the line rule's nodes
        (vectors of ``n``) and the basis ``B_k0`` there (matrices ``(p + 1, n + 1)``, node ``n``:
        at ``u`` itself)."""
        ell = u - self.B
        step = ell * self.scale[0]
        U = self.layout.stack(xp, [self.B + xi * ell for xi in line[0]])
        t = self.layout.stack(xp, [self.t_B + xi * step for xi in list(line[0]) + [1.0]])
        return ell, U, self.layout.bases(xp, t, self.p)


def _points(X, edges, l1, l2):
    """The points ``X_0 + l1 (X_1 - X_0) + l2 (X_2 - X_0)`` of the triangles ``X`` (9 arrays)."""
    return [X[a] + l1 * edges[0][a] + l2 * edges[1][a] for a in range(3)]


def _edges(X):
    """``X_1 - X_0`` and ``X_2 - X_0`` (3 arrays each)."""
    return [X[3 + a] - X[a] for a in range(3)], [X[6 + a] - X[a] for a in range(3)]


def _areas(xp, edges, normal=None):
    """The projected area ``int n_x dS`` of the triangles and their area (signed along
    ``normal`` if given)."""
    e1, e2 = edges
    cross = [e1[1] * e2[2] - e1[2] * e2[1], e1[2] * e2[0] - e1[0] * e2[2], e1[0] * e2[1] - e1[1] * e2[0]]
    if normal is None:
        area = 0.5 * xp.sqrt(cross[0] * cross[0] + cross[1] * cross[1] + cross[2] * cross[2])
    else:
        area = 0.5 * (cross[0] * normal[0] + cross[1] * normal[1] + cross[2] * normal[2])
    return 0.5 * cross[0], area


def _over_triangle(xp, rule, like, body, state):
    """``state = body(l1, l2, w, state)`` over the nodes of the triangle ``rule``: a Python loop
    eagerly (floats), a ``fori_loop`` over an array of the nodes when traced (one copy of
    ``body`` in the compiled program)."""
    if not _compat.is_traced(like):
        for l1, l2, w in rule:
            state = body(l1, l2, w, state)
        return state
    nodes = xp.asarray(rule, dtype=like.dtype, device=aac.device(like))
    return _compat.fori_loop(0, len(rule), lambda r, st: body(nodes[r, 0], nodes[r, 1], nodes[r, 2], st), state)


def _line_weights(xp, layout, line, like):
    """The line rule's weights, a vector to multiply vectors of ``like``'s shape."""
    w = xp.asarray(line[1], dtype=like.dtype, device=aac.device(like))
    return w if layout.first else xp.reshape(w, (len(line[1]),) + (1,) * like.ndim)


#: The pairs ``(a, b)``, ``a <= b``, of the second moments of a facet (:func:`piece_moments`'s "facet").
PAIRS = ((0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2))


def piece_moments(xp, col, X, rules, normal=None, live=None, kind="cell"):
    """Per triangle ``X`` (9 arrays, relative to the cell's origin, in the voxel of ``col``)
    its share of the cell's integrals about the origin, zero where not ``live``; of ``kind``:

    - ``"cell"``: ``(mass, M_u, M_v, M_w, M_2, facet)``: the moments (``int G n_x dS`` of the
      primitives of the module docstring) and the facet integral ``int rho dS`` (signed along
      ``normal`` if given);
    - ``"axes"``: ``(mass, M_u, M_v, M_w, M_uu, M_vv, M_ww, facet)``, ``M_2`` by axis;
    - ``"facet"``: ``int rho (1, u, v, w) dS`` and ``int rho x_a x_b dS`` for the :data:`PAIRS`
      (10 terms, signed along ``normal`` if given): on the triangle ``rho x_a x_b`` is of degree
      ``3 p + 2``, within the triangle rule's."""
    triangle, line = rules
    lay, p, n = col.layout, col.p, len(line[0])
    edges = _edges(X)
    W, area = _areas(xp, edges, normal)
    weights = _line_weights(xp, lay, line, W)

    def node(l1, l2, w, out):
        u, v, z = _points(X, edges, l1, l2)
        rows = lay.matvec(xp, col.rows, col.across(xp, v, z))                 # p + 4 per point
        if kind == "facet":
            basis = lay.basis(xp, col.t_B + (u - col.B) * col.scale[0], p)
            rho = lay.total(xp, lay.span(rows, 0, p + 1) * basis)
            x = (u, v, z)
            terms = (rho, rho * u, rho * v, rho * z) + tuple(rho * x[a] * x[b] for a, b in PAIRS)
            return [o + w * t for o, t in zip(out, terms)]
        ell, U, basis = col.along(xp, u, line)
        rho = lay.vecmat(xp, lay.span(rows, 0, p + 1), basis)   # the density at the line's nodes and at u
        part = lay.span(rho, 0, n) * weights * lay.scalar(ell)  # the piece's column: int from B to u
        part_U = part * U
        G0 = lay.at(rows, p + 1) + lay.total(xp, part)
        G1 = lay.at(rows, p + 2) + lay.total(xp, part_U)
        G2 = lay.at(rows, p + 3) + lay.total(xp, part_U * U)
        second = (G2 + (v * v + z * z) * G0,) if kind == "cell" else (G2, v * v * G0, z * z * G0)
        terms = (G0, G1, v * G0, z * G0) + second + (lay.at(rho, n),)
        return [o + w * t for o, t in zip(out, terms)]

    count = {"cell": 6, "axes": 8, "facet": 10}[kind]
    out = _over_triangle(xp, triangle, W, node, [xp.zeros_like(W) for _ in range(count)])
    out = [o * area for o in out] if kind == "facet" else [o * W for o in out[:-1]] + [out[-1] * area]
    if live is not None:
        out = [xp.where(live, o, 0.0) for o in out]
    return out


def piece_gradients(xp, col, X, rules, q, live=None):
    """The transpose of :func:`piece_moments`: for ``Q = kappa m + beta . M_1 + g M_2`` of
    the triangles' shares (``q = (kappa, beta_u, beta_v, beta_w, g)``, per piece), its
    gradient with respect to ``col.rows``, the fans summed: ``(p + 4, R, P)`` eagerly, else
    ``(S, p + 4, R)``. Zero where not ``live``."""
    triangle, line = rules
    lay, p, n = col.layout, col.p, len(line[0])
    edges = _edges(X)
    W = _areas(xp, edges)[0]
    if live is not None:
        W = xp.where(live, W, 0.0)
    weights = _line_weights(xp, lay, line, W)
    kappa, bu, bv, bw, g = q

    def node(l1, l2, w, grad):
        u, v, z = _points(X, edges, l1, l2)
        weight = w * W
        omega = [weight * (kappa + bv * v + bw * z + g * (v * v + z * z)), weight * bu, weight * g]
        ell, U, basis = col.along(xp, u, line)
        part = (lay.scalar(omega[0]) + U * (lay.scalar(omega[1]) + U * lay.scalar(omega[2]))) * weights
        e = lay.matvec(xp, lay.span(basis, 0, n) if lay.first else basis[:, :n, ...], part * lay.scalar(ell))
        rows = xp.concat([e, lay.stack(xp, omega)], axis=-1 if lay.first else 0)          # p + 4 per point
        return lay.add_outer(xp, grad, rows, col.across(xp, v, z))

    R = (p + 1) * (p + 1)
    S = W.shape[0]
    shape = (S, p + 4, R) if lay.first else (p + 4, R, S)
    return _over_triangle(xp, triangle, W, node, xp.zeros(shape, dtype=W.dtype, device=aac.device(W)))
