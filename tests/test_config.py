"""cli/flags_to_config.py: one typed run config, read from the flags once.

Every flag is read by a section, refused, or listed with why it has no effect; the sections' defaults are the
flags' defaults; a section's own check ends a bad command line in one line; the IS benchmark's typed configs
are the ones the equivalent command lines give.
"""

import dataclasses
import json
from dataclasses import replace

import pytest

from reinforce_pro.algos.losses import SurrogateConfig
from reinforce_pro.cli.args import NO_EFFECT, UNSUPPORTED, build_parser
from reinforce_pro.cli.flags_to_config import SECTIONS, flag_sections, run_config
from reinforce_pro.cli.presets import EMBEDDED
from reinforce_pro.cli.train_ppo_ray import parse, parse_args
from reinforce_pro.rollout.sampler import RolloutConfig
from reinforce_pro.run.config import KLPenalty, RunConfig
from reinforce_pro.trainer.experience_builder import ExperienceConfig
from reinforce_pro.workers.configs import OptimConfig


def _dests() -> set[str]:
    return {a.dest for a in build_parser()._actions if a.dest != "help"}


def test_every_flag_is_read_by_a_section_refused_or_without_effect():
    read, refused, inert = set(flag_sections()), set(UNSUPPORTED), set(NO_EFFECT)
    assert read <= _dests(), f"builders read names that are not flags: {sorted(read - _dests())}"
    assert not read & refused and not read & inert and not refused & inert
    assert _dests() == read | refused | inert, f"accepted and ignored: {sorted(_dests() - read - refused - inert)}"


def test_sections_are_runconfig_fields_in_order():
    assert list(SECTIONS) == list(RunConfig.__dataclass_fields__)


# (dataclass, field) whose value the builder derives from several flags, so no single flag default exists
DERIVED_FIELDS = {("OptimConfig", "grad_accum_steps"),  # train batch / (micro batch x ranks)
                  ("CheckpointConfig", "every_s")}  # --auto_checkpoint_minutes x 60, 0 under --save_steps  # fmt: skip


def _default_drift(obj, path: str) -> list[str]:
    """Fields of `obj` (and the dataclasses inside it) whose value differs from the field's own default."""
    drift = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            drift += _default_drift(value, f"{path}.{f.name}")
            continue
        if (type(obj).__name__, f.name) in DERIVED_FIELDS:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            continue  # no default: every construction names it
        as_list = lambda v: list(v) if isinstance(v, (tuple, list)) else v  # noqa: E731 (argparse gives lists)
        if as_list(value) != as_list(default):
            drift.append(f"{path}.{f.name}: field default {default!r}, flag default {value!r}")
    return drift


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["--absolute_zero", "--n_samples_per_prompt", "2", "--save_steps", "1", "--use_wandb", "k", "--lora_rank", "8"],
        ["--agent_func_path", "agent.py"],
        ["--eval_dataset", "held_out.jsonl"],
    ],
)
def test_every_section_field_default_is_its_flag_default(extra):
    """A dataclass default that disagrees with its flag's is a second truth (a test or benchmark that
    builds the dataclass directly runs with values no command line gives). Built from the flags' defaults
    (--pretrain given: no preset), every field with a default holds it, but for the few that are derived from
    several flags; the optional sections are reached by the flags that switch them on."""
    args, cfg = parse(["--pretrain", "m", *extra])
    switched = {"pretrain", "n_samples_per_prompt", "lora_rank", "save_steps", "use_wandb"}  # the switches differ
    drift = [d for d in _default_drift(cfg, "cfg") if d.split(":")[0].rsplit(".", 1)[1] not in switched]
    assert drift == []


def test_section_defaults_are_the_flag_defaults():
    """A run with no presets (--pretrain given) gets exactly the dataclasses' own defaults for the loss, KL and
    rollout, the experience, and the optimizer's but for the accumulation (which follows the 8 default ranks)."""
    cfg = run_config(parse_args(["--pretrain", "m"]))
    assert cfg.loss.surrogate == SurrogateConfig()
    assert cfg.kl == KLPenalty(init_coef=0.01, target=None, horizon=10000)  # has no defaults of its own
    assert cfg.rollout == RolloutConfig()
    assert cfg.experience == ExperienceConfig()
    assert cfg.actor_optim == replace(OptimConfig(learning_rate=1e-6), grad_accum_steps=128 // (4 * 8))
    assert cfg.critic_optim == replace(cfg.actor_optim, learning_rate=9e-6)


def test_derived_values_are_derived_once():
    cfg = run_config(parse_args(["--pretrain", "m", "--max_len", "512", "--eps_clip", "0.1", "--partial_rollout",
                                 "--async_train"]))  # fmt: skip
    assert (cfg.loss.surrogate.clip_eps_low, cfg.loss.surrogate.clip_eps_high) == (0.1, 0.1)
    assert cfg.rollout.max_new_tokens == 511  # unset 1024, capped by the context
    assert cfg.loop.partial_rollout_chunk == 256  # a quarter of the unset 1024
    assert cfg.engines.count == 1 and cfg.engines.sync_backend == "nccl"
    asym = run_config(parse_args(["--pretrain", "m", "--eps_clip_low_high", "0.2", "0.28", "--vllm_sync_with_ray"]))
    assert (asym.loss.surrogate.clip_eps_low, asym.loss.surrogate.clip_eps_high) == (0.2, 0.28)
    assert asym.engines.sync_backend == "object_store"


@pytest.mark.parametrize(
    "argv, message",
    [
        pytest.param(["--kl_target", "-1"], "--kl_target and --kl_horizon must be > 0", id="kl-target"),
        pytest.param(["--init_kl_coef", "-0.1"], "--init_kl_coef must be >= 0, got -0.1", id="kl-coef"),
        pytest.param(["--dual_clip", "0.5"], "--dual_clip must be > 1.0", id="dual-clip"),
        pytest.param(["--vllm_num_engines", "0"], "--vllm_num_engines must be >= 1, got 0", id="engines"),
        pytest.param(["--vllm_sync_bucket_mb", "0"], "--vllm_sync_bucket_mb must be > 0", id="bucket"),
    ],
)
def test_a_section_check_is_one_line_naming_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and err.count("\n") == 1, err


def test_no_effect_flags_say_so_in_help():
    helps = {a.dest: a.help for a in build_parser()._actions}
    assert all(f"(no effect: {why})" in helps[dest] for dest, why in NO_EFFECT.items())


def test_the_is_benchmark_builds_the_config_the_command_line_gives(tmp_path):
    """compare_is_correction.py varies typed sections instead of argv strings; the result is the config of
    the equivalent command line (embedded presets written out, plus the condition's flags)."""
    from studies.compare_is_correction import base_config, run_config_for

    preset = []
    for dest, value in EMBEDDED.items():
        if dest not in ("enable_vllm_is_correction", "vllm_is_correction_type", "vllm_dtype", "max_samples"):
            preset += [f"--{dest}", *map(str, value if isinstance(value, list) else [value])]
    common = ["--pretrain", "m", "--seed", "3", "--max_samples", str(32 * 10), "--save_path", str(tmp_path)]
    cases = {
        ("reinforce_pro", "bf16"): ["--enable_vllm_is_correction", "--vllm_is_correction_type", "reinforce_pro",
                                    "--vllm_dtype", "bfloat16"],
        ("none", "stale2"): ["--vllm_dtype", "float32", "--rollout_staleness", "2"],
        ("icepop", "async2"): ["--enable_vllm_is_correction", "--vllm_is_correction_type", "icepop",
                               "--vllm_dtype", "float32", "--async_train", "--async_queue_size", "2"],
    }  # fmt: skip
    base = base_config("m", seed=3, steps=10)
    for (correction, condition), flags in cases.items():
        want = run_config(parse_args(preset + common + flags))
        assert run_config_for(base, correction, condition, tmp_path) == want, (correction, condition)


def test_each_flag_is_one_field_and_the_parser_is_built_from_the_fields():
    """A flag's spellings, type, default, choices, help and bounds live on one field of a flag section;
    the parser, the dotted table and the refused / no-effect lists are derived from the fields, so a default
    or an alias cannot drift from its declaration."""
    from reinforce_pro.cli.args import flag_fields, option_strings
    from reinforce_pro.cli.spellings import DOTTED

    parser = build_parser()
    fields = flag_fields()
    assert {f.name for _, f, _, _ in fields} == _dests() - {"preset"}
    for _, f, spec, _ in fields:
        action = parser._option_string_actions[option_strings(f.name, spec)[0]]
        assert (action.dest, action.default, action.help.startswith(spec.help)) == (f.name, f.default, True)
        assert set(option_strings(f.name, spec)) <= set(action.option_strings)
    assert DOTTED["zero_stage"] == "ds.zero_stage" and DOTTED["ref_reward_offload"] == ("ref.offload", "reward.offload")
    assert "adam_eps" not in DOTTED  # dotted-only (--actor.adam.eps): no flat flag to pair with


def test_every_config_that_declares_a_flag_is_read_by_the_parser():
    """A flag declared on a config reaches the parser only through cli/args.py's CARRIED: a config of the package
    that declares one and is not listed would be a flag no command line can give. The configs the builders fill
    by name are the ones listed."""
    import ast
    from pathlib import Path

    from reinforce_pro.cli.args import CARRIED, GROUPS

    package = Path(__file__).resolve().parents[1] / "reinforce_pro"
    declaring = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(s, ast.AnnAssign) and isinstance(s.value, ast.Call) and ast.unparse(s.value.func) == "flag"
                for s in node.body
            ):
                declaring.add(node.name)
    # a --help group whose flags all live on a config (distillation's) is a section without fields of its own
    listed = {cls.__name__ for cls in (*CARRIED, *GROUPS.values()) if dataclasses.fields(cls)}
    assert declaring == listed and len(declaring) == 21
    filled = {cls.__name__ for b in SECTIONS.values() for cls in getattr(b, "fills", ())}
    assert filled | {"Data"} == {cls.__name__ for cls in CARRIED}


def _outside(spec) -> str:
    if spec.finite:
        return "nan"
    return str(spec.at_least - 1 if spec.at_least is not None else spec.above)


def test_every_declared_bound_ends_a_command_line_in_one_line(capsys):
    """Bounds declared on a field (at_least / above / finite) are checked for every flag that declares them,
    before any combination check, with the flag's name in the message."""
    from reinforce_pro.cli.args import flag_fields

    bounded = [(f.name, spec) for _, f, spec, _ in flag_fields() if spec.at_least is not None or spec.above is not None]
    assert len(bounded) >= 25
    for name, spec in bounded:
        with pytest.raises(SystemExit):
            parse_args(["--pretrain", "m", f"--{name}", _outside(spec)])
        err = capsys.readouterr().err
        assert f"--{name} must be " in err and err.count("\n") == 1, (name, err)


@pytest.mark.parametrize(
    "flags, loads_them",
    [
        (["--param_dtype", "fp32", "--vllm_dtype", "bfloat16"], True),  # the embedded default: a sync casts the same
        (["--param_dtype", "bf16"], True),  # auto: a bf16 engine, as the policy holds them
        (["--param_dtype", "bf16", "--vllm_dtype", "float32"], False),  # the policy rounded them to bf16
        (["--param_dtype", "bf16", "--vllm_dtype", "bfloat16", "--vllm_quantization", "fp8_per_channel"], False),
    ],
)
def test_the_first_weight_sync_is_skipped_only_where_the_engines_load_what_it_would_send(flags, loads_them):
    """Engines a run starts from the policy's checkpoint skip the sync before the first step (2.8 s of
    SmolLM2's start) only where the policy holds exactly what they loaded."""
    from reinforce_pro.run.start import engines_load_policy_weights

    assert engines_load_policy_weights(run_config(parse_args(["--pretrain", "m", *flags]))) is loads_them


def test_dialogue_records_cannot_be_an_agents_held_out_set(tmp_path):
    """--eval_dataset of dialogue records (a list of turns) with --agent_func_path is refused by name: a dialogue
    trains a row per target turn and has no one score for an agent's episode."""
    from types import SimpleNamespace

    from reinforce_pro.run.sources import eval_set

    path = tmp_path / "held_out.jsonl"
    dialogue = {"input": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}], "label": "x"}
    path.write_text(json.dumps(dialogue) + "\n")
    argv = ["--pretrain", "m", "--agent_func_path", "examples/python/agent_calculator_openai.py", "--eval_dataset",
            str(path), "--label_key", "label"]  # fmt: skip
    cfg = run_config(parse_args(argv))
    plan = SimpleNamespace(task=None, agent_cls=object())
    with pytest.raises(ValueError, match="dialogue records .* cannot be evaluated with --agent_func_path"):
        eval_set(cfg, plan, tokenizer=None, source=object())
    plain = {"input": "2+2=", "label": "4"}
    path.write_text(json.dumps(plain) + "\n")
    assert eval_set(cfg, plan, tokenizer=None, source="the source").prompts == [{"prompt": "2+2=", "label": "4"}]
