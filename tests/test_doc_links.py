"""Every relative link of README.md and docs/ leads somewhere: the file exists, and an
#anchor names a heading of the page it points into (as GitHub makes its anchor) or an
explicit `<a id="...">` there, so that moving a section cannot leave a dead link behind.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from urllib.parse import unquote

import pytest

from tests.conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
# [text](target) and ![alt](target), the text possibly holding one level of brackets.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)
EXPLICIT = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # http:, https:, mailto:


def prose(text: str) -> str:
    """The page without its fenced blocks and code spans, where nothing is a link."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def github_slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text (links and tags reduced to their text),
    lower-cased, with everything but letters, digits, `_`, `-` and spaces dropped and
    each space a `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor a link into `page` may name: heading anchors (a repeated one gets
    -1, -2, ... as on GitHub) and explicit ones."""
    text = page.read_text()
    found = set(EXPLICIT.findall(text))
    seen: Counter[str] = Counter()
    for heading in HEADING.findall(FENCE.sub("", text)):
        slug = github_slug(heading)
        found.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return found


def links(page: Path) -> list[str]:
    return LINK.findall(prose(page.read_text()))


def test_the_slugs_are_githubs():
    assert (
        github_slug("Slurm: the jobs run on the spot VMs") == "slurm-the-jobs-run-on-the-spot-vms"
    )
    assert github_slug("2.1 Driver: VMs") == "21-driver-vms"
    assert github_slug("What `spotbag slurm conf` emits, and why") == (
        "what-spotbag-slurm-conf-emits-and-why"
    )
    assert github_slug("Clouds: AWS — and GCE") == "clouds-aws--and-gce"


def test_links_are_found_outside_code_only(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "See [a](a.md#x) and ![b](b.png), [`code`](c.md).\n"
        "Not `[d](d.md)`, nor\n```sh\n[e](e.md)\n# heading in a block\n```\n"
        '## A heading\n<a id="explicit"></a>\n## A heading\n'
    )
    assert links(page) == ["a.md#x", "b.png", "c.md"]
    assert anchors(page) == {"a-heading", "a-heading-1", "explicit"}


def test_the_pages_have_links_to_check():
    readme = links(REPO / "README.md")
    assert sum(target.startswith("docs/") for target in readme) >= 10
    assert sum("#" in target for page in PAGES for target in links(page)) >= 30


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    dead = []
    for target in links(page):
        if EXTERNAL.match(target):
            continue
        path_part, _, anchor = target.partition("#")
        path = (page.parent / unquote(path_part)).resolve() if path_part else page
        if not path.exists():
            dead.append(f"{target}: no {path_part}")
        elif anchor and path.suffix == ".md" and unquote(anchor) not in anchors(path):
            dead.append(f"{target}: no anchor #{anchor} in {path.relative_to(REPO)}")
        elif anchor and path.suffix != ".md":
            dead.append(f"{target}: an anchor into a file that is not a page")
    assert not dead, f"{page.relative_to(REPO)}: dead links: {dead}"
