"""A flag reaches the code that uses it in a few hops, so a reader can follow it: the flag's declaration (on the
config that takes it as given, or in cli/args.py), its section builder (cli/flags_to_config.py) where the builder
computes a field from it, the section that carries it (a field named after a flag is filled from it), the
component that reads it. A hop is one class or top-level function of the package whose code names the setting;
every wrapper that copies it under the same name adds one. The OpenRLHF integration and selfcheck are entry
points of their own and not on the trainer's path. The tests list some flags' hops exactly: a new one fails
them, and is welcome only while the count stays within MAX_HOPS.

Every flag the README shows is walked too, by the files whose code names it: at most MAX_FILES. A name two
settings share counts for both (the MoE router's top-k is named experts_per_token here so that it does not pass
for the sampling flag --top_k; the evaluation's samples per prompt are Evaluation.n_samples)."""

from __future__ import annotations

import ast
from pathlib import Path

import torch

import reinforce_pro.algos.losses as losses
from reinforce_pro.cli.flags_to_config import run_config
from reinforce_pro.cli.train_ppo_ray import parse_args

PACKAGE = Path(__file__).resolve().parents[1] / "reinforce_pro"
MAX_HOPS = 5
OWN_ENTRY_POINTS = ("integrations", "selfcheck.py")


def _names(node: ast.AST, name: str) -> bool:
    """Whether `node` names `name` as code: an attribute, an argument, a keyword or a variable (not a string)."""
    return (
        (isinstance(node, ast.Attribute) and node.attr == name)
        or (isinstance(node, ast.arg) and node.arg == name)
        or (isinstance(node, ast.keyword) and node.arg == name)
        or (isinstance(node, ast.Name) and node.id == name)
    )


def hops(name: str, root: Path = PACKAGE) -> list[str]:
    """The classes and top-level functions under `root` (module:owner) whose code names `name`."""
    owners = set()
    for path in sorted(root.rglob("*.py")):
        if any(part in OWN_ENTRY_POINTS for part in path.relative_to(root).parts):
            continue
        module = path.relative_to(root).with_suffix("").as_posix()
        for top in ast.parse(path.read_text()).body:
            if any(_names(node, name) for node in ast.walk(top)):
                owner = top.name if isinstance(top, (ast.FunctionDef, ast.ClassDef)) else "<module>"
                owners.add(f"{module}:{owner}")
    return sorted(owners)


MAX_FILES = 5


def readme_flags() -> list[str]:
    """The trainer flags the README's text names (`--name`), those train_ppo_ray's parser knows."""
    import re

    from reinforce_pro.cli.args import build_parser

    known = {o[2:] for a in build_parser()._actions for o in a.option_strings if o.startswith("--")}
    text = (PACKAGE.parent / "README.md").read_text()
    return sorted(set(re.findall(r"--([a-z][a-z0-9_]+)", text)) & known)


def test_every_readme_flag_reaches_its_use_within_five_files():
    flags = readme_flags()
    assert len(flags) >= 25 and {"vllm_is_truncated_threshold", "n_samples_per_prompt"} <= set(flags)
    files = {f: {h.split(":")[0] for h in hops(f)} for f in flags}
    assert all(files[f] for f in flags)  # every one reaches the code
    wider = {f: sorted(files[f]) for f in flags if len(files[f]) > MAX_FILES}
    assert wider == {}, f"README flags named in more than {MAX_FILES} files: {wider}"


def test_the_group_size_reaches_the_sources_as_an_argument():
    """--n_samples_per_prompt: the trainer asks each rollout source for n responses to each prompt
    (RolloutSource.generate(batch, n)), so no source reads the setting; the group estimators then read
    Samples.group_size, which the source sets."""
    assert hops("n_samples_per_prompt") == [
        "cli/args:<module>",  # RULES: >= 2 for the group estimators and self-play
        "cli/args:_samples_per_step",  # a step's samples fill whole optimizer batches
        "run/start:optimizer_steps",  # the LR schedule's length
        "trainer/ppo_trainer:LoopConfig",  # declares the flag, beside --rollout_batch_size
        "trainer/ppo_trainer:PPOTrainer",  # asks the source for that many responses to each prompt
    ]


def test_the_is_threshold_reaches_the_loss_in_five_hops():
    assert hops("vllm_is_truncated_threshold") == [
        "algos/losses:PolicyLoss",  # reads it into compute_is_weights
        "algos/losses:SurrogateConfig",  # carries it, checked for callers without a command line
        "cli/args:EngineFlags",  # declares the flag
        "cli/args:_is_band",  # checks it in flag words, with the other command-line checks
        "cli/flags_to_config:loss",  # builds the loss section
    ]


def test_the_async_queue_size_reaches_the_trainer_in_two_hops():
    assert hops("async_queue_size") == [
        "trainer/ppo_trainer:LoopConfig",  # the trainer's own settings declare the flag, filled from it
        "trainer/ppo_trainer:PPOTrainer",  # bounds the producer's lead with it
    ]


def test_the_routing_replay_reaches_the_forwards_in_four_files():
    assert hops("routing_replay") == [
        "run/prepare:_check_moe_flags",  # refuses it before anything starts when the model has no experts
        "trainer/experience_builder:ExperienceBuilder",  # chooses which routes each forward replays
        "trainer/experience_builder:ExperienceConfig",  # carries it for the experience builder
        "workers/configs:ForwardConfig",  # declares the flag (verl's values read as ours), carries it to workers
        "workers/policy:PolicyWorker",  # replays the routes in the training forward
    ]


def test_a_wrapper_that_copies_a_setting_counts_as_a_hop(tmp_path):
    """The count can fail: six owners pass `lag` along, each under the same name."""
    chain = ["class Flags:\n    lag: int = 1\n", "def build(lag):\n    return Section(lag=lag)\n"]
    chain += [f"class Wrapper{i}:\n    def __init__(self, s):\n        self.lag = s.lag\n" for i in range(4)]
    for i, source in enumerate(chain):
        (tmp_path / f"m{i}.py").write_text(source)
    (tmp_path / "m9.py").write_text("NOTE = 'lag'  # a string is not a hop\n")
    assert len(hops("lag", tmp_path)) == 6 > MAX_HOPS


def test_the_is_threshold_on_the_command_line_is_the_band_the_loss_applies(monkeypatch):
    """Runtime check of the same path: the parsed flag, through the config, is the band compute_is_weights gets."""
    args = parse_args(["--enable_vllm_is_correction", "--vllm_is_correction_type", "icepop",
                       "--vllm_is_truncated_threshold", "0.37", "3.7"])  # fmt: skip
    seen = {}

    def recording(correction, old, rollout, mask, low, high, **kwargs):
        seen.update(correction=correction, band=(low, high))
        return torch.ones_like(old), {}

    monkeypatch.setattr(losses, "compute_is_weights", recording)
    loss_fn = losses.PolicyLoss(run_config(args).loss.surrogate)  # what the policy worker does with the section
    log_probs = torch.zeros(2, 3, requires_grad=True)
    loss_fn(log_probs, torch.zeros(2, 3), torch.ones(2, 3), torch.ones(2, 3, dtype=torch.bool), torch.zeros(2, 3))
    assert seen == {"correction": "icepop", "band": (0.37, 3.7)}
