"""Crowd motion with congestion: a crowd leaves a room through a door, its density at most 1.

The Lagrangian scheme of Leclerc, Merigot, Santambrogio and Stra (2020) for the model of Maury,
Roudneff-Chupin and Santambrogio (2010): each of N people (Diracs of mass m, total mass below the
room's area) takes a step along the desired velocity U (towards the door), then the crowd is
projected onto the densities at most 1: every person moves to the barycentre of its capped cell
in the partial transport to the uniform density 1 on the room (``sdot.Grid(ones, mass=area)``,
heavier than the crowd). People who reach the door leave.

    python examples/crowd_motion.py --out crowd.png
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

import sdot

DOOR = np.array([1.0, 0.5])
DOOR_HALF_WIDTH = 0.08


def desired_velocity(x):
    """Unit vectors towards the door."""
    d = DOOR - x
    return d / np.linalg.norm(d, axis=1, keepdims=True)


def step(x, mass, tau):
    """One step: move along U, then project onto the densities <= 1 (the barycentres of the
    capped cells of the partial transport); the people at the door leave."""
    moved = np.clip(x + tau * desired_velocity(x), 0.0, 1.0)
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(moved, mass=mass * len(moved)),
                                       sdot.Grid(np.ones((1, 1)), mass=1.0))
    x = np.asarray(plan.barycenters)
    out = (x[:, 0] > 1.0 - 0.03) & (np.abs(x[:, 1] - DOOR[1]) < DOOR_HALF_WIDTH)
    return x[~out], float(plan.transported_mass)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=400, help="number of people")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--tau", type=float, default=0.02, help="time step (distance walked freely per step)")
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "crowd.png"))
    args = parser.parse_args(argv)
    sdot.driver.framework = "numpy"
    rng = np.random.default_rng(0)
    x = np.column_stack([0.05 + 0.45 * rng.random(args.n), 0.1 + 0.8 * rng.random(args.n)])
    mass = 0.5 / args.n                 # the crowd at density 1 fills half of the room's left part
    frames = [x]
    for k in range(args.steps):
        x, moved = step(x, mass, args.tau)
        frames.append(x)
        print(f"step {k + 1}: {len(x)} people in the room, mass moved {moved:.6f}")
    draw(frames, args.out)


def draw(frames, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = np.linspace(0, len(frames) - 1, 4).round().astype(int)
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.8))
    for ax, k in zip(axes, shown):
        x = frames[k]
        ax.plot(x[:, 0], x[:, 1], "o", ms=2.5, color="tab:blue")
        ax.plot([1, 1], [DOOR[1] - DOOR_HALF_WIDTH, DOOR[1] + DOOR_HALF_WIDTH], color="tab:red", lw=4)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_aspect("equal")
        ax.set_title(f"step {k}: {len(x)} people", fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle("Crowd motion with congestion (density <= 1): the projection is partial transport", fontsize=10)
    fig.savefig(out, dpi=80, bbox_inches="tight")
    print(f"saved {out}")


if __name__ == "__main__":
    main()
