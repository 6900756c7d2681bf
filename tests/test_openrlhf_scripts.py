"""OpenRLHF's own example scripts, in both flag eras, through reinforce_pro's parser.

The scripts under tests/data/openrlhf are OpenRLHF's, copied unchanged (SOURCE.md there): flat/ from the
stored index (each flag-era test rewrites them into the dotted spelling), v0.9.10/ and v0.11.0/ every example
script of those releases that calls train_ppo_ray (v0.11.0 is also the main branch of 2026-08). Each one is
run by bash with `python3`, `ray`, `srun` and the other cluster commands replaced by shell functions that
write the trainer's argv to a file, so arrays, `$(( ))`, line continuations, comments and the Slurm script's
`bash -c "..."` string are expanded the way a user's shell would.
"""

import argparse
import os
import subprocess
from pathlib import Path

import pytest

from reinforce_pro.cli.args import build_parser
from reinforce_pro.cli.spellings import DOTTED, dotted_names
from reinforce_pro.cli.train_ppo_ray import parse_args

DATA = Path(__file__).parent / "data" / "openrlhf"
FLAT_SCRIPTS = sorted((DATA / "flat").glob("*.sh"))
RELEASE_SCRIPTS = sorted((DATA / "v0.9.10").glob("*.sh")) + sorted((DATA / "v0.11.0").glob("*.sh"))
FLAT_REFERENCE = DATA / "flat-0.9.10-train_ppo_ray-flags.tsv"

# Each stand-in replaces a model / data / output path of OpenRLHF's scripts (hub names, /openrlhf/...).
PATH_FLAGS = {
    "--pretrain": "models/policy", "--reward_pretrain": "models/rm", "--prompt_data": "data/prompts.jsonl",
    "--eval_dataset": "data/eval.jsonl", "--remote_rm_url": "reward.py", "--agent_func_path": "agent.py",
    "--save_path": "out", "--ckpt_path": "out/ckpt", "--use_tensorboard": "out/tb",
}  # fmt: skip

# What still stops each script, by flag: the rest of every script is accepted as it is. Vision-language
# models are not implemented; every other script (hybrid engine with TP-2 engines, ring attention) runs.
STILL_REFUSED = {
    "train_vlm_math_hybrid_engine.sh": {"max_images_per_prompt", "freeze_visual_encoder"},
}

# The Slurm script's placeholder for the OpenRLHF checkout (a path the user must fill in).
PLACEHOLDERS = {"<OPENRLHF_ROOT_PATH>": "openrlhf"}

STUBS = r"""
python3() {
    if [[ "$1" == -m && "$2" == openrlhf.cli.train_ppo_ray ]]; then shift 2; printf '%s\0' "$@" > "$ARGV_OUT"; fi
}
ray() { [[ "$1" == job ]] || return 0; while [[ $# -gt 0 && "$1" != -- ]]; do shift; done; shift; "$@"; }
pip() { :; }
sleep() { :; }
scontrol() { echo node-1; }
srun() {  # the command of `srun ... bash -c "..."`, its ray at /root/.local/bin/ray being the stub
    while [[ $# -gt 0 && "$1" != bash ]]; do shift; done
    [[ "$2" == -c ]] && eval "${3//\/root\/.local\/bin\/ray/ray}"
}
"""


def read_tsv(path: Path) -> dict[str, dict]:
    lines = path.read_text().splitlines()
    header = lines[0].split("\t")
    rows = [dict(zip(header, line.split("\t") + [""] * 5, strict=False)) for line in lines[1:]]
    return {r["flag"]: r for r in rows}


def script_argv(script: Path, tmp_path: Path) -> list[str]:
    """The argv a script passes to train_ppo_ray, with its paths (in either spelling) replaced by local
    stand-ins."""
    text = script.read_text()
    for placeholder, stand_in in PLACEHOLDERS.items():
        text = text.replace(placeholder, str(tmp_path / stand_in))
    local, out = tmp_path / script.name, tmp_path / f"{script.stem}.argv"
    local.write_text(text)
    env = {"PATH": os.environ["PATH"], "ARGV_OUT": str(out), "HOME": str(tmp_path)}
    subprocess.run(["bash", "-c", f"{STUBS}\nsource {local}"], env=env, cwd=tmp_path, check=True,
                   capture_output=True, timeout=30)  # fmt: skip
    argv = out.read_bytes().decode().split("\0")[:-1]
    options = build_parser()._option_string_actions
    stand_ins = {options[flag].dest: path for flag, path in PATH_FLAGS.items()}
    path_of = {o: stand_ins[a.dest] for o, a in options.items() if a.dest in stand_ins}
    return [str(tmp_path / path_of[argv[i - 1]]) if i and argv[i - 1] in path_of else a for i, a in enumerate(argv)]


def parse_dropping_refused(argv: list[str], capsys) -> tuple[argparse.Namespace, set[str]]:
    """parse_args(argv); each time it stops with one line that starts with a flag the script gave (a flag
    reinforce_pro refuses, or a combination it cannot run), note the flag, drop it with its values and parse
    again. Any other error fails the test."""
    parser, refused = build_parser(), set()
    while True:
        try:
            return parse_args(argv), refused
        except SystemExit:
            err = capsys.readouterr().err
            assert err.count("\n") == 1, err
            action = parser._option_string_actions[err.split(": error: ")[1].split(" ")[0]]
            refused.add(action.dest)
            i = next(i for i, a in enumerate(argv) if a in action.option_strings)
            argv = argv[:i] + argv[i + 1 + (action.nargs if isinstance(action.nargs, int) else 1) :]


def to_dotted(argv: list[str]) -> list[str]:
    """The same argv in OpenRLHF v0.11's spelling: each flat flag with a dotted name is renamed."""
    return [dotted_names(a)[0] if a.startswith("--") and dotted_names(a) else a for a in argv]


def test_the_copies_are_there():
    assert len(FLAT_SCRIPTS) == 9
    assert [p.parent.name for p in RELEASE_SCRIPTS].count("v0.9.10") == 7  # every train_ppo_ray script of each
    assert [p.parent.name for p in RELEASE_SCRIPTS].count("v0.11.0") == 8


@pytest.mark.parametrize("script", RELEASE_SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_release_script_is_accepted_with_only_its_paths_replaced(script, tmp_path, capsys):
    """Strict: each example script of OpenRLHF v0.9.10 and v0.11.0 (= main of 2026-08) that calls
    train_ppo_ray parses with nothing dropped: hybrid engine with TP-2 engines, ring attention, the async agent
    run with partial rollouts, Slurm. Only the vision-language one stops, on its image flags."""
    argv = script_argv(script, tmp_path)
    assert len(argv) > 40
    if script.stem == "train_vlm_math_hybrid_engine":
        _, refused = parse_dropping_refused(argv, capsys)
        assert refused == STILL_REFUSED[script.name]
        return
    args = parse_args(argv)
    assert args.pretrain == str(tmp_path / "models/policy") and args.save_path == str(tmp_path / "out")
    assert args.enable_vllm_is_correction == any("is_correction" in a and "enable" in a for a in argv)


@pytest.mark.parametrize("script", FLAT_SCRIPTS, ids=lambda p: p.stem)
def test_openrlhf_flat_script_parses_and_means_the_same_in_dotted_flags(script, tmp_path, capsys):
    argv = script_argv(script, tmp_path)
    assert len(argv) > 40 and "--pretrain" in argv
    args, refused = parse_dropping_refused(argv, capsys)
    assert refused == STILL_REFUSED.get(script.name, set())
    # every flag the script gave reached the namespace with the script's value (spot checks of each kind)
    assert args.pretrain == str(tmp_path / "models/policy")
    assert args.packing_samples == ("--packing_samples" in argv)
    assert args.vllm_enable_sleep == ("--vllm_enable_sleep" in argv)

    dotted = to_dotted(argv)
    assert "--actor.model_name_or_path" in dotted and "--pretrain" not in dotted
    dotted_args, dotted_refused = parse_dropping_refused(dotted, capsys)
    assert dotted_refused == refused
    assert vars(dotted_args) | {"wandb_run_name": None} == vars(args) | {"wandb_run_name": None}


def test_each_dotted_name_pairs_a_flat_flag_with_the_same_type_and_arity():
    """DOTTED's pairs are checked against the reference lists: the dotted name exists in OpenRLHF's dotted
    parser and takes values of the flat flag's type and count (a mis-paired int/float or 1/2-value flag fails).
    A flag that 0.11.2 added, or that only train_opd has, has no flat spelling upstream; its type and count are
    checked against that parser's."""
    flat, dotted = read_tsv(FLAT_REFERENCE), read_tsv(DATA / "dotted-train_ppo_ray-flags.tsv")
    added = read_tsv(DATA / "dotted-0.11.2-new-flags.tsv")
    added |= read_tsv(DATA / "dotted-train_opd-flags.tsv")  # OpenRLHF's distillation entry point (train_opd)
    later_flat = {"--partial_rollout", "--image_key", "--max_images_per_prompt", "--freeze_visual_encoder"}
    ours = {o: a for a in build_parser()._actions for o in a.option_strings}
    for name in DOTTED:
        for d in dotted_names(name):
            assert d in dotted or d in added, d
            if d in added:
                action = ours[d]
                assert added[d]["type"] == getattr(action.type, "__name__", ""), d
                assert (added[d]["choices"] == "") == (action.choices is None), d
            elif f"--{name}" in flat:
                f = flat[f"--{name}"]
                assert (f["type"], f["nargs"]) == (dotted[d]["type"], dotted[d]["nargs"]), (name, d)
            else:
                assert f"--{name}" in later_flat, name


def test_every_flag_openrlhf_0_11_2_added_is_recognised():
    """0.11.2's new flags (the correction level / mode / gating, loss aggregation, the unbiased KL gradient)
    parse with each of their choices."""
    for flag, row in read_tsv(DATA / "dotted-0.11.2-new-flags.tsv").items():
        values = [c.strip().strip("'") for c in row["choices"].strip("[]").split(",")] if row["choices"] else [None]
        for value in values:
            parse_args(
                [flag]
                + ([] if value is None else [value])
                + (["--algo.advantage.is_correction_threshold", "0.5", "2"] if flag.endswith("level") else [])
            )


def test_every_dotted_reference_flag_is_recognised(capsys):
    """Each flag of OpenRLHF's dotted parser parses with a well-typed value, or stops with one line that is
    a refusal or a validation message, never 'unrecognized arguments'."""
    options = {o for a in build_parser()._actions for o in a.option_strings}
    rows = read_tsv(DATA / "dotted-train_ppo_ray-flags.tsv")
    assert len(rows) == 164
    assert sorted(set(rows) - options) == []
    for flag, row in rows.items():
        value = row["choices"].strip("[]").split(",")[-1].strip().strip("'") if row["choices"] else None
        value = value or {"int": "3", "float": "0.7", "str": "x", "": None}[row["type"]]
        argv = [flag] + ([] if value is None else [value] * (2 if row["nargs"] == "2" else 1))
        try:
            parse_args(argv)
        except SystemExit as e:
            err = capsys.readouterr().err
            assert e.code == 2 and err.count("\n") == 1, (argv, err)
            assert "unrecognized arguments" not in err and "invalid choice" not in err, (argv, err)


def test_a_script_may_mix_spellings_but_not_contradict_itself(capsys):
    args = parse_args(["--ds.zero_stage", "3", "--rollout_batch_size", "16", "--rollout.n_samples_per_prompt", "4",
                       "--train_batch_size", "64", "--vllm_is_truncated_threshold", "0.5", "5",
                       "--algo.advantage.is_correction_threshold", "0.5", "5.0"])  # fmt: skip
    assert (args.zero_stage, args.rollout_batch_size, args.n_samples_per_prompt) == (3, 16, 4)
    assert args.vllm_is_truncated_threshold == [0.5, 5.0]  # the same band twice is no contradiction

    cases = [
        (["--zero_stage", "2", "--ds.zero_stage", "3"], "--zero_stage 2 and --ds.zero_stage 3 are two spellings"),
        (["--bf16", "--ds.param_dtype", "fp16"], "--bf16 and --ds.param_dtype fp16 are two spellings"),
        (["--generate_max_len", "8", "--max_new_tokens", "9"], "--generate_max_len 8 and --max_new_tokens 9"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as e:
            parse_args(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and message in err and err.count("\n") == 1, err


def test_a_refusal_names_both_spellings(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--ds.load_in_4bit"])
    assert "--load_in_4bit / --ds.load_in_4bit is recognised but not supported" in capsys.readouterr().err


def test_critic_optimizer_follows_the_policy_unless_given():
    from reinforce_pro.cli.flags_to_config import run_config

    args = parse_args(["--actor.adam.betas", "0.9", "0.99", "--actor.adam.weight_decay", "0.1", "--critic.max_norm",
                       "0.5", "--actor.min_lr_ratio", "0.2"])  # fmt: skip
    cfg = run_config(args)
    actor, critic = cfg.actor_optim, cfg.critic_optim
    assert (actor.adam_betas, actor.l2, actor.max_norm, actor.min_lr_ratio) == ((0.9, 0.99), 0.1, 1.0, 0.2)
    assert (critic.adam_betas, critic.l2, critic.max_norm, critic.min_lr_ratio) == ((0.9, 0.99), 0.1, 0.5, 0.2)
    assert (actor.learning_rate, critic.learning_rate) == (args.actor_learning_rate, args.critic_learning_rate)


def test_the_cpu_recipe_means_the_same_in_both_spellings(recipe_argv):
    flat = recipe_argv("train_reinforce_pro_cpu.sh", RESUME="1", ASYNC="1")
    dotted = recipe_argv("train_reinforce_pro_cpu_dotted.sh", RESUME="1", ASYNC="1")
    assert not [a for a in dotted if a.startswith("--") and "." not in a]  # no flat flag left
    a, b = parse_args(flat), parse_args(dotted)
    assert vars(a) | {"wandb_run_name": None} == vars(b) | {"wandb_run_name": None}
    assert a.load_checkpoint and a.async_train and a.vllm_is_correction_type == "reinforce_pro"
