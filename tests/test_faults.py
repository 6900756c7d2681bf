"""A lost actor named in one line (run/faults.py), the driver's recovery decisions (run/driver.py) and the default
checkpoints by the clock (trainer/ppo_trainer.py), on hand-made errors and configs; the run that recovers from a
killed engine and policy is tests/test_e2e.py's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

ray = pytest.importorskip("ray")
from ray import exceptions as rex  # noqa: E402

from reinforce_pro.cli.train_ppo_ray import parse  # noqa: E402
from reinforce_pro.run import driver, faults, resume, run_lock  # noqa: E402
from reinforce_pro.run import prepare as prepare_module  # noqa: E402
from reinforce_pro.run.errors import UserInputError  # noqa: E402

MEMORY_MONITOR = """Task was killed due to the node running low on memory.
Memory on the node (IP: 127.0.0.1, ID: 4f2) where the task (actor ID: ab12, name=VLLMEngine.generate, pid=4242,
memory used=6.10GB) was running was 22.91GB / 24.00GB (0.954), which exceeds the memory usage threshold of 0.95.
Ray killed this worker (ID: 77) because it was the most recently scheduled task. Top 10 memory users:
PID\tMEM(GB)\tCOMMAND
9001\t18.02\tpython hog.py --gigabytes 18
4242\t6.10\tray::VLLMEngine.generate
4300\t0.90\tray::PolicyWorker
"""


# The report of Ray 2.x's memory monitor as a run caught it (tests/test_e2e.py's memory hog), abridged: it carries no
# actor id of its own; the actors it killed are on its "Selected to kill" lines.
MEMORY_MONITOR_REPORT = """2 worker(s) were killed due to the node running low on memory. \
Memory on the node (IP: 127.0.0.1, ID: 483c) was 6.95GB used / 23.54GB limit (0.295252)
OOM kill reason: Memory usage 7458402304B exceeded threshold of 7448890880B (29.5% of 25276182528B limit)
Ray killed 2 worker(s) based on the killing policy
Considered workers: [
Selected to kill: (Worker with no lease granted: pid=20243, actual memory used=0.18GB, worker ID=36fe)
Selected to kill: (Actor(505370e853a1054b32dc506c01000000): job ID=01000000, lease ID=0200, \
task name=VLLMEngine.__init__, required resources={CPU: 1}, pid=20376, actual memory used=1.54GB, worker ID=c341)
(Actor(6eefaae736780f13429fba2c01000000): job ID=01000000, task name=PolicyWorker.__init__, pid=20323, \
actual memory used=0.41GB, worker ID=b3a5)
]
Top 10 memory users: PID\tMEM(GB)\tCOMMAND
20082\t3.30\t.venv/bin/python -m pytest -q tests/test_e2e.py -k memory_hog -x
20376\t1.54\tray::VLLMEngine
20323\t0.41\tray::PolicyWorker.train_minibatch
"""


def test_a_memory_monitor_kill_reported_without_an_actor_id_names_the_actor_it_selected():
    """Ray's report on another call carries no actor id: the engine it selected is still named, and replaced in
    place (lost_engine finds it), with the node's use and its largest users."""
    from reinforce_pro.rollout.engine_wait import lost_engine

    error = rex.OutOfMemoryError(MEMORY_MONITOR_REPORT)
    engine, policy = _Actor("505370e853a1054b32dc506c01000000"), _Actor("6eefaae736780f13429fba2c01000000")
    roles = {"policy": [policy], "engines": [engine]}
    line = faults.describe(error, roles, step=7)
    assert line.startswith("vLLM engine 0 was lost at step 8: killed by Ray's memory monitor (node memory 6.95GB / "
                           "23.54GB); largest users: pid 20082 3.30 GB (.venv/bin/python -m pytest")  # fmt: skip
    assert lost_engine(error, [engine]) == 0 and lost_engine(error, [policy]) is None  # not selected: not lost
    assert faults.actor_of(error, {}) == "actor VLLMEngine (pid 20376)"  # an actor of no role: class and pid


class _Actor:
    def __init__(self, hex_id: str):
        self._actor_id = SimpleNamespace(hex=lambda: hex_id)


def _died(actor_id: str | None, text: str = "") -> rex.ActorDiedError:
    error = rex.ActorDiedError()
    error.actor_id = actor_id
    if text:
        error.error_msg = text
    return error


def test_a_lost_actor_is_named_by_its_role_and_rank_and_why():
    roles = {"policy": [_Actor("p0"), _Actor("p1")], "engines": [_Actor("e0")]}
    line = faults.describe(_died("p1"), roles, step=6)
    assert line == "policy rank 1 was lost at step 7: its process died (a signal, the kernel's OOM killer or a crash)"
    assert faults.describe(_died("e0"), roles, 0).startswith("vLLM engine 0 was lost at step 1")
    stranger = _died("zz", "The actor died unexpectedly.\n\tclass_name: Critic\n\tpid: 31")
    assert faults.actor_of(stranger, roles) == "actor Critic (pid 31)"
    assert faults.actor_of(_died(None), {}) == "a worker"


def test_a_hung_engine_is_lost_like_a_dead_one_and_named_in_one_line():
    from reinforce_pro.rollout.engine_wait import EngineHung

    hung = EngineHung(1, "generate", 15.0)
    assert isinstance(hung, faults.LOST)  # the driver recovers from it as from a dead actor
    assert faults.describe(hung, {}, step=4) == (
        "vLLM engine 1 hung at step 5: no answer to a generate call in 15 s (--engine_timeout_s)"
    )
    assert _cfg(Path("/tmp")).loop.engine_timeout_s == 1800 == _cfg(Path("/tmp")).rollout.engine_timeout_s
    assert _cfg(Path("/tmp"), "--engine_timeout_s", "0").rollout.engine_timeout_s == 0  # waits as long as it takes


def test_a_lost_engine_is_started_again_in_place_and_the_call_runs_again():
    """EngineRecovery (trainer/engine_recovery.py) without Ray: the engine the error names (by Ray's actor id, or
    a hung one's index) is replaced in the shared list, given the others' weights, what the failed call consumed
    is put back, and the call runs again; an error about another actor, or a restart refused, ends the call."""
    from reinforce_pro.rollout.engine_wait import EngineHung, lost_engine
    from reinforce_pro.trainer.engine_recovery import EngineRecovery

    engines = [_Actor("e0"), _Actor("e1")]
    restored, restarts, put_back = [], [], []
    sync = SimpleNamespace(restores_engines=True, restore=restored.append)

    def restart(index, error, step):
        restarts.append((index, type(error).__name__, step))
        return _Actor(f"new{index}")

    failures = iter([_died("e1"), EngineHung(0, "generate", 5.0)])
    recovery = EngineRecovery(engines, sync, restart)

    def call():
        error = next(failures, None)
        if error is not None:
            raise error
        return "sampled"

    assert recovery.run(call, 7, lambda: put_back.append(1)) == "sampled"
    assert restarts == [(1, "ActorDiedError", 7), (0, "EngineHung", 7)] and restored == [1, 0] and put_back == [1, 1]
    assert [e._actor_id.hex() for e in engines] == ["new0", "new1"] and recovery.restarts == 2
    assert lost_engine(_died("zz"), engines) is None and lost_engine(ValueError("x"), engines) is None
    assert lost_engine(EngineHung(0, "generate", 5.0, actor_id="judge0"), engines) is None  # another list's engine
    assert lost_engine(EngineHung(0, "generate", 5.0, actor_id="new1"), engines) == 1  # found by its actor id
    with pytest.raises(rex.ActorDiedError):  # a policy rank's loss is the driver's to handle
        recovery.run(lambda: (_ for _ in ()).throw(_died("p0")), 7)
    refused = EngineRecovery(engines, sync, lambda *a: (_ for _ in ()).throw(EngineHung(0, "generate", 5.0)))
    with pytest.raises(EngineHung):  # the budget is spent: the restart raises the error again
        refused.run(lambda: (_ for _ in ()).throw(EngineHung(0, "generate", 5.0)), 7)
    broadcast = EngineRecovery(engines, SimpleNamespace(restores_engines=False), restart)
    assert broadcast.restart is None  # a new engine cannot join a broadcast group: the driver restarts the run


def test_the_memory_monitor_is_named_with_the_node_s_use_and_largest_users():
    why = faults.cause(rex.OutOfMemoryError(MEMORY_MONITOR))
    assert why.startswith("killed by Ray's memory monitor (node memory 22.91GB / 24.00GB)")
    assert "pid 9001 18.02 GB (python hog.py --gigabytes 18)" in why and "pid 4300" in why
    assert "\n" not in why  # one line
    assert faults.cause(rex.NodeDiedError("node gone")) == "its node died"


def _cfg(tmp_path: Path, *extra: str):
    _, cfg = parse(["--pretrain", "m", "--save_path", str(tmp_path / "run"), *extra])
    return cfg


def test_default_checkpoints_go_under_the_run_directory_by_the_clock(tmp_path):
    plan = SimpleNamespace(run_dir=tmp_path / "run")
    cfg = resume.run_checkpoints(_cfg(tmp_path), plan.run_dir)
    ckpt = cfg.loop.checkpoints
    assert ckpt.ckpt_path == tmp_path / "run" / "checkpoints" and ckpt.every_s == 300 and ckpt.save_steps == -1
    assert cfg.loop.max_failures == 3 and not ckpt.resume
    by_steps = resume.run_checkpoints(_cfg(tmp_path, "--save_steps", "5", "--ckpt_path", str(tmp_path / "c")),
                                      plan.run_dir)  # fmt: skip
    assert by_steps.loop.checkpoints.every_s == 0 and by_steps.loop.checkpoints.ckpt_path == tmp_path / "c"
    assert _cfg(tmp_path, "--auto_checkpoint_minutes", "0").loop.checkpoints is None
    assert _cfg(tmp_path, "--auto_checkpoint_minutes", "1.5").loop.checkpoints.every_s == 90


def test_starting_again_resumes_from_the_newest_checkpoint_or_cuts_every_row(tmp_path):
    plan = SimpleNamespace(run_dir=tmp_path / "run")
    plan.run_dir.mkdir()
    (plan.run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)))
    cfg = resume.run_checkpoints(_cfg(tmp_path), plan.run_dir)
    assert resume.resuming(cfg, plan.run_dir, tmp_path / "run" / "checkpoints" / "global_step2").loop.checkpoints.resume
    assert (plan.run_dir / "metrics.jsonl").read_text().count("step") == 3  # resume_checkpoint cuts them
    assert resume.resuming(cfg, plan.run_dir, None) is cfg and (plan.run_dir / "metrics.jsonl").read_text() == ""


def test_a_run_that_cannot_recover_says_what_is_saved_and_how_to_resume(tmp_path, monkeypatch):
    plan = SimpleNamespace(run_dir=tmp_path / "run")
    cfg = resume.run_checkpoints(_cfg(tmp_path, "--max_failures", "1"), plan.run_dir)
    monkeypatch.setattr("sys.argv", ["train_ppo_ray", "--seed", "3"])
    saved = plan.run_dir / "checkpoints" / "global_step40"
    budget = faults.FailureBudget(cfg.loop.max_failures)
    assert budget.spend() and not budget.spend() and budget.used == 1  # one recovery, then none
    note = driver.lost_run_note(plan, saved, driver.stop_reason(False, budget))
    assert note.startswith(" (2 actors lost, past --max_failures 1); saved: ") and str(saved) in note
    assert note.endswith(f"--seed 3 --load_checkpoint --ckpt_path {saved.parent} --save_path {plan.run_dir}")
    assert "no checkpoint was saved" in driver.lost_run_note(plan, None, "why")
    assert driver.stop_reason(True, faults.FailureBudget(3)) == "the run's engines are its caller's"


def _service_errors():
    from reinforce_pro.search.retriever import RetrieverError
    from reinforce_pro.serving import ServiceLost

    return [
        faults.RunLost("vLLM engine 0 was lost at step 9: killed by Ray's memory monitor (past it)"),
        ServiceLost("[retriever] stopped answering at http://127.0.0.1:5 (x) and could not start again on port 5: y"),
        RetrieverError("retriever http://127.0.0.1:9/retrieve is unreachable (refused); is it running?"),
    ]


@pytest.mark.parametrize("error", _service_errors(), ids=["actor-past-budget", "service-lost", "user-retriever"])
def test_a_loss_the_run_cannot_recover_from_is_one_line_and_exit_1(tmp_path, monkeypatch, capsys, error):
    """train() turns an actor lost past the budget, a kept service that cannot start again and a user's retrieval
    service that went away into one line on stderr and exit status 1, no traceback."""
    cfg = _cfg(tmp_path)
    monkeypatch.setattr("reinforce_pro.run.prepare.prepare", lambda cfg: SimpleNamespace(run_dir=tmp_path))

    def lost(cfg, plan):
        raise error

    monkeypatch.setattr(driver, "build_and_fit", lost)
    assert driver.train(cfg) == 1
    assert capsys.readouterr().err == f"train_ppo_ray: error: {error}\n"


def test_the_clock_checkpoints_once_its_interval_passed(tmp_path, monkeypatch):
    from reinforce_pro.trainer import ppo_trainer
    from reinforce_pro.trainer.ppo_trainer import CheckpointConfig, LoopConfig, PPOTrainer

    saved = []
    monkeypatch.setattr(ppo_trainer, "save_checkpoint", lambda root, step, state, write: saved.append(step) or root)
    monkeypatch.setattr(ppo_trainer, "rotate", lambda *a: [])
    clock = iter([1100.0, 1400.0, 1500.0, 1650.0, 1700.0])
    monkeypatch.setattr(ppo_trainer.time, "monotonic", lambda: next(clock))
    trainer = SimpleNamespace(cfg=LoopConfig(checkpoints=CheckpointConfig(tmp_path, -1, every_s=300.0)),
                              last_saved=1000.0, trainer_state=dict, _write_model_states=None)  # fmt: skip
    for step in (1, 2, 3, 4):
        PPOTrainer.maybe_save(trainer, step)
    assert saved == [2]  # 1100 - 1000 < 300; 1400 - 1000 >= 300; then 1500 and 1650 - 1400 < 300
    trainer.cfg = replace(trainer.cfg, checkpoints=CheckpointConfig(tmp_path, 2, every_s=0.0))
    PPOTrainer.maybe_save(trainer, 6)
    assert saved == [2, 6]


def test_memory_metrics_read_the_run_s_processes_on_this_node_and_the_headroom(monkeypatch):
    import os

    from reinforce_pro.run import memory

    placement = {"policy": [{"pid": os.getpid(), "ip": "10.0.0.1"}],  # this process, standing in for a rank
                 "engines": [{"pid": 2**22 + 7, "ip": "10.0.0.1"}],  # a process that is gone: 0
                 "reference": [{"pid": os.getpid(), "ip": "10.0.0.2"}]}  # another node: not read  # fmt: skip
    watch = memory.MemoryWatch(placement, here="10.0.0.1")
    m = watch.metrics()
    assert set(m) == {"memory/driver_rss_gb", "memory/policy0_rss_gb", "memory/engines0_rss_gb", "memory/run_rss_gb",
                      "memory/node_used_frac", "memory/headroom_gb"}  # fmt: skip
    assert m["memory/policy0_rss_gb"] > 0.01 and m["memory/engines0_rss_gb"] == 0.0
    assert m["memory/run_rss_gb"] == pytest.approx(sum(v for k, v in m.items() if k.endswith("0_rss_gb")) +
                                                   m["memory/driver_rss_gb"])  # fmt: skip
    assert 0 < m["memory/node_used_frac"] < 1 and "Tight" not in watch.startup_line()
    monkeypatch.setenv("RAY_memory_usage_threshold", "0.0001")  # the monitor would act already
    tight = memory.MemoryWatch(placement, here="10.0.0.1")
    assert tight.threshold == 0.0001 and tight.metrics()["memory/headroom_gb"] < 0
    assert tight.startup_line().startswith("[memory] node ") and "Tight" in tight.startup_line()


def test_the_start_line_says_where_the_run_checkpoints_and_how_a_killed_run_resumes(tmp_path):
    plan = SimpleNamespace(run_dir=tmp_path / "run")
    cfg = resume.run_checkpoints(_cfg(tmp_path), plan.run_dir)
    line = resume.checkpoint_line(cfg, plan, ["--seed", "3"])
    assert line.startswith(f"[checkpoints] every 5 min of training into {tmp_path / 'run' / 'checkpoints'}")
    assert line.endswith(f"--seed 3 --load_checkpoint --ckpt_path {tmp_path / 'run' / 'checkpoints'} "
                         f"--save_path {tmp_path / 'run'}")  # fmt: skip
    steps = resume.run_checkpoints(_cfg(tmp_path, "--save_steps", "4", "--ckpt_path", str(tmp_path / "c")),
                                   plan.run_dir)  # fmt: skip
    assert resume.checkpoint_line(steps, plan, []).startswith(f"[checkpoints] every 4 steps into {tmp_path / 'c'}")
    assert resume.checkpoint_line(_cfg(tmp_path, "--auto_checkpoint_minutes", "0"), plan, []) is None


def _rows(run_dir: Path, steps: int) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "x": 1.0}) + "\n" for s in range(steps + 1)))


def test_the_same_command_again_into_its_save_path_resumes_its_run(tmp_path, capsys):
    """A run killed with its driver (no line of its own survives) is resumed by running its command again: from
    the newest checkpoint, or from the first step with the old rows cut; a finished run or another command's is
    moved aside (nothing lost) and a new run starts; a first start only records its command."""
    run_dir = tmp_path / "run"

    def start(*extra):  # what train() does before it builds anything: rerun, prepare (the run directory), record
        given = _cfg(tmp_path, *extra)
        cfg, from_first_step = resume.rerun(given)
        run_dir.mkdir(parents=True, exist_ok=True)
        if from_first_step:
            resume.cut_rows(run_dir, -1)
        resume.record_command(resume.asked(given), run_dir)
        return cfg

    assert not start().loop.checkpoints.resume and (run_dir / resume.COMMAND_FILE).is_file()
    assert not start().loop.checkpoints.resume  # no step trained yet: a new start
    _rows(run_dir, 3)
    again = start()  # killed before its first checkpoint
    assert again.loop.checkpoints.resume is False and (run_dir / "metrics.jsonl").read_text() == ""
    assert "resuming it from the first step (no checkpoint yet)" in capsys.readouterr().out
    _rows(run_dir, 3)
    saved = run_dir / "checkpoints" / "global_step2"
    saved.mkdir(parents=True)
    (saved / "trainer_state.json").write_text(json.dumps({"step": 2}))
    (run_dir / "checkpoints" / "latest").write_text("global_step2")
    resumed = start()
    assert resumed.loop.checkpoints.resume is True and resumed.loop.checkpoints.ckpt_path == saved.parent
    assert f"resuming it from {saved}" in capsys.readouterr().out
    other = start("--seed", "7")  # another command: the old run moved aside, kept whole
    assert not other.loop.checkpoints.resume and (tmp_path / "run.1" / "checkpoints" / "latest").is_file()
    assert not (run_dir / "metrics.jsonl").exists() and (run_dir / resume.COMMAND_FILE).is_file()
    assert f"{run_dir} held a run of another command (" in capsys.readouterr().out
    _rows(run_dir, 5)
    (run_dir / "final_model").mkdir()
    assert not start("--seed", "7").loop.checkpoints.resume  # finished: a new run
    assert (tmp_path / "run.2" / "final_model").is_dir()
    assert f"held this command's finished run: moved to {tmp_path / 'run.2'}" in capsys.readouterr().out
    _rows(run_dir, 5)
    explicit = start("--seed", "7", "--load_checkpoint")  # --load_checkpoint: as before
    assert explicit.loop.checkpoints.resume is True and (run_dir / "metrics.jsonl").is_file()
    _, elsewhere = parse(["--pretrain", "m", "--seed", "8"])  # no --save_path: a new runs/<time> every time
    fresh, from_first_step = resume.rerun(elsewhere)
    assert fresh.output.save_path is None and not from_first_step and fresh.loop.checkpoints.run_id  # a new run's id


def test_without_a_save_path_the_same_command_resumes_its_newest_unfinished_run(tmp_path, monkeypatch, capsys):
    """A run of the default runs/<time>/ directory: a second start of the same command finds the newest one that
    trained a step and did not finish, and resumes it there; finished runs, other commands' runs and runs that
    never trained a step are left alone (a new runs/<time>/)."""
    monkeypatch.setattr(resume, "DEFAULT_RUNS", tmp_path / "runs")

    def command(*extra):
        _, cfg = parse(["--pretrain", "m", *extra])
        return cfg

    def made(name: str, cfg, steps: int, finished: bool = False) -> Path:
        run_dir = tmp_path / "runs" / name
        _rows(run_dir, steps)
        resume.record_command(resume.asked(cfg), run_dir)
        if finished:
            (run_dir / "final_model").mkdir()
        return run_dir

    assert resume.rerun(command())[0].output.save_path is None  # nothing there: a new runs/<time>/
    made("20261206-100000", command(), 5)
    killed = made("20261206-110000", command(), 3)
    made("20261206-120000", command(), 9, finished=True)
    made("20261206-130000", command("--seed", "7"), 4)
    made("20261206-140000", command(), 0)  # stopped before its first step
    for name, mtime in zip(sorted(p.name for p in (tmp_path / "runs").iterdir()), range(5), strict=True):
        os.utime(tmp_path / "runs" / name / resume.COMMAND_FILE, (1e9 + mtime, 1e9 + mtime))
    cfg, from_first_step = resume.rerun(command())
    assert cfg.output.save_path == str(killed) and cfg.loop.checkpoints.ckpt_path == killed / "checkpoints"
    assert f"[resume] {killed} holds this command's run: resuming it from the first step" in capsys.readouterr().out
    assert from_first_step  # no checkpoint yet: its rows are cut (once prepare checked the inputs), from step 1
    resume.cut_rows(killed, -1)
    assert (killed / "metrics.jsonl").read_text() == ""
    (killed / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2, "x"')  # a last line cut short by the kill
    assert resume.rerun(command())[0].output.save_path == str(killed)


# ---------------------------------------------------------------------------------------------- one run a directory
@pytest.fixture(autouse=True)
def _no_run_directory_held_after_a_test():
    yield
    run_lock.release_all()


def _holding(run_dir: Path):
    """Another live run: a process that holds `run_dir` (run_lock.claim) until it is killed."""
    code = "import sys, time; from reinforce_pro.run import run_lock; run_lock.claim(sys.argv[1]); print('held', " \
           "flush=True); time.sleep(600)"  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", code, str(run_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_run_directory_a_live_run_holds_is_refused_untouched_and_free_once_that_run_dies(tmp_path):
    """Two starts of one --save_path (a SLURM array, a sweep started with &): the second stops in one line naming
    the live run's process, before it cuts, moves or records anything; the lock dies with its process (kill -9),
    so the run can be resumed at once."""
    run_dir = tmp_path / "run"
    _rows(run_dir, 3)
    given = _cfg(tmp_path)
    resume.record_command(resume.asked(given), run_dir)
    live = _holding(run_dir)
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    try:
        with pytest.raises(UserInputError, match=rf"{run_dir} belongs to a live run \(pid {live.pid} on "):
            resume.rerun(given)
        with pytest.raises(UserInputError, match="belongs to a live run"):
            resume.rerun(_cfg(tmp_path, "--seed", "7"))  # another command: not moved aside from under it either
        assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before
        assert not (tmp_path / "run.1").exists()
    finally:
        live.kill()
        live.wait()
    cfg, from_first_step = resume.rerun(given)  # killed: resumed at once
    assert from_first_step and cfg.output.save_path == str(run_dir)


def test_without_a_save_path_a_live_run_is_not_adopted_and_two_starts_get_two_directories(tmp_path, monkeypatch):
    monkeypatch.setattr(resume, "DEFAULT_RUNS", tmp_path / "runs")
    _, given = parse(["--pretrain", "m"])
    running = tmp_path / "runs" / "20261207-100000"
    _rows(running, 3)
    resume.record_command(resume.asked(given), running)
    live = _holding(running)
    try:
        assert resume.rerun(given)[0].output.save_path is None  # a new runs/<time>/, not the live one
    finally:
        live.kill()
        live.wait()
    assert resume.rerun(given)[0].output.save_path == str(running.resolve())  # now an unfinished run: resumed
    run_lock.release_all()
    first, second = prepare_module._new_run_dir(), prepare_module._new_run_dir()  # within one second
    assert first != second and first.is_dir() and second.is_dir() and first.parent == second.parent


def test_a_restart_cuts_only_the_runs_own_files_and_only_after_the_inputs_are_checked(tmp_path, capsys):
    """The same command again, killed before its first checkpoint: its rows are cut to run again from step 1, but
    only once prepare has checked the inputs (a bad one exits 2 with the history whole), and only the files the
    run writes (--save_path . beside a user's prompts.jsonl leaves that alone)."""
    run_dir = tmp_path / "run"
    _rows(run_dir, 3)
    (run_dir / "prompts.jsonl").write_text('{"input": "1+1=", "label": "2"}\n')
    (run_dir / "samples.jsonl").write_text('{"step": 2, "prompt": "p"}\n')
    given = _cfg(tmp_path)  # --pretrain m, a directory that does not exist: prepare refuses it
    resume.record_command(resume.asked(given), run_dir)
    history = (run_dir / "metrics.jsonl").read_text()
    assert driver.train(given) == 2 and "--pretrain m: not a local HF model directory" in capsys.readouterr().err
    assert (run_dir / "metrics.jsonl").read_text() == history  # nothing cut before the inputs were checked
    cfg, from_first_step = resume.rerun(given)
    assert from_first_step
    resume.cut_rows(run_dir, -1)
    assert (run_dir / "metrics.jsonl").read_text() == "" == (run_dir / "samples.jsonl").read_text()
    assert (run_dir / "prompts.jsonl").read_text() == '{"input": "1+1=", "label": "2"}\n'
    _rows(run_dir, 3)
    assert resume.resuming(cfg, run_dir, None) is cfg  # a lost actor before the first checkpoint: the same rule
    assert (run_dir / "metrics.jsonl").read_text() == ""
    assert (run_dir / "prompts.jsonl").read_text() == '{"input": "1+1=", "label": "2"}\n'


def test_the_same_command_is_matched_by_what_it_trains_and_by_the_contents_of_the_files_it_names(
    tmp_path, monkeypatch, capsys
):
    """Flags that change how a run is run, not what it trains (--verbose, --max_failures, --engine_timeout_s,
    --logging_steps, --eval_steps, --max_ckpt_num), and ./m for /abs/m, resume it with a line naming the change;
    another seed, or other bytes in the prompt file at the same path, is another command (moved aside)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    data = tmp_path / "p.jsonl"
    data.write_text('{"input": "1+1=", "label": "2"}\n')
    (tmp_path / "r.py").write_text("def reward_func(queries, prompts, labels):\n    return [0.0] * len(queries)\n")
    run_dir = tmp_path / "run"

    def start(*extra, model="m"):
        _, given = parse(["--pretrain", model, "--prompt_data", "p.jsonl", "--remote_rm_url", "r.py", "--save_path",
                          str(run_dir), *extra])  # fmt: skip
        cfg, _ = resume.rerun(given)
        run_dir.mkdir(parents=True, exist_ok=True)
        resume.record_command(resume.asked(given), run_dir)
        return capsys.readouterr().out

    start()
    for extra in (["--verbose"], ["--max_failures", "5", "--engine_timeout_s", "60"], ["--logging_steps", "10"],
                  ["--eval_steps", "4", "--eval_dataset", "p.jsonl", "--max_ckpt_num", "9"]):  # fmt: skip
        _rows(run_dir, 3)
        out = start(*extra)
        assert f"[resume] {run_dir} holds this command's run" in out and "changed, not what it trains: " in out, out
    _rows(run_dir, 3)
    assert f"{run_dir} holds this command's run" in start(model=str(tmp_path / "m"))  # the same model, spelled absolute
    data.write_text('{"input": "2+2=", "label": "4"}\n')  # same path, other prompts
    _rows(run_dir, 3)
    out = start(model=str(tmp_path / "m"))
    assert f"held a run of another command (other contents in {data})" in out and (tmp_path / "run.1").is_dir()
    _rows(run_dir, 3)
    assert "held a run of another command (" in start("--seed", "7", model=str(tmp_path / "m"))


def test_what_a_run_directory_holds_never_ends_a_start_in_a_traceback(tmp_path, monkeypatch, capsys):
    """A command.json cut short (or not JSON), bytes that are not UTF-8 in metrics.jsonl, a move aside that the file
    system refuses: each is a line, never a traceback."""
    run_dir = tmp_path / "run"
    _rows(run_dir, 3)
    (run_dir / resume.COMMAND_FILE).write_text('{"seed": 4')  # cut short by a kill
    with (run_dir / "metrics.jsonl").open("ab") as f:
        f.write(b'{"step": 4, "x": "\xff\xfe"}\n')
    cfg, _ = resume.rerun(_cfg(tmp_path))
    assert "held a run that recorded no command: moved to" in capsys.readouterr().out
    aside = tmp_path / "run.1"
    resume.cut_rows(aside, 2)
    assert [json.loads(line)["step"] for line in (aside / "metrics.jsonl").read_text().splitlines()] == [0, 1, 2]
    assert [r["step"] for r in driver.logged_history(aside)] == [1, 2]
    _rows(run_dir, 3)

    def refused(self, target):
        raise OSError(16, "Device or resource busy")

    monkeypatch.setattr(Path, "rename", refused)
    with pytest.raises(UserInputError, match=r"moving it aside to .*run\.2 failed \(Device or resource busy\)"):
        resume.rerun(_cfg(tmp_path, "--seed", "9"))


def test_a_checkpoint_without_model_states_is_never_resumed_from(tmp_path):
    """--disable_ds_ckpt writes checkpoints a resume cannot load (then FileNotFoundError on every resume): they are
    passed over for the newest one that can be, or none."""
    from reinforce_pro.trainer.checkpoint import find_latest, save_checkpoint

    root = tmp_path / "c"
    save_checkpoint(root, 2, {"resumable": True}, lambda tmp: None)
    save_checkpoint(root, 4, {"resumable": False}, lambda tmp: None)
    assert find_latest(root) == root / "global_step2"
    (root / "global_step2" / "trainer_state.json").write_text('{"step": 2, "resumable": false}')
    assert find_latest(root) is None


def test_a_full_disk_is_one_line_that_says_how_to_go_on(tmp_path, monkeypatch, capsys):
    import errno

    def full(cfg, command=None):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / "metrics.jsonl"))

    monkeypatch.setattr(resume, "rerun", full)
    assert driver.train(_cfg(tmp_path)) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left on device writing " in err and "run the same command again" in err


def _checkpoint(root: Path, step: int, run_id: str | None) -> Path:
    from reinforce_pro.trainer.checkpoint import save_checkpoint

    def parts(tmp: Path) -> None:
        (tmp / "policy").mkdir()

    return save_checkpoint(root, step, {"run_id": run_id} if run_id else {}, parts)


def test_checkpoints_are_the_runs_own_resume_and_rotation_never_take_anothers(tmp_path):
    """Each checkpoint names the run that wrote it: a resume takes only its run's (or one that names none, written
    before ids were kept), rotation counts and deletes only its run's (it deleted a new run's checkpoint the moment
    it was written when older runs' filled --max_ckpt_num), and a save never replaces another run's."""
    from reinforce_pro.trainer.checkpoint import CheckpointClash, find_latest, rotate, save_checkpoint

    root = tmp_path / "c"
    for step in (10, 20, 30):
        _checkpoint(root, step, "older")
    mine = _checkpoint(root, 2, "mine")
    assert find_latest(root, "mine") == mine and find_latest(root, "older") == root / "global_step30"
    assert rotate(root, max_num=1, max_mem_gb=float("inf"), run_id="mine") == [] and mine.is_dir()
    _checkpoint(root, 4, "mine")
    assert rotate(root, max_num=1, max_mem_gb=float("inf"), run_id="mine") == [mine]
    assert all((root / f"global_step{s}").is_dir() for s in (10, 20, 30))  # the other run's, untouched
    with pytest.raises(CheckpointClash, match="global_step30 is run older's checkpoint"):
        save_checkpoint(root, 30, {"run_id": "mine"}, lambda tmp: None)
    legacy = tmp_path / "legacy"
    _checkpoint(legacy, 5, None)
    assert find_latest(legacy, "anyone") == legacy / "global_step5"


def test_a_new_run_into_a_ckpt_path_holding_anothers_checkpoints_is_refused_and_without_one_they_are_its_own(
    tmp_path, capsys
):
    """Without --load_checkpoint a new run there is refused in one line; with it, it says plainly that it continues
    the other run's weights as a new run (the multi-node test resumes two nodes' checkpoint in a new directory)."""
    first = _cfg(tmp_path, "--save_steps", "5", "--ckpt_path", str(tmp_path / "shared"))
    _checkpoint(tmp_path / "shared", 5, "someone")
    with pytest.raises(
        UserInputError,
        match=rf"--ckpt_path {tmp_path / 'shared'} holds another run's checkpoints "
        r"\(global_step5, run someone\): give this run a --ckpt_path of its own",
    ):
        resume.rerun(first)  # fmt: skip
    assert (tmp_path / "shared" / "global_step5").is_dir()
    taken, _ = resume.rerun(_cfg(tmp_path, "--save_steps", "5", "--ckpt_path", str(tmp_path / "shared"),
                                 "--load_checkpoint"))  # fmt: skip
    assert taken.loop.checkpoints.run_id == "someone" and resume.latest(taken) == tmp_path / "shared" / "global_step5"
    assert "is another run's (run someone); this run continues its weights and state as a new run" in (
        capsys.readouterr().out)  # fmt: skip
    default, _ = resume.rerun(_cfg(tmp_path, "--save_steps", "5"))  # no --ckpt_path: under the run directory
    assert default.loop.checkpoints.ckpt_path == tmp_path / "run" / "checkpoints"


def test_the_documented_comparison_script_starts_the_second_correction_afresh_and_keeps_the_first(tmp_path, capsys):
    """examples/scripts/_gpu_common.sh: --save_path OUT --ckpt_path OUT/ckpt --save_steps 20 --load_checkpoint, run
    once per correction into one OUT. The second correction resumed the first one's checkpoint and overwrote its
    final_model and records; now it is another command: the first run is moved aside whole, checkpoints and all,
    and the second starts from scratch. The same correction again resumes its own checkpoint."""
    out = tmp_path / "run"

    def start(correction: str):
        given = _cfg(tmp_path, "--ckpt_path", str(out / "ckpt"), "--save_steps", "20", "--load_checkpoint",
                     "--enable_vllm_is_correction", "--vllm_is_correction_type", correction)  # fmt: skip
        cfg, _ = resume.rerun(given)
        out.mkdir(exist_ok=True)
        resume.record_command(resume.asked(given), out, cfg.loop.checkpoints.run_id)
        return cfg

    tis = start("tis")
    _rows(out, 20)
    resume.record_command(json.loads((out / resume.COMMAND_FILE).read_text()), out, tis.loop.checkpoints.run_id)
    _checkpoint(out / "ckpt", 20, tis.loop.checkpoints.run_id)
    icepop = start("icepop")
    assert "held a run of another command (" in capsys.readouterr().out
    assert (tmp_path / "run.1" / "ckpt" / "global_step20").is_dir() and resume.latest(icepop) is None
    assert icepop.loop.checkpoints.run_id != tis.loop.checkpoints.run_id
    _rows(out, 20)
    _checkpoint(out / "ckpt", 20, icepop.loop.checkpoints.run_id)
    again = start("icepop")
    assert resume.latest(again) == out / "ckpt" / "global_step20" and again.loop.checkpoints.resume
    assert again.loop.checkpoints.run_id == icepop.loop.checkpoints.run_id


def test_groups_that_cannot_all_be_placed_leave_nothing_of_the_run_on_the_cluster(tmp_path, monkeypatch):
    """build_groups after a node was lost: the policy's placement group and actors are created, the reference's
    placement cannot be satisfied; what was created is released (not leaked to the next try or to the cluster)
    and the placement error goes on to the driver."""
    from reinforce_pro.run import actors
    from reinforce_pro.workers.launcher import PlacementFailed

    made, killed, removed = [], [], []

    def placement(spec, use_gpu):
        if spec.name != "actor":
            raise PlacementFailed(f"{spec.name}: 1 bundle(s) of {{'CPU': 1}} (PACK) could not be placed in 300 s")
        made.append(f"pg-{spec.name}")
        return made[-1]

    monkeypatch.setattr(actors, "make_placement_group", placement)
    monkeypatch.setattr(actors, "create_group", lambda cls, spec, pg, *a, **k: [f"{cls.__name__}@{pg}"])
    monkeypatch.setattr(ray, "kill", killed.append)
    monkeypatch.setattr(ray.util, "remove_placement_group", removed.append)
    cfg = _cfg(tmp_path, "--init_kl_coef", "0.01", "--ref_num_gpus_per_node", "1")  # a reference of its own
    with pytest.raises(PlacementFailed, match="^ref: 1 bundle"):
        actors.build_groups(cfg, SimpleNamespace(model_path="m", log_dir=None), use_gpu=False)
    assert made == ["pg-actor"] and removed == made and killed == ["PolicyWorker@pg-actor"]


def test_a_run_whose_actors_cannot_be_placed_again_stops_in_one_line_with_its_checkpoint(tmp_path, monkeypatch):
    """The driver's recovery starts the run's actors again after a lost node; a placement the smaller cluster
    cannot satisfy ends the run as a lost one (exit 1, one line): the placement error, what is saved and the
    command that resumes."""
    from reinforce_pro.workers.launcher import PlacementFailed

    plan = SimpleNamespace(run_dir=tmp_path / "run", log_dir=None, model_path="m")
    plan.run_dir.mkdir()
    saved = tmp_path / "run" / "checkpoints" / "global_step4"
    error = PlacementFailed("policy: 2 bundle(s) of {'CPU': 1} (STRICT_SPREAD) could not be placed in 300 s")
    monkeypatch.setattr("sys.argv", ["train_ppo_ray", "--seed", "3"])
    monkeypatch.setattr(driver, "start_ray", lambda *a, **k: None)
    monkeypatch.setattr(driver, "gpus_available", lambda: False)
    monkeypatch.setattr("transformers.AutoTokenizer.from_pretrained", lambda *a, **k: None)
    monkeypatch.setattr(resume, "latest", lambda cfg: saved)
    monkeypatch.setattr(driver, "fit_once", lambda *a: (_ for _ in ()).throw(error))
    monkeypatch.setattr(driver.start, "start_config", lambda cfg, plan, use_gpu: cfg)
    with pytest.raises(faults.RunLost) as lost:
        driver.build_and_fit(_cfg(tmp_path, "--save_steps", "2"), plan)
    said = str(lost.value)
    assert said.startswith(f"{error} (its actors cannot be placed); saved: {saved}; resume with: ") and "\n" not in said
    assert said.endswith(f"--seed 3 --load_checkpoint --ckpt_path {saved.parent} --save_path {plan.run_dir}")
    monkeypatch.setattr(resume, "latest", lambda cfg: None)  # on a first start: the placement error alone
    with pytest.raises(faults.RunLost, match=r"^policy: 2 bundle\(s\) .* placed in 300 s$"):
        driver.build_and_fit(_cfg(tmp_path, "--save_steps", "2"), plan)


class _Ready:
    """An actor handle's __ray_ready__ as dead_actor calls it; its answer is `answer` (an error to raise, or a
    value)."""

    def __init__(self, name: str, answer):
        self.name, self.answer = name, answer
        self._actor_id = SimpleNamespace(hex=lambda: name)
        self.__ray_ready__ = SimpleNamespace(remote=lambda: self)


def _fake_ray(monkeypatch):
    def get(ref, timeout=None):
        if isinstance(ref.answer, BaseException):
            raise ref.answer
        return ref.answer

    monkeypatch.setattr(faults.ray, "wait", lambda refs, num_returns, timeout: (refs, []))
    monkeypatch.setattr(faults.ray, "get", get)


def _dead_actor_error(actor_id: str) -> BaseException:
    error = rex.ActorDiedError()
    error.actor_id = actor_id
    return error


def test_the_dead_actor_behind_a_call_that_failed_on_its_own_is_found_and_a_busy_one_is_not_dead(monkeypatch):
    _fake_ray(monkeypatch)
    dead = _dead_actor_error("p1")
    roles = {"policy": [_Ready("p0", True), _Ready("p1", dead)], "engines": [_Ready("e0", rex.GetTimeoutError())]}
    assert faults.dead_actor(roles) is dead
    assert faults.dead_actor({"policy": roles["policy"][:1], "engines": roles["engines"]}) is None  # busy != dead
    assert faults.describe(dead, roles, 6) == (
        "policy rank 1 was lost at step 7: its process died (a signal, the kernel's OOM killer or a crash)"
    )


def test_a_collective_that_lost_its_peer_is_the_peers_loss_and_any_other_actor_error_goes_on_unchanged(
    tmp_path, monkeypatch
):
    """Multi-rank ZeRO: a rank killed mid-step leaves rank 0's all-reduce with "connection closed by peer", which
    reaches the driver as rank 0's own error (RayTaskError) before, or instead of, the dead rank's ActorDiedError:
    fit_once finds the dead rank and reports it lost (the driver then recovers from the checkpoint); an actor's
    error with every actor alive is raised as it was."""
    from reinforce_pro.rewards.loader import RewardFileError

    _fake_ray(monkeypatch)
    dead = _dead_actor_error("p1")
    groups = SimpleNamespace(policy=[_Ready("p0", True), _Ready("p1", dead)], release=lambda: None)
    groups.roles = lambda: {"policy": groups.policy}
    peer = RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:40123\nsecond line")
    collective = rex.RayTaskError("PolicyWorker.train_batch", "Traceback (most recent call last): ...", peer)
    failing = {"error": collective.as_instanceof_cause()}

    def reward_function(*a):
        raise failing["error"]

    monkeypatch.setattr(driver.actors, "build_groups", lambda *a: groups)
    monkeypatch.setattr(driver.sources, "reward_function", reward_function)
    cfg, plan = _cfg(tmp_path), SimpleNamespace(task=None, reward_source="file:r.py", run_dir=tmp_path)
    with pytest.raises(driver.ActorLost) as lost:
        driver.fit_once(cfg, plan, False, None, None, faults.FailureBudget(3))
    assert str(lost.value) == (
        "policy rank 1 was lost at step 1: its process died (a signal, the kernel's OOM killer or a crash) (another "
        "rank's call failed with it: [gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:40123)"
    )
    groups.policy[1] = _Ready("p1", True)  # every rank alive: the actor's own error, untouched
    failing["error"] = rex.RayTaskError("f", "tb", RewardFileError("r.py: reward_func raised")).as_instanceof_cause()
    with pytest.raises(RewardFileError) as own:
        driver.fit_once(cfg, plan, False, None, None, faults.FailureBudget(3))
    assert own.value is failing["error"]
