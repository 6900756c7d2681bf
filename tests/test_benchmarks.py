"""The benchmark scripts run end to end at a tiny size and write what they promise (no timing asserted)."""

import json

from benchmarks import bench_is_correction


def test_bench_is_correction_writes_json_table_and_plot(tmp_path):
    rc = bench_is_correction.main(
        ["--sizes", "2x16,3x8", "--repeats", "2", "--warmup", "0", "--output", str(tmp_path), "--system-malloc"]
    )
    assert rc == 0
    payload = json.loads((tmp_path / "bench_is_correction.json").read_text())
    assert {"benchmark", "commit", "machine", "config", "results"} <= set(payload)
    assert payload["machine"]["torch"].startswith("2.")
    rows = payload["results"]
    assert {(r["B"], r["T"]) for r in rows} == {(2, 16), (3, 8)}
    assert {r["variant"] for r in rows} == set(bench_is_correction.VARIANTS)
    assert all(r["variant"] != "tis" or r["ratio_to_tis"] == 1.0 for r in rows)
    table = (tmp_path / "bench_is_correction.md").read_text()
    assert "| reinforce_pro |" in table and "B=3, T=8" in table
    assert (tmp_path / "bench_is_correction.png").stat().st_size > 1000
