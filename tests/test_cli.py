"""train_ppo_ray's command line: every reference flag recognised, dotted aliases, bad input -> one line + exit 2."""

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from reinforce_pro.cli.args import UNSUPPORTED, build_parser
from reinforce_pro.cli.flags_to_config import run_config
from reinforce_pro.cli.presets import EMBEDDED
from reinforce_pro.cli.train_ppo_ray import main, parse, parse_args

# OpenRLHF v0.9.10's flat flags (tests/data/openrlhf/SOURCE.md says where the list comes from).
REFERENCE = Path(__file__).parent / "data" / "openrlhf" / "flat-0.9.10-train_ppo_ray-flags.tsv"


def reference_flags() -> list[dict]:
    lines = REFERENCE.read_text().splitlines()
    header = lines[0].split("\t")
    rows = []
    for line in lines[1:]:
        cells = line.split("\t")
        rows.append(dict(zip(header, cells + [""] * (len(header) - len(cells)), strict=True)))
    return rows


def sample_argv(row: dict) -> list[str]:
    """A well-typed value for a flag of the reference list."""
    flag, typ, nargs, choices = row["flag"], row["type"], row["nargs"], row["choices"]
    if not typ:
        return [flag]
    value = {"int": "3", "float": "0.7", "str": "x"}[typ]
    if choices:
        value = choices.strip("[]").split(",")[-1].strip().strip("'")
    count = 2 if nargs == "2" else 1
    return [flag] + [value] * count


def test_reference_list_has_141_flags_and_parser_defines_all():
    rows = reference_flags()
    assert len(rows) == 141
    options = {o for a in build_parser()._actions for o in a.option_strings}
    assert [r["flag"] for r in rows if r["flag"] not in options] == []


def test_every_reference_flag_is_recognised(capsys):
    """Each flag parses, or stops with a validation message naming something other than an unknown flag."""
    for row in reference_flags():
        argv = sample_argv(row)
        try:
            parse_args(argv)
        except SystemExit as e:
            err = capsys.readouterr().err
            assert e.code == 2, (argv, err)
            assert "unrecognized arguments" not in err and "invalid choice" not in err, (argv, err)
            assert err.count("\n") == 1, (argv, err)  # one line
            if row["flag"][2:] in UNSUPPORTED:
                assert "is recognised but not supported by reinforce_pro" in err, (argv, err)


@pytest.mark.parametrize(
    "dotted, flat",
    [
        (["--algo.advantage.is_correction_enable"], ["--enable_vllm_is_correction"]),
        (["--algo.advantage.is_correction_type", "icepop"], ["--vllm_is_correction_type", "icepop"]),
        (["--algo.advantage.is_correction_threshold", "0.7", "3.0"], ["--vllm_is_truncated_threshold", "0.7", "3.0"]),
    ],
)
def test_dotted_aliases_set_the_same_values(dotted, flat):
    a, b = vars(parse_args(dotted)), vars(parse_args(flat))
    a.pop("wandb_run_name"), b.pop("wandb_run_name")
    assert a == b


def test_reinforce_pro_is_a_correction_choice():
    args = parse_args(["--vllm_is_correction_type", "reinforce_pro", "--enable_vllm_is_correction"])
    assert args.vllm_is_correction_type == "reinforce_pro"


def test_embedded_default_presets_only_fill_what_was_not_given():
    args = parse_args([])
    assert args.preset == "embedded"
    for dest, value in EMBEDDED.items():
        assert getattr(args, dest) == value, dest
    args = parse_args(["--actor_learning_rate", "1e-6", "--n_samples_per_prompt", "4", "--train_batch_size", "128"])
    assert args.actor_learning_rate == 1e-6 and args.n_samples_per_prompt == 4
    assert args.vllm_is_correction_type == "reinforce_pro"  # still preset
    # the main job's warm start stops at a greedy accuracy, not a step count (its jump moves with seed and host);
    # self-play's and the scratchpad's run their steps
    assert (parse_args([]).sft_warmup_target, parse_args([]).sft_warmup_steps) == (0.2, 600)
    assert parse_args(["--absolute_zero"]).sft_warmup_target == 0.0
    assert parse_args(["--builtin_task", "scratchpad"]).sft_warmup_target == 0.0
    dotted = parse_args(["--actor.adam.lr", "1e-6", "--rollout.n_samples_per_prompt", "4", "--train_batch_size", "128"])
    assert (dotted.actor_learning_rate, dotted.n_samples_per_prompt) == (1e-6, 4)  # given wins in either spelling
    assert parse_args(["--pretrain", "some/model", "--remote_rm_url", "r.py"]).preset is None
    assert parse_args(["--pretrain", "some/model", "--remote_rm_url", "r.py"]).rollout_batch_size == 1024


@pytest.mark.parametrize(
    "argv, message",
    [
        pytest.param(["--vllm_is_truncated_threshold", "5", "0.5"], "0 <= low < high, got [5.0, 0.5]", id="threshold"),
        pytest.param(["--train_batch_size", "100"], "multiple of --train_batch_size 100", id="batch-divides"),
        pytest.param(["--micro_train_batch_size", "48"], "multiple of --micro_train_batch_size 48", id="micro"),
        pytest.param(
            ["--load_in_4bit"], "--load_in_4bit / --ds.load_in_4bit is recognised but not supported", id="unsupported"
        ),
        pytest.param(["--lora_rank", "-1"], "--lora_rank must be >= 0, --lora_alpha > 0", id="lora-rank"),
        pytest.param(
            ["--lora_rank", "8", "--lora_dropout", "1"], "--lora_dropout in [0, 1), got 8 / 16 / 1.0", id="lora-drop"
        ),
        pytest.param(
            ["--lora_save_merged"], "--lora_save_merged merges a LoRA adapter: add --lora_rank", id="lora-merged"
        ),
        pytest.param(["--n_samples_per_prompt", "1", "--train_batch_size", "32"], "must be >= 2", id="group-n"),
        pytest.param(["--gamma", "0.9"], "needs --gamma 1", id="group-gamma"),
        pytest.param(["--dual_clip", "0.5"], "--dual_clip must be > 1", id="dual-clip"),
        pytest.param(["--async_train", "--async_queue_size", "0"], "--async_queue_size must be >= 1", id="async-q"),
        pytest.param(["--async_train", "--rollout_staleness", "1"], "use it or --async_train", id="async-stale"),
        pytest.param(["--partial_rollout"], "--partial_rollout continues rollouts across weight syncs", id="partial"),
        pytest.param(
            ["--partial_rollout", "--rollout_staleness", "1", "--agent_func_path", "a.py"],
            "agents need --async_train",
            id="partial-stale-agent",
        ),
        pytest.param(
            ["--async_train", "--partial_rollout", "--partial_rollout_chunk", "0"], "must be >= 1", id="partial-chunk"
        ),
        pytest.param(["--max_new_tokens", "0"], "--max_new_tokens must be >= 1, got 0", id="new-tokens"),
        pytest.param(["--min_new_tokens", "-1"], "--min_new_tokens must be >= 0, got -1", id="min-tokens"),
        pytest.param(
            ["--max_new_tokens", "8", "--min_new_tokens", "9"], "exceeds the response budget of 8", id="min-above-max"
        ),
        pytest.param(
            ["--async_train", "--partial_rollout", "--min_new_tokens", "4"], "applies to whole prompt", id="min-chunks"
        ),
        pytest.param(["--actor_learning_rate", "nan"], "--actor_learning_rate must be a finite", id="lr-nan"),
        pytest.param(["--critic_learning_rate", "-1"], "--critic_learning_rate must be a finite", id="lr-neg"),
        pytest.param(["--reward_clip_range", "10", "-10"], "LOW < HIGH, got 10.0 -10.0", id="clip-range"),
        pytest.param(["--input_template", "Q: {} A: {}"], "exactly one {} placeholder", id="template-two"),
        pytest.param(["--input_template", "Q: {q}"], "KeyError", id="template-named"),
        pytest.param(["--input_template", "no placeholder"], "exactly one {} placeholder", id="template-none"),
        pytest.param(["--rollout_batch", "8"], "unrecognized arguments: --rollout_batch", id="no-abbrev"),
        pytest.param(["--prompt_data", "x.jsonl"], "needs a reward", id="no-reward"),
        pytest.param(["--vllm_is_correction_type", "mis"], "invalid choice", id="choice"),
        pytest.param(["--absolute_zero", "--n_questions_per_prompt", "0"], "must be >= 1, got 0", id="az-questions"),
        pytest.param(["--absolute_zero", "--max_repropose_attempts", "-1"], "must be >= 0", id="az-attempts"),
        pytest.param(["--absolute_zero", "--selfplay_reference_buffer", "-1"], "must be >= 0", id="az-buffer"),
        pytest.param(["--absolute_zero", "--proposer_train_scope", "all"], "invalid choice", id="az-scope"),
        pytest.param(["--absolute_zero", "--proposer_reward", "hardest"], "invalid choice", id="az-proposer-reward"),
        pytest.param(
            ["--absolute_zero", "--n_samples_per_prompt", "1", "--advantage_estimator", "reinforce"],
            "judges learnability from several solver responses",
            id="az-rollout-n",
        ),
        pytest.param(["--absolute_zero", "--remote_rm_url", "r.py"], "scores with its task", id="az-reward"),
        pytest.param(["--temperature", "0"], "--temperature must be > 0, got 0.0", id="temperature"),
        pytest.param(["--top_p", "1.5"], "--top_p must be in (0, 1], got 1.5", id="top-p-high"),
        pytest.param(["--top_p", "0"], "--top_p must be in (0, 1], got 0.0", id="top-p-zero"),
        pytest.param(["--vllm_num_engines", "0"], "--vllm_num_engines must be >= 1", id="engines"),
        pytest.param(["--rollout_batch_size", "0"], "--rollout_batch_size must be >= 1, got 0", id="rollout-bs"),
        pytest.param(["--n_samples_per_prompt", "0"], "--n_samples_per_prompt must be >= 1, got 0", id="n-zero"),
        pytest.param(["--num_episodes", "0"], "--num_episodes must be >= 1, got 0", id="episodes"),
        pytest.param(["--max_epochs", "0"], "--max_epochs must be >= 1, got 0", id="epochs"),
        pytest.param(["--max_len", "0"], "--max_len must be >= 1, got 0", id="max-len"),
        pytest.param(["--prompt_max_len", "-3"], "--prompt_max_len must be >= 1, got -3", id="prompt-max-len"),
        pytest.param(["--vllm_tensor_parallel_size", "0"], "--vllm_tensor_parallel_size must be >= 1", id="tp"),
        pytest.param(["--actor_num_nodes", "0"], "--actor_num_nodes must be >= 1, got 0", id="nodes"),
        pytest.param(["--rollout_staleness", "-1"], "--rollout_staleness must be >= 0, got -1", id="staleness"),
        pytest.param(["--max_ckpt_num", "0"], "--max_ckpt_num must be >= 1, got 0", id="ckpt-num"),
        pytest.param(["--max_ckpt_mem", "0"], "--max_ckpt_mem must be > 0", id="ckpt-mem"),
        pytest.param(["--logging_steps", "0"], "--logging_steps must be >= 1, got 0", id="logging-steps"),
        pytest.param(["--eval_n_samples_per_prompt", "0"], "--eval_n_samples_per_prompt must be >= 1", id="eval-n"),
        pytest.param(["--eval_temperature", "-1"], "--eval_temperature must be >= 0, got -1.0", id="eval-temp"),
        pytest.param(["--eval_steps", "5"], "--eval_steps / --eval_before_training need --eval_dataset", id="eval"),
        pytest.param(
            ["--dynamic_filtering_reward_range", "1", "0"], "must satisfy LOW < HIGH, got 1.0 0.0", id="filter-range"
        ),
        pytest.param(["--remote_rm_url", "r.py", "--reward_pretrain", "d"], "not both", id="two-rewards"),
        pytest.param(["--train_batch_size", "abc"], "invalid int value: 'abc'", id="not-an-int"),
        pytest.param(["--actor_learning_rate", "fast"], "invalid float value: 'fast'", id="not-a-float"),
        pytest.param(
            ["--vllm_is_truncated_threshold", "0.1", "0.5", "5"],
            "takes HIGH or LOW HIGH, got 3 values",
            id="threshold-three-values",
        ),  # fmt: skip
        pytest.param(
            ["--vllm_is_correction_args", "delta"],
            "takes KEY=VALUE with a number as VALUE, got 'delta'",
            id="correction-args",
        ),  # fmt: skip
        pytest.param(
            ["--vllm_is_correction_type", "cppo", "--vllm_is_correction_args", "delt=1"],
            "cppo has no setting delt",
            id="correction-arg-name",
        ),  # fmt: skip
        pytest.param(
            ["--algo.advantage.is_correction_level", "seq", "--algo.advantage.is_correction_mode", "clip"],
            "is_correction_mode clip requires is_correction_level token",
            id="openrlhf-seq-clip",
        ),  # fmt: skip
        pytest.param(
            ["--algo.advantage.is_correction_level", "token", "--algo.advantage.is_correction_gating", "tv"],
            "gates a divergence, which takes an upper bound only",
            id="openrlhf-tv-band",
        ),  # fmt: skip
        pytest.param(
            ["--algo.advantage.is_correction_level", "token", "--vllm_is_correction_type", "kpop"],
            "selects icepop, and --vllm_is_correction_type / _path kpop: give one",
            id="two-corrections",
        ),
        pytest.param(["--advantage_estimator", "ppo"], "invalid choice: 'ppo'", id="estimator"),
        pytest.param(["--reward_nan_policy", "skip"], "invalid choice: 'skip'", id="nan-policy"),
        pytest.param(["--absolute_zero", "--dynamic_filtering"], "has its own filter (learnability)", id="az-filter"),
        pytest.param(["--colocate_all_models", "--vllm_num_engines", "2"], "at most the policy ranks", id="colocate"),
        pytest.param(
            [
                "--colocate_all_models",
                "--actor_num_gpus_per_node",
                "3",
                "--vllm_tensor_parallel_size",
                "2",
                "--micro_train_batch_size",
                "1",
                "--train_batch_size",
                "3",
                "--rollout_batch_size",
                "3",
            ],
            "--vllm_tensor_parallel_size must divide --actor_num_gpus_per_node",
            id="colocate-tp",
        ),
        pytest.param(["--ring_attn_size", "2"], "--ring_attn_size 2 must divide the 1 policy ranks", id="ring-ranks"),
        pytest.param(
            ["--ring_attn_size", "2", "--actor_num_gpus_per_node", "2"], "add --packing_samples", id="ring-packing"
        ),
        pytest.param(["--not_a_flag", "1"], "unrecognized arguments: --not_a_flag 1", id="unknown"),
        pytest.param(
            ["--vllm_quantization", "fp8_per_channel", "--vllm_dtype", "float32"],
            "--vllm_quantization fp8_per_channel needs --vllm_dtype bfloat16 or float16, got float32",
            id="fp8-engine-dtype",
        ),
        pytest.param(
            ["--overlong_buffer_len", "64", "--max_new_tokens", "32"],
            "must be in (0, --max_new_tokens 32]",
            id="overlong",
        ),
        pytest.param(
            ["--overlong_penalty_factor", "-1"], "--overlong_penalty_factor must be >= 0", id="overlong-factor"
        ),
        pytest.param(
            ["--stop_properly_penalty_coef", "1.5"], "--stop_properly_penalty_coef must be <= 1", id="stop-coef"
        ),
        pytest.param(
            ["--absolute_zero", "--n_questions_per_prompt", "1"],
            "compares proposer rows within a group of 1 (--n_questions_per_prompt)",
            id="az-proposer-group",
        ),
    ],
)
def test_bad_flag_values_exit_2_with_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2
    assert message in err
    assert err.count("\n") == 1 and err.startswith("train_ppo_ray: error:")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    pytest.importorskip("transformers")
    from reinforce_pro.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))


def _main_error(argv, capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("train_ppo_ray: error:"), err
    return err


def test_a_broken_correction_file_is_one_line_before_ray(tmp_path, capsys):
    path = tmp_path / "mine.py"
    path.write_text("def correction(inp):\n    return inp.ratio\n")
    with pytest.raises(SystemExit) as e:
        main(["--enable_vllm_is_correction", "--vllm_is_correction_path", str(path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert f"--vllm_is_correction_path {path}: correction must return (weights, keep, metrics), got Tensor" in err


def test_max_len_beyond_the_model(tiny_model, tmp_path, capsys):
    argv = ["--pretrain", tiny_model, "--max_len", "4096", "--save_path", str(tmp_path / "run")]
    assert "--max_len 4096 exceeds the model's max_position_embeddings 256" in _main_error(argv, capsys)


def test_max_len_shorter_than_the_prompts(tiny_model, tmp_path, capsys):
    argv = ["--pretrain", tiny_model, "--max_len", "4", "--prompt_max_len", "64", "--save_path", str(tmp_path / "r")]
    err = _main_error(argv, capsys)
    assert "tokens (after --prompt_max_len 64), leaving no room for a response in --max_len 4" in err


def test_a_reward_function_failing_mid_run_is_one_line(tmp_path, capsys, monkeypatch):
    from reinforce_pro.rewards.loader import RewardFileError
    from reinforce_pro.run import driver, prepare

    def failing(cfg, plan):
        raise RewardFileError("step 3: reward_func raised ZeroDivisionError: division by zero")

    monkeypatch.setattr(prepare, "prepare", lambda cfg: SimpleNamespace(run_dir=tmp_path))
    monkeypatch.setattr(driver, "build_and_fit", failing)
    args = parse_args(["--remote_rm_url", "r.py", "--pretrain", "m", "--save_path", str(tmp_path)])
    assert driver.train(run_config(args)) == 2
    err = capsys.readouterr().err
    assert (
        err == "train_ppo_ray: error: --remote_rm_url r.py: step 3: reward_func raised ZeroDivisionError: "
        "division by zero\n"
    )


def test_an_agent_whose_every_episode_fails_is_one_line(tmp_path, capsys, monkeypatch):
    from reinforce_pro.agents.contract import AgentFileError
    from reinforce_pro.run import driver, prepare

    why = "--agent_func_path a.py: step 2: all 32 episodes of the step failed; the first: run_agent raised KeyError"

    def failing(cfg, plan):
        raise AgentFileError(why)

    monkeypatch.setattr(prepare, "prepare", lambda cfg: SimpleNamespace(run_dir=tmp_path))
    monkeypatch.setattr(driver, "build_and_fit", failing)
    args = parse_args(["--agent_func_path", "a.py", "--pretrain", "m", "--save_path", str(tmp_path)])
    assert driver.train(run_config(args)) == 2
    assert capsys.readouterr().err == f"train_ppo_ray: error: {why}\n"


def test_missing_model_path(tmp_path, capsys):
    err = _main_error(["--pretrain", str(tmp_path / "nope"), "--save_path", str(tmp_path / "run")], capsys)
    assert "nope: not a local HF model directory" in err


@pytest.mark.parametrize("where", ["is-a-file", "under-a-file"])
def test_save_path_that_cannot_be_a_directory(tmp_path, capsys, where):
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    save = blocker if where == "is-a-file" else blocker / "run"
    err = _main_error(["--save_path", str(save)], capsys)
    assert f"--save_path {save}: {blocker} is a file, not a directory" in err


@pytest.mark.parametrize("flag", ["--save_path", "--ckpt_path"])
def test_output_dir_the_kernel_refuses_is_one_line(tmp_path, capsys, flag):
    """/proc passes a permission check as root, but no directory can be made there."""
    argv = ["--save_path", str(tmp_path / "run"), "--save_steps", "5", flag, "/proc/rp_run"]
    err = _main_error(argv, capsys)
    assert f"{flag} /proc/rp_run: cannot create a directory and write in it" in err
    assert not (tmp_path / "run").exists()


def test_ckpt_path_under_a_file(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    argv = ["--save_path", str(tmp_path / "run"), "--save_steps", "5", "--ckpt_path", str(tmp_path / "f" / "ckpt")]
    assert "--ckpt_path" in _main_error(argv, capsys) and not (tmp_path / "run").exists()


def test_pretrain_with_a_garbage_config(tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_bytes(b"\xff{not json")
    err = _main_error(["--pretrain", str(model), "--save_path", str(tmp_path / "run")], capsys)
    assert f"--pretrain {model}: config.json is not valid JSON" in err


GOOD_REWARD = "def reward_func(queries, prompts, labels):\n    return [0.0] * len(queries)\n"


def _run_with_files(tiny_model, tmp_path, capsys, prompts: str, reward: str) -> tuple[str, str]:
    """main() on a jsonl and a reward file with these contents; returns (error line, data path)."""
    data, reward_file = tmp_path / "prompts.jsonl", tmp_path / "reward.py"
    data.write_text(prompts)
    reward_file.write_text(reward)
    argv = ["--pretrain", tiny_model, "--prompt_data", str(data), "--remote_rm_url", str(reward_file)]
    return _main_error(argv + ["--save_path", str(tmp_path / "run")], capsys), str(data)


def test_malformed_jsonl_names_the_line(tiny_model, tmp_path, capsys):
    err, data = _run_with_files(tiny_model, tmp_path, capsys, '{"input": "1+1="}\n{"input": "2+2=",\n', GOOD_REWARD)
    assert f"{data}:2: not valid JSON" in err


@pytest.mark.parametrize(
    "name, content, message",
    [
        pytest.param("p.json", b'[{"input": "1+1="},', ":1: not valid JSON", id="json-malformed"),
        pytest.param("p.json", b"[1, 2, 3]", "item 0 is a int, expected a JSON object", id="json-list-of-ints"),
        pytest.param("p.json", b'{"input": "1+1="}', "expected a JSON list of objects, got dict", id="json-object"),
        pytest.param("p.jsonl", b'{"input": "caf\xe9"}\n', "not UTF-8 text (byte 14", id="jsonl-latin1"),
        pytest.param("p.json", b"\xff\xfe[]", "not UTF-8 text (byte 0", id="json-utf16-bom"),
    ],
)
def test_bad_prompt_files_are_one_line(tiny_model, tmp_path, capsys, name, content, message):
    data, reward_file = tmp_path / name, tmp_path / "reward.py"
    data.write_bytes(content)
    reward_file.write_text(GOOD_REWARD)
    argv = ["--pretrain", tiny_model, "--prompt_data", str(data), "--remote_rm_url", str(reward_file)]
    assert f"{data}" in (err := _main_error(argv + ["--save_path", str(tmp_path / "run")], capsys))
    assert message in err


def test_reward_file_without_reward_func(tiny_model, tmp_path, capsys):
    err, _ = _run_with_files(tiny_model, tmp_path, capsys, '{"input": "1+1="}\n', "def score(x):\n    return 1\n")
    assert "defines no callable reward_func" in err


def test_missing_prompt_data(tiny_model, tmp_path, capsys):
    reward = tmp_path / "reward.py"
    reward.write_text("def reward_func(q, p, l):\n    return [0.0] * len(q)\n")
    argv = ["--pretrain", tiny_model, "--prompt_data", str(tmp_path / "none.jsonl"), "--remote_rm_url", str(reward)]
    err = _main_error(argv + ["--save_path", str(tmp_path / "run")], capsys)
    assert "none.jsonl: no such file or directory" in err


def test_module_entry_point_exits_2_without_traceback():
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, "-m", "reinforce_pro.cli.train_ppo_ray", "--vllm_is_truncated_threshold", "2", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "train_ppo_ray: error: --vllm_is_truncated_threshold must satisfy 0 <= low < high, got [2.0, 1.0]"
    ]


def test_absolute_zero_embedded_default():
    from reinforce_pro.cli.presets import EMBEDDED_SELFPLAY

    args = parse_args(["--absolute_zero"])
    assert args.preset == "embedded-selfplay"
    for dest, value in EMBEDDED_SELFPLAY.items():
        assert getattr(args, dest) == value, dest
    assert args.proposer_train_scope == "group" and args.rollout_batch_size == 16
    assert parse_args(["--absolute_zero", "--proposer_train_scope", "sampled"]).proposer_train_scope == "sampled"


def test_selfplay_task_file_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "task.py"
    bad.write_text("raise RuntimeError('boom')\n")
    argv = ["--absolute_zero", "--selfplay_task_path", str(bad), "--save_path", str(tmp_path / "run")]
    assert "importing it failed: RuntimeError: boom" in _main_error(argv, capsys)
    no_refs = tmp_path / "no_refs.py"
    no_refs.write_text(
        "from reinforce_pro.selfplay.tasks import SelfPlayTask\n"
        "class T(SelfPlayTask):\n    name = 'plain'\n    thresholds = {'completion': (1.0, 0.1, 0.9)}\n"
        "    weights = {'completion': 1.0}\n"
        "    def proposer_prompt(self, r): return ''\n    def parse_question(self, t): return None\n"
        "    def solver_prompt(self, q): return ''\n    def score(self, q, r, judge=None): return None\n"
        "TASK = T()\n"
    )
    argv = ["--absolute_zero", "--selfplay_task_path", str(no_refs), "--selfplay_reference_buffer", "8",
            "--save_path", str(tmp_path / "run2")]  # fmt: skip
    assert "task plain defines no reference_record(question)" in _main_error(argv, capsys)
    with pytest.raises(SystemExit) as e:  # the choices come from BUILTIN_TASKS
        main(["--absolute_zero", "--selfplay_task", "chess"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "invalid choice: 'chess'" in err and "'code_output'" in err
    graded = run_config(parse_args(["--absolute_zero", "--proposer_reward", "difficulty"]))
    assert graded.selfplay.config.proposer_reward == "difficulty"


SCRIPTS_DIR = Path(__file__).resolve().parents[1] / "examples" / "scripts"
ALL_SCRIPTS = sorted(SCRIPTS_DIR.glob("*.sh"))
RECIPES = [s for s in ALL_SCRIPTS if not s.name.startswith("_")]


@pytest.mark.parametrize("script", ALL_SCRIPTS, ids=[s.name for s in ALL_SCRIPTS])
def test_example_scripts_are_valid_bash(script):
    subprocess.run(["bash", "-n", str(script)], check=True)


def _stub_bin(tmp_path: Path) -> tuple[Path, Path]:
    """A bin directory of stubs: `python`/`ray` record their arguments (one per line, then a blank line);
    `scontrol`/`srun` answer like a two-node SLURM allocation; `ray status` lists two nodes."""
    bin_dir, record = tmp_path / "bin", tmp_path / "calls.txt"
    bin_dir.mkdir()
    stubs = {
        "python": f"printf '%s\\n' \"$@\" >> {record}; echo >> {record}",
        "ray": f'if [ "$1" = status ]; then echo node_1; echo node_2; exit 0; fi\n'
        f"printf '%s\\n' \"$@\" >> {record}; echo >> {record}",
        "scontrol": "echo node-a; echo node-b",
        "srun": 'case "$*" in *hostname*) echo 10.0.0.1 ;; esac',
    }
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir, record


@pytest.mark.parametrize("script", RECIPES, ids=[s.name for s in RECIPES])
def test_example_scripts_pass_valid_flags(script, tmp_path):
    """Run each recipe with stub python / ray / SLURM commands that record their arguments, then give the
    train_ppo_ray arguments to parse_args: every flag a script passes must parse and validate."""
    bin_dir, record = _stub_bin(tmp_path)
    env = {
        **os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": str(bin_dir / "python"),
        "RAY": str(bin_dir / "ray"), "OUT": str(tmp_path / "out"), "MODEL": str(tmp_path / "model"),
        "DATA": str(tmp_path / "data.jsonl"), "SLURM_JOB_NODELIST": "node-[a-b]", "RAY_START_WAIT": "0",
        "RAY_POLL_S": "0",
    }  # fmt: skip
    # no check: a script may verify the run's outputs afterwards, which the stubs do not write
    subprocess.run(["bash", str(script)], env=env, timeout=60, capture_output=True, cwd=SCRIPTS_DIR.parents[1])
    calls = [c.split("\n") for c in record.read_text().split("\n\n") if c.strip()]
    runs = [
        c[c.index("reinforce_pro.cli.train_ppo_ray") + 1 :] for c in calls if "reinforce_pro.cli.train_ppo_ray" in c
    ]
    assert len(runs) == 1, calls
    args = parse_args(runs[0])
    assert args.save_path == str(tmp_path / "out")
    submitted = [c for c in calls if c[:2] == ["job", "submit"]]
    if script.name.endswith("_ray.sh") or script.name.startswith("slurm"):
        assert submitted and "--address=http://127.0.0.1:8265" in submitted[0]
        assert args.enable_vllm_is_correction and args.vllm_is_truncated_threshold == [0.5, 5.0]


def test_a_failed_start_leaves_no_run_directory(tmp_path, capsys):
    """The embedded default builds base_model/ before the prompts are checked; a bad prompt file must not
    leave that half-made directory behind (a rerun would find it)."""
    bad = tmp_path / "prompts.jsonl"
    bad.write_text('{"input": "1+1=", "label": "2"}\nnot json\n')
    reward = tmp_path / "r.py"
    reward.write_text("def reward_func(queries, prompts, labels):\n    return [0.0] * len(queries)\n")
    run_dir = tmp_path / "runs" / "new"
    argv = ["--prompt_data", str(bad), "--remote_rm_url", str(reward), "--save_path", str(run_dir)]
    assert "prompts.jsonl:2: not valid JSON" in _main_error(argv, capsys)
    assert not (tmp_path / "runs").exists()
    late = ["--max_len", "4096", "--sft_warmup_steps", "0", "--save_path", str(run_dir)]  # fails after base_model/
    assert "exceeds the model's max_position_embeddings" in _main_error(late, capsys)
    assert not (tmp_path / "runs").exists()
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    _main_error([*argv[:4], "--save_path", str(existing)], capsys)
    assert (existing / "keep.txt").read_text() == "mine"  # a directory the user made is never removed


@pytest.mark.parametrize(
    "extra, message",
    [
        ([], "--best_metric_key picks by an eval metric: add --eval_dataset and --eval_steps"),
        (["--eval_dataset", "held.jsonl", "--eval_steps", "2", "--best_metric_key", "pass@4"], None),
        (["--eval_dataset", "held.jsonl", "--eval_steps", "2", "--best_metric_key", "eval/held/score_mean"], None),
        (["--eval_dataset", "held.jsonl", "--eval_steps", "2", "--best_metric_key", "accuracy"],
         "--best_metric_key accuracy: not an eval metric of this run (eval/held/pass@4, "),
    ],
)  # fmt: skip
def test_best_metric_key_must_name_an_eval_metric_before_anything_starts(extra, message, capsys):
    argv = ["--best_metric_key", "pass@1", *extra] if not extra else extra
    if message is None:
        assert parse_args(argv).best_metric_key == argv[-1]
        return
    with pytest.raises(SystemExit):
        parse_args(argv)
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "level, mode, gating, threshold, correction, band",
    [
        pytest.param("token", "clip", "ratio", ["0.5", "5"], "tis", (0.5, 5.0), id="token-clip"),
        pytest.param("token", "mask", "ratio", ["0.5", "5"], "icepop", (0.5, 5.0), id="token-mask"),
        pytest.param("seq", "mask", "ratio", ["0.9", "1.1"], "seq-mask-tis", (0.9, 1.1), id="seq-mask"),
        pytest.param("token", "mask", "tv", ["0.2"], "token-tv", (0.0, 0.2), id="token-tv"),
        pytest.param("token", "mask", "binary_kl", ["0", "0.1"], "token-binary-kl", (0.0, 0.1), id="token-bkl"),
        pytest.param("seq", "mask", "tv", ["0.05"], "seq-tv", (0.0, 0.05), id="seq-tv"),
        pytest.param("seq", "mask", "binary_kl", ["0.01"], "seq-binary-kl", (0.0, 0.01), id="flash-reinforce"),
        pytest.param("prefix", "mask", "ratio", ["0.5", "5"], "reinforce_pro", (0.5, 5.0), id="prefix"),
    ],
)
def test_openrlhf_0_11_2_correction_flags_select_the_same_correction(level, mode, gating, threshold, correction, band):
    """OpenRLHF 0.11.2's level / mode / gating / threshold (openrlhf/cli/train_ppo_ray.py): one value is an upper
    bound; tests/test_integrations.py checks each selected correction's loss against 0.11.2's PolicyLoss."""
    for model in (["--pretrain", "m"], []):  # a user's run, and the embedded default (its preset keeps out)
        args, cfg = parse([*model, "--algo.advantage.is_correction_level", level,
                           "--algo.advantage.is_correction_mode", mode, "--algo.advantage.is_correction_gating", gating,
                           "--algo.advantage.is_correction_threshold", *threshold])  # fmt: skip
        s = cfg.loss.surrogate
        assert (s.enable_vllm_is_correction, s.vllm_is_correction_type, s.vllm_is_truncated_threshold) == (
            True, correction, band)  # fmt: skip
    _, off = parse(["--pretrain", "m", "--algo.advantage.is_correction_level", "off"])
    assert not off.loss.surrogate.enable_vllm_is_correction


def test_openrlhf_0_11_2_loss_surface_reaches_the_loss():
    _, cfg = parse(["--pretrain", "m", "--actor.loss_agg_mode", "seq-mean-token-mean", "--algo.kl.use_loss",
                    "--algo.kl.unbiased_gradient", "--algo.advantage.estimator", "flash_reinforce"])  # fmt: skip
    assert not cfg.loss.surrogate.token_level_loss and cfg.loss.kl_unbiased_gradient and cfg.loss.use_kl_loss
    assert cfg.experience.advantage_estimator == "flash_reinforce"
    _, default = parse(["--pretrain", "m"])
    assert default.loss.surrogate.token_level_loss and not default.loss.kl_unbiased_gradient


def test_anchor_and_correction_settings_reach_the_loss_settings():
    _, cfg = parse(["--pretrain", "m", "--enable_vllm_is_correction", "--vllm_is_correction_type", "cppo",
                    "--vllm_is_correction_args", "delta=0.1", "w_min=0.5", "--vllm_is_anchor", "rollout"])  # fmt: skip
    s = cfg.loss.surrogate
    assert (s.vllm_is_correction_args, s.vllm_is_anchor) == ({"delta": 0.1, "w_min": 0.5}, "rollout")
