"""How a command-line flag is declared: a dataclass field whose metadata carries a `FlagSpec`.

    name: type = flag(default, help, dotted=..., ...)

The field's name is the flat flag and the argparse dest, its annotation the value type (`bool`: a switch;
`tuple[float, float]`: two values; `X | None`: may be unset), its default the default; `flag(...)` carries the
rest. A flag lives on the field that uses it: a setting a component takes as given is declared on that
component's config (LoopConfig.async_queue_size), with `group=` naming its --help group; a flag a section builder
turns into something else is declared in cli/args.py, in the section class of its group. cli/args.py builds the
parser from both (like transformers' HfArgumentParser). This module is at the bottom of the package so that any
config may declare its flags.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FlagSpec:
    """What a flag field carries besides its name, type and default."""

    help: str
    dotted: tuple[str, ...] = ()  # OpenRLHF v0.11's name(s), without the leading --
    also: tuple[str, ...] = ()  # other flat spellings, e.g. --generate_max_len
    flat: bool = True  # False: the flag exists only in dotted form (--actor.adam.eps)
    choices: tuple | None = None
    metavar: tuple[str, ...] | None = None
    nargs: str | None = None  # for a list of values ("*"); fixed counts come from a tuple annotation
    at_least: float | None = None  # bounds, checked by cli/args.py's out_of_bounds (an unset None value passes)
    above: float | None = None
    finite: bool = False
    refused: str | None = None  # why a non-default value stops the run
    no_effect: str | None = None  # why any value changes nothing
    shorthand: tuple[str, Any] | None = None  # (option, value): a switch that sets the flag (--bf16)
    off: str | None = None  # the option that switches off a switch that is on by default
    group: str | None = None  # a config's flag: its --help group (a key of cli/args.py's GROUPS)
    convert: Callable[[str], Any] | None = None  # reads the given text instead of the annotation's type


def flag(default, help: str, *, dotted=(), also=(), choices=None, metavar=None, **spec) -> Any:
    """A flag field: `name: type = flag(default, help, ...)`."""
    as_tuple = lambda v: (v,) if isinstance(v, str) else tuple(v)  # noqa: E731
    spec = FlagSpec(help, as_tuple(dotted), as_tuple(also), choices=choices and tuple(choices), metavar=metavar,
                    **spec)  # fmt: skip
    return dataclasses.field(default=default, metadata={"flag": spec})
