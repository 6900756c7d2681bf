"""`python -m reinforce_pro.cli.train_ppo_ray`: OpenRLHF-style RL on Ray.

With no model or data flags it runs the embedded default on CPU: a tiny Qwen2 model and tokenizer
created locally, a short supervised warm start on built-in additions, then RL with reinforce_baseline
and the reinforce_pro IS correction. Its settings are a named preset (cli/presets.py), which changes the
defaults of the flags: a flag given on the command line wins.

`parse_args(argv)` validates flag values and their combinations without touching the file system or
starting anything; `main(argv)` then checks paths and runs. User errors end with one line on stderr
and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from reinforce_pro.cli.args import build_parser, first_problem
from reinforce_pro.cli.presets import preset_defaults, preset_for
from reinforce_pro.cli.spellings import conflicting_spellings, given_options

if TYPE_CHECKING:
    from reinforce_pro.run.config import RunConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The checked flags (tests and the OpenRLHF scripts read these); `parse` also returns the run config."""
    return parse(argv)[0]


def parse(argv: list[str] | None = None) -> tuple[argparse.Namespace, RunConfig]:
    """Flags -> (namespace, RunConfig), the config built once: its sections' own checks are what end a bad
    command line (in one line, worded with the flag), and the same object is the run's."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    if clash := conflicting_spellings(parser, given_options(parser, argv)):
        parser.error(clash)
    if (preset := preset_for(args)) is not None:  # the preset's values become the defaults: given flags win
        parser.set_defaults(preset=preset, **preset_defaults(preset, args))
        args = parser.parse_args(argv)
    if problem := first_problem(args, parser):  # every check of the flags: cli/args.py
        parser.error(problem)
    from reinforce_pro.cli.flags_to_config import run_config  # torch and the workers: not needed for --help

    try:
        return args, run_config(args)
    except ValueError as e:  # what only a built section can tell (a correction's settings, a user's file)
        parser.error(str(e))


def main(argv: list[str] | None = None) -> int:
    """Flags -> RunConfig -> one run (run/driver.py: train)."""
    from reinforce_pro.run.driver import train

    _, cfg = parse(argv)
    return train(cfg)


if __name__ == "__main__":
    sys.exit(main())
