"""MkDocs hooks for the documentation site (mkdocs.yml `hooks:`), kept small.

- Headings get GitHub's anchors (`github_slug`), so a `page.md#anchor` link written for GitHub
  also resolves on the site, and `mkdocs build --strict` checks it there.
- A link from a page of docs/ to a file outside it (`../bench/RESULTS.md`, `../README.md`,
  `../streams/...`) resolves on GitHub but is not part of the site: on the site it is shown as the
  file's path in the repository instead of a link to nowhere. tests/test_docs_site.py checks that
  every such file exists.
"""

from __future__ import annotations

import posixpath
import re
import unicodedata

LINK = re.compile(r"(?<!!)\[([^\]\n]+)\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def github_slug(text: str, separator: str = "-") -> str:
    """The anchor GitHub gives a heading: inline markup gone, lower case, every character that is
    not a letter, digit, space, `-` or `_` dropped, each space a `-` (runs are not collapsed)."""
    text = re.sub(r"<[^>]+>", "", text)
    text = unicodedata.normalize("NFC", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", separator)


def on_config(config):
    config.mdx_configs.setdefault("toc", {})["slugify"] = github_slug
    return config


def outside_docs(page_src: str, target: str) -> str | None:
    """The repository path of `target` when a link from `page_src` (relative to docs/) leaves docs/."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
        return None
    path = target.split("#", 1)[0]
    joined = posixpath.normpath(posixpath.join("docs", posixpath.dirname(page_src), path))
    return None if joined == "docs" or joined.startswith("docs/") else joined


def rewrite(markdown: str, page_src: str) -> str:
    out, fenced = [], False
    for line in markdown.splitlines(keepends=True):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
        if not fenced and "](" in line:
            def repl(m: re.Match) -> str:
                repo_path = outside_docs(page_src, m.group(2))
                if repo_path is None:
                    return m.group(0)
                text = m.group(1)
                shown = f"`{repo_path}`"
                return shown if text.strip("`") == repo_path else f"{text} ({shown} in the repository)"
            line = LINK.sub(repl, line)
        out.append(line)
    return "".join(out)


def on_page_markdown(markdown, page, config, files):
    return rewrite(markdown, page.file.src_uri)
