"""Image transport: displacement interpolation from one image to another.

The source image is sampled by Diracs (one per bright pixel of a coarse grid, of mass its grey
level); the target image is a density. The optimal transport plan sends each Dirac y_i to its
Laguerre cell, whose barycentre b_i is where the map T takes it; the frames show the Diracs at
(1 - t) y_i + t b_i. Along this path, W2^2 to the target falls at least as fast as the bound
of the plan's own coupling: ``W2^2(t) <= V + (1 - t)^2 (W2^2 - V)`` with ``V`` the mass-weighted
variance of the cells (the Diracs at the barycentres, t = 1).

    python examples/gallery/image_transport.py --out image_transport.png
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import sdot


def source_image(size):
    """A bright disc and a dimmer bar."""
    t = (np.arange(size) + 0.5) / size
    x, y = np.meshgrid(t, t, indexing="ij")          # values[i, j] is the pixel (x_i, y_j)
    disc = np.hypot(x - 0.3, y - 0.65) < 0.18
    bar = (np.abs(x - 0.62) < 0.25) & (np.abs(y - 0.25) < 0.07)
    return 1.0 * disc + 0.5 * bar


def target_image(size):
    """A ring and a spot."""
    t = (np.arange(size) + 0.5) / size
    x, y = np.meshgrid(t, t, indexing="ij")
    ring = np.exp(-((np.hypot(x - 0.62, y - 0.55) - 0.22) / 0.04) ** 2)
    spot = np.exp(-(np.hypot(x - 0.2, y - 0.2) / 0.07) ** 2)
    return 0.01 + ring + 0.6 * spot


def diracs_of(image):
    """Diracs at the centres of the image's nonzero pixels, of masses their values."""
    size = image.shape[0]
    i, j = np.nonzero(image)
    return (np.column_stack([i, j]) + 0.5) / size, image[i, j]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source-size", type=int, default=96, help="the source image's pixels per side")
    parser.add_argument("--target-size", type=int, default=128, help="the target image's pixels per side")
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "image_transport.png"))
    args = parser.parse_args(argv)
    sdot.driver.framework = "numpy"
    y, m = diracs_of(source_image(args.source_size))
    target = sdot.Grid(target_image(args.target_size))
    start = time.perf_counter()
    plan = sdot.optimal_transport_plan(sdot.SumOfWeightedDiracs(y, m), target)
    b, masses, w2 = np.asarray(plan.barycenters), np.asarray(plan.cell_masses), float(plan.distance)
    print(f"{len(y)} Diracs, {args.target_size}^2 pixels: W2^2 = {w2:.6f} in {time.perf_counter() - start:.2f} s")
    moved = float(np.sum(masses * np.sum((y - b) ** 2, axis=1)))
    variance = w2 - moved                 # int |x - b_i|^2 over the cells
    frames = []
    for t in (0.0, 0.25, 0.5, 0.75, 1.0):
        x = (1 - t) * y + t * b
        w2_t = float(sdot.distance(sdot.SumOfWeightedDiracs(x, m), target))
        bound = variance + (1 - t) ** 2 * moved
        print(f"t = {t:.2f}: W2^2 to the target {w2_t:.6f} <= {bound:.6f}")
        frames.append(x)
    draw(frames, masses, y, b, target_image(args.target_size), args.out)


def draw(frames, masses, y, b, target, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(frames) + 1, figsize=(3 * (len(frames) + 1), 3.2))
    for k, (ax, x) in enumerate(zip(axes, frames)):
        ax.scatter(x[:, 0], x[:, 1], s=6 * masses / masses.max(), c=y[:, 0] + y[:, 1], cmap="viridis",
                   linewidths=0)
        ax.set_title(f"t = {k / (len(frames) - 1):.2f}")
    ax = axes[-1]
    ax.imshow(target.T, origin="lower", extent=(0, 1, 0, 1), cmap="Greys")
    pick = np.random.default_rng(0).permutation(len(y))[:120]
    ax.quiver(y[pick, 0], y[pick, 1], (b - y)[pick, 0], (b - y)[pick, 1], angles="xy", scale_units="xy",
              scale=1, width=0.004, color="tab:red")
    ax.set_title("target and the map")
    for ax in axes:
        ax.set(xlim=(0, 1), ylim=(0, 1), aspect="equal", xticks=[], yticks=[])
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
