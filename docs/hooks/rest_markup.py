"""A Griffe extension that lets mkdocstrings render hvdlite's docstrings.

The docstrings are written in reStructuredText's inline style (Sphinx roles such as
``:func:`allreduce``` and literal blocks introduced by ``::``), while mkdocstrings renders
Markdown. Double backquotes and indented blocks already read the same in both; this
turns the rest into Markdown: a role into an inline code span of its target (``~a.b``
shows ``b``), and the ``::`` that opens a literal block into ``:``.
"""
from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|meth|class|mod|data|attr|exc|obj|const):`([^`]+)`")
_LITERAL_OPENER = re.compile(r"(\S)::$", re.M)
_LONE_OPENER = re.compile(r"^(\s*)::$", re.M)


def _role(match: re.Match[str]) -> str:
    target = match.group(1).strip()
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"`{target}`"


def to_markdown(text: str) -> str:
    """``text`` with its reStructuredText roles and literal-block openers in Markdown."""
    text = _ROLE.sub(_role, text)
    text = _LONE_OPENER.sub("", text)
    return _LITERAL_OPENER.sub(r"\1:", text)


class RestMarkup(griffe.Extension):
    """Rewrites each docstring as it is loaded (see the module's docstring)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = to_markdown(obj.docstring.value)
