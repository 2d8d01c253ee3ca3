"""Incompressible Euler by a Lagrangian scheme (Gallouet and Merigot 2018, after Brenier).

N particles of mass 1/N carry velocities; incompressibility is a stiff spring towards the
uniform density: the force on particle i is ``-(x_i - b_i) / eps^2``, with ``b_i`` the
barycentre of its Laguerre cell in the optimal transport to the uniform density (the gradient
of ``W2^2 / (2 eps^2)``). A symplectic Euler step::

    v <- v + tau (b(x) - x) / eps^2,    x <- x + tau v.

The energy ``sum m |v|^2 / 2 + W2^2 / (2 eps^2)`` is conserved up to the scheme's error. The
start is the Taylor-Green vortex ``v = (sin(pi x) cos(pi y), -cos(pi x) sin(pi y))``, a
stationary solution in the unit square: one vortex turns the particles about the centre.

    python examples/gallery/euler.py --out euler.png
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

import sdot


def taylor_green(x):
    return np.column_stack([np.sin(np.pi * x[:, 0]) * np.cos(np.pi * x[:, 1]),
                            -np.cos(np.pi * x[:, 0]) * np.sin(np.pi * x[:, 1])])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000, help="number of particles (rounded up to a square)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--time", type=float, default=1.0, help="final time")
    parser.add_argument("--eps", type=float, default=0.05, help="the spring's length scale")
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "euler.png"))
    args = parser.parse_args(argv)
    sdot.driver.framework = "numpy"
    side = int(np.ceil(np.sqrt(args.n)))                 # a jittered lattice: nearly incompressible
    rng = np.random.default_rng(0)
    lattice = (np.stack(np.meshgrid(np.arange(side), np.arange(side), indexing="ij"), -1).reshape(-1, 2) + 0.5)
    x = (lattice + 0.2 * (rng.random(lattice.shape) - 0.5)) / side
    v, colour = taylor_green(x), 2 * (x[:, 0] < 0.5) + (x[:, 1] < 0.5)     # the quarter it started in
    target, tau, mass = sdot.Grid(np.ones((1, 1))), args.time / args.steps, 1.0 / len(x)
    frames, energies, t0 = [x], [], time.perf_counter()
    for k in range(args.steps + 1):
        plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(x), target)
        b, w2 = np.asarray(plan.barycenters), float(plan.distance)
        energies.append(0.5 * mass * float(np.sum(v * v)) + w2 / (2 * args.eps ** 2))
        if k == args.steps:
            break
        v = v + tau * (b - x) / args.eps ** 2
        x = x + tau * v
        if (k + 1) % (args.steps // 2) == 0:
            frames.append(x)
    drift = max(abs(e - energies[0]) for e in energies) / energies[0]
    print(f"{len(x)} particles, {args.steps} steps in {time.perf_counter() - t0:.1f} s: energy {energies[0]:.6f} -> "
          f"{energies[-1]:.6f}, largest relative drift {drift:.2e}")
    draw(frames, colour, energies, tau, args.out)


def draw(frames, colour, energies, tau, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(frames) + 1, figsize=(3.2 * (len(frames) + 1), 3.2))
    for k, (ax, x) in enumerate(zip(axes, frames)):
        ax.scatter(x[:, 0], x[:, 1], s=2, c=colour, cmap="tab10", vmin=0, vmax=9, linewidths=0)
        ax.set(xlim=(0, 1), ylim=(0, 1), aspect="equal", xticks=[], yticks=[],
               title=f"t = {k * tau * (len(energies) - 1) / max(len(frames) - 1, 1):.2f}")
    ax = axes[-1]
    ax.plot(np.arange(len(energies)) * tau, np.asarray(energies) / energies[0])
    ax.set(xlabel="t", title="energy / initial energy")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
