"""models/packaged.py: the errors a user meets before any model is read (the full SmolLM2 conversion is a
benchmark step, studies/bench_smollm2.py: it needs the `models` extra and ~40 s)."""

import pytest

from reinforce_pro.models.packaged import PackagedModel, PrepareError, main, packaged_file


def test_a_missing_package_names_the_extra_to_install():
    with pytest.raises(PrepareError, match=r"'no_such_model_pkg' is not installed: install the models extra"):
        packaged_file(PackagedModel("no_such_model_pkg", "model.gguf", "MIT"))


def test_a_package_without_the_file_says_so():
    with pytest.raises(PrepareError, match=r"no-such-file\.gguf is missing from the installed package 'pytest'"):
        packaged_file(PackagedModel("pytest", "no-such-file.gguf", "MIT"))


def test_an_incomplete_output_directory_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "config.json").write_text("{}")
    assert main(["smollm2-135m-instruct", "--out", str(tmp_path / "half")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("prepare: error: ") and "holds no complete model" in err


def test_an_unknown_model_name_lists_the_choices(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["gpt-5", "--out", "x"])
    assert exit_info.value.code == 2 and "smollm2-135m-instruct" in capsys.readouterr().err


@pytest.mark.parametrize("lora", ["0", "1"])
def test_the_smollm2_recipe_parses_in_both_variants(recipe_argv, tmp_path, lora):
    """examples/scripts/train_smollm2_cpu.sh (model preparation and task generation are recorded, not run)."""
    from reinforce_pro.cli.train_ppo_ray import parse_args

    args = parse_args(recipe_argv("train_smollm2_cpu.sh", CACHE=str(tmp_path / "cache"), LORA=lora, STEPS="3"))
    assert args.apply_chat_template and args.label_key == "entry" and args.max_samples == 12
    assert args.vllm_is_correction_type == "reinforce_pro" and args.vllm_is_truncated_threshold == [0.5, 5.0]
    assert (args.lora_rank, args.lora_save_merged) == ((16, True) if lora == "1" else (0, False))


def test_the_smollm2_tools_recipe_parses(recipe_argv, tmp_path):
    """examples/scripts/train_smollm2_tools_cpu.sh: SmolLM2 with the add function tool (model preparation and
    data generation recorded, not run)."""
    from reinforce_pro.cli.train_ppo_ray import parse_args

    args = parse_args(recipe_argv("train_smollm2_tools_cpu.sh", CACHE=str(tmp_path / "cache"), STEPS="3"))
    assert args.agent_func_path.endswith("examples/python/agent_calculator_tools.py") and args.max_samples == 12
    assert args.prompt_data == str(tmp_path / "cache" / "tasks" / "additions_999" / "train.jsonl")
    assert args.max_len >= args.prompt_max_len + args.max_new_tokens and args.vllm_is_correction_type == "reinforce_pro"


def test_the_absolute_zero_code_recipe_parses(recipe_argv, tmp_path):
    """examples/scripts/train_absolute_zero_code.sh: SmolLM2 self-play on the code task (model preparation
    recorded, not run; the run itself is measured in docs/selfplay.md)."""
    from reinforce_pro.cli.train_ppo_ray import parse_args

    args = parse_args(recipe_argv("train_absolute_zero_code.sh", CACHE=str(tmp_path / "cache"), STEPS="3", SEED="7"))
    assert args.absolute_zero and args.selfplay_task == "code_output" and args.proposer_train_scope == "group"
    assert args.pretrain == str(tmp_path / "cache" / "smollm2-135m-instruct") and args.preset is None
    assert args.max_samples == 8 * 3 and args.seed == 7 and args.eval_before_training and args.eval_steps == 5
    assert args.max_new_tokens == 128 and args.max_len >= args.prompt_max_len + args.max_new_tokens
