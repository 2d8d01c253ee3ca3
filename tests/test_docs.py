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


@pytest.mark.parametrize("args", [["quickstart.py"],
                                  ["quantization.py", "--n", "300", "--iterations", "3",
                                   "--out", "quantization.png"],
                                  ["laguerre_picture.py", "--out", "laguerre.png"],
                                  ["power_diagram_3d.py", "--n", "30", "--out", "laguerre3d.png"],
                                  ["centroidal.py", "--n", "60", "--iterations", "8"],
                                  ["smooth_densities.py", "--n", "30", "--steps", "3", "--out", "densities.png"],
                                  ["partial_transport.py", "--n", "30", "--out", "partial.png"],
                                  ["crowd_motion.py", "--n", "60", "--steps", "3", "--out", "crowd.png"]],
                         ids=["quickstart", "quantization", "laguerre-picture", "power-diagram-3d", "centroidal",
                              "smooth-densities", "partial-transport", "crowd-motion"])
def test_examples_run(args, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SDOT_")}
    env.update(MPLBACKEND="Agg", PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / args[0]), *args[1:]],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    if args[0] == "laguerre_picture.py":
        assert (tmp_path / "laguerre.png").stat().st_size > 10_000
    if args[0] == "power_diagram_3d.py":
        assert (tmp_path / "laguerre3d.png").stat().st_size > 10_000
    if args[0] == "partial_transport.py":
        assert (tmp_path / "partial.png").stat().st_size > 10_000
        assert "transported mass 0.99999999" in proc.stdout or "transported mass 1.0000000" in proc.stdout
    if args[0] == "crowd_motion.py":
        assert (tmp_path / "crowd.png").stat().st_size > 10_000
        assert "step 3: 60 people in the room, mass moved 0.500000" in proc.stdout
    if args[0] == "smooth_densities.py":
        assert (tmp_path / "densities.png").stat().st_size > 10_000
    if args[0] == "centroidal.py":
        line = proc.stdout.split("mean |y - b(y)|^2:")[1]
        start, final = float(line.split()[0]), float(line.split("derivative:")[1].split()[0])
        assert final < 0.01 * start                # the barycentre loss falls
    if args[0] == "quantization.py":
        assert (tmp_path / "quantization.png").stat().st_size > 10_000
        values = [float(line.split("=")[1].split()[0]) for line in proc.stdout.splitlines()
                  if line.startswith("iteration")]
        assert values == sorted(values, reverse=True) and len(values) == 3   # Lloyd decreases W
