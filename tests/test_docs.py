"""The README and docs/: every relative link (and its #anchor, by GitHub's heading slugs) resolves, and the README
stays a front page (at most 250 lines)."""
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 250
PAGES = ("guide", "algorithms", "scaling", "reliability", "architecture", "results", "config", "verifier")

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_LINK = re.compile(r"<(?:a|img)\s[^>]*?(?:href|src)=\"([^\"]+)\"", re.I)
CODE_SPAN = re.compile(r"(`+)(?:.+?)\1")


def doc_files() -> list:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def prose_lines(text: str):
    """(line number, line) outside fenced code blocks."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield n, line


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # links and images keep their text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set:
    seen: dict = {}
    out = set()
    for _, line in prose_lines(path.read_text()):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        k = seen.get(base, 0)
        out.add(base if k == 0 else f"{base}-{k}")
        seen[base] = k + 1
    return out


def links(path: Path):
    """(line number, target) of every Markdown or HTML link and image outside code."""
    for n, line in prose_lines(path.read_text()):
        line = CODE_SPAN.sub("", line)
        for m in LINK.finditer(line):
            yield n, m.group(1)
        for m in HTML_LINK.finditer(line):
            yield n, m.group(1)


def broken_links(files, root: Path = ROOT) -> list:
    """One message per link that does not resolve inside ``root``."""
    bad = []
    cache: dict = {}
    for f in files:
        for n, target in links(f):
            where = f"{f.relative_to(root)}:{n}: {target}"
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):   # http:, https:, mailto:
                continue
            if target.startswith("/") or target.startswith("\\"):
                bad.append(f"{where} (absolute path: links are relative)")
                continue
            path, _, anchor = target.partition("#")
            dest = (f.parent / path).resolve() if path else f.resolve()
            if root.resolve() not in (dest, *dest.parents):
                bad.append(f"{where} (points outside the repository)")
                continue
            if not dest.exists():
                bad.append(f"{where} (no such file)")
                continue
            if anchor:
                if dest.suffix != ".md":
                    bad.append(f"{where} (an anchor into a file that is not Markdown)")
                    continue
                if dest not in cache:
                    cache[dest] = anchors(dest)
                if anchor not in cache[dest]:
                    bad.append(f"{where} (no heading with anchor #{anchor} in {dest.name})")
    return bad


def test_every_relative_link_and_anchor_resolves():
    assert broken_links(doc_files()) == []


def test_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"


def test_readme_links_every_docs_page():
    targets = {t.split("#", 1)[0] for _, t in links(ROOT / "README.md")}
    for page in PAGES:
        assert (ROOT / "docs" / f"{page}.md").is_file(), page
        assert f"docs/{page}.md" in targets, f"README.md does not link docs/{page}.md"


def test_the_checker_finds_broken_links(tmp_path):
    """The check fails on a missing file, a missing anchor, an absolute path and a link out of the tree; it accepts
    GitHub's slugs, duplicate headings' -1 suffixes, links in code and external URLs."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        "# A page\n## GRAFT: compatibility gate\n## Dr. GRPO\n## `algo.delta` and *s*\n## Notes\n## Notes\n"
        "```\n[in a fence](nowhere.md)\n```\n")
    (tmp_path / "img.png").write_bytes(b"")
    good = ("[x](docs/a.md#graft-compatibility-gate) [y](docs/a.md#dr-grpo) [z](docs/a.md#algodelta-and-s) "
            "[n](docs/a.md#notes-1) ![i](img.png) [w](https://example.com/x#y) `[c](nowhere.md)` [s](#top)\n# Top\n")
    (tmp_path / "README.md").write_text(good)
    files = [tmp_path / "README.md", tmp_path / "docs" / "a.md"]
    assert broken_links(files, tmp_path) == []

    (tmp_path / "README.md").write_text(good + "[a](docs/b.md) [b](docs/a.md#nope) [c](/etc/passwd) "
                                               "[d](../outside.md) [e](img.png#x)\n")
    bad = broken_links(files, tmp_path)
    assert len(bad) == 5, bad
    for text in ("no such file", "no heading with anchor #nope", "absolute path", "outside the repository",
                 "not Markdown"):
        assert any(text in b for b in bad), (text, bad)


@pytest.mark.parametrize("heading, expected", [
    ("GRAFT", "graft"), ("GRAFT: compatibility gate", "graft-compatibility-gate"), ("Dr. GRPO", "dr-grpo"),
    ("OM-GRPO: answer mask", "om-grpo-answer-mask"), ("Your model, your data, your results",
                                                       "your-model-your-data-your-results"),
    ("`make demo`: GRAFT vs GRPO, 2 seeds each", "make-demo-graft-vs-grpo-2-seeds-each"),
    ("Export a trained model (Hugging Face folder)", "export-a-trained-model-hugging-face-folder"),
])
def test_slug_follows_github(heading, expected):
    assert slug(heading) == expected


# references to files outside the repository (a sibling folder, notes, spec or design files that do not ship) and
# machine paths: the docs, configs, code and tests cite the docs/ page that covers a point instead
OUTSIDE = re.compile(r"\.\./shared|(?<![\w-])notes/[\w.-]+|spec/algos_|\bDESIGN\.md|(?<![\w.~])/work/")
TEXT = {".py", ".md", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".txt", ".sh", ".json"}
SKIP = {".git", ".venv", "runs", "build", "dist", "__pycache__", ".pytest_cache", ".import_linter_cache", "data"}


def outside_references(root: Path) -> list:
    """``path:line: text`` for each reference of ``OUTSIDE`` in the text files under ``root`` (this file aside)."""
    bad = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP and not d.endswith(".egg-info"))
        for name in sorted(files):
            path = Path(folder) / name
            if (path.suffix not in TEXT and name not in ("Makefile", ".importlinter")) or \
                    path == Path(__file__).resolve():
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if OUTSIDE.search(line):
                    bad.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    return bad


def test_no_reference_to_a_file_outside_the_repository():
    assert outside_references(ROOT) == []


def test_the_outside_reference_check_finds_them(tmp_path):
    (tmp_path / "configs").mkdir()
    ref = "/".join(["notes", "miniature-feasibility.md"])
    (tmp_path / "configs" / "a.yaml").write_text(f"# see {ref}\nname: a\n")
    (tmp_path / "README.md").write_text("see [x](" + "../" + "shared/x.md), " + "DESIGN" + ".md, spec/" + "algos_x.md\n"
                                        "runs in " + "/work" + "/main\n")
    (tmp_path / "ok.md").write_text("release-notes/x, my_notes/x, runs/work/x, docs/algorithms.md\n")
    bad = outside_references(tmp_path)
    assert [b.split(":")[0] for b in bad] == ["README.md", "README.md", "configs/a.yaml"], bad
