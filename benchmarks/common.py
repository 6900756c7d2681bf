"""Shared helpers for benchmarks: where a result came from (machine, commit) and writing it as JSON."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"
PACKAGED_MODELS = Path.home() / ".cache" / "reinforce_pro"  # where examples/scripts keep prepared models


@contextmanager
def attention_kernel(config, kernel: str | None):
    """An HF model's attention kernel switched to `kernel` meanwhile (its config's attn_implementation, which the
    attention layers read at every forward); None leaves it as loaded."""
    loaded = config._attn_implementation
    config._attn_implementation = kernel or loaded
    try:
        yield
    finally:
        config._attn_implementation = loaded


@contextmanager
def scratch_dir(prefix: str):
    """A new temporary directory for a study's or benchmark's runs, removed when the block ends; a block cut
    short (an error, Ctrl-C) keeps it and prints where, since the unfinished run's logs are what one reads next.
    What a study keeps of each run goes to its JSON before the block ends, never only here."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    except BaseException:
        print(f"[{prefix.rstrip('_')}] stopped: the unfinished run's files are in {path}", file=sys.stderr, flush=True)
        raise
    shutil.rmtree(path, ignore_errors=True)


def machine_info() -> dict:
    import torch

    cpu = cpu_model()
    info = {
        "host_id": host_id(cpu),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    return info


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo; platform.processor() where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                        platform.processor())  # fmt: skip
    except OSError:
        return platform.processor()


def host_id(cpu: str) -> str:
    """A stable id of this machine that names nothing: a hash of /etc/machine-id and the CPU model (Python's
    hash() is salted per process and would differ between two runs on one host)."""
    try:
        machine = Path("/etc/machine-id").read_text().strip()
    except OSError:
        machine = platform.node()
    return hashlib.sha256(f"{machine}|{cpu}".encode()).hexdigest()[:12]


def git_commit() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=root, text=True).strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=root).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("-dirty" if dirty else "")


def run_provenance(root: Path | None = None, ignore: tuple[Path, ...] = ()) -> dict:
    """Where one run of a study came from, recorded per run: the commit, whether the tree was clean and, if not,
    a hash of its diff against the commit (so two runs from the same dirty tree can be told from two from
    different ones), the stable host id, the CPU and the start time. A study compares runs within one host kind
    or blocks on `host_id`. `ignore`: files the study itself writes (its result JSON and table), which would
    otherwise make every run after its first look dirty when it writes them inside the tree."""
    root = root or Path(__file__).resolve().parent.parent
    excluded = [f":(exclude){path.resolve().relative_to(root.resolve())}" for path in ignore
                if path.resolve().is_relative_to(root.resolve())]  # fmt: skip
    cpu = cpu_model()
    out = {"commit": "unknown", "clean": False, "diff_sha256": None, "host_id": host_id(cpu), "cpu": cpu,
           "started": datetime.now(UTC).isoformat(timespec="seconds")}  # fmt: skip
    try:
        out["commit"] = subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=root, text=True).strip()
        diff = subprocess.check_output(["git", "diff", "HEAD", "--", ".", *excluded], cwd=root)
        untracked = subprocess.check_output(["git", "ls-files", "--others", "--exclude-standard", "--", ".",
                                             *excluded], cwd=root)  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return out
    out["clean"] = not diff and not untracked
    if not out["clean"]:
        out["diff_sha256"] = hashlib.sha256(diff + b"\0" + untracked).hexdigest()[:16]
    return out


def write_result(name: str, config: dict, results, output_dir: Path = RESULTS_DIR) -> Path:
    """Write {machine, commit, time, config, results} to output_dir/name.json (atomically) and return the path."""
    output_dir.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": name,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": machine_info(),
        "config": config,
        "results": results,
    }
    path = output_dir / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    tmp.replace(path)
    return path


def run_cli(argv: list[str], run_dir: Path, timeout_s: float = 1800) -> tuple[list[dict], str]:
    """One run of `train_ppo_ray` with `argv` into `run_dir`, in a process of its own from the repository root:
    (its metrics.jsonl rows, its output). A run that does not end 0 raises with the end of its output."""
    root = Path(__file__).resolve().parent.parent
    cmd = [sys.executable, "-m", "reinforce_pro.cli.train_ppo_ray", *argv, "--save_path", str(run_dir)]
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"train_ppo_ray {' '.join(argv)}: exit {done.returncode}\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return rows, done.stdout + done.stderr


def bench_main(argv, name, doc: str, options, measure, render, output: Path = RESULTS_DIR) -> int:
    """The command line every benchmark shares: its own options (`options(parser)` adds them), --output DIR (the
    JSON, the table and any plot go there; default `output`) and --render FILE (only re-render the table and plot
    from a saved JSON). `measure(args)` runs the benchmark and returns (configuration, results) for the JSON,
    which write_result completes with the machine and the commit; `name`: the JSON's name, or a function of the
    args. A study that measures once (no runs to resume) uses it too, with its results folder as `output`."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    options(p)
    p.add_argument("--output", type=Path, default=output, help="directory for the JSON, the table and the plot")
    p.add_argument("--render", type=Path, default=None, help="only re-render the table and plot from this JSON")
    args = p.parse_args(argv)
    if args.render is not None:
        return render_saved(args.render, render)
    config, results = measure(args)
    return save_and_render(name(args) if callable(name) else name, config, results, args.output, render)


def arms_main(argv, name: str, doc: str, arms: dict, run_arm, render, steps: int, config: dict) -> int:
    """bench_main for a benchmark that runs the trainer once per arm, one after the other in one invocation:
    --steps / --seed. `run_arm(arm, steps, seed, workdir)` is one arm's result; `config` joins the steps, the
    seed and `arms` in the JSON."""

    def options(p):
        p.add_argument("--steps", type=int, default=steps, help="RL steps per run")
        p.add_argument("--seed", type=int, default=42)

    def measure(args):
        with tempfile.TemporaryDirectory(prefix=f"{name}_") as tmp:
            results = [run_arm(arm, args.steps, args.seed, Path(tmp)) for arm in arms]
        return {"steps": args.steps, "seed": args.seed, "arms": arms, **config}, {"arms": results}

    return bench_main(argv, name, doc, options, measure, render)


def render_saved(path: Path, render) -> int:
    """`--render FILE`: re-render the table (and plot) next to FILE from its JSON and print the table."""
    print(render(json.loads(path.read_text()), path.parent))
    return 0


def save_and_render(name: str, config: dict, results, output_dir: Path, render) -> int:
    """Write the result JSON, then render the table and plot from what was written (a later `--render` of
    the file gives the same output) and print the table."""
    path = write_result(name, config, results, output_dir)
    print(render(json.loads(path.read_text()), output_dir))
    print(f"wrote {path}")
    return 0


def write_table(payload: dict, lines: list[str], out_dir: Path, name: str) -> str:
    """A rendered table: `lines`, then the machine and commit the payload was measured on, written to
    out_dir/<name>.md; returns the text."""
    m = payload["machine"]
    text = "\n".join(
        [*lines, f"\n_{m['cpu']} ({m['cpu_count']} cores), torch {m['torch']}, commit {payload['commit'][:12]}._"]
    )
    (out_dir / f"{name}.md").write_text(text + "\n")
    return text


def new_figure(figsize: tuple[float, float]):
    """(figure, axes) of matplotlib drawn off-screen (the Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=figsize)


def save_figure(fig, ax, path: Path) -> None:
    """Legend, tight layout, a 120-dpi PNG at `path`; the figure is closed."""
    import matplotlib.pyplot as plt

    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
