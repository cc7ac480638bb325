"""mkdocs hook: links from docs/ to repository files outside it (`../reports/x/README.md`,
`../spaces/quickstart.toml`) work on the repository host as they are; on the site, each such
file is copied in under `_repo/` and the link pointed at the copy, so `mkdocs build --strict`
checks them like any other link."""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File

LINK = re.compile(r"(\]\(|<img src=\")(?!https?:|mailto:|#)([^)\"\s#]+)(#[^)\"\s]*)?")


class _RepoFile(File):
    """A repository file served as it is (a Markdown file too: not rendered as a page)."""

    def is_documentation_page(self) -> bool:
        return False


def _outside(docs: Path, page_dir: Path, target: str) -> str | None:
    """The repository-relative path of a link that leaves docs/, else None."""
    path = (page_dir / target).resolve()
    root = docs.parent.resolve()
    if path.is_relative_to(docs.resolve()) or not path.is_relative_to(root):
        return None
    return path.relative_to(root).as_posix()


def on_files(files, config):
    docs = Path(config["docs_dir"])
    wanted = set()
    for md in docs.rglob("*.md"):
        for m in LINK.finditer(md.read_text()):
            rel = _outside(docs, md.parent, m[2])
            if rel and (docs.parent / rel).is_file():
                wanted.add(rel)
    for rel in sorted(wanted):
        f = _RepoFile(f"_repo/{rel}", str(docs), config["site_dir"], config["use_directory_urls"])
        f.abs_src_path = str((docs.parent / rel).resolve())
        files.append(f)
    return files


def on_page_markdown(markdown, page, config, files):
    docs = Path(config["docs_dir"])
    src = Path(page.file.src_uri)

    def fix(m):
        rel = _outside(docs, docs / src.parent, m[2])
        if rel is None:
            return m[0]
        new = posixpath.relpath(f"_repo/{rel}", src.parent.as_posix() or ".")
        return f"{m[1]}{new}{m[3] or ''}"

    return LINK.sub(fix, markdown)
