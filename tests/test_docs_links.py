"""Every relative link in README.md, results/README.md and docs/*.md points at a file that exists, and every
``#anchor`` at a heading of its target (GitHub's slugs), so moving a page or renaming a heading cannot leave a
dangling link. Links inside code (fenced blocks, inline code) are not links; web addresses are not checked."""

import re
import sys
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")


def _pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "results" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _prose_lines(text: str):
    """(line number, line) outside fenced code blocks, with inline code spans blanked."""
    fenced = False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield n, re.sub(r"(`+)(?:(?!\1).)+?\1", lambda m: " " * len(m.group(0)), line)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text (link targets, code ticks and emphasis marks dropped),
    lower-cased, punctuation other than '-' and '_' removed, each space a '-'."""
    text = re.sub(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1", heading)  # [text](url) -> text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor the page's headings make; a repeated slug gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            base = slug(m.group(2))
            k = seen.get(base, 0)
            seen[base] = k + 1
            out.add(base if k == 0 else f"{base}-{k}")
    return out


def broken_links(page: Path) -> list[str]:
    """'page:line: target (why)' for every relative link of ``page`` that does not resolve."""
    out = []
    cache: dict[Path, set[str]] = {}
    for n, line in _prose_lines(page.read_text(encoding="utf-8")):
        for m in LINK.finditer(line):
            target = m.group(1)
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # http:, https:, mailto:, ...
                continue
            path_part, _, anchor = target.partition("#")
            dest = (page.parent / unquote(path_part)).resolve() if path_part else page
            where = f"{page.relative_to(ROOT)}:{n}: {target}"
            if not dest.exists():
                out.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md":
                if dest not in cache:
                    cache[dest] = anchors(dest)
                if unquote(anchor).lower() not in cache[dest]:
                    out.append(f"{where} (no heading with this anchor in {dest.relative_to(ROOT)})")
    return out


def test_slugs_follow_github():
    assert slug("Speed: the TRL comparison (the README's former section)") == \
        "speed-the-trl-comparison-the-readmes-former-section"
    assert slug("Inside objbench.experiments") == "inside-objbenchexperiments"
    assert slug("A study ([smollm2_arithmetic/](smollm2_arithmetic/report.md))") == "a-study-smollm2_arithmetic"
    assert slug("`objbench card` and 1/|y|") == "objbench-card-and-1y"


def test_a_broken_link_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "b.md").write_text("# Here\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#here) [ok](b.md#twice-1) ![x](b.md) [web](https://example.org/x)\n"
                    "`[in code](nowhere.md)`\n```\n[in a block](nowhere.md)\n# not a heading\n```\n"
                    "[gone](missing.md) [bad anchor](b.md#there) [self](#nothing)\n")
    found = broken_links(page)
    assert [f.split(": ", 1)[1] for f in found] == [
        "missing.md (no such file)",
        "b.md#there (no heading with this anchor in b.md)",
        "#nothing (no heading with this anchor in a.md)",
    ]


def test_every_relative_link_resolves():
    pages = _pages()
    assert all(p.exists() for p in pages)
    broken = [b for p in pages for b in broken_links(p)]
    assert not broken, "broken links:\n" + "\n".join(broken)
