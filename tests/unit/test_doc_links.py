"""Every relative link and image in the README and docs/ points at a file in the repository, so the
study's figures and archives cannot go missing from the pages that cite them."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "ablations").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def targets(text: str) -> list[str]:
    """Relative link and image targets in Markdown ``text``: no URLs, no in-page anchors, nothing in
    code blocks (they hold commands, not links)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


def test_link_pattern_finds_links_and_images():
    page = ("see [a](docs/x.md) and ![fig](figures/y.png), not [web](https://e.org) or [here](#anchor)\n"
            "```bash\nls [x](not/a/link.md)\n```")
    assert targets(page) == ["docs/x.md", "figures/y.png"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    missing = [t for t in targets(page.read_text()) if not (page.parent / t.split("#")[0]).exists()]
    assert not missing, f"{page.relative_to(ROOT)} links to files that do not exist: {missing}"
