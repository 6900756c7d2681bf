"""Generated docs stay in step with the code."""

from pathlib import Path

from reinforce_pro.cli.flags_doc import render

ROOT = Path(__file__).resolve().parents[1]


def test_flags_doc_is_generated_from_the_parser():
    assert (ROOT / "docs" / "flags.md").read_text() == render(), (
        "docs/flags.md is stale: run `python -m reinforce_pro.cli.flags_doc > docs/flags.md`"
    )
