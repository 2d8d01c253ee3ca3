"""Quickstart: W2^2 between 1000 uniform points and a Gaussian image, on the default backend."""
import numpy as np

import sdot

x = np.random.default_rng(0).random((1000, 2))                 # 1000 Diracs in [0, 1]^2
i, j = np.meshgrid(np.arange(64), np.arange(64), indexing="ij")
c = (np.stack([i, j], -1) + 0.5) / 64
img = 0.2 + np.exp(-((c - 0.5) ** 2).sum(-1) / (2 * 0.15**2))   # 64 x 64 density

plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(x), sdot.Grid(img), verbose=True)
print(f"backend: {sdot.driver.framework} ({sdot.driver.dtype})")
print(f"W2^2 = {float(plan.distance):.12g} in {int(plan.iterations)} Newton steps, "
      f"max cell-mass error {float(plan.residual):.1e}")
