"""MkDocs hooks for the documentation site (mkdocs.yml ``hooks:``): pages that show a file of the repository root.

A page line ``--8<-- "NAME"`` is replaced by the repository root's file ``NAME`` (docs/benchmarks.md shows
BENCHMARKS.md, docs/changelog.md CHANGELOG.md), whose links are written relative to the root, not to docs/. They
keep working on the site:

* a link into docs/ becomes the link between pages (``docs/FORMAT.md`` -> ``FORMAT.md``);
* a link to another file of the repository that is not Markdown (a plot, a result file, a script) is copied into
  the site at the same path, where the link finds it as written;
* a link to Markdown elsewhere in the repository, or to a folder, goes to the repository's page of it
  (``repo_url``).

A link to nothing stays as written, and the strict build fails on it as on any broken link; so does a missing file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

_INCLUDE = re.compile(r'^--8<-- "(?P<name>[^"/]+)"$', re.MULTILINE)
#: An inline link or image's target, ``](target)`` or ``](target "title")``, and a reference definition's.
_TARGET = re.compile(r"(?P<before>\]\(|^\[[^\]]+\]:[ \t]*)(?P<target>[^)\s#]+)(?P<fragment>#[^)\s]*)?", re.MULTILINE)
_EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def _root(config: MkDocsConfig) -> Path:
    return Path(config.config_file_path).resolve().parent


def _included(root: Path, name: str) -> str:
    path = root / name
    if not path.is_file():
        raise PluginError(f"a page includes {name}, which is not a file of the repository root ({root})")
    return path.read_text()


def _targets(markdown: str) -> list[str]:
    return [m["target"] for m in _TARGET.finditer(markdown) if not _EXTERNAL.match(m["target"])]


def _copied(root: Path, docs: Path, path: Path) -> bool:
    """Whether a link of a root file to ``path`` (resolved) is served by copying that file into the site."""
    return path.is_file() and path.suffix != ".md" and not path.is_relative_to(docs) and path.is_relative_to(root)


def on_files(files: Files, config: MkDocsConfig, **kwargs: Any) -> Files:
    """Add to the site the repository files that the included root files link to (see the module docstring)."""
    root, docs = _root(config), Path(config.docs_dir).resolve()
    for page in files.documentation_pages():
        for include in _INCLUDE.finditer(Path(page.abs_src_path or "").read_text()):
            for target in _targets(_included(root, include["name"])):
                path = (root / target).resolve()
                if _copied(root, docs, path) and files.get_file_from_path(path.relative_to(root).as_posix()) is None:
                    files.append(
                        File(path.relative_to(root).as_posix(), str(root), config.site_dir, config.use_directory_urls)
                    )
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, **kwargs: Any) -> str:
    """Replace the page's include lines by the root files, their links made to work from the page."""
    root, docs = _root(config), Path(config.docs_dir).resolve()
    depth = page.file.src_uri.count("/")  # the included links are relative to the root: the page's folder is not

    def linked(match: re.Match[str]) -> str:
        target, fragment = match["target"], match["fragment"] or ""
        path = (root / target).resolve()
        if _EXTERNAL.match(target) or not path.exists() or not path.is_relative_to(root):
            return match[0]
        if path.is_relative_to(docs) or _copied(root, docs, path):
            where = path.relative_to(docs) if path.is_relative_to(docs) else path.relative_to(root)
            return match["before"] + "../" * depth + where.as_posix() + fragment
        kind = "tree" if path.is_dir() else "blob"
        url = f"{config.repo_url.rstrip('/')}/{kind}/main/{path.relative_to(root).as_posix()}"
        return match["before"] + url + fragment

    def include(match: re.Match[str]) -> str:
        return _TARGET.sub(linked, _included(root, match["name"]))

    return _INCLUDE.sub(include, markdown)
