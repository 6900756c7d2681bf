"""The drift picture (trainer/drift_plot.py), from metrics rows (the per-position gap it is drawn from:
tests/test_engine_outputs.py)."""

from __future__ import annotations

import math

import pytest

from reinforce_pro.trainer.drift_plot import drift_table, main, write_drift


def rows(steps: int = 6) -> list[dict]:
    """Metrics rows of a run whose gap grows along the responses and over the steps (a partial rollout's shape)."""
    out = []
    for step in range(1, steps + 1):
        row = {"step": step, "is/token_masked_frac": 0.01 * step, "async/staleness_mean": 1.0}
        for lo, name in ((0, "0-1"), (2, "2-3"), (4, "4-7"), (8, "8+")):
            row[f"rollout_pos/logprob_abs_diff/{name}"] = 1e-3 * step * (lo + 1)
        out.append(row)
    out[2]["rollout_pos/logprob_abs_diff/8+"] = None  # a step whose responses stopped short
    return out


def test_the_table_orders_buckets_by_position_and_keeps_gaps_as_nan():
    steps, names, matrix = drift_table([{"step": 0, "eval/x": 1.0}, *rows()])
    assert steps == [1, 2, 3, 4, 5, 6] and names == ["0-1", "2-3", "4-7", "8+"]
    assert matrix[1][0] == pytest.approx(3e-3) and matrix[0][5] == pytest.approx(6e-3)
    assert math.isnan(matrix[3][2])
    assert drift_table([{"step": 1, "rollout/reward_mean": 0.5}]) == ([], [], [])


def test_a_png_is_written_from_metrics_and_the_command_refuses_files_without_them(tmp_path, capsys):
    import json

    out = write_drift(rows(), tmp_path / "drift.png", title="run")
    assert out is not None and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert write_drift([{"step": 1}], tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    assert main([str(metrics)]) == 0 and (tmp_path / "drift.png").is_file()
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"step": 1, "rollout/reward_mean": 0.1}) + "\n")
    assert main([str(empty)]) == 2 and "has no rollout_pos/logprob_abs_diff/* metrics" in capsys.readouterr().err
    assert main([str(tmp_path / "missing.jsonl")]) == 2


def test_a_run_with_a_teacher_gets_the_reverse_kl_panel():
    """opd_pos/reverse_kl/* rows (a distillation run) add a middle heat map over the same steps and buckets; a run
    without them keeps two panels."""
    pytest.importorskip("matplotlib")
    from reinforce_pro.trainer.drift_plot import OPD_PREFIX, draw_drift

    rows = [
        {"step": s, "rollout_pos/logprob_abs_diff/0-1": 1e-3, f"{OPD_PREFIX}0-1": 2.0 - s / 10,
         f"{OPD_PREFIX}2-3": 0.5}
        for s in (1, 2, 3)
    ]  # fmt: skip
    steps, names, matrix = drift_table(rows, OPD_PREFIX)
    assert steps == [1, 2, 3] and names == ["0-1", "2-3"] and matrix[0] == pytest.approx([1.9, 1.8, 1.7])
    titles = [ax.get_title() for ax in draw_drift(rows).axes]
    assert "reverse KL to the teacher (k1)" in titles
    plain = [{k: v for k, v in r.items() if not k.startswith(OPD_PREFIX)} for r in rows]
    assert "reverse KL to the teacher (k1)" not in [ax.get_title() for ax in draw_drift(plain).axes]
