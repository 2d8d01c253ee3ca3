"""Every ```python block of docs/*.md and README.md runs.

The blocks of one file run in order, in one namespace, in a fresh interpreter
(as a reader would run them) with a temporary working directory, on the NumPy driver
except the files of :data:`DEFAULT_DRIVER`. A block is
skipped only if its info string is ``python no-run``.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted((ROOT / "docs").glob("*.md")) + [p for p in [ROOT / "README.md"] if p.exists()]
#: Files whose blocks run with the driver's default framework (JAX when installed); the
#: others run NumPy inputs on the NumPy driver (torch and JAX inputs keep their framework).
DEFAULT_DRIVER = {"backends.md", "README.md", "getting-started.md"}
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")

RUNNER = r"""
import json, sys, traceback
path, blocks = json.load(sys.stdin)
namespace = {"__name__": "__main__"}
for line, code in blocks:
    try:
        exec(compile("\n" * (line - 1) + code, path, "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        print(f"\n{path}: the block starting at line {line} failed", file=sys.stderr)
        sys.exit(1)
"""


def python_blocks(text):
    """``[(first line number, code)]`` of the runnable python blocks of ``text``."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        i += 1
        if not m:
            continue
        indent, fence, info = len(m["indent"]), m["fence"], m["info"].split()
        start, body = i + 1, []
        while i < len(lines) and not (lines[i].strip().startswith(fence)
                                      and set(lines[i].strip()) == {fence[0]}):
            line = lines[i]
            body.append(line[indent:] if line[:indent].strip() == "" else line.lstrip())
            i += 1
        i += 1
        if info and info[0] in ("python", "py") and info[1:] != ["no-run"]:
            blocks.append((start, "\n".join(body) + "\n"))
    return blocks


def test_python_blocks_parser():
    text = ("a\n```python\nx = 1\n```\n```python no-run\nboom\n```\n"
            "  ```py\n  if y:\n      y = 2\n  ```\n```bash\nls\n```\n````python\n```\nz\n````\n")
    assert python_blocks(text) == [(3, "x = 1\n"), (9, "if y:\n    y = 2\n"), (16, "```\nz\n")]


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_doc_examples_run(path, tmp_path):
    blocks = python_blocks(path.read_text())
    if not blocks:
        pytest.skip(f"{path.name} has no python block")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SDOT_")}
    env.update(MPLBACKEND="Agg", PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    if path.name not in DEFAULT_DRIVER:
        # NumPy inputs on the NumPy driver: JAX's compile of each new shape (about 15 s)
        # is the driver's business, tested where the driver is documented
        env["SDOT_FRAMEWORK"] = "numpy"
    proc = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps([str(path), blocks]),
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]


#: ``(name, script, tiny-size arguments)``: every example runs in one interpreter (runpy, the
#: driver's settings restored before each), at sizes that take seconds.
EXAMPLES = [("quickstart", "quickstart.py", []),
            ("power-diagram-3d", "power_diagram_3d.py", ["--n", "30", "--out", "laguerre3d.png"]),
            ("quantization", "quantization.py", ["--n", "300", "--iterations", "3", "--out", "quantization.png"]),
            ("laguerre-picture", "laguerre_picture.py", ["--out", "laguerre.png"]),
            ("centroidal", "centroidal.py", ["--n", "60", "--iterations", "8"]),
            ("smooth-densities", "smooth_densities.py", ["--n", "30", "--steps", "3", "--out", "densities.png"]),
            ("partial-transport", "partial_transport.py", ["--n", "30", "--out", "partial.png"]),
            ("crowd-motion", "crowd_motion.py", ["--n", "60", "--steps", "3", "--out", "crowd.png"]),
            ("image-transport", "gallery/image_transport.py",
             ["--source-size", "12", "--target-size", "16", "--out", "image_transport.png"]),
            ("gaussian-mixture", "gallery/gaussian_mixture.py",
             ["--size", "16", "--samples", "15", "--steps", "4", "--out", "gaussian_mixture.png"]),
            ("euler", "gallery/euler.py", ["--n", "100", "--steps", "10", "--time", "0.05", "--out", "euler.png"]),
            ("fokker-planck", "gallery/fokker_planck.py",
             ["--n", "200", "--steps", "4", "--time", "0.002", "--size", "48", "--out", "fokker_planck.png"]),
            ("power-diagram-geometry", "gallery/power_diagram_geometry.py",
             ["--n", "12", "--out", "power_diagram_geometry.png"]),
            ("blue-noise", "gallery/blue_noise.py",
             ["--n", "100", "--size", "32", "--steps", "4", "--out", "blue_noise.png"]),
            ("periodic-tile", "periodic_tile.py", ["--n", "60", "--steps", "6", "--out", "periodic_tile.png"]),
            ("quantization-3d", "gallery/quantization_3d.py",
             ["--n", "20", "--size", "8", "--iterations", "2", "--out", "quantization_3d.png"])]

EXAMPLES_RUNNER = r"""
import contextlib, io, json, runpy, sys, traceback
import sdot
jobs, settings, out = json.load(sys.stdin), dict(vars(sdot.driver)), {}
for name, path, args in jobs:
    vars(sdot.driver).update(settings)
    sys.argv, buf = [path, *args], io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            runpy.run_path(path, run_name="__main__")
        out[name] = [0, buf.getvalue()]
    except BaseException:
        out[name] = [1, buf.getvalue() + traceback.format_exc()]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def example_runs(tmp_path_factory):
    """``{name: (working directory, return code, stdout or traceback)}`` of :data:`EXAMPLES`."""
    cwd = tmp_path_factory.mktemp("examples")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SDOT_")}
    env.update(MPLBACKEND="Agg", PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    jobs = [(name, str(ROOT / "examples" / script), args) for name, script, args in EXAMPLES]
    proc = subprocess.run([sys.executable, "-c", EXAMPLES_RUNNER], input=json.dumps(jobs), capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-5000:]
    return {name: (cwd, code, text) for name, (code, text) in json.loads(proc.stdout.splitlines()[-1]).items()}


def _numbers(line):
    return [float(w) for w in re.findall(r"-?\d+\.\d+(?:e[-+]\d+)?", line)]


@pytest.mark.parametrize("name", [e[0] for e in EXAMPLES])
def test_examples_run(name, example_runs):
    cwd, code, stdout = example_runs[name]
    assert code == 0, stdout[-5000:]
    picture = {"laguerre-picture": "laguerre.png", "power-diagram-3d": "laguerre3d.png",
               "partial-transport": "partial.png", "crowd-motion": "crowd.png", "smooth-densities": "densities.png",
               "quantization": "quantization.png"}.get(name, name.replace("-", "_") + ".png")
    if name not in ("quickstart", "centroidal"):
        assert (cwd / picture).stat().st_size > 10_000
    lines = stdout.splitlines()
    if name == "partial-transport":
        assert "transported mass 0.99999999" in stdout or "transported mass 1.0000000" in stdout
    if name == "periodic-tile":                 # Lloyd on the torus spreads the points
        spacings = [float(line.split("smallest distance")[1]) for line in lines if "smallest distance" in line]
        assert spacings[-1] > 3 * spacings[0]
    if name == "crowd-motion":
        assert "step 3: 60 people in the room, mass moved 0.500000" in stdout
    if name == "centroidal":
        line = stdout.split("mean |y - b(y)|^2:")[1]
        start, final = float(line.split()[0]), float(line.split("derivative:")[1].split()[0])
        assert final < 0.01 * start                # the barycentre loss falls
    if name == "quantization":
        values = [float(line.split("=")[1].split()[0]) for line in lines if line.startswith("iteration")]
        assert values == sorted(values, reverse=True) and len(values) == 3   # Lloyd decreases W
    if name == "quantization-3d":
        values = [float(line.split("=")[1].split()[0]) for line in lines if line.startswith("iteration")]
        assert len(values) == 2 and values[1] < values[0]
    if name == "blue-noise":           # W2^2 falls; the closest two Diracs move apart
        steps = [_numbers(line) for line in lines if line.startswith(("start:", "step"))]
        w2 = [row[0] for row in steps[1:]]           # start: (smallest, mean); steps: (W2^2, smallest, mean)
        assert len(w2) == 4 and w2 == sorted(w2, reverse=True) and steps[-1][1] > 3 * steps[0][0]
    if name == "image-transport":      # W2^2 along the path below the plan's own coupling's
        path = [_numbers(line)[-2:] for line in lines if line.startswith("t = ")]
        assert len(path) == 5 and all(w <= bound * (1 + 1e-9) for w, bound in path)
        assert path[-1][0] < 0.2 * path[0][0]
    if name == "gaussian-mixture":     # the loss falls; torch and JAX take the same steps
        fits = {line.split(":")[0]: _numbers(line)[:2] for line in lines if line.startswith(("torch:", "jax:"))}
        assert set(fits) == {"torch", "jax"} and fits["torch"][1] < fits["torch"][0]
        assert fits["jax"] == pytest.approx(fits["torch"], rel=1e-6)
    if name == "euler":                # the energy drifts by less than 1e-3 over 10 steps
        assert float(stdout.split("largest relative drift")[1].split()[0]) < 1e-3
    if name == "fokker-planck":        # the variance follows the exact solution's; the mean stays
        assert float(stdout.split("largest relative error of the variance")[1].split(",")[0]) < 0.02
        assert "mean [0.5, 0.5]" in stdout
    if name == "power-diagram-geometry":
        assert "areas sum to 1.0000000000000" in stdout or "areas sum to 0.9999999999999" in stdout
        assert float(stdout.split("largest |area - asked|")[1].split()[0]) < 1e-9
