"""Linear Fokker-Planck equation by a Lagrangian scheme: particles moved by optimal transport.

The Ornstein-Uhlenbeck equation ``d rho / dt = Laplacian(rho) + div(rho (x - c) / s)`` is the
Wasserstein gradient flow of the entropy plus the potential ``|x - c|^2 / (2 s)`` (Jordan,
Kinderlehrer and Otto 1998). From a Gaussian of variance ``s0`` (per axis) its solution stays a
Gaussian, of variance ``s + (s0 - s) exp(-2 t / s)``: the exact kernel we compare with.

N particles of mass 1/N, a step of length ``tau`` split in two (as in the Lagrangian schemes of
Leclerc, Merigot, Santambrogio and Stra 2020, with the heat flow instead of their entropy's
Moreau-Yosida regularisation):

- **diffusion**: the particles' measure flowed by the heat equation for ``tau`` is the mixture of
  Gaussians of variance ``2 tau`` about them; each particle moves to the barycentre of its
  Laguerre cell in the optimal transport to that mixture (its pixel integrals on a grid), the
  Lagrangian form of the heat flow ``v = -grad log rho``;
- **drift**: ``y <- c + (y - c) exp(-tau / (2 s))`` before and after it, the exact flow of the
  potential for half a step (Strang's splitting: the variance of the equilibrium is then off by
  ``(tau / s)^2 / 6`` relative; one drift of ``tau`` after the diffusion, by ``tau / s``).

The particles start at a Lloyd quantization of the initial Gaussian. The exact W2 between the
particles and the exact solution is measured along the way.

    python examples/gallery/fokker_planck.py --out fokker_planck.png
"""
from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import numpy as np

import sdot

CENTRE = 0.5


def gaussian_pixels(points, variance, size):
    """The mixture of Gaussians of ``variance`` (per axis) about ``points`` (equal masses),
    integrated over the pixels of a ``size`` x ``size`` grid of the unit square (erf differences,
    one axis at a time): pixel masses, axis 0 along x."""
    from scipy.special import erf

    edges = np.linspace(0.0, 1.0, size + 1)
    scale = math.sqrt(2.0 * variance)
    per_axis = [np.diff(0.5 * erf((edges[None, :] - points[:, a, None]) / scale), axis=1) for a in range(2)]
    return per_axis[0].T @ per_axis[1] / len(points)


def exact_variance(t, s0, s):
    return s + (s0 - s) * np.exp(-2.0 * t / s)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="number of particles")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--time", type=float, default=0.01, help="final time")
    parser.add_argument("--size", type=int, default=128, help="pixels per side of the heat step's grid")
    parser.add_argument("--s0", type=float, default=0.0025, help="initial variance per axis")
    parser.add_argument("--s", type=float, default=0.01, help="the equilibrium's variance per axis")
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "fokker_planck.png"))
    args = parser.parse_args(argv)
    sdot.driver.framework = "numpy"
    tau = args.time / args.steps
    shrink = math.exp(-0.5 * tau / args.s)                 # half a step of the drift
    rng = np.random.default_rng(0)
    y = CENTRE + math.sqrt(args.s0) * rng.standard_normal((args.n, 2))
    start = sdot.Grid(gaussian_pixels(np.array([[CENTRE, CENTRE]]), args.s0, 2 * args.size))
    for _ in range(10):                                     # Lloyd: spread evenly over the Gaussian
        y = np.asarray(sdot.barycenters(sdot.SumOfDiracs(y), start))
    times, variances, w2, frames, t0 = [0.0], [y.var(axis=0).mean()], [], [(0.0, y)], time.perf_counter()
    for k in range(1, args.steps + 1):
        y = CENTRE + (y - CENTRE) * shrink
        heat = sdot.Grid(gaussian_pixels(y, 2.0 * tau, args.size))      # the heat flow of the particles
        y = np.asarray(sdot.barycenters(sdot.SumOfDiracs(y), heat))
        y = CENTRE + (y - CENTRE) * shrink
        times.append(k * tau)
        variances.append(y.var(axis=0).mean())
        if k % (args.steps // 2) == 0:
            frames.append((k * tau, y))
    elapsed = time.perf_counter() - t0
    for t, x in frames:
        exact = sdot.Grid(gaussian_pixels(np.array([[CENTRE, CENTRE]]), exact_variance(t, args.s0, args.s),
                                          2 * args.size))
        w2.append(float(sdot.distance(sdot.SumOfDiracs(x), exact)))
        print(f"t = {t:.4f}: variance {x.var(axis=0).mean():.6f} (exact {exact_variance(t, args.s0, args.s):.6f}), "
              f"W2^2 to the exact solution {w2[-1]:.3e}")
    error = max(abs(v - exact_variance(t, args.s0, args.s)) / exact_variance(t, args.s0, args.s)
                for t, v in zip(times, variances))
    print(f"{args.n} particles, {args.steps} steps in {elapsed:.1f} s: largest relative error of the variance "
          f"{error:.3e}, mean {np.mean(y, axis=0).round(6).tolist()}")
    draw(frames, times, variances, args, args.out)


def draw(frames, times, variances, args, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(frames) + 1, figsize=(3.2 * (len(frames) + 1), 3.2))
    angle = np.linspace(0, 2 * np.pi, 200)
    for ax, (t, y) in zip(axes, frames):
        ax.scatter(y[:, 0], y[:, 1], s=1.5, c="k", linewidths=0)
        for r in (1, 2):                                    # the exact solution's 1 and 2 sigma circles
            radius = r * math.sqrt(exact_variance(t, args.s0, args.s))
            ax.plot(CENTRE + radius * np.cos(angle), CENTRE + radius * np.sin(angle), "C1", lw=1)
        ax.set(xlim=(0.1, 0.9), ylim=(0.1, 0.9), aspect="equal", xticks=[], yticks=[], title=f"t = {t:.3f}")
    ax = axes[-1]
    fine = np.linspace(0, times[-1], 200)
    ax.plot(fine, exact_variance(fine, args.s0, args.s), "C1", label="exact")
    ax.plot(times, variances, "k.", ms=3, label="particles")
    ax.set(xlabel="t", title="variance per axis")
    ax.legend(frameon=False)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
