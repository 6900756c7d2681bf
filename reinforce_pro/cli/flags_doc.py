"""Render docs/flags.md from the parser: `python -m reinforce_pro.cli.flags_doc > docs/flags.md`.

tests/test_docs.py fails when the committed page and the parser drift apart.
"""

from __future__ import annotations

import argparse

from reinforce_pro.cli.args import UNSUPPORTED, build_parser
from reinforce_pro.cli.flags_to_config import flag_sections
from reinforce_pro.cli.presets import PRESETS


def _default(action: argparse.Action) -> str:
    if isinstance(action, argparse._StoreTrueAction):
        return "off"
    if isinstance(action, argparse._StoreConstAction):
        return "-"
    value = action.default
    if isinstance(value, (list, tuple)):
        value = " ".join(str(v) for v in value)
    return f"`{value}`"


def render() -> str:
    parser = build_parser()
    readers = flag_sections()
    lines = [
        "# Flags of `python -m reinforce_pro.cli.train_ppo_ray`",
        "",
        "Generated from the parser by `python -m reinforce_pro.cli.flags_doc`; do not edit by hand.",
        "Each setting has OpenRLHF v0.9.10's flat name and, where OpenRLHF has one, the dotted name of v0.10.2",
        "onwards (v0.11); a script may mix the two, and giving one setting twice in two spellings with different",
        "values is an error. `[reinforce_pro]` marks flags this project adds. A flag marked *refused* is",
        "recognised, but giving it a non-default value stops with the reason shown; one marked *no effect* is",
        "accepted (OpenRLHF's scripts pass it) and its help says why it changes nothing. The *config* column names",
        "the sections of the typed run config (`RunConfig`, built in `reinforce_pro/cli/flags_to_config.py`) that",
        "read the flag.",
        "With no `--pretrain` and no `--prompt_data` the embedded default runs: its preset (below, from",
        "`reinforce_pro/cli/presets.py`) replaces the defaults of the flags it names; flags you give win.",
        "",
    ]
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.option_strings and a.dest != "help"]
        if not actions:
            continue
        lines += [f"## {group.title}", "", "| flat | dotted (v0.11) | default | config | meaning |"]
        lines.append("|---|---|---|---|---|")
        for a in actions:
            flat = ", ".join(f"`{o}`" for o in a.option_strings if "." not in o)
            dotted = ", ".join(f"`{o}`" for o in a.option_strings if "." in o)
            meaning = (a.help or "").replace("|", "\\|")
            if a.choices:
                meaning += " Choices: " + ", ".join(f"`{c}`" for c in a.choices) + "."
            if a.dest in UNSUPPORTED:
                meaning += f" *Refused:* {UNSUPPORTED[a.dest]}."
            config = ", ".join(f"`{s}`" for s in readers.get(a.dest, [])) or "-"
            lines.append(f"| {flat} | {dotted} | {_default(a)} | {config} | {meaning} |")
        lines.append("")
    names = list(PRESETS)
    lines += ["## Presets", "", "| flag | " + " | ".join(f"`{n}`" for n in names) + " |"]
    lines.append("|---" * (len(names) + 1) + "|")
    for dest in dict.fromkeys(k for values in PRESETS.values() for k in values):
        cells = [f"`{PRESETS[n][dest]}`" if dest in PRESETS[n] else "-" for n in names]
        lines.append(f"| `--{dest}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")
