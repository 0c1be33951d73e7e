"""A griffe extension for the documentation site (mkdocs.yml): the package's docstrings cross-reference in Sphinx's
roles (``:class:`~.backend.StorageBackend```), which Markdown would show as written. Each role becomes a link to the
object's entry in the API reference, titled as Sphinx titles it (``~``: the last name only), or the plain name where
the reference does not document that object: an optional autorefs reference, which never fails the strict build.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|func|meth|attr|data|mod|exc|obj):`(?P<short>~)?(?P<target>[\w.]+)`")


def _identifier(obj: griffe.Object, target: str) -> str:
    """The full path ``target`` names, as Python would see it from ``obj``'s docstring (``target`` itself if it
    names nothing there)."""
    if target.startswith("."):  # relative to the module the docstring is in
        package = obj.module.path if obj.module.is_package else obj.module.path.rsplit(".", 1)[0]
        return package + target
    head, _, rest = target.partition(".")
    try:
        found = obj.resolve(head)
    except griffe.NameResolutionError:
        return target
    return f"{found}.{rest}" if rest else found


def _linked(obj: griffe.Object, docstring: str) -> str:
    def link(match: re.Match[str]) -> str:
        target = match["target"]
        title = target.rsplit(".", 1)[-1] if match["short"] else target.lstrip(".")
        identifier = html.escape(_identifier(obj, target), quote=True)
        return f'<autoref identifier="{identifier}" optional><code>{html.escape(title)}</code></autoref>'

    return _ROLE.sub(link, docstring)


class SphinxRoles(griffe.Extension):
    """Turns the Sphinx roles of every docstring in a package into optional cross-references."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self._visit(pkg)

    def _visit(self, obj: griffe.Object) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _linked(obj, obj.docstring.value)
        for member in obj.members.values():
            if not member.is_alias and member.parent is obj:
                self._visit(member)  # type: ignore[arg-type]
