"""The documentation holds together: every relative link of README.md, CHANGELOG.md and docs/*.md
resolves (a file that exists; an `#anchor` names a heading of its page as GitHub renders it), every
page of docs/ is reachable from docs/index.md by links and is in the site's navigation, and
`mkdocs build --strict` (broken links and anchors as errors) builds the site, offline."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md"))
SOURCES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *PAGES]

_spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "scripts" / "mkdocs_hooks.py")
assert _spec and _spec.loader
hooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hooks)

LINK = re.compile(r"(?<!!)\[(?:[^\[\]\n]|\[[^\]\n]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def prose(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans blanked (links in code are not links)."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        out.append("" if fenced else re.sub(r"`[^`\n]*`", "``", line))
    return out


def links(path: Path) -> list[str]:
    return [m.group(1) for line in prose(path.read_text()) for m in LINK.finditer(line)]


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown file (a repeated one gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose(path.read_text()):
        m = HEADING.match(line)
        if not m:
            continue
        # inline markup as GitHub drops it: code ticks, emphasis, link targets
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(2))
        text = text.replace("`", "").replace("**", "").replace("*", "")
        slug = hooks.github_slug(text)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def is_external(target: str) -> bool:
    return bool(re.match(r"^[a-z][a-z0-9+.-]*:", target))


def resolve(source: Path, target: str) -> tuple[Path, str]:
    path, _, anchor = target.partition("#")
    return (source if not path else (source.parent / path).resolve()), anchor


def headings_text(path: Path) -> str:
    """A page's headings, code spans kept (`prose` blanks them)."""
    return "\n".join(line for line in path.read_text().splitlines() if HEADING.match(line))


def test_the_slug_is_githubs():
    assert hooks.github_slug("Memory consolidation (how it decides)") == "memory-consolidation-how-it-decides"
    assert hooks.github_slug("Local stack (memstream dev)") == "local-stack-memstream-dev"
    assert hooks.github_slug("5. Divergence — when") == "5-divergence--when"
    assert hooks.github_slug("A user's memory state: one table") == "a-users-memory-state-one-table"


def test_every_relative_link_and_anchor_resolves():
    checked = anchored = 0
    broken = []
    for source in SOURCES:
        assert source.is_file(), source
        for target in links(source):
            if is_external(target):
                continue
            path, anchor = resolve(source, target)
            checked += 1
            if not path.exists():
                broken.append(f"{source.relative_to(ROOT)}: {target} (no such file)")
                continue
            if anchor:
                anchored += 1
                if path.suffix != ".md" or anchor not in anchors(path):
                    broken.append(f"{source.relative_to(ROOT)}: {target} (no heading with that anchor)")
    assert not broken, "broken links:\n" + "\n".join(broken)
    # not vacuous: the pages link to each other and to headings
    assert checked >= 100 and anchored >= 20, (checked, anchored)


def test_every_docs_page_is_reachable_from_the_index():
    assert len(PAGES) >= 14 and DOCS / "index.md" in PAGES
    reached, todo = set(), [DOCS / "index.md"]
    while todo:
        page = todo.pop()
        if page in reached:
            continue
        reached.add(page)
        for target in links(page):
            if not is_external(target):
                path, _ = resolve(page, target)
                if path.parent == DOCS and path.suffix == ".md" and path.exists():
                    todo.append(path)
    assert reached == set(PAGES), f"not reachable from docs/index.md: {sorted(p.name for p in set(PAGES) - reached)}"
    readme_targets = {resolve(ROOT / "README.md", t)[0] for t in links(ROOT / "README.md")}
    assert DOCS / "index.md" in readme_targets, "README.md must link to docs/index.md"


def nav_pages(nav) -> list[str]:
    out = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        out += nav_pages(value) if isinstance(value, list) else [value]
    return out


def test_the_site_navigation_lists_every_page_once():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    assert config["docs_dir"] == "docs"
    pages = nav_pages(config["nav"])
    assert len(pages) == len(set(pages))
    assert set(pages) == {p.name for p in PAGES}
    assert config["validation"]["omitted_files"] == "warn" and config["validation"]["anchors"] == "warn"


def test_no_issue_numbers_in_the_hand_written_docs():
    """Readers cannot resolve "#12" or "stop 22": the docs name the thing instead. Generated
    sections are made from the code's own text and are left to it."""
    pattern = re.compile(r"(?<![\w&])#\d+\b|\b[Ii]ssues? #?\d+|\b[Ss]tops? \d+\b")
    found = []
    for source in [ROOT / "README.md", *PAGES]:
        text = re.sub(r"<!-- ([\w-]+):begin -->.*?<!-- \1:end -->", "", source.read_text(), flags=re.S)
        found += [f"{source.relative_to(ROOT)}: {m.group(0)}" for m in pattern.finditer(text)]
    assert not found, found


def test_links_out_of_docs_become_repository_paths_on_the_site():
    md = "see [results](../bench/RESULTS.md) and [the API](http-api.md#routes)\n```\n[x](../y)\n```\n"
    out = hooks.rewrite(md, "index.md")
    assert "results (`bench/RESULTS.md` in the repository)" in out
    assert "[the API](http-api.md#routes)" in out and "[x](../y)" in out


@pytest.mark.slow
def test_mkdocs_builds_the_site_strictly(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    built = {p.stem for p in site.glob("*.html")}
    assert {p.stem for p in PAGES} <= built, {p.stem for p in PAGES} - built
    assert "WARNING" not in done.stderr, done.stderr
