"""mkdocs hooks: the docstrings' Sphinx roles (``:class:`X```, ``:func:`~a.b```) shown as code;
the gallery (``examples/gallery/build.py``'s table): a page per example with its text, picture
and code, the thumbnails on gallery.md, and a full-size run of an example whose picture is
missing (of every example with ``SDOT_GALLERY=rebuild``)."""
import functools
import importlib.util
import os
import re
from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel

_ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj):<code>~?([^<]*)</code>")
ROOT = Path(__file__).resolve().parent
THUMBNAILS = "<!-- gallery thumbnails -->"


@functools.cache
def _gallery():
    """examples/gallery/build.py, loaded once (its ``GALLERY`` table and ``run``)."""
    spec = importlib.util.spec_from_file_location("gallery_build", ROOT / "examples" / "gallery" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _docstring(script):
    """The script's module docstring: (title, body in Markdown)."""
    import ast

    text = ast.get_docstring(ast.parse(script.read_text()))
    title, _, body = text.partition("\n")
    return title.rstrip("."), re.sub(r"``([^`]+)``", r"`\1`", body.strip())


def on_pre_build(config, **kwargs):
    gallery = _gallery()
    rebuild = os.environ.get("SDOT_GALLERY") == "rebuild"
    for slug, _, picture in gallery.GALLERY:
        if rebuild or not (ROOT / "docs" / picture).exists():
            gallery.run(slug)


def on_files(files, config, **kwargs):
    for slug, script, picture in _gallery().GALLERY:
        title, body = _docstring(ROOT / "examples" / script)
        code = (ROOT / "examples" / script).read_text()
        page = (f"# {title}\n\n[Gallery](../gallery.md) · `python examples/{script}` "
                f"([source](../../examples/{script}))\n\n![{title}](../{picture})\n\n{body}\n\n"
                f"## The script\n\n```python\n{code}```\n")
        files.append(File.generated(config, f"gallery/{slug}.md", content=page,
                                    inclusion=InclusionLevel.NOT_IN_NAV))   # linked from the thumbnails
    return files


def on_page_markdown(markdown, page, config, files, **kwargs):
    if THUMBNAILS not in markdown:
        return markdown
    cards = []
    for slug, script, picture in _gallery().GALLERY:
        title, _ = _docstring(ROOT / "examples" / script)
        cards.append(f"[![{title}]({picture}){{ width=\"300\" }}](gallery/{slug}.md \"{title}\")")
    return markdown.replace(THUMBNAILS, "\n".join(cards))


def on_page_content(html, **kwargs):
    return _ROLE.sub(lambda m: f"<code>{m.group(1)}</code>", html)
