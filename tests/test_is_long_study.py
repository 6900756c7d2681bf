"""The long-response study's arms, configs and analysis (studies/is_long_study.py) on constructed runs."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from studies import is_long_study as study


def test_arms_run_sync_with_none_alone_and_every_correction_under_each_other_regime():
    arms = study.arms(["sync", "stale4"], ["none", "tis", "reinforce_pro"])
    assert arms == [("sync", "none"), ("stale4", "none"), ("stale4", "tis"), ("stale4", "reinforce_pro")]
    assert study.arms(["stale2"], ["none"]) == [("stale2", "none")]


def test_each_run_config_sets_the_staleness_the_evaluation_and_the_correction_band(tmp_path):
    from reinforce_pro.models.tiny import build_tiny_model

    model = str(build_tiny_model(tmp_path / "tiny"))
    eval_path = study.held_out_file(tmp_path)
    records = [json.loads(line) for line in eval_path.read_text().splitlines()]
    assert len(records) == study.HELD_OUT and all({"input", "label"} <= set(r) for r in records)

    cfg = study.run_config(model, seed=3, steps=20, regime=study.REGIMES["stale4"], eval_path=eval_path)
    assert cfg.loop.rollout_staleness == 4 and cfg.data.builtin_task == "running_sum" and cfg.seed == 3
    assert cfg.rollout.max_new_tokens == 64 and cfg.evaluation.dataset == str(eval_path)
    assert cfg.engines.config.model_path == model  # the study starts the engine itself
    assert cfg.engines.config.cpu_max_batched_tokens == study.PREFILL_BUDGET >= 256 * 22  # the prompts in one step
    gate = study.with_correction(cfg, "token-tv", tmp_path / "a").loss.surrogate
    assert gate.vllm_is_correction_type == "token-tv" and gate.vllm_is_truncated_threshold == (0.0, 0.2)
    ratio = study.with_correction(cfg, "reinforce_pro", tmp_path / "b").loss.surrogate
    assert ratio.enable_vllm_is_correction and ratio.vllm_is_truncated_threshold == (0.5, 5.0)
    assert not study.with_correction(cfg, "none", tmp_path / "c").loss.surrogate.enable_vllm_is_correction
    tight = study.with_correction(cfg, "reinforce_pro@0.9,1.1", tmp_path / "d").loss.surrogate
    assert tight.vllm_is_correction_type == "reinforce_pro" and tight.vllm_is_truncated_threshold == (0.9, 1.1)
    partial = study.run_config(model, seed=3, steps=20, regime=study.REGIMES["partial"], eval_path=eval_path)
    assert partial.loop.async_train and partial.loop.partial_rollout_chunk == 16 and partial.loop.rollout_staleness == 0
    both = study.run_config(model, seed=3, steps=20, regime=study.REGIMES["stale2+partial"], eval_path=eval_path)
    assert not both.loop.async_train and both.loop.partial_rollout_chunk == 16 and both.loop.rollout_staleness == 2
    fp8 = study.run_config(model, seed=3, steps=20, regime=study.REGIMES["fp8"], eval_path=eval_path)
    assert fp8.engines.config.quantization == "fp8_per_channel" and cfg.engines.config.quantization is None
    # the study keys its engines by quantization: the regimes' engine settings differ in nothing else
    settings = [study.run_config(model, 3, 20, flags, eval_path).engines.config for flags in study.REGIMES.values()]
    assert all(replace(s, quantization=None) == cfg.engines.config for s in settings)
    assert {s.quantization for s in settings} == {None, "fp8_per_channel"}
    # the study samples unfiltered (top-p 1, no top-k, no minimum length): the trainer replays no filter, so its
    # log-probs are those every committed run used
    assert cfg.loss.sampling_filter is None and cfg.rollout.top_p == 1.0 and cfg.rollout.top_k == -1
    assert cfg.rollout.min_new_tokens == 0


def _run(seed, regime, correction, final_eval, reward=0.3):
    return {"seed": seed, "regime": regime, "correction": correction, "steps": 40, "final_eval": final_eval,
            "start_eval": 0.2, "final_reward": reward, "rewards": [reward] * 40, "grad_norms": [1.0] * 40,
            "masked_frac": 0.02, "response_length": 60.0, "staleness_trained": 4.0, "mean_abs_log_ratio": 0.1,
            "wall_s": 60.0, "host_id": "h", "clean": True, "commit": "0" * 40}  # fmt: skip


def test_analysis_pairs_by_seed_corrects_for_multiplicity_and_tests_equivalence(tmp_path):
    gains = [0.10, 0.12, 0.08, 0.11, 0.09]
    noise = [0.004, -0.003, 0.002, -0.004, 0.001]
    runs = []
    for i, seed in enumerate(range(1, 6)):
        base = 0.3 + 0.01 * i  # seeds differ; pairing removes it
        runs += [_run(seed, "sync", "none", base + 0.15), _run(seed, "stale4", "none", base)]
        runs += [_run(seed, "stale4", "tis", base + noise[i]), _run(seed, "stale4", "reinforce_pro", base + gains[i])]
    rows = {(r["regime"], r["correction"]): r for r in study.analyse(runs)}
    rp = rows[("stale4", "reinforce_pro")]
    assert rp["final_eval_vs_none"]["mean"] == pytest.approx(0.10)
    assert rp["final_eval_vs_none"]["low"] > 0 and rp["final_eval_vs_none"]["p_holm"] < 0.05
    assert rp["final_eval_vs_sync"]["mean"] == pytest.approx(-0.05)
    # Holm never lowers a p-value; equal rewards at every seed differ by exactly 0: no spread, no t-test
    assert rp["final_eval_vs_none"]["p_holm"] >= rp["final_eval_vs_none"]["p_t"]
    assert rp["final_reward_vs_none"]["mean"] == 0 and rp["final_reward_vs_none"]["p_holm"] is None
    tis = rows[("stale4", "tis")]["final_eval_vs_none"]
    assert tis["p_holm"] > 0.05 and tis["p_tost"] < 0.05  # within ±0.03 of none: equivalent
    assert rows[("sync", "none")]["final_eval_vs_sync"] is None
    text = study.render({"benchmark": "t", "results": {"runs": runs}}, tmp_path)
    assert (tmp_path / "t.md").read_text().strip() == text and "| stale4 | reinforce_pro | 5 |" in text
    assert "| 2.00% | 0.100 | 60.0 | 4.00 |" in text  # masked, mean abs log ratio, length, staleness
    tight = [_run(s, "stale4", "reinforce_pro@0.9,1.1", 0.3) for s in range(1, 6)]  # an arm at another band
    rows = [(r["regime"], r["correction"]) for r in study.analyse(runs + tight)]
    assert rows.index(("stale4", "reinforce_pro")) + 1 == rows.index(("stale4", "reinforce_pro@0.9,1.1"))


def test_an_arm_may_run_a_correction_at_another_band():
    import argparse

    assert study.correction_arm("reinforce_pro@0.9,1.1") == "reinforce_pro@0.9,1.1"
    for bad in ("reinforce_pr", "none@0.9,1.1", "icepop@0.9", "icepop@1.1,0.9", "icepop@a,b"):
        with pytest.raises(argparse.ArgumentTypeError):
            study.correction_arm(bad)
    assert study.split_arm("icepop") == ("icepop", None)
    assert study.split_arm("reinforce_pro@0.9,1.1") == ("reinforce_pro", (0.9, 1.1))


def test_the_mechanism_table_pairs_each_variant_with_its_parent_seed_by_seed(tmp_path):
    runs = []
    for seed, (parent, variant) in zip((1, 2, 3), ((0.6, 0.7), (0.5, 0.45), (0.7, 0.8)), strict=True):
        runs += [_run(seed, "stale4", "cppo", parent), _run(seed, "stale4", "cppo-nosign", variant)]
    collapsed = _run(4, "stale4", "cppo-nosign", 0.1)
    collapsed["rewards"] = [0.3] * 10 + [0.0] * 30  # below its start for 30 steps: a reward collapse
    runs += [_run(4, "stale4", "cppo", 0.6), collapsed, _run(1, "stale4", "reinforce_pro-sign", 0.5)]
    (row,) = study.mechanisms(runs)  # reinforce_pro-sign has no parent run: no row
    assert (row["variant"], row["parent"], row["seeds"]) == ("cppo-nosign", "cppo", [1, 2, 3, 4])
    assert row["diffs"] == pytest.approx([0.1, -0.05, 0.1, -0.5])
    assert (row["lower"], row["higher"]) == (2, 2) and (row["collapsed_design"], row["collapsed_other"]) == (1, 0)
    text = "\n".join(study.render_mechanisms([row]))
    assert "| - CPPO's exemption of tokens moving toward mu | cppo-nosign - cppo | 4 |" in text
    assert "+0.100, -0.050, +0.100, -0.500 | 2 / 2 |" in text and "| 1 / 0 |" in text


def test_an_arm_may_run_a_correction_under_the_rollout_anchor():
    import argparse

    from reinforce_pro.cli.flags_to_config import run_config
    from reinforce_pro.cli.train_ppo_ray import parse_args

    for arm in ("reinforce_pro+rollout", "reinforce_pro@0.9,1.1+rollout"):
        assert study.correction_arm(arm) == arm and study.arm_anchor(arm) == "rollout"
    assert study.split_arm("reinforce_pro@0.9,1.1+rollout") == ("reinforce_pro", (0.9, 1.1))
    assert study.arm_anchor("reinforce_pro") == "old"
    for bad in ("none+rollout", "reinforce_pro+old", "reinforce_pro+rollout@0.9,1.1"):
        with pytest.raises(argparse.ArgumentTypeError):
            study.correction_arm(bad)
    cfg = run_config(parse_args(["--pretrain", "m"]))
    for arm, anchor in (("reinforce_pro+rollout", "rollout"), ("cppo", "old")):
        surrogate = study.with_correction(cfg, arm, Path("out")).loss.surrogate
        assert surrogate.vllm_is_anchor == anchor and surrogate.enable_vllm_is_correction
        assert surrogate.vllm_is_correction_type == study.split_arm(arm)[0]
    assert study.arm_order("reinforce_pro+rollout") > study.arm_order("reinforce_pro")


def test_a_warm_start_is_made_once_per_seed_and_settings_and_remade_when_cut_short(tmp_path, monkeypatch):
    import reinforce_pro.models.tiny as tiny
    import reinforce_pro.trainer.sft_warmup as sft

    made = []

    def fake_warm_start(task, base, out, steps, seed, target, max_new_tokens):
        made.append(seed)
        out.mkdir(parents=True)
        (out / "model.safetensors").write_text(f"seed {seed}")
        return {"sft/steps": 100 * seed}

    monkeypatch.setattr(tiny, "build_tiny_model", lambda path, seed, num_layers: path)
    monkeypatch.setattr(sft, "embedded_warm_start", fake_warm_start)
    cache, code = tmp_path / "cache", {"host_id": "h", "commit": "c"}
    first = study.warm_start(3, tmp_path / "a", code, cache)
    again = study.warm_start(3, tmp_path / "b", code, cache)  # another invocation: reused
    assert made == [3] and first == again and first[1]["sft/steps"] == 300 and first[1]["commit"] == "c"
    import hashlib

    assert first[1]["sha256"] == hashlib.sha256(b"seed 3").hexdigest()[:16]  # the weights' file, hashed
    study.warm_start(4, tmp_path / "c", code, cache)  # another seed: its own
    (cache / "warm_4" / "warm_start.json").unlink()  # cut short before its stamp: made again from scratch
    study.warm_start(4, tmp_path / "d", code, cache)
    import reinforce_pro.cli.presets as presets

    monkeypatch.setitem(presets.RUNNING_SUM_WARMUP, "sft_warmup_target", 0.6)  # other settings: not reused
    study.warm_start(3, tmp_path / "e", code, cache)
    assert made == [3, 4, 4, 3]
    assert study.warm_start(5, tmp_path / "f", code)[0] == str(tmp_path / "f" / "warm_5")  # no cache: the run's own dir


def test_the_design_meets_every_other_correction_head_to_head_with_holm_and_tost():
    from studies.study_stats import seeds_needed

    runs = []
    for i, seed in enumerate(range(1, 7)):
        base = 0.3 + 0.02 * i
        wobble = [0.004, -0.003, 0.002, -0.004, 0.001, 0.0][i]
        runs += [_run(seed, "stale4", "reinforce_pro", base + 0.3), _run(seed, "stale4", "none", base + wobble)]
        runs += [_run(seed, "stale4", "icepop", base + 0.3 + wobble)]  # within ±0.05 of the design: equivalent
        runs += [_run(seed, "stale4", "tis", base + (0.6 if i % 2 else 0.0))]  # holds at half the seeds
        runs += [_run(seed, "stale4", "minpro", base + 0.25)]  # 0.05 below the design at every seed: no spread
        runs += [_run(seed, "sync", "none", base + 0.4)]  # not a correction of a stale regime: no row
    rows = {r["other"]: r for r in study.head_to_head(runs, margin=0.05)}
    assert set(rows) == {"none", "tis", "icepop", "minpro"}
    assert rows["none"]["mean"] == pytest.approx(0.3, abs=0.001) and rows["none"]["verdict"] == "better"
    # the same difference at every seed: the t-test has no spread to scale by, so it establishes nothing, while
    # the seed-by-seed reading still shows the side
    same = rows["minpro"]
    assert same["p_t"] is None and same["p_holm"] is None and same["verdict"].startswith("not established")
    assert (same["higher"], same["lower"]) == (6, 0) and "p_tost" not in same
    assert rows["icepop"]["mean"] == pytest.approx(0.0, abs=1e-12) and rows["icepop"]["p_holm"] > 0.05
    assert rows["icepop"]["verdict"] == "equivalent within ±0.05"
    tis = rows["tis"]
    assert tis["mean"] == pytest.approx(0.0, abs=1e-12) and tis["verdict"].startswith("not established")
    assert tis["p_tost_holm"] > 0.05  # the differences are +0.3 and -0.3: no equivalence within ±0.05
    for r in (rows["none"], tis, rows["icepop"]):  # Holm never lowers a p-value
        assert r["p_holm"] >= r["p_t"] and r.get("p_tost_holm", 1.0) >= r.get("p_tost", 0.0)
    assert tis["seeds_for_delta"] == seeds_needed(tis["sd"], 0.10, alpha=0.05 / 4) > 16
    assert tis["sd"] == pytest.approx(0.3 * (6 / 5) ** 0.5)  # +-0.3 alternating: sd = 0.3 sqrt(n / (n - 1))
    assert study.verdict({"p_holm": 0.01, "mean": -0.2}, 0.05) == "worse"


def _plan_parser():
    """The flags screening_or_plan reads, as the study's parser declares them."""
    import argparse

    parser = argparse.ArgumentParser()
    for flag in ("--plan", "--seeds", "--regimes", "--corrections", "--steps", "--name", "--model"):
        parser.add_argument(flag, default=None)
    return parser


def test_a_registered_plan_runs_as_registered(monkeypatch):
    plan = study.Plan("p", seeds=(7, 8), regimes=("sync",), corrections=("none",), steps=5, margin=0.1)
    monkeypatch.setitem(study.PLANS, "p", plan)
    parser = _plan_parser()
    assert study.screening_or_plan(parser, parser.parse_args(["--plan", "p"])) is plan
    for flag, value in (("--steps", "50"), ("--seeds", "1"), ("--name", "x")):  # nothing can change a plan
        with pytest.raises(SystemExit):
            study.screening_or_plan(parser, parser.parse_args(["--plan", "p", flag, value]))
    screening = study.screening_or_plan(parser, parser.parse_args([]))
    assert screening.name == study.NAME and screening.margin == study.MARGIN and screening.seeds == (101, 102, 103)
    assert screening.steps == 150 and screening.corrections == tuple(study.CORRECTIONS)


def test_the_study_s_ray_workers_import_the_tree_its_runs_record(monkeypatch, tmp_path):
    import os

    monkeypatch.setenv("PYTHONPATH", f"/elsewhere{os.pathsep}{tmp_path}")
    study.workers_import(tmp_path)  # first, once
    assert os.environ["PYTHONPATH"].split(os.pathsep) == [str(tmp_path), "/elsewhere"]
    monkeypatch.delenv("PYTHONPATH")
    study.workers_import(tmp_path)
    assert os.environ["PYTHONPATH"] == str(tmp_path)
    assert study.ROOT == study.RESULTS_DIR.parent.parent  # the tree of the study's own file


def test_a_seed_cut_across_two_hosts_is_run_again_whole_on_the_second():
    arm_list = study.arms(["sync", "stale4"], ["none", "reinforce_pro"])
    done_there = [{**_run(1, g, c, 0.5), "host_id": "there"} for g, c in arm_list]  # seed 1: complete elsewhere
    cut = [{**_run(2, g, c, 0.5), "host_id": "there"} for g, c in arm_list[:2]]  # seed 2: two arms of three
    own = [{**_run(3, "sync", "none", 0.5), "host_id": "here"}]
    kept, aside = study.set_aside_other_hosts(done_there + cut + own, [1, 2, 3], arm_list, 40, "here")
    assert kept == done_there + own and aside == cut
    assert study.set_aside_other_hosts(cut, [2], arm_list, 40, "there") == (cut, [])  # resumed on its own host
    other_regime = [{**_run(2, "fp8", "none", 0.5), "host_id": "there"}]  # another invocation's arm: not paired here
    assert study.set_aside_other_hosts(cut + other_regime, [2], arm_list, 40, "here") == (other_regime, cut)


def test_another_host_s_runs_stay_where_this_host_s_warm_start_is_the_same_weights():
    arm_list = study.arms(["sync", "stale4"], ["none", "reinforce_pro"])
    cut = [{**_run(2, g, c, 0.5), "host_id": "there", "warm_start_sha256": "aa"} for g, c in arm_list[:2]]
    asked = []

    def weights(seed):
        asked.append(seed)
        return {2: "aa"}[seed]

    assert study.set_aside_other_hosts(cut, [2], arm_list, 40, "here", weights) == (cut, [])
    assert set(asked) == {2}  # asked only about the seed another host began
    other = [cut[0], {**cut[1], "warm_start_sha256": "bb"}]  # one of them from other weights: the seed is redone
    assert study.set_aside_other_hosts(other, [2], arm_list, 40, "here", weights) == ([], other)
    unhashed = [{k: v for k, v in r.items() if k != "warm_start_sha256"} for r in cut]  # made before hashes were kept
    assert study.set_aside_other_hosts(unhashed, [2], arm_list, 40, "here", weights) == ([], unhashed)


def test_the_registered_confirmation_uses_fresh_seeds_the_reference_arms_and_the_screened_corrections():
    plan = study.PLANS["confirmation"]
    screened = json.loads((study.RESULTS_DIR / f"{study.NAME}.json").read_text())["results"]["runs"]
    assert len(plan.seeds) >= 16 and len(set(plan.seeds)) == len(plan.seeds)
    assert not set(plan.seeds) & {r["seed"] for r in screened}  # no seed the screening tuned on
    assert "sync" in plan.regimes and {"none", "tis", study.DESIGN} <= set(plan.corrections)
    for arm in plan.corrections:
        assert study.correction_arm(arm) == arm  # a correction the study runs, written as --corrections takes it
        assert any(r["correction"] == arm and r["regime"] in plan.regimes for r in screened)  # and it was screened
    assert plan.name != study.NAME and 0 < plan.margin < study.DELTA and plan.steps == 100
    parser = _plan_parser()
    assert study.screening_or_plan(parser, parser.parse_args(["--plan", "confirmation"])) is plan


def test_the_second_confirmation_is_what_the_committed_rule_picked_on_seeds_no_study_has_used():
    from studies import confirmation_rule
    from studies.study_stats import stored_runs

    plan = study.PLANS["second_confirmation"]
    rule = json.loads((study.RESULTS_DIR / f"{confirmation_rule.NAME}.json").read_text())["results"]
    assert rule["complete"]  # registered only once both screenings had their seeds
    again = confirmation_rule.apply_rule(stored_runs(study.RESULTS_DIR / "is_regime_screening.json"),
                                         stored_runs(study.RESULTS_DIR / "is_mechanism_screening.json"))  # fmt: skip
    for part in ("regime", "variant"):
        assert again[part]["chosen"] == rule[part]["chosen"]
    assert plan.regimes == ("sync", rule["regime"]["chosen"])
    assert {"sync", *plan.corrections} == set(rule["arms"]) and len(plan.corrections) == len(set(plan.corrections))
    for arm in plan.corrections:
        assert study.correction_arm(arm) == arm  # a correction the study runs, written as --corrections takes it
    used = {r["seed"] for f in study.RESULTS_DIR.glob("is_*.json") if not f.stem.startswith(plan.name)
            for r in json.loads(f.read_text()).get("results", {}).get("runs", [])}  # fmt: skip
    assert len(plan.seeds) == 24 and len(set(plan.seeds)) == 24 and not set(plan.seeds) & used
    assert plan.steps == 100 and plan.margin == confirmation_rule.MARGIN
    assert plan.name not in (study.NAME, study.PLANS["confirmation"].name)
    parser = _plan_parser()
    assert study.screening_or_plan(parser, parser.parse_args(["--plan", "second_confirmation"])) is plan
    with pytest.raises(SystemExit):
        study.screening_or_plan(parser, parser.parse_args(["--plan", "second_confirmation", "--seeds", "501"]))


def test_a_plan_rendered_before_its_last_run_says_it_is_partial_and_the_pairing_is_checked(tmp_path):
    plan = {"seeds": [1, 2], "regimes": ["sync", "stale4"], "corrections": ["none", "reinforce_pro"], "steps": 40}
    runs = [_run(s, g, c, 0.5 + 0.01 * s) for s in (1, 2) for g, c in study.arms(plan["regimes"], plan["corrections"])]
    payload = {"benchmark": "confirm", "config": {"margin": 0.05, "plan": plan}, "results": {"runs": runs[:-1]}}
    text = study.render(payload, tmp_path)
    assert text.startswith("**Partial: 5 of 6 runs, 1 of 2 seeds complete.")
    assert "Pairing: at each of the 2 seeds every arm started from the same" in text
    payload["results"]["runs"] = runs
    assert not study.render(payload, tmp_path).startswith("**Partial")  # complete: no banner
    runs[-1] = {**runs[-1], "rewards": [0.9] * 40}  # one arm of seed 2 saw another first batch
    assert "Pairing broken at seed(s) 2" in study.render(payload, tmp_path)
    # same start, but seed 1's arms record two warm starts' weights (remade in another session): not paired
    runs[-1] = {**runs[-1], "rewards": runs[0]["rewards"]}
    runs[:] = [{**r, "warm_start_sha256": "a" if r is not runs[1] else "b"} if r["seed"] == 1 else r for r in runs]
    assert "Pairing broken at seed(s) 1: their arms' warm starts are other weights." in study.render(payload, tmp_path)
    runs[1] = {**runs[1], "warm_start_sha256": "a"}
    runs.append({**runs[0], "warm_start_sha256": None})  # a run made before the hash was recorded: not counted
    assert "Pairing: at each of the 2 seeds" in study.render(payload, tmp_path)
    payload["config"]["plan"] = None  # a screening is never partial
    assert not study.render(payload, tmp_path).startswith("**Partial")
    # an FP8 engine evaluates the same warm start its own way: its arms pair with each other, not with bf16's
    fp8 = {"vllm_quantization": "fp8_per_channel"}
    runs += [{**_run(s, "fp8", c, 0.5), "start_eval": 0.25, "regime_flags": fp8}
             for s in (1, 2) for c in ("none", "tis")]  # fmt: skip
    text = study.render(payload, tmp_path)
    assert "Pairing: at each of the 2 seeds every arm started from the same held-out accuracy and the same " \
           "first-step reward, each engine's arms apart (fp8's its own)." in text  # fmt: skip
    runs[-1] = {**runs[-1], "start_eval": 0.3}
    assert "Pairing broken at seed(s) 2" in study.render(payload, tmp_path)
    # partial rollouts sample the same weights in chunks (and, asynchronously, ahead): another first batch, their own
    runs[-1] = {**runs[-1], "start_eval": 0.25}
    chunked = [{**_run(s, g, c, 0.5), "rewards": [reward] * 40, "regime_flags": flags} for s in (1, 2)
               for g, flags, reward in (("partial", study.REGIMES["partial"], 0.35),
                                        ("stale2+partial", study.REGIMES["stale2+partial"], 0.4))
               for c in ("none", "tis")]  # fmt: skip
    runs += chunked
    text = study.render(payload, tmp_path)
    assert "Pairing: at each of the 2 seeds" in text and "among the arms that sample alike" in text
    chunked[-1]["rewards"] = [0.45] * 40  # but within a regime one first batch, as before
    assert "Pairing broken at seed(s) 2" in study.render(payload, tmp_path)
    chunked[-1]["rewards"], chunked[-1]["start_eval"] = [0.4] * 40, 0.21  # and one held-out start per engine
    assert "Pairing broken at seed(s) 2" in study.render(payload, tmp_path)


def test_the_versions_cell_gives_the_share_of_rows_that_span_two_versions():
    assert study.versions_cell({"versions_per_row": 1.5, "mixed_rows": 0.5}) == "1.50 (50%)"
    assert study.versions_cell({"versions_per_row": 1.0, "mixed_rows": None}) == "1.00"
    assert study.versions_cell({"versions_per_row": None, "mixed_rows": None}) == "-"  # no partial rollouts


def test_the_seed_by_seed_table_gives_every_arm_at_every_seed_and_marks_collapses():
    runs = [_run(s, "fp8", c, 0.5 + 0.1 * s) for s in (1, 2) for c in ("none", "reinforce_pro@0.98,1.02")]
    runs += [_run(1, "stale4", "cppo", 0.7), _run(1, "sync", "none", 0.8)]
    runs[0] = {**runs[0], "rewards": [0.5] * 10 + [0.1] * 30}  # fp8 none at seed 1: reward fell for 30 steps
    lines = study.render_by_seed(runs)
    assert lines[3] == "| regime | correction | seed 1 | seed 2 |"
    assert lines[5:] == ["| sync | none | 0.800 | - |", "| stale4 | cppo | 0.700 | - |",
                         "| fp8 | none | 0.600 (c) | 0.700 |",
                         "| fp8 | reinforce_pro@0.98,1.02 | 0.600 | 0.700 |"]  # fmt: skip
    assert study.render_by_seed(runs[:2]) == []  # one seed: the main table already says it


def test_a_study_removes_its_scratch_when_it_ends_and_keeps_a_cut_run_s_files(tmp_path, monkeypatch):
    """run_study with Ray, the engine and the trainer replaced: the runs land in the JSON's list and their
    pictures are kept; its temporary directory goes when it ends, and stays (named) when a run is cut short."""
    import tempfile
    from types import SimpleNamespace

    import ray

    import reinforce_pro.run.driver as driver
    import reinforce_pro.run.prepare as prepare
    import reinforce_pro.workers.launcher as launcher

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setattr(launcher, "start_ray", lambda **kw: None)
    monkeypatch.setattr(study, "workers_import", lambda root: None)
    monkeypatch.setattr(study, "warm_start", lambda seed, workdir, code, cache, model: ("/model", {"sft/steps": 7,
                        "commit": "c", "sha256": "s"}))  # fmt: skip
    monkeypatch.setattr(study, "run_config", lambda model, seed, steps, regime, eval_path, moe: SimpleNamespace())
    monkeypatch.setattr(study, "with_correction", lambda cfg, correction, save: SimpleNamespace(
        engines=SimpleNamespace(config=SimpleNamespace(quantization=None)), save=save))  # fmt: skip
    engine = SimpleNamespace(reseed=SimpleNamespace(remote=lambda seed: seed))
    monkeypatch.setattr(ray, "remote", lambda cls: SimpleNamespace(options=lambda **kw: SimpleNamespace(
        remote=lambda setting: engine)))  # fmt: skip
    monkeypatch.setattr(ray, "get", lambda ref: ref)
    monkeypatch.setattr(ray, "kill", lambda actor: None)

    def fake_prepare(cfg):
        cfg.save.mkdir(parents=True)
        (cfg.save / "drift.png").write_bytes(b"png")
        return SimpleNamespace(run_dir=cfg.save)

    fits = []

    def fake_fit(cfg, plan, engines):
        fits.append(plan.run_dir.name)
        if plan.run_dir.name.endswith("cut"):
            raise KeyboardInterrupt
        return [{"step": 1}]

    monkeypatch.setattr(prepare, "prepare", fake_prepare)
    monkeypatch.setattr(driver, "build_and_fit", fake_fit)
    monkeypatch.setattr(study, "held_out", lambda run_dir: [(0, 0.5), (1, 0.75)])
    monkeypatch.setattr(study, "summarise", lambda history, wall, evals: {"final_eval": evals[-1][1]})
    monkeypatch.setattr(study, "lengths", lambda history: {})
    monkeypatch.setattr(study, "arms", lambda regimes, corrections: [(g, c) for g in regimes for c in corrections])
    saved, pictures = [], tmp_path / "pictures"

    runs = study.run_study([3], ["stale4"], ["none", "tis"], 5, [], lambda r: saved.append(len(r)), {"commit": "c"},
                           pictures=pictures)  # fmt: skip
    assert [(r["seed"], r["correction"], r["final_eval"], r["warm_start_sha256"]) for r in runs] == [
        (3, "none", 0.75, "s"), (3, "tis", 0.75, "s")]  # fmt: skip
    assert saved == [1, 2] and sorted(p.name for p in pictures.iterdir()) == ["3_stale4_none.png", "3_stale4_tis.png"]
    assert list(scratch.iterdir()) == []  # each run's directory and the held-out file: gone

    with pytest.raises(KeyboardInterrupt):
        study.run_study([4], ["stale4"], ["none", "cut"], 5, [], lambda r: None, {"commit": "c"})
    (left,) = scratch.iterdir()  # the stopped study's directory stays, with the cut run's files
    assert (left / "4_stale4_cut" / "drift.png").is_file() and fits[-1] == "4_stale4_cut"


def test_the_moe_screening_replays_routes_only_on_the_moe_model_with_its_balance_loss(tmp_path):
    """The registered MoE screening: fresh seeds, the built-in MoE model, stale4 with and without replaying the
    engine's experts; its runs' configs turn the balance loss and the engine's route capture on, and a dense
    screening cannot ask for replay."""
    from reinforce_pro.models.tiny import build_tiny_moe_model

    plan = study.PLANS["moe_screening"]
    assert plan.model == "moe" and plan.regimes == ("sync", "stale4", "stale4+r3") and plan.steps == 100
    assert {"none", "tis", study.DESIGN, "cppo", "dppo-tv"} <= set(plan.corrections)
    used = set()  # every seed a committed study ran
    for f in study.RESULTS_DIR.glob("*.json"):
        results = json.loads(f.read_text()).get("results")
        runs = results.get("runs", []) if isinstance(results, dict) and not f.stem.startswith(plan.name) else []
        used |= {r["seed"] for r in runs if isinstance(r, dict) and "seed" in r}
    assert len(set(plan.seeds)) == 3 and not set(plan.seeds) & used
    model, eval_path = str(build_tiny_moe_model(tmp_path / "moe")), study.held_out_file(tmp_path)
    replayed = study.run_config(model, 3, 20, study.REGIMES["stale4+r3"], eval_path, moe=True)
    assert replayed.forward.routing_replay == "r3" and replayed.loop.rollout_staleness == 4
    assert replayed.loss.aux_loss_coef == 0.001 and replayed.engines.config.capture_routes
    dense = study.run_config(model, 3, 20, study.REGIMES["stale4"], eval_path)
    assert dense.forward.routing_replay == "none" and not dense.engines.config.capture_routes
    with pytest.raises(SystemExit):
        study.main(["--regimes", "stale4+r3", "--seeds", "1", "--output", str(tmp_path)])
    parser = _plan_parser()
    assert study.screening_or_plan(parser, parser.parse_args(["--plan", "moe_screening"])) is plan
    assert "stale4+r3" not in study.screening_or_plan(parser, parser.parse_args([])).regimes


def test_the_replay_table_pairs_each_correction_with_itself_under_r3_by_seed():
    """`none` gains 0.2 under replay at both seeds and collapses without it at one; `cppo` is level."""
    runs = []
    for seed in (1, 2):
        for regime, flip in (("stale4", 0.04), ("stale4+r3", 0.05)):
            gain = 0.2 if regime == "stale4+r3" else 0.0
            collapsed = regime == "stale4" and seed == 1
            rewards = [0.3] * 10 + [0.0] * 30 if collapsed else [0.3] * 40
            drift = {"routing": {"routing/flip_frac": flip}}
            runs += [{**_run(seed, regime, "none", 0.5 + gain), "rewards": rewards, **drift},
                     {**_run(seed, regime, "cppo", 0.7), **drift}]  # fmt: skip
    rows = {r["correction"]: r for r in study.replay_effect(runs)}
    none, cppo = rows["none"], rows["cppo"]
    assert none["diffs"] == pytest.approx([0.2, 0.2]) and (none["lower"], none["higher"]) == (0, 2)
    assert none["p_sign_flip"] == pytest.approx(0.5) and none["p_sign_flip_holm"] == pytest.approx(1.0)
    assert (none["collapsed_other"], none["collapsed_design"]) == (1, 0)  # off / r3
    assert cppo["diffs"] == [0.0, 0.0] and cppo["p_sign_flip"] == 1.0
    assert cppo["p_wilcoxon"] is None and none["p_tost"] is None  # no ranks to test; differences that do not vary
    assert none["p_wilcoxon"] == pytest.approx(0.5)  # both seeds on one side: the smallest two-sided p of 2 seeds
    assert none["flip_off"] == pytest.approx(0.04) and none["flip_replayed"] == pytest.approx(0.05)
    text = "\n".join(study.render_replay(list(rows.values())))
    assert "| none | 2 | 0.500 -> 0.700 | +0.200, +0.200 | 0 / 2 |" in text and "4.00% / 5.00%" in text
    assert "| - (±0.03) | 1 / 0, 1.000 |" in text  # TOST not defined; one collapse off, none under r3
    assert study.routing([{"routing/flip_frac": 0.1}, {"routing/flip_frac": 0.3}]) == {
        "routing": {"routing/flip_frac": pytest.approx(0.2)}}  # fmt: skip
    assert study.routing([{"rollout/reward_mean": 0.5}]) == {}
