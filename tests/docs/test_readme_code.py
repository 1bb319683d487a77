"""A code block in a README or a guide under docs/ that is preceded by
`<!-- code: PATH [NAME] -->` must be, word for word, the file PATH (relative to the repository
root), or with NAME the lines between `README NAME begin` and `README NAME end` comments in it
(common indentation removed). So the examples a user copies are the ones the tests compile and
run, and they cannot drift apart."""
import pathlib
import re
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The fence may be indented (a block inside a list item): its indentation is removed.
MARK = re.compile(r"<!-- code: (\S+)(?: (\S+))? -->\n+( *)```\w*\n(.*?)^\3```", re.S | re.M)


def readmes():
    """Every README.md, and the user guides under docs/."""
    found = set(ROOT.rglob("README.md")) | set((ROOT / "docs").rglob("*.md"))
    return sorted(p for p in found
                  if not any(part.startswith(".") or part.startswith("build") for part in
                             p.relative_to(ROOT).parts))


def marked_blocks():
    for readme in readmes():
        for m in MARK.finditer(readme.read_text()):
            indent = len(m.group(3))
            block = "".join(line[indent:] if line.strip() else line.lstrip(" ")
                            for line in m.group(4).splitlines(keepends=True))
            yield pytest.param(readme, m.group(1), m.group(2), block,
                               id=f"{readme.relative_to(ROOT)}:{m.group(1)}:{m.group(2) or ''}")


def region(path, name):
    text = (ROOT / path).read_text()
    if name is None:
        return text
    m = re.search(rf"^[^\n]*README {re.escape(name)} begin[^\n]*\n(.*?)^[^\n]*README "
                  rf"{re.escape(name)} end", text, re.S | re.M)
    assert m, f"{path} has no 'README {name} begin/end' region"
    return textwrap.dedent(m.group(1))


def test_the_readmes_mark_their_tested_examples():
    found = list(marked_blocks())
    assert len(found) >= 3, "the SDK README's tested examples lost their markers"


@pytest.mark.parametrize("readme,path,name,block", marked_blocks())
def test_readme_block_is_the_tested_code(readme, path, name, block):
    assert block == region(path, name), (
        f"{readme.relative_to(ROOT)}: the block marked {path} {name or ''} differs from the code "
        "the tests run; copy it from there")
