"""`ray job submit` end to end: start a Ray head on 127.0.0.1 (its own session, so it can be stopped by
process group), submit the CPU recipe for two steps, wait for success, stop the head."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytest.importorskip("ray")

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    """One head for the module's jobs."""
    tmp_path = tmp_path_factory.mktemp("ray_head")
    gcs, dashboard, agent = _free_port(), _free_port(), _free_port()
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    env.pop("RAY_ADDRESS", None)
    cmd = [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address", "127.0.0.1", "--port", str(gcs),
           "--dashboard-host", "127.0.0.1", "--dashboard-port", str(dashboard), "--include-dashboard", "true",
           "--num-cpus", "8", "--disable-usage-stats",
           # the job agent's HTTP port: Ray's default (52365) is taken by any other local cluster (a run or a study
           # beside the tests), and without it the head takes no job ("No available agent to submit job")
           "--dashboard-agent-listen-port", str(agent)]  # fmt: skip
    log = open(tmp_path / "head.log", "wb")  # noqa: SIM115 - closed below
    head = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"http://127.0.0.1:{dashboard}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{address}/api/version", timeout=2) as r:
                    json.load(r)
                break
            except OSError:
                assert head.poll() is None, (tmp_path / "head.log").read_text()[-2000:]
                assert time.monotonic() < deadline, "the Ray dashboard did not come up"
                time.sleep(1)
        # the dashboard answers before the node's job agent has registered: a trivial job that succeeds says the
        # cluster takes jobs
        while subprocess.run([str(BIN / "ray"), "job", "submit", f"--address={address}", "--", "true"], env=env,
                             capture_output=True, timeout=120).returncode != 0:  # fmt: skip
            assert time.monotonic() < deadline, "the Ray head takes no job"
            time.sleep(2)
        yield address
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # the head's own session: the processes this fixture started
        try:
            head.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        try:
            os.killpg(head.pid, signal.SIGKILL)  # raylet / GCS children still in the group, if any
        except ProcessLookupError:
            pass
        log.close()
        # `ray start` recorded this head as the machine's current cluster; a killed head leaves the record
        current = Path("/tmp/ray/ray_current_cluster")
        if current.is_file() and current.read_text().strip() == f"127.0.0.1:{gcs}":
            current.unlink()


SDK_AGENT = f"--agent_func_path {ROOT / 'examples' / 'python' / 'agent_calculator_openai.py'} --label_key label"


# CI runs the job with an SDK agent: it takes every assertion the plain job does, so the plain one is a recipe test
@pytest.mark.parametrize(
    "extra", [pytest.param("", marks=pytest.mark.recipe, id="prompts"), pytest.param(SDK_AGENT, id="openai-sdk-agent")]
)
def test_cpu_recipe_runs_as_a_ray_job(ray_head, tmp_path, extra):
    """The recipe as a job; with an OpenAI-SDK agent, whose endpoint the job's driver serves on its own loopback."""
    out = tmp_path / "out"
    env = {
        **os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "PYTHON": sys.executable, "RAY_JOB_ADDRESS": ray_head,
        "OUT": str(out), "STEPS": "2", "SAVE_STEPS": "1", "EXTRA_ARGS": f"--sft_warmup_steps 0 {extra}",
    }  # fmt: skip
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        ["bash", str(ROOT / "examples" / "scripts" / "train_reinforce_pro_cpu.sh")],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "succeeded" in (proc.stdout + proc.stderr)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    if extra:
        assert all(r["agent/episodes"] == 32 * 8 and r["agent/dropped_episodes"] == 0 for r in rows)
    assert (out / "ckpt" / "latest").read_text().strip() == "global_step2"
    assert (out / "final_model" / "config.json").is_file()
