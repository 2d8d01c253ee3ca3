"""The documentation site (mkdocs.yml, docs/) builds with ``mkdocs build --strict``.

The API reference (docs/api.md) is generated from the docstrings by mkdocstrings: the
build fails if a ``::: sdot.NAME`` directive does not resolve, and every name of
``sdot.__all__`` must appear on the built page. Links to repository files outside docs/
(``../examples/quantization.py``) are only reported at INFO level by mkdocs (mkdocs.yml, ``validation``);
this test checks that their targets exist in the repository.
"""
import ast
import importlib.util
import os
import posixpath
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest



ROOT = Path(__file__).resolve().parents[1]
INSTALL = ('install the `docs` extra: pip install -e ".[docs]" '
           '(that is: pip install mkdocs mkdocs-material "mkdocstrings[python]")')
NOT_FOUND = re.compile(r"Doc file '(?P<page>[^']+)' contains a link '(?P<url>[^']+)', "
                       r"but the target.* is not found among documentation files")


def public_names():
    """``sdot.__all__``, read from sdot/__init__.py without importing sdot."""
    tree = ast.parse((ROOT / "sdot" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__"
                                                for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("sdot/__init__.py defines no __all__")


def installed(module):
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:                     # the parent package is missing
        return False


def test_docs_site_builds_strict(tmp_path):
    missing = [m for m in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")
               if not installed(m)]
    if missing:
        pytest.fail(f"the documentation tools are not installed ({', '.join(missing)}): {INSTALL}")

    site = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                           "--site-dir", str(site)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{output[-5000:]}"

    api = (site / "api" / "index.html").read_text()
    absent = [name for name in public_names() if name not in api]
    assert not absent, f"names of sdot.__all__ missing from the API reference: {absent}"

    # links that leave the site (INFO, not a failure, for mkdocs) must reach a repository file
    broken = []
    for m in NOT_FOUND.finditer(output):
        target = m["url"].split("#")[0].split("?")[0]
        path = posixpath.normpath(posixpath.join("docs", posixpath.dirname(m["page"]), target))
        if path.startswith("..") or not (ROOT / path).exists():
            broken.append(f"{m['page']}: {m['url']}")
    assert not broken, f"links to files that do not exist: {broken}"

    # the gallery: a page per example with its picture and its code, a thumbnail linking to it
    gallery = (site / "gallery" / "index.html").read_text()
    build = runpy.run_path(str(ROOT / "examples" / "gallery" / "build.py"))
    for slug, script, picture in build["GALLERY"]:
        page = (site / "gallery" / slug / "index.html").read_text()
        assert f'src="../{posixpath.relpath(picture, "gallery")}"' in page and "def main(" in page, slug
        assert f'href="{slug}/"' in gallery and (ROOT / "docs" / picture).exists(), slug
