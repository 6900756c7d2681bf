"""Everything a run needs before Ray starts: check the inputs, make the run directory, load the prompts, the
reward source and the task or agent, and (without --pretrain) have the built-in model made and warm-started
(run/warm_start.py); the result is a RunPlan (run/config.py)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from datetime import datetime
from pathlib import Path

from reinforce_pro.data.prompts import DataError, build_prompts, load_prompt_records
from reinforce_pro.models.routing import is_moe_dir
from reinforce_pro.rewards.loader import RewardFileError, load_reward_func
from reinforce_pro.run import resume, run_lock
from reinforce_pro.run.config import Data, RunConfig, RunPlan
from reinforce_pro.run.errors import UserInputError
from reinforce_pro.run.warm_start import built_in_model


def _check_model_dir(flag: str, path: str | None) -> None:
    if path is None:
        return
    config = Path(path) / "config.json"
    if not config.is_file():
        raise UserInputError(f"{flag} {path}: not a local HF model directory (no config.json)")
    try:
        json.loads(config.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise UserInputError(f"{flag} {path}: config.json is not valid JSON ({e})") from None


def _check_output_dir(flag: str, path: str) -> None:
    """`path` must be (or be creatable as) a directory we can write: checked before any model is built, by
    creating it and a file in it, then removing what the check created. Permission bits alone are not the
    answer: root may "write" to /proc or a read-only mount, and only mkdir says no."""
    target = Path(path).resolve()
    missing = _first_missing(target)
    probe = missing.parent if missing is not None else target  # the deepest part that exists
    if not probe.is_dir():
        raise UserInputError(f"{flag} {path}: {probe} is a file, not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UserInputError(f"{flag} {path}: {probe} is not writable")
    try:
        target.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=target).close()
    except OSError as e:
        raise UserInputError(f"{flag} {path}: cannot create a directory and write in it ({e.strerror})") from None
    finally:
        if missing is not None:
            shutil.rmtree(missing, ignore_errors=True)


def _check_max_len(max_len: int, model_dir: str) -> None:
    """vLLM refuses a max_model_len beyond the model's positions with a long traceback: say it in one line."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    limit = config.get("max_position_embeddings")
    if limit is not None and max_len > limit:
        raise UserInputError(f"--max_len {max_len} exceeds the model's max_position_embeddings {limit}")


def _check_sandbox() -> None:
    """A task that executes model-written code runs only where the kernel can confine it; say which layers."""
    from reinforce_pro.selfplay.sandbox import SandboxUnavailable, require_isolation

    try:
        print(f"[self-play] {require_isolation().describe()}", flush=True)
    except SandboxUnavailable as e:
        raise UserInputError(f"--selfplay_task runs model-written code, but {e}") from None


def prepare(cfg: RunConfig) -> RunPlan:
    """Check every path the config names, read the prompts, build the built-in model if asked: a bad input
    stops here, in one line, before Ray or any engine starts."""
    models = cfg.models
    judge = cfg.selfplay.judge_pretrain if cfg.selfplay else None
    model_dirs = {"--pretrain": models.pretrain, "--critic_pretrain": models.critic_pretrain,
                  "--reward_pretrain": models.reward_pretrain, "--selfplay_judge_pretrain": judge}  # fmt: skip
    for flag, path in model_dirs.items():
        _check_model_dir(flag, path)
    if cfg.output.save_path:
        _check_output_dir("--save_path", cfg.output.save_path)
    if cfg.loop.checkpoints is not None and cfg.loop.checkpoints.ckpt_path is not None:  # None: the run directory's
        _check_output_dir("--ckpt_path", str(cfg.loop.checkpoints.ckpt_path))
    task = None
    if cfg.selfplay is not None:
        from reinforce_pro.selfplay.builtin_tasks import load_task

        try:
            task = load_task(cfg.selfplay.task, cfg.selfplay.task_path, cfg.selfplay.kb, cfg.selfplay.retriever_url)
        except ValueError as e:
            raise UserInputError(str(e)) from None
        if getattr(task, "runs_code", False):  # task files are duck-typed
            _check_sandbox()
        if cfg.selfplay.config.reference_buffer > 0 and not _overrides(task, "reference_record"):
            raise UserInputError(
                f"--selfplay_reference_buffer: task {getattr(task, 'name', '?')} defines no reference_record(question)"
            )
    agent_cls = _load_agent_file(cfg.agent.func_path, task) if cfg.agent is not None else None
    if models.remote_rm_url:
        try:
            load_reward_func(models.remote_rm_url)
        except RewardFileError as e:
            raise UserInputError(str(e)) from None
    if cfg.output.save_path:
        run_dir = Path(cfg.output.save_path).resolve()
        created = _first_missing(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
    else:
        created = _first_missing(resume.DEFAULT_RUNS.resolve())
        run_dir = _new_run_dir()
        created = created or run_dir
    run_lock.claim(run_dir)  # outside the clean-up below: a directory another live run holds is not removed
    try:
        return _prepare_run_dir(cfg, run_dir, task, agent_cls)
    except BaseException:
        run_lock.release(run_dir)
        if created is not None:  # a failed start leaves no half-made run directory behind (base_model/...)
            shutil.rmtree(created, ignore_errors=True)
        raise


def _load_agent_file(path: str, task):
    """The --agent_func_path file's agent; with self-play (`task`), an OpenAI-SDK solver only. A search task's
    retrieval service is started first for the file to read (SEARCH_RETRIEVER_URL), and stopped again, with the
    variable taken back, when the file is refused."""
    from reinforce_pro.agents.agent_file import load_agent
    from reinforce_pro.agents.contract import AgentFileError

    retriever = getattr(task, "retriever_url", None)  # search self-play: its service, for the agent file
    set_url = retriever is not None and "SEARCH_RETRIEVER_URL" not in os.environ
    if set_url:
        os.environ["SEARCH_RETRIEVER_URL"] = retriever()  # read by the file as it loads (agent_search_openai)
    try:
        try:
            agent_cls = load_agent(path)
        except AgentFileError as e:
            raise UserInputError(str(e)) from None
        if task is not None and isinstance(agent_cls, type):
            raise UserInputError(
                f"--absolute_zero --agent_func_path {path}: the solver must be an OpenAI-SDK agent (async def "
                "run_agent(client, prompt, label), or OpenRLHF's executor class); an AgentInstance solver is the "
                "task's own (its solver_agent)"
            )
    except UserInputError:  # a refused run leaves no service behind
        if set_url:
            del os.environ["SEARCH_RETRIEVER_URL"]
        if task is not None:
            task.close()
        raise
    return agent_cls


def _new_run_dir() -> Path:
    """A runs/<time>/ directory of its own: two starts in one second get two (the second with a -1 suffix),
    since mkdir, which one of them wins, makes it."""
    stamp, runs = datetime.now().strftime("%Y%m%d-%H%M%S"), resume.DEFAULT_RUNS
    runs.mkdir(parents=True, exist_ok=True)
    for n in range(10**6):
        run_dir = runs / (stamp if n == 0 else f"{stamp}-{n}")
        try:
            run_dir.mkdir()
            return run_dir.resolve()
        except FileExistsError:
            continue
    raise UserInputError(f"{runs}: no free directory name for {stamp}")


def _first_missing(path: Path) -> Path | None:
    """The outermost directory of `path` (itself included) that does not exist yet: what mkdir -p creates."""
    missing = None
    while not path.exists():
        missing, path = path, path.parent
    return missing


def _prepare_run_dir(cfg: RunConfig, run_dir: Path, task, agent_cls) -> RunPlan:
    summary: dict = {}
    data = cfg.data
    try:  # the prompt file is read before any model is built: a bad file fails in a second, with one line
        records = None
        if data.prompt_data:
            records = load_prompt_records(
                data.prompt_data, data.prompt_data_probs, data.prompt_split, data.max_samples, cfg.seed
            )
        model_path = cfg.models.pretrain or built_in_model(cfg, run_dir, summary, task)
        prompts = _seed_records(cfg, task, records) if task else _prompts(cfg, model_path, records)
    except DataError as e:
        raise UserInputError(str(e)) from None
    if not prompts:
        raise UserInputError("no prompts to train on")
    if len(prompts) < cfg.loop.rollout_batch_size:
        raise UserInputError(f"{len(prompts)} prompts, fewer than --rollout_batch_size {cfg.loop.rollout_batch_size}")
    if task is not None:
        source = f"selfplay:{task.name}"
    elif isinstance(agent_cls, type):  # an AgentInstance environment scores its episodes (an OpenAI-SDK agent
        source = f"agent:{Path(cfg.agent.func_path).resolve()}"  # may leave them to the reward function below)
    elif cfg.models.remote_rm_url:
        source = str(Path(cfg.models.remote_rm_url).resolve())
    elif cfg.models.reward_pretrain:
        source = f"model:{cfg.models.reward_pretrain}"
    elif cfg.data.built_in:
        source = f"builtin:{cfg.data.builtin_task}"
    elif cfg.distill is not None and cfg.agent is None:  # a teacher and no reward: pure distillation
        source = "none"
    else:
        source = "builtin:exact_match"
    _check_max_len(data.max_len, model_path)
    _check_moe_flags(cfg, model_path)
    teacher_path = None
    if cfg.distill is not None:
        from reinforce_pro.run.teacher import resolve_teacher

        teacher_path = resolve_teacher(cfg, model_path)
        _check_max_len(data.max_len, teacher_path)
    log_dir = None if cfg.output.verbose else run_dir / "logs"
    return RunPlan(run_dir, model_path, prompts, source, summary, task, agent_cls, log_dir, teacher_path)


def _check_moe_flags(cfg: RunConfig, model_path: str) -> None:
    """The MoE flags need an MoE model, and an MoE engine records routes only without prefix caching."""
    moe = is_moe_dir(model_path)
    if not moe and (cfg.forward.routing_replay != "none" or cfg.loss.aux_loss_coef > 0):
        flag = (
            f"--routing_replay {cfg.forward.routing_replay}"
            if cfg.forward.routing_replay != "none"
            else "--aux_loss_coef"
        )
        raise UserInputError(f"{flag} needs a mixture-of-experts model; {model_path} has no experts")
    if moe and cfg.engines.config.enable_prefix_caching:
        raise UserInputError(
            "--enable_prefix_caching with a mixture-of-experts model: its engine records every token's experts "
            "(routing/*, --routing_replay), and a cached prefix is never fed again; drop the flag"
        )


def _prompts(cfg: RunConfig, model_path: str, records: list[dict] | None) -> list[dict]:
    from transformers import AutoTokenizer

    from reinforce_pro.data import EMBEDDED_TASKS

    data = cfg.data
    tokenizer = AutoTokenizer.from_pretrained(model_path, use_fast=not cfg.models.disable_fast_tokenizer)
    if data.built_in:
        records = EMBEDDED_TASKS[data.builtin_task]().records(min(data.max_samples, 100_000), cfg.seed)
        spec = data.prompt_spec("input", "label")
        source = f"built-in {data.builtin_task}"
    else:
        spec = data.prompt_spec(data.input_key, data.label_key)
        source = data.prompt_data
    prompts = build_prompts(records, spec, tokenizer, source)
    _check_prompts_fit(prompts, tokenizer, data)
    return prompts


def _check_prompts_fit(prompts: list[dict], tokenizer, data: Data) -> None:
    """A prompt (after --prompt_max_len keeps its end) must leave room for one response token in --max_len:
    otherwise vLLM rejects it inside Ray a minute later. Only possible when prompt_max_len >= max_len, so
    only then is every prompt tokenised."""
    if data.prompt_max_len < data.max_len:
        return
    from reinforce_pro.rollout.sampler import encode_prompt

    for i, p in enumerate(prompts):
        n = len(encode_prompt(tokenizer, p["prompt"], data.prompt_max_len))
        if n >= data.max_len:
            raise UserInputError(
                f"prompt {i} is {n} tokens (after --prompt_max_len {data.prompt_max_len}), leaving no room for a "
                f"response in --max_len {data.max_len}: raise --max_len or lower --prompt_max_len"
            )


def _seed_records(cfg: RunConfig, task, records: list[dict] | None) -> list[dict]:
    """Self-play seeds: --prompt_data records as they are (the task reads them), or the task's own."""
    if cfg.data.built_in:
        return task.seed_records(min(cfg.data.max_samples, 100_000), seed=cfg.seed)
    return records


def _overrides(task, method: str) -> bool:
    """Whether a (duck-typed) task defines `method` other than SelfPlayTask's placeholder."""
    from reinforce_pro.selfplay.tasks import SelfPlayTask

    own = getattr(type(task), method, None)
    return own is not None and own is not getattr(SelfPlayTask, method)
