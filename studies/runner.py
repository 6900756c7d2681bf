"""The command line every resumable study shares, as benchmarks/common.bench_main is the benchmarks'.

A study gives its JSON's name, its own options, a `run(args, study)` and a `render(payload, out_dir)`; the runner
owns the rest: --seeds and --steps where the study has defaults for them, --output (the JSON and its renders),
--name (another file for a pilot or a calibration), --render FILE (re-render a saved JSON, no training),
--allow-dirty where the study refuses a tree with uncommitted changes (each run records its commit), the
provenance of the code when the study started, and printing the table once the runs are in.

`run` resumes: `study.stored()` holds the runs the JSON already has, and `study.save(runs, config)` writes the
JSON after each run (atomically), so a stop loses no finished run. A `UsageError` from `name` or `run` ends the
command line in one line, as a bad flag does.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import render_saved, run_provenance, write_result
from studies import RESULTS_DIR
from studies.study_stats import parse_seeds, stored_runs


class UsageError(Exception):
    """A command line the study cannot run, in one line."""


@dataclass
class Study:
    """Where one invocation's runs go: the JSON `output/name.json`, and the code they run (`code`: its commit,
    whether the tree was clean, the host, when it started)."""

    name: str
    output: Path
    code: dict

    @property
    def path(self) -> Path:
        return self.output / f"{self.name}.json"

    def stored(self, config: dict | None = None) -> list[dict]:
        """The runs the JSON already holds (none before the first): what a resumed study skips; with `config`,
        only when the JSON was written with it."""
        return stored_runs(self.path, config)

    def save(self, runs: list[dict], config: dict, **results) -> Path:
        """Write every run so far (and any other results) with the study's configuration."""
        return write_result(self.name, config, {"runs": runs, **results}, self.output)


def study_main(argv, doc: str, name, run, render, *, options=None, seeds: str | None = None,
               steps: int | None = None, steps_help: str = "RL steps per run", clean: bool = False) -> int:  # fmt: skip
    """`name`: the JSON's name (--name gives another), or a function of the parsed args that returns it (the
    study then declares --name itself if it takes one). `options(parser)` adds the study's own flags; `seeds` /
    `steps` are the defaults of --seeds / --steps (None: the study has no such flag, or declares its own).
    `clean`: refuse a tree with uncommitted changes unless --allow-dirty."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if seeds is not None:
        p.add_argument("--seeds", type=parse_seeds, default=parse_seeds(seeds), help="paired seeds, e.g. 1-4 or 1,3,5")
    if steps is not None:
        p.add_argument("--steps", type=int, default=steps, help=steps_help)
    if options is not None:
        options(p)
    p.add_argument("--output", type=Path, default=RESULTS_DIR, help="directory of the JSON and its renders")
    if not callable(name):
        p.add_argument("--name", default=name, help="the JSON's name (a pilot or a calibration keeps its own file)")
    if clean:
        p.add_argument("--allow-dirty", action="store_true", help="run from a tree with uncommitted changes (a pilot)")
    p.add_argument("--render", type=Path, default=None, help="only re-render the table (and plots) from this JSON")
    args = p.parse_args(argv)
    if args.render is not None:
        return render_saved(args.render, render)
    try:
        study = Study(name(args) if callable(name) else args.name, args.output, run_provenance())
        if clean and not study.code["clean"] and not args.allow_dirty:
            raise UsageError("the tree has uncommitted changes: commit them (each run records its commit) or pass "
                             "--allow-dirty")  # fmt: skip
        run(args, study)
    except UsageError as e:
        p.error(str(e))
    print(render(json.loads(study.path.read_text()), args.output))
    return 0
