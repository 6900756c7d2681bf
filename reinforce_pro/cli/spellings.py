"""OpenRLHF's two spellings of every flag: v0.9.10's flat names and the dotted names of v0.10.2 onwards (v0.11).

OpenRLHF renamed its flags in v0.10.2 with no backward compatibility (`--pretrain` became
`--actor.model_name_or_path`, `--zero_stage` became `--ds.zero_stage`, ...). Here both spellings name one
argparse action: each flag field declares its dotted name(s) (cli/args.py), `DOTTED` collects them, and a
script may mix the two. Giving one setting twice in two spellings with different
values is an error (`conflicting_spellings`); the same spelling twice keeps argparse's last-one-wins.

The dotted names are those of OpenRLHF's dotted `openrlhf/cli/train_ppo_ray.py` (tests/data/openrlhf/
dotted-train_ppo_ray-flags.tsv lists them; tests/test_openrlhf_scripts.py checks each one is recognised).
Flags that only exist in dotted form (`--actor.adam.eps`, `--critic.max_norm`, Muon's slots, ...) are
declared with `flat=False`.
"""

from __future__ import annotations

import argparse

from reinforce_pro.cli.args import flag_fields

# flat name -> dotted name(s), from the flag fields (cli/args.py); dotted-only flags are not in it
DOTTED: dict[str, str | tuple[str, ...]] = {
    f.name: spec.dotted[0] if len(spec.dotted) == 1 else spec.dotted
    for _, f, spec, _ in flag_fields()
    if spec.flat and spec.dotted
}


def dotted_names(flat: str) -> tuple[str, ...]:
    """The dotted option strings of a flat flag (`--zero_stage` -> (`--ds.zero_stage`,)), or ()."""
    dotted = DOTTED.get(flat.removeprefix("--"), ())
    return tuple(f"--{d}" for d in ((dotted,) if isinstance(dotted, str) else dotted))


def given_options(parser: argparse.ArgumentParser, argv: list[str]) -> list[tuple[str, str, object]]:
    """(dest, option string, value) for each option string that appears in argv, parsed by argparse itself
    (so `--x=1`, nargs and types are handled as in the real parse); the last occurrence of a spelling wins."""
    quiet = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    owners: dict[str, tuple[str, str]] = {}
    for action in parser._actions:
        if action.dest == "help":
            continue
        for option in action.option_strings:
            key = f"option{len(owners)}"
            owners[key] = (action.dest, option)
            kwargs = {"dest": key, "default": argparse.SUPPRESS}
            if isinstance(action, argparse._StoreConstAction):  # store_true / store_false / store_const
                kwargs.update(action="store_const", const=action.const)
            else:
                kwargs.update(nargs=action.nargs, type=action.type)
            quiet.add_argument(option, **kwargs)
    ns, _ = quiet.parse_known_args(argv)
    return [(*owners[key], value) for key, value in vars(ns).items()]


def conflicting_spellings(parser: argparse.ArgumentParser, given: list[tuple[str, str, object]]) -> str | None:
    """'--a X and --b Y are two spellings ...' when one setting is given (`given_options`) in two spellings
    with two values."""
    first: dict[str, tuple[str, object]] = {}
    for dest, option, value in given:
        if dest in first and first[dest][0] != option and first[dest][1] != value:
            other, other_value = first[dest]
            return (
                f"{_shown(parser, other, other_value)} and {_shown(parser, option, value)} are two spellings of "
                "one setting with different values: give it once"
            )
        first.setdefault(dest, (option, value))
    return None


def _shown(parser: argparse.ArgumentParser, option: str, value: object) -> str:
    """An option as it was given: `--bf16`, `--zero_stage 3`, `--eps_clip_low_high 0.2 0.3`."""
    if parser._option_string_actions[option].nargs == 0:
        return option
    values = value if isinstance(value, (list, tuple)) else [value]
    return " ".join([option, *(str(v) for v in values)])
