"""Generated docs stay in step with the code."""

import re
from pathlib import Path

from reinforce_pro.cli.flags_doc import render

ROOT = Path(__file__).resolve().parents[1]


def test_flags_doc_is_generated_from_the_parser():
    assert (ROOT / "docs" / "flags.md").read_text() == render(), (
        "docs/flags.md is stale: run `python -m reinforce_pro.cli.flags_doc > docs/flags.md`"
    )


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # a '#' comment in a code block is no heading
    return {slug(m) for m in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def test_every_link_in_the_docs_resolves_inside_the_repository():
    """Each relative link of the README, CONTRIBUTING.md, docs/, benchmarks/README.md and studies/README.md names
    a file of the repository, and its #anchor a heading of that file: the docs need nothing outside it."""
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "benchmarks" / "README.md"]
    pages += [ROOT / "studies" / "README.md"]
    pages += sorted((ROOT / "docs").rglob("*.md"))
    broken = []
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://|mailto:", target):
                continue
            file, _, anchor = target.partition("#")
            resolved = (page.parent / file).resolve() if file else page
            if not resolved.exists() or (anchor and resolved.suffix == ".md" and anchor not in anchors(resolved)):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []
