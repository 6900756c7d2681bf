"""The Absolute-Zero rollout source: one batch of seed prompts -> proposer and solver samples with their
rewards, as one `Samples` batch that the ordinary ExperienceBuilder turns into one joint update.

Rows are ordered solver groups first (rollout_n consecutive rows per kept question), then proposer rows;
`advantage_segments` tells the builder to compute each role's advantages on its own (docs/selfplay.md). A solver
row of an agent task (the search task) is a whole episode: its environment tokens carry action_mask 0, out of
the loss and of the IS correction, as in --agent_func_path runs. With --agent_func_path naming an OpenAI-SDK agent,
that agent solves through the trainer's endpoint; an episode whose history was rewritten adds its earlier segments
as rows after all others (`fork_of`: they take their episode's advantage).
"""

from __future__ import annotations

import random

import torch

from reinforce_pro.agents.agent_source import agent_metrics
from reinforce_pro.agents.episode import Episode
from reinforce_pro.experience import Samples, layout_routes, pad_rows
from reinforce_pro.rewards.loader import RewardOutput
from reinforce_pro.rollout.sampler import Sampler, pad_token_id, sampling_params
from reinforce_pro.selfplay.controller import Rollout, SelfPlayConfig, SelfPlayController, TrainingSample
from reinforce_pro.selfplay.solve import solve
from reinforce_pro.selfplay.tasks import Question, SelfPlayTask, role_sampling

JUDGE_MAX_TOKENS = 8


class SelfPlaySource:
    def __init__(
        self, sampler: Sampler, task: SelfPlayTask, selfplay: SelfPlayConfig, seed: int, judge_engines=None,
        max_len: int = 2048, sdk_agent=None,
    ):  # fmt: skip
        """judge_engines: engines that serve the task's `llm` scorers (greedy); None uses the rollout engines,
        i.e. the current policy judges. max_len (--max_len) bounds a solver episode of an agent task. sdk_agent:
        the OpenAIAgentSource of an --agent_func_path OpenAI-SDK solver (None: the task's own solver)."""
        self.sampler, self.task, self.judge_engines, self.max_len = sampler, task, judge_engines, max_len
        self.sdk_agent = sdk_agent
        self.controller = SelfPlayController(task, selfplay, self.generate_texts, self.judge, self.solve)
        self.rng = random.Random(seed)  # which question of each group is sampled: part of the resume state

    def state_dict(self) -> dict:
        return {"rng": self.rng.getstate(), **self.controller.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        version, internal, gauss = state["rng"]  # lists after a JSON round trip
        self.rng.setstate((version, tuple(internal), gauss))
        self.controller.load_state_dict(state)

    def use_partial(self, partial) -> None:
        raise ValueError("--partial_rollout applies to prompt rollouts and agent episodes, not to self-play")

    def generate_texts(self, prompts: list[str], sampling: dict | None = None, engines=None) -> list[Rollout]:
        """Sample one response per prompt text; Rollout.generation keeps (prompt ids, Generation). `sampling`
        overrides the run's sampling parameters key by key (the task's per-role budgets, the judge's);
        --max_new_tokens stays the ceiling, so a response always fits --max_len."""
        if sampling:
            sampling = role_sampling(sampling_params(self.sampler.cfg), sampling)
        ids, generations, texts = self.sampler.sample_texts(prompts, sampling, engines)
        return [Rollout(p, t, (i, g)) for p, t, i, g in zip(prompts, texts, ids, generations, strict=True)]

    def solve(self, questions: list[Question], sampling: dict | None = None) -> list[Rollout]:
        """One solver response per question (an episode for an agent task: selfplay/solve.py), sampled with the
        run's parameters under the task's solver overrides."""
        run = sampling_params(self.sampler.cfg)
        full = role_sampling(run, sampling) if sampling else run
        return solve(self.sampler, self.task, questions, full, self.max_len, self.sdk_agent)

    def close(self) -> None:
        """Stop the SDK solver's endpoints (the run's end)."""
        if self.sdk_agent is not None:
            self.sdk_agent.close()

    def judge(self, prompts: list[str]) -> list[str]:
        """Greedy completions of the judge model, for tasks whose scorers are `llm`."""
        sampling = {"temperature": 0.0, "max_tokens": JUDGE_MAX_TOKENS, "skip_special_tokens": True}
        return [r.text for r in self.generate_texts(prompts, sampling, self.judge_engines)]

    def generate(self, batch: list[dict], n: int) -> Samples:
        """`batch`: seed records; `n` solver responses to each proposed question. Runs the whole self-play step
        (with re-proposals) and returns its training rows, already scored."""
        result = self.controller.step(batch, n, self.rng)
        fork_of = [lead for lead, s in enumerate(result.samples) for _ in s.rollout.forks]
        forks = [TrainingSample(Rollout(s.rollout.prompt, "", fork), s.reward, s.score, s.role)
                 for s in result.samples for fork in s.rollout.forks]  # fmt: skip
        rows = result.samples + forks
        index = torch.zeros(len(rows), dtype=torch.long)
        for k, (start, end, _) in enumerate(result.segments):
            index[start:end] = k
        samples = self.to_samples([s.rollout for s in rows], index)
        is_proposer = torch.tensor([float(s.role == "proposer") for s in rows])
        extra = {"proposer_frac": is_proposer}
        episodes = [s.rollout.generation for s in rows if isinstance(s.rollout.generation, Episode)]
        for key in sorted({k for e in episodes for k in e.extra_logs}):  # the agent's logs, 0 on other rows
            extra[key] = torch.tensor([_episode_log(s.rollout.generation, key) for s in rows])
        samples.rewards = RewardOutput(
            rewards=torch.tensor([s.reward for s in rows], dtype=torch.float32),
            scores=torch.tensor([s.score for s in rows], dtype=torch.float32),
            extra_logs=extra,
        )
        samples.advantage_segments = result.segments
        samples.fork_of = fork_of or None
        samples.metrics = result.metrics
        if episodes:
            samples.metrics.update(agent_metrics(episodes, dialogues=False))
            for key in sorted({k for e in episodes for k in e.extra_logs}):
                mean = sum(_episode_log(e, key) for e in episodes) / len(episodes)
                samples.metrics[f"selfplay/{self.task.name}/solver_{key}_mean"] = mean
        if self.sdk_agent is not None:  # the step's solver and re-proposal rounds (and earlier ladder episodes)
            samples.metrics["agent/episodes"] = float(self.sdk_agent.answered)
            samples.metrics["agent/failed_episodes"] = float(self.sdk_agent.failed_answers)
            samples.metrics["agent/segment_forks"] = float(len(forks))  # of the trained episodes
            self.sdk_agent.answered = self.sdk_agent.failed_answers = 0
        return samples

    def to_samples(self, rollouts: list[Rollout], index: torch.Tensor) -> Samples:
        """The padded Samples layout of completions and episodes together: an episode's environment tokens
        get action_mask 0 and log-prob 0 (agents/episode.py), a completion's tokens are all actions."""
        prompt_ids, tokens, actions, log_probs, truncated, routes = [], [], [], [], [], []
        for r in rollouts:
            if isinstance(r.generation, Episode):
                e = r.generation
                prompt_ids.append(e.prompt_ids)
                tokens.append(e.tokens)
                actions.append(e.action)
                log_probs.append(e.log_probs)
                truncated.append(e.truncated)
                routes.append(e.routes)
            else:
                ids, g = r.generation
                prompt_ids.append(ids)
                tokens.append(list(g.token_ids))
                actions.append([True] * len(g.token_ids))
                log_probs.append(list(g.log_probs))
                truncated.append(g.finish_reason == "length")
                routes.append(g.routes)
        tok = self.sampler.tokenizer
        padded = pad_rows(prompt_ids, tokens, actions, log_probs, pad_token_id(tok))
        responses = [tok.decode(t, skip_special_tokens=True, clean_up_tokenization_spaces=False) for t in tokens]
        prompts = [r.prompt for r in rollouts]
        samples = Samples(*padded, prompts, responses, [None] * len(rollouts), index, torch.tensor(truncated))
        samples.routes = layout_routes(list(map(len, prompt_ids)), routes, padded[0].size(1))  # MoE engines
        return samples


def _episode_log(generation, key: str) -> float:
    """An episode's agent log summed over its turns (0 for a completion)."""
    return float(sum(generation.extra_logs.get(key, [0.0]))) if isinstance(generation, Episode) else 0.0
