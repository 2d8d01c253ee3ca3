"""FP32 on JAX with JAX's default settings (``jax_enable_x64`` off), in a fresh process (the
test session turns x64 on): eager calls, ``jax.jit``, ``jax.grad`` of the distance and of the
barycentres work, agree with NumPy to FP32's precision, leave the flag
off and print no int64-truncation warning."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("jax")
ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, warnings
import numpy as np
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    import jax, jax.numpy as jnp
    import sdot
    sdot.driver.dtype = "FP32"
    rng = np.random.default_rng(0)
    x_np, img_np = rng.random((60, 2)), 0.5 + rng.random((8, 8))
    x, img = jnp.asarray(x_np, dtype=jnp.float32), jnp.asarray(img_np, dtype=jnp.float32)
    w2 = lambda x: sdot.distance(sdot.SumOfDiracs(x), sdot.Grid(img))
    bsum = lambda x: jnp.sum(sdot.barycenters(sdot.SumOfDiracs(x), sdot.Grid(img)) ** 2)
    out = dict(eager=float(w2(x)), jit=float(jax.jit(w2)(x)),
               grad=np.asarray(jax.grad(w2)(x)).tolist(),
               bary_grad=np.asarray(jax.grad(bsum)(x)).tolist(),
               jit_bary_grad=np.asarray(jax.jit(jax.grad(bsum))(x)).tolist(),
               dtype=str(jax.jit(w2)(x).dtype), x64=bool(jax.config.jax_enable_x64))
    sdot.driver.framework, sdot.driver.dtype = "numpy", "FP64"
    plan = sdot.optimal_transport_plan(sdot.SumOfDiracs(x_np), sdot.Grid(img_np))
    out["numpy"] = float(plan.distance)
    out["numpy_grad"] = (2 * (x_np - plan.barycenters) / len(x_np)).tolist()
    out["numpy_bary_grad"] = plan.vjp(barycenters=2 * plan.barycenters)["positions"].tolist()
out["warnings"] = [str(w.message)[:120] for w in caught if "int64" in str(w.message) or "64-bit" in str(w.message)]
print(json.dumps(out))
"""


def test_fp32_with_x64_off():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SDOT_", "JAX_ENABLE"))}
    env.update(SDOT_FRAMEWORK="jax", PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["x64"] is False and out["dtype"] == "float32"
    assert out["warnings"] == []
    for key in ("eager", "jit"):
        assert abs(out[key] - out["numpy"]) <= 1e-4 * out["numpy"]
    import numpy as np

    for key in ("grad",):
        np.testing.assert_allclose(out[key], out["numpy_grad"], atol=1e-3 * np.abs(out["numpy_grad"]).max())
    for key in ("bary_grad", "jit_bary_grad"):
        # FP32 solves to tol 1e-5 on cell masses of 1/60: the derivative of the barycentres to ~1e-3
        np.testing.assert_allclose(out[key], out["numpy_bary_grad"], atol=1e-2 * np.abs(out["numpy_bary_grad"]).max())
