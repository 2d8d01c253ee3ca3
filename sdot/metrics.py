"""Ground metrics: the cost of moving a unit of mass from ``y`` to ``x``.

``metric=`` of :func:`sdot.distance`, :func:`sdot.distances`, :func:`sdot.barycenters` and
:func:`sdot.optimal_transport_plan`:

- :class:`Norm2` (the default): ``|x - y|^2``;
- :class:`PeriodicMetric`: ``min over integer k of |x - y - k * period|^2``, the squared
  distance on the torus (a period on every axis) or the cylinder (``None`` on an axis that is
  not periodic). The period of an axis is the target's domain extent on it.
"""
from __future__ import annotations

import dataclasses
import math
import numbers


@dataclasses.dataclass(frozen=True)
class Norm2:
    """The squared Euclidean cost ``|x - y|^2`` (W2^2)."""


@dataclasses.dataclass(frozen=True)
class PeriodicMetric:
    """The squared distance on the torus: ``min over integer k of |x - y - k * period|^2``.

    Diracs anywhere are folded onto the domain; :attr:`sdot.OtPlan.barycenters` come back
    next to their Dirac (``y_i + (b_i - y_i)`` with the shortest periodic difference), so that
    ``2 m_i (y_i - b_i)`` stays the gradient of W2^2 with respect to ``y_i``.

    Parameters
    ----------
    base : Norm2
        The cost in the covering space (only :class:`Norm2`).
    period : sequence of float or None
        The period of each axis, equal to the target's domain extent on it; ``None`` for an
        axis that is not periodic (a cylinder).
    """

    base: Norm2
    period: tuple

    def __post_init__(self):
        if not isinstance(self.base, Norm2):
            raise TypeError(f"PeriodicMetric's base must be Norm2(), got {self.base!r}")
        try:
            period = tuple(self.period)
        except TypeError:
            raise TypeError(f"PeriodicMetric's period must be a sequence (one entry per axis: a number > 0 or None), "
                            f"got {self.period!r}") from None
        for p in period:
            if p is not None and (isinstance(p, bool) or not isinstance(p, numbers.Real)
                                  or not (math.isfinite(p) and p > 0)):
                raise ValueError(f"PeriodicMetric's period entries must be finite numbers > 0 or None, got {period}")
        if not period or all(p is None for p in period):
            raise ValueError(f"PeriodicMetric needs a period on at least one axis, got {period}")
        object.__setattr__(self, "period", tuple(None if p is None else float(p) for p in period))


def periods(metric, lo, hi):
    """The period of each axis (0: not periodic) for the domain ``[lo, hi]`` (host floats),
    or None for :class:`Norm2`; a ``ValueError`` if a period is not the domain's extent."""
    if metric is None or isinstance(metric, Norm2):
        return None
    if not isinstance(metric, PeriodicMetric):
        raise TypeError(f"metric must be sdot.metrics.Norm2() or sdot.metrics.PeriodicMetric(...), got {metric!r}")
    if len(metric.period) != len(lo):
        raise ValueError(f"PeriodicMetric has {len(metric.period)} periods for a {len(lo)}D problem")
    out = []
    for axis, (p, a, b) in enumerate(zip(metric.period, lo, hi)):
        if p is not None and not math.isclose(p, b - a, rel_tol=1e-12, abs_tol=0.0):
            raise ValueError(f"PeriodicMetric's period on axis {axis} is {p}, but the target's domain extends over "
                             f"{b - a} there ([{a}, {b}]): the period must equal the domain's extent (the density "
                             f"is one period of a periodic one)")
        out.append(0.0 if p is None else b - a)
    return out
