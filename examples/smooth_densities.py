"""Diracs fitted to smooth densities: one constant per pixel, a Bernstein polynomial per
pixel, and a B-spline through the pixels' values.

The same 12 x 12 control image is read three ways: ``Grid`` (one constant per pixel),
``PolynomialGrid`` of degree 2 (a smooth Bernstein patch per pixel, here built to match the
spline) and ``SplineGrid`` (the C^1 quadratic B-spline whose control values are the pixels).
On each, Lloyd's iteration (every Dirac moved to the barycentre of its Laguerre cell) fits
``n`` Diracs to the density; the picture shows the density and the final cells.

    python examples/smooth_densities.py --out docs/densities.png
"""
from __future__ import annotations

import argparse
import tempfile
from math import comb
from pathlib import Path

import numpy as np

import sdot


def control_image(size=12):
    """Two bumps on a dim background, on [0, 1]^2 (``values[i, j]`` at (x_i, y_j))."""
    t = (np.arange(size) + 0.5) / size
    x, y = np.meshgrid(t, t, indexing="ij")
    bump = lambda cx, cy, r: np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / r ** 2)   # noqa: E731
    return 0.1 + bump(0.3, 0.35, 0.18) + 0.7 * bump(0.7, 0.7, 0.12)


def evaluate(grid, samples=240):
    """The density of a 2D ``PolynomialGrid`` (any degree) on a ``samples`` x ``samples``
    raster of [0, 1]^2, from its Bernstein coefficients."""
    values = np.asarray(grid.density)
    if values.ndim == 2:
        values = values[..., None]
    n0, n1, k = values.shape
    p = int(round(np.sqrt(k))) - 1
    u = (np.arange(samples) + 0.5) / samples
    i0, t0 = np.minimum((u * n0).astype(int), n0 - 1), u * n0 - np.minimum((u * n0).astype(int), n0 - 1)
    i1, t1 = np.minimum((u * n1).astype(int), n1 - 1), u * n1 - np.minimum((u * n1).astype(int), n1 - 1)
    basis = lambda t: np.stack([comb(p, a) * t ** a * (1 - t) ** (p - a) for a in range(p + 1)], -1)  # noqa: E731
    b0, b1 = basis(t0), basis(t1)                                   # (samples, p+1)
    coef = values[i0[:, None], i1[None, :]].reshape(samples, samples, p + 1, p + 1)
    return np.einsum("xyab,xa,yb->xy", coef, b0, b1)


def lloyd(target, n, steps, seed):
    """``n`` Diracs moved ``steps`` times to the barycentres of their cells under ``target``."""
    x = np.random.default_rng(seed).uniform(0.05, 0.95, (n, 2))
    for _ in range(steps):
        x = np.asarray(sdot.barycenters(sdot.SumOfDiracs(x), target))
    return x, sdot.optimal_transport_plan(sdot.SumOfDiracs(x), target)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=60, help="number of Diracs")
    parser.add_argument("--steps", type=int, default=10, help="Lloyd steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "densities.png"))
    args = parser.parse_args(argv)
    sdot.driver.framework = "numpy"
    img = control_image()
    spline = sdot.SplineGrid(img, continuity=1)
    targets = {"Grid: one constant per pixel": sdot.Grid(img),
               "PolynomialGrid, degree 2 (the spline's patches)": spline.as_polynomial_grid(),
               "SplineGrid(continuity=1): a C^1 quadratic B-spline": spline}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13.5, 4.8))
    for ax, (title, target) in zip(axes, targets.items()):
        x, plan = lloyd(target, args.n, args.steps, args.seed)
        rho = evaluate(target.as_polynomial_grid() if isinstance(target, sdot.SplineGrid) else target)
        ax.imshow(rho.T, origin="lower", extent=(0, 1, 0, 1), cmap="Greys", vmin=0)
        plan.power_diagram.plot(ax, points=False, colors="tab:green", linewidths=0.8)
        ax.plot(x[:, 0], x[:, 1], "o", ms=3, color="tab:red")
        ax.set_title(f"{title}\nW2^2 = {float(plan.distance):.3e}, {int(plan.iterations)} Newton steps", fontsize=9)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.savefig(args.out, dpi=80, bbox_inches="tight")
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
