"""Agents written to the OpenAI SDK: the two file shapes `--agent_func_path` accepts besides `AgentInstance`,
and the rollout source that runs them against the endpoint (agents/openai_endpoint.py).

A plain function (the shape most agent code already has):

    async def run_agent(client, prompt, label) -> {"reward": float, "scores": float, "extra_logs": {...}}

`client` is an `openai.AsyncOpenAI` whose base URL is the episode's session (any model name is served). A file
that sets `CLIENT = "anthropic"` gets an `anthropic.AsyncAnthropic` instead, served Anthropic's Messages API
(`await client.messages.create(model=..., max_tokens=..., messages=[...])`) by the same endpoint.

OpenRLHF's executor file (examples/python/agent_func_openai_server_executor.py): a class whose
`async def run_agent(self, prompt, label, session_id)` calls `self.client` with
`extra_body={"session_id": session_id}`. Its `run_agent` runs here unchanged: the class is created without
calling its `__init__`, and given what OpenRLHF's executor sets before calling it (`client`, `model_name`,
`sampling_params`, `hf_tokenizer`, `max_length`). A result without a reward (OpenRLHF's default `run_agent`
returns {}) is scored by the run's reward function, as OpenRLHF does.

Each episode is one session; its calls become token-exact rows (agents/trajectory.py). An episode whose agent
raises, times out or never calls the endpoint is dropped with the rest of its prompt's group (the group
baseline needs every sample of it), counted in `agent/dropped_episodes`; a step where every group drops stops
the run with the first error.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import json
import queue
import ssl
import sys
import threading
import types
from dataclasses import dataclass

import torch

from reinforce_pro.agents.contract import AgentFileError
from reinforce_pro.agents.episode import Episode, episodes_to_samples
from reinforce_pro.agents.openai_endpoint import Endpoint
from reinforce_pro.agents.runner import AgentConfig
from reinforce_pro.agents.trajectory import segment_episode
from reinforce_pro.experience import Samples
from reinforce_pro.rollout.sampler import pad_token_id, sampling_params, token_versions

CLIENTS = ("openai", "anthropic")  # the SDK clients a run_agent function can be given (its file's CLIENT)
EPISODE_TIMEOUT_S = 600.0  # an agent that has not returned by then is dropped (a hung tool, a lost request)


@dataclass
class OpenAIAgent:
    """What an agent file of either OpenAI shape provides: a coroutine (client, base_url, session, prompt,
    label) -> result dict, made by `load_openai_agent`."""

    kind: str  # "function" or "executor"
    target: object  # the function, or the executor class
    path: str
    client: str = "openai"  # the SDK a function gets: "openai" or "anthropic" (the file's CLIENT)


def load_openai_agent(module: types.ModuleType, path: str) -> OpenAIAgent | None:
    """The file's OpenAI-shape agent, or None if it has none (an AgentInstance file)."""
    fn = getattr(module, "run_agent", None)
    if fn is not None:
        if not inspect.iscoroutinefunction(fn):
            raise AgentFileError(f"--agent_func_path {path}: run_agent must be an async function")
        if len(inspect.signature(fn).parameters) < 3:
            raise AgentFileError(f"--agent_func_path {path}: run_agent takes (client, prompt, label)")
        client = getattr(module, "CLIENT", "openai")
        if client not in CLIENTS:
            raise AgentFileError(
                f"--agent_func_path {path}: CLIENT must be one of {', '.join(CLIENTS)}, got {client!r}"
            )
        return OpenAIAgent("function", fn, path, client)
    classes = [c for c in vars(module).values() if inspect.isclass(c) and c.__module__ == module.__name__
               and inspect.iscoroutinefunction(getattr(c, "run_agent", None))]  # fmt: skip
    if len(classes) > 1:
        names = ", ".join(c.__name__ for c in classes)
        raise AgentFileError(f"--agent_func_path {path}: several classes define run_agent ({names}): keep one")
    return OpenAIAgent("executor", classes[0], path) if classes else None


class OpenAIAgentSource:
    """Runs n episodes of the agent per prompt against the endpoint, then turns each session's trajectory into
    rows. The endpoint is started here and stopped with the run (`close`). `solver_only`: self-play's solver,
    which answers through `answer`'s endpoints alone, so the run's own endpoint is never started."""

    def __init__(self, sampler, agent: OpenAIAgent, cfg: AgentConfig, solver_only: bool = False):
        self.sampler, self.agent, self.cfg = sampler, agent, cfg
        self.sampling = sampling_params(sampler.cfg)
        self.endpoint = None if solver_only else self._endpoint(self.sampling)
        self.executor = None if solver_only else self._executor(self.endpoint)
        # --eval_dataset: held-out episodes get an endpoint of their own (made at the first evaluation), so
        # that under --async_train the episodes of a training step in flight keep their sampling and batching
        self.eval_endpoint: Endpoint | None = None
        self.eval_executor = None
        self.partial = None
        self.timeout_s = EPISODE_TIMEOUT_S
        self.solver_endpoints: dict[str, tuple[Endpoint, object]] = {}  # answer(): sampling -> (endpoint, executor)
        self.eval_logs: dict[str, float] = {}  # the last evaluate()'s mean extra_logs per key
        self.answered = 0  # answer()'s episodes since the caller last read it (self-play logs and resets both)
        self.failed_answers = 0  # of those, the ones that failed

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def use_partial(self, partial) -> None:
        """--partial_rollout: every request is sampled in chunks with weight syncs let in between, so one
        completion may come from several policy versions; each token keeps the version that sampled it."""
        self.partial = partial
        self.endpoint.batcher.chunked = lambda prompts, sampling: self.sampler.sample_in_chunks(prompts, partial,
                                                                                               sampling)  # fmt: skip
        # between chunks a weight sync is let in through the engine gate, which the thread that called generate()
        # holds: the engine calls run there, the agents on a thread of their own
        self.caller = CallerThread()
        self.endpoint.batcher.submit = self.caller.submit

    def close(self) -> None:
        started = [self.endpoint, self.eval_endpoint, *(endpoint for endpoint, _ in self.solver_endpoints.values())]
        for endpoint in started:
            if endpoint is not None:
                endpoint.stop()

    def _endpoint(self, sampling: dict) -> Endpoint:
        engines = getattr(self.sampler, "engines", None)  # several: each session pinned to one
        endpoint = Endpoint(self.sampler.tokenizer, self.sampler.sample, sampling, self.cfg.max_len, engines=engines)
        endpoint.start()
        return endpoint

    def _executor(self, endpoint: Endpoint):
        """OpenRLHF's executor, made as its execute() would have made it, without its __init__ (None for the
        plain function shape)."""
        import openai

        if self.agent.kind != "executor":
            return None
        cls = self.agent.target
        executor = cls.__new__(cls)
        executor.client = openai.AsyncOpenAI(base_url=f"{endpoint.url}/v1", api_key="none", max_retries=0)
        executor.model_name = endpoint.model_name
        executor.sampling_params = types.SimpleNamespace(**endpoint.sampling, logprobs=1)
        executor.hf_tokenizer, executor.max_length = self.sampler.tokenizer, self.cfg.max_len
        return executor

    def generate(self, batch: list[dict], n: int) -> Samples:
        jobs, results, trajectories = self._episodes(batch, n, self.endpoint, self.executor, self.partial is not None)
        return self._samples(jobs, results, trajectories, n)

    def evaluate(self, batch: list[dict], n: int, temperature: float, score) -> tuple[torch.Tensor, ...]:
        """Held-out episodes (--eval_dataset), n per prompt, trained on nothing: (scores, rewards, tokens the
        model sampled), flat in prompt order. They run against an endpoint of their own, which samples at
        `temperature` (a request may not change it, as in training) and whole responses, never in chunks. A
        failed episode scores 0; without a reward from the agent the run's reward function scores the text of
        its last segment."""
        sampling = {**self.sampling, "temperature": temperature}
        if self.eval_endpoint is None or self.eval_endpoint.sampling != sampling:
            if self.eval_endpoint is not None:
                self.eval_endpoint.stop()
            self.eval_endpoint = self._endpoint(sampling)
            self.eval_executor = self._executor(self.eval_endpoint)
        jobs, results, trajectories = self._episodes(batch, n, self.eval_endpoint, self.eval_executor, False)
        failed = [_failure(r, t) is not None for r, t in zip(results, trajectories, strict=True)]
        lasts = [segment_episode(t.segments[-1], i, i // n, job[0], job[1], job[0]) if t.segments else None
                 for i, (job, t) in enumerate(zip(jobs, trajectories, strict=True))]  # fmt: skip
        lengths = torch.tensor([float(sum(len(c.completion_ids) for seg in t.segments for c in seg))
                                for t in trajectories])  # fmt: skip
        kept = [r for r, f in zip(results, failed, strict=True) if not f]
        if kept and all(r.get("reward") is None for r in kept):  # the run's reward function scores them
            tokenizer = self.sampler.tokenizer
            responses = [tokenizer.decode(e.tokens, skip_special_tokens=True) if e else "" for e in lasts]
            out = score([job[0] for job in jobs], responses, [job[1] for job in jobs])
            rewards, scores = out.rewards.float(), out.scores.float()
        else:
            for e, r, f in zip(lasts, results, failed, strict=True):
                if not f:
                    _set_result([e], r)
            rewards = torch.tensor([0.0 if f else e.turn_rewards[0] for e, f in zip(lasts, failed, strict=True)])
            scores = torch.tensor([0.0 if f else e.turn_scores[0] for e, f in zip(lasts, failed, strict=True)])
        ok = torch.tensor([not f for f in failed], dtype=torch.float32)
        self.eval_logs = _mean_logs([None if f else r for r, f in zip(results, failed, strict=True)])
        return scores * ok, rewards * ok, lengths

    def answer(self, prompts: list[str], labels: list, sampling: dict) -> list[tuple[Episode, list[Episode], str]]:
        """Self-play's solver (--absolute_zero with this file): one episode per prompt, sampled with `sampling`
        (the task's solver settings; the ladder's greedy ones), against an endpoint kept per sampling. The task
        scores what the episode answered, so the agent's own reward is not read. Per prompt: its last segment
        (the answer), its earlier segments, and why it failed ("" when it did not). A failed episode keeps what
        it sampled; one that never called the endpoint is a row with no model tokens (nothing trained, scored
        as an empty answer)."""
        key = json.dumps(sampling, sort_keys=True)
        if key not in self.solver_endpoints:
            endpoint = self._endpoint(sampling)
            self.solver_endpoints[key] = (endpoint, self._executor(endpoint))
        endpoint, executor = self.solver_endpoints[key]
        batch = [{"prompt": p, "label": label} for p, label in zip(prompts, labels, strict=True)]
        jobs, results, trajectories = self._episodes(batch, 1, endpoint, executor, False)
        self.answered += len(jobs)
        out = []
        for i, (job, result, t) in enumerate(zip(jobs, results, trajectories, strict=True)):
            rows = [segment_episode(seg, i, i, job[0], job[1], job[0]) for seg in t.segments]
            if not rows:  # the prompt's ids as the endpoint would have rendered them for a completion
                rows = [Episode(i, i, job[0], job[1], self.sampler.tokenizer(job[0])["input_ids"], text=job[0])]
            out.append((rows[-1], rows[:-1], _failure(result, t) or ""))
        failures = [why for _, _, why in out if why]
        if failures:
            self.failed_answers += len(failures)
            print(f"[agent] {len(failures)} solver episodes failed (first: {failures[0]}); each kept what it "
                  "sampled and is scored as answered", file=sys.stderr, flush=True)  # fmt: skip
        return out

    def _episodes(self, batch: list[dict], n: int, endpoint: Endpoint, executor, serve: bool) -> tuple[list, ...]:
        """n episodes of the agent per prompt against `endpoint`: (the (prompt, label) jobs, what each run_agent
        returned or raised, each session's trajectory). `serve`: the engine calls run on this thread (partial
        rollouts: it holds the engine gate), the agents on the caller thread. The endpoint is checked first, and
        started again if it stopped answering; an engine lost under the episodes is raised once they end (its
        requests were answered 503), for the trainer's engine recovery to replace it and sample them again."""
        endpoint.ensure()
        jobs = [(item["prompt"], item["label"]) for item in batch for _ in range(n)]
        sessions = [endpoint.open_session() for _ in jobs]
        endpoint.set_live(len(jobs))
        endpoint.batcher.lost = None
        try:
            run = lambda: asyncio.run(self._run_all(jobs, sessions, endpoint, executor))  # noqa: E731
            results = self.caller.serve_while(run) if serve else run()
        finally:
            trajectories = [endpoint.close_session(s).trajectory for s in sessions]
            endpoint.set_live(0)
        if endpoint.batcher.lost is not None:  # an engine was lost under them: it is replaced, the batch sampled again
            raise endpoint.batcher.lost
        return jobs, results, trajectories

    async def _run_all(self, jobs, sessions, endpoint: Endpoint, executor) -> list:
        import httpx
        import openai

        # a connection pool per session: one pool shared by every session scans all of its connections on each
        # request (httpcore), a cost that grows with the sessions (benchmarks/bench_agent_endpoint.py); the
        # endpoint is plain http, so the clients share one unused TLS context rather than each loading the CA
        # bundle
        tls, limits = _tls_context(), httpx.Limits(max_connections=2, max_keepalive_connections=2)

        async def one(job, sid):
            try:
                if executor is not None:
                    return await asyncio.wait_for(executor.run_agent(*job, sid), self.timeout_s)
                if self.agent.client == "anthropic":
                    return await self._run_anthropic(job, f"{endpoint.url}/s/{sid}")
                async with httpx.AsyncClient(verify=tls, limits=limits, timeout=self.timeout_s) as http:
                    client = openai.AsyncOpenAI(base_url=f"{endpoint.url}/s/{sid}/v1", api_key="none",
                                                http_client=http, max_retries=0)  # fmt: skip
                    return await asyncio.wait_for(self.agent.target(client, *job), self.timeout_s)
            except Exception as e:  # the agent's code: its episode is dropped and counted
                return e
            finally:
                endpoint.set_live(endpoint.batcher.live - 1)

        return await asyncio.gather(*(one(job, sid) for job, sid in zip(jobs, sessions, strict=True)))

    async def _run_anthropic(self, job, base_url: str):
        """One episode of a `CLIENT = "anthropic"` agent: its SDK posts to <base_url>/v1/messages."""
        import anthropic

        client = anthropic.AsyncAnthropic(base_url=base_url, api_key="none", max_retries=0, timeout=self.timeout_s)
        async with client:
            return await asyncio.wait_for(self.agent.target(client, *job), self.timeout_s)

    def _samples(self, jobs, results, trajectories, n: int) -> Samples:
        failures = [_failure(r, t) for r, t in zip(results, trajectories, strict=True)]
        groups = range(len(jobs) // n)
        kept = [g for g in groups if not any(failures[g * n : (g + 1) * n])]
        if not kept:
            first = next(f for f in failures if f)
            raise AgentFileError(f"--agent_func_path {self.agent.path}: all {len(jobs)} episodes of the step failed; "
                                 f"the first: {first}")  # fmt: skip
        if len(kept) < len(groups):
            print(
                f"[agent] {sum(map(bool, failures))} episodes failed (first: {next(f for f in failures if f)}); "
                f"dropping their {len(groups) - len(kept)} prompt groups this step",
                file=sys.stderr,
                flush=True,
            )
        rewards = [results[g * n + j].get("reward") for g in kept for j in range(n)]
        if any(r is None for r in rewards) and not all(r is None for r in rewards):
            raise AgentFileError(
                f"--agent_func_path {self.agent.path}: run_agent returned a reward for some "
                "episodes and none for others: return one always, or never (the reward function)"
            )
        leads, forks, fork_of = [], [], []
        for g_index, g in enumerate(kept):
            for j in range(n):
                i = g * n + j
                rows = [segment_episode(seg, i, g_index, jobs[i][0], jobs[i][1], jobs[i][0])
                        for seg in trajectories[i].segments]  # fmt: skip
                _set_result(rows, results[i])
                lead = len(leads)
                leads.append(rows[-1])  # the last segment holds the answer the reward judged
                forks += rows[:-1]
                fork_of += [lead] * (len(rows) - 1)
        episodes = leads + forks
        tokenizer = self.sampler.tokenizer
        responses = [tokenizer.decode(e.tokens, skip_special_tokens=True) for e in episodes]
        samples = episodes_to_samples(episodes, pad_token_id(tokenizer), responses, self.cfg.reward_mode)
        if rewards[0] is None:
            samples.rewards = None  # the run's reward function scores them (experience_builder.rewards)
        samples.fork_of, samples.group_size = (fork_of if forks else None), n
        if self.partial is not None:
            samples.token_version = token_versions([e.versions for e in episodes], samples.num_actions)
        samples.metrics = {
            "agent/episodes": float(len(jobs)),
            "agent/dropped_episodes": float(len(jobs) - len(kept) * n),
            "agent/calls_mean": sum(t.calls for t in trajectories) / len(jobs),
            "agent/segment_forks": float(sum(t.forks for t in trajectories)),
            "agent/abandoned_calls": float(sum(t.abandoned for t in trajectories)),
            "agent/tool_calls_mean": sum(t.tool_calls for t in trajectories) / len(jobs),
            "agent/tool_call_failures": float(sum(t.tool_call_failures for t in trajectories)),
            "agent/clamped_max_tokens": float(sum(t.clamped for t in trajectories)),
            "agent/rows": float(len(episodes)),
            "agent/env_token_frac": sum(a is False for e in episodes for a in e.action)
            / max(1, sum(len(e.tokens) for e in episodes)),
            "agent/truncated_frac": sum(e.truncated for e in leads) / len(leads),
        }
        return samples


@functools.cache
def _tls_context() -> ssl.SSLContext:
    return ssl.create_default_context()


class CallerThread:
    """Calls submitted from other threads, run on the thread inside serve_while (the caller of generate())."""

    def __init__(self):
        self.queue: queue.Queue = queue.Queue()

    def submit(self, fn, *args) -> concurrent.futures.Future:
        future = concurrent.futures.Future()
        self.queue.put((future, fn, args))
        return future

    def serve_while(self, work):
        """Run `work()` on a thread of its own, serving submitted calls here until it returns; its result."""
        out: list = []
        thread = threading.Thread(target=lambda: out.append(_result_or_error(work)), name="agents", daemon=True)
        thread.start()
        while thread.is_alive() or not self.queue.empty():
            try:
                future, fn, args = self.queue.get(timeout=0.02)
            except queue.Empty:
                continue
            try:
                future.set_result(fn(*args))
            except Exception as e:  # handed back to the waiting request (a 503)
                future.set_exception(e)
        if isinstance(out[0], BaseException):
            raise out[0]
        return out[0]


def _result_or_error(work):
    try:
        return work()
    except BaseException as e:  # re-raised on the caller's thread
        return e


def _failure(result, trajectory) -> str | None:
    """Why an episode cannot be trained, or None."""
    if isinstance(result, BaseException):
        kind = "timed out" if isinstance(result, TimeoutError) else f"raised {type(result).__name__}"
        return f"run_agent {kind}: {result}"
    if result is not None and not isinstance(result, dict):
        return f"run_agent must return a dict (reward, scores, extra_logs), got {type(result).__name__}"
    if not trajectory.segments:
        return "run_agent never called the endpoint"
    reward = (result or {}).get("reward")
    if reward is not None and not isinstance(reward, int | float):
        return f"run_agent returned a non-numeric reward {reward!r}"
    return None


def _mean_logs(results: list[dict | None]) -> dict[str, float]:
    """The mean of each numeric `extra_logs` key over the episodes (a failed one, None, counts 0)."""
    logs = [(r or {}).get("extra_logs") or {} for r in results]
    keys = sorted({k for log in logs for k, v in log.items() if isinstance(v, int | float)})
    return {k: sum(float(log.get(k, 0.0)) for log in logs) / len(logs) for k in keys} if logs else {}


def _set_result(rows: list[Episode], result: dict | None) -> None:
    """Every row of an episode carries its reward, score and logs."""
    result = result or {}
    reward = float(result.get("reward") or 0.0)
    score = float(result.get("scores", reward) or 0.0)
    extra = {k: float(v) for k, v in (result.get("extra_logs") or {}).items() if isinstance(v, int | float)}
    for e in rows:
        e.turn_rewards, e.turn_scores = [reward], [score]
        e.extra_logs = {k: [v] for k, v in extra.items()}
