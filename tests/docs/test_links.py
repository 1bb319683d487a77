"""Every relative link in the documentation (each README.md and docs/**/*.md) leads somewhere:
`[text](path)` to a file or folder of the repository, `[text](path#anchor)` and `[text](#anchor)`
to a heading of that Markdown file (GitHub's anchor for it). Everything the project needs to be
understood is in the repository, so a link to a web page fails too, unless ALLOWED lists it with
its reason. Links inside code (fenced blocks, `inline code`) are text, not links: not checked."""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Web addresses a document may link to, each with why it cannot live in the repository. None
# so far: a fact a page out there holds is written down here instead.
ALLOWED = {}

FENCE = re.compile(r"^ *(```|~~~).*?^ *\1[^\n]*$", re.S | re.M)
INLINE_CODE = re.compile(r"(`+).+?\1", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}#{1,6} +(.*?)(?: +#+)? *$", re.M)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
BARE_ADDRESS = re.compile(r"(?:https?://|mailto:|www\.)[^\s)>\]]+")  # GitHub links these too


def documents():
    found = set(ROOT.rglob("README.md")) | set((ROOT / "docs").rglob("*.md"))
    return sorted(p for p in found
                  if not any(part.startswith(".") or part.startswith("build") for part in
                             p.relative_to(ROOT).parts))


def prose(text):
    """The text with code blocks and inline code blanked out (line numbers kept)."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return INLINE_CODE.sub(lambda m: " " * len(m.group(0)) if "\n" not in m.group(0)
                           else "\n" * m.group(0).count("\n"), text)


def slug(heading):
    """GitHub's anchor of a heading: its text lowercased, markup and punctuation other than
    '-' and '_' dropped, each space a '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    seen = {}
    result = set()
    for m in HEADING.finditer(FENCE.sub(lambda f: "\n" * f.group(0).count("\n"),
                                        path.read_text())):
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        result.add(base if n == 0 else f"{base}-{n}")
    return result


def links():
    for doc in documents():
        text = prose(doc.read_text())
        for m in LINK.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            yield pytest.param(doc, m.group(1), id=f"{doc.relative_to(ROOT)}:{line}:{m.group(1)}")


def test_the_documents_have_links():
    assert len(list(links())) >= 20, "the link pattern no longer finds the documents' links"


def test_slug_is_githubs():
    assert slug("Store: `scripts/bench store --rounds 3`") == "store-scriptsbench-store---rounds-3"
    assert slug("Hangs, health and events") == "hangs-health-and-events"
    assert slug("Several nodes, elastic (c10d)") == "several-nodes-elastic-c10d"


@pytest.mark.parametrize("doc,target", links())
def test_link_leads_somewhere(doc, target):
    where = f"{doc.relative_to(ROOT)}: link {target}"
    if SCHEME.match(target):
        assert target in ALLOWED, (
            f"{where} points outside the repository; write what it says here instead (or add "
            "it to ALLOWED in tests/docs/test_links.py with the reason)")
        return
    path_part, _, anchor = target.partition("#")
    dest = (doc.parent / path_part).resolve() if path_part else doc
    assert dest.exists(), f"{where}: no such file"
    assert dest == ROOT or ROOT in dest.parents, f"{where}: outside the repository"
    if anchor:
        assert dest.is_file() and dest.suffix == ".md", f"{where}: an anchor into a non-Markdown file"
        assert anchor in anchors(dest), (
            f"{where}: {dest.relative_to(ROOT)} has no heading with the anchor #{anchor}")


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_bare_web_address(doc):
    text = LINK.sub("", prose(doc.read_text()))
    outside = [m.group(0) for m in BARE_ADDRESS.finditer(text) if m.group(0) not in ALLOWED]
    assert not outside, (f"{doc.relative_to(ROOT)} points outside the repository: {outside}; write "
                         "what it says here instead (or add it to ALLOWED with the reason)")
