"""Blue noise in a non-convex shape: the W2 gradient flow of Diracs towards the uniform density
on a letter.

The Diracs start at random in the letters; each step moves every Dirac to the barycentre of its
Laguerre cell in the optimal transport to the uniform density on the shape (the gradient step
``y <- y - grad_y W2^2 / (2 m)``, Lloyd's iteration; de Goes, Breeden, Ostromoukhov and Desbrun
2012, "Blue noise through optimal transport"). The points spread evenly, with no two close: the
smallest distance between two Diracs grows towards the mean spacing.

    python examples/gallery/blue_noise.py --out blue_noise.png
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy.spatial import cKDTree

import sdot


def letters(text, size):
    """A ``size x size`` image of 1 on ``text`` (rasterised by matplotlib), 0 elsewhere;
    ``values[i, j]`` is the pixel (x_i, y_j)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(1, 1), dpi=size)
    fig.text(0.5, 0.5, text, ha="center", va="center", fontsize=0.62 * 72, fontweight="bold")
    fig.canvas.draw()
    grey = np.asarray(fig.canvas.buffer_rgba())[..., 0]
    plt.close(fig)
    return (grey[::-1].T < 128).astype(float)


def spacing(x):
    """Smallest and mean distance from each Dirac to its nearest neighbour."""
    d = cKDTree(x).query(x, k=2)[0][:, 1]
    return d.min(), d.mean()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3000, help="number of Diracs")
    parser.add_argument("--size", type=int, default=256, help="pixels per side of the image of the letters")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--text", default="OT")
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "blue_noise.png"))
    args = parser.parse_args(argv)
    sdot.driver.framework = "numpy"
    img = letters(args.text, args.size)
    rng = np.random.default_rng(0)
    inside = np.argwhere(img > 0)                       # random pixels of the shape, jittered
    x = (inside[rng.integers(len(inside), size=args.n)] + rng.random((args.n, 2))) / args.size
    target, frames, t0 = sdot.Grid(img), [x], time.perf_counter()
    print("start: nearest neighbour smallest {:.4f}, mean {:.4f}".format(*spacing(x)))
    for k in range(args.steps):
        plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(x), target)
        x = np.asarray(plan.barycenters)
        if k in (0, args.steps // 3):
            frames.append(x)
        smallest, mean = spacing(x)
        print(f"step {k + 1:2d}: W2^2 {float(plan.distance):.4e}, nearest neighbour smallest {smallest:.4f}, "
              f"mean {mean:.4f}")
    frames.append(x)
    print(f"{args.n} Diracs, {args.steps} steps in {time.perf_counter() - t0:.1f} s")
    draw(frames, [0, 1, args.steps // 3 + 1, args.steps], args.out)


def draw(frames, steps, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(frames), figsize=(3.2 * len(frames), 3.2))
    for ax, x, k in zip(axes, frames, steps):
        ax.scatter(x[:, 0], x[:, 1], s=1.5, c="k", linewidths=0)
        ax.set(xlim=(0, 1), ylim=(0, 1), aspect="equal", xticks=[], yticks=[], title=f"step {k}")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
