"""mkdocs hook: the docstrings' Sphinx roles (``:class:`X```, ``:func:`~a.b```) shown as code."""
import re

_ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj):<code>~?([^<]*)</code>")


def on_page_content(html, **kwargs):
    return _ROLE.sub(lambda m: f"<code>{m.group(1)}</code>", html)
