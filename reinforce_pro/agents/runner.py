"""The multi-turn rollout loop: engine generation and environment steps, alternating, for a whole batch of
episodes at once (each turn is one engine call for every live episode, then every agent's `step` runs
concurrently on one event loop).

Two kinds of data (docs/agents.md):
- a prompt string: an agent episode of up to `max_turns` model turns, one token sequence per episode;
- a list of turns marked `history` / `target`: the environment processes history turns (the model generates
  nothing), and each target turn is one trained row whose prompt the agent builds from what the history
  produced. The episode reward is broadcast to its target rows.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass

from reinforce_pro.agents.contract import StepOutput, normalize_step
from reinforce_pro.agents.episode import Episode
from reinforce_pro.rollout.sampler import encode_prompt

Sample = Callable[[list[list[int]], dict], list]  # (prompt ids, sampling) -> [Generation]
# --partial_rollout: (prompt ids, sampling) -> ([Generation], each token's weight version), sampled in chunks
# with weight syncs let in between (Sampler.sample_in_chunks)
SampleInChunks = Callable[[list[list[int]], dict], tuple[list, list[list[int]]]]


@dataclass
class AgentConfig:
    max_turns: int = 4
    max_len: int = 2048  # prompt + every turn, in tokens
    prompt_max_len: int = 1024
    reward_mode: str = "sum"


class AgentRunner:
    def __init__(self, agent_cls: type, tokenizer, sample: Sample, sampling: dict, cfg: AgentConfig):
        self.agent_cls, self.tokenizer, self.sample, self.sampling, self.cfg = (
            agent_cls, tokenizer, sample, sampling, cfg
        )  # fmt: skip
        self.sample_in_chunks: SampleInChunks | None = None  # set for --partial_rollout (AgentSource.use_partial)

    # ------------------------------------------------------------------ multi-turn episodes
    def run_episodes(self, batch: list[dict], n: int) -> list[Episode]:
        """n episodes per {"prompt", "label"} of `batch`, in prompt order (episodes of a prompt adjacent)."""
        loop = asyncio.new_event_loop()
        try:
            agents = [self.agent_cls() for _ in range(len(batch) * n)]
            states = [{"prompt": item["prompt"], "label": item["label"]} for item in batch for _ in range(n)]
            firsts = loop.run_until_complete(_gather(*(a.reset(s) for a, s in zip(agents, states, strict=True))))
            episodes = [
                self._start(i, i // n, s, first) for i, (s, first) in enumerate(zip(states, firsts, strict=True))
            ]
            for turn in range(self.cfg.max_turns):
                live = [i for i, e in enumerate(episodes) if not e.done]
                if not live:
                    break
                actions = self._generate([episodes[i] for i in live])
                steps = loop.run_until_complete(
                    _gather(
                        *(self._step(agents[i], episodes[i], text, turn) for i, text in zip(live, actions, strict=True))
                    )
                )
                for i, out in zip(live, steps, strict=True):
                    self._after_step(episodes[i], out, last_turn=turn == self.cfg.max_turns - 1)
        finally:
            loop.close()
        return episodes

    def _start(self, index: int, group: int, state: dict, first: dict) -> Episode:
        if "observation_tokens" in first:
            ids = list(first["observation_tokens"])
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
        else:
            text = first.get("observation", state["prompt"])
            ids = encode_prompt(self.tokenizer, text, self.cfg.prompt_max_len)
        meta = {"episode_id": index, "group_id": group, "turn_spans": []}
        return Episode(index, group, state["prompt"], state["label"], ids, text=text, step_meta=meta)

    def _generate(self, episodes: list[Episode]) -> list[str]:
        """One model turn for each episode: one engine call per distinct sampling setting."""
        by_setting: dict[str, list[int]] = {}
        settings = []
        for k, e in enumerate(episodes):
            room = self.cfg.max_len - len(e.context())
            setting = {**self.sampling, **(e.sampling or {})}
            setting["max_tokens"] = max(1, min(setting.get("max_tokens", room), room))
            settings.append(setting)
            by_setting.setdefault(json.dumps(setting, sort_keys=True), []).append(k)
        texts = [""] * len(episodes)
        for key, members in by_setting.items():
            contexts, versions = [episodes[k].context() for k in members], [None] * len(members)
            if self.sample_in_chunks is None:
                generations = self.sample(contexts, json.loads(key))
            else:  # a weight sync may land before any chunk of any turn: each token keeps its version
                generations, versions = self.sample_in_chunks(contexts, json.loads(key))
            for k, g, v in zip(members, generations, versions, strict=True):
                e = episodes[k]
                text = self.tokenizer.decode(g.token_ids, skip_special_tokens=True)
                start = len(e.tokens)
                e.add_model(list(g.token_ids), list(g.log_probs), text, v, g.routes)
                e.step_meta.setdefault("turn_spans", []).append([start, len(e.tokens), "model"])
                texts[k] = text
        return texts

    async def _step(self, agent, e: Episode, action_text: str, turn: int) -> StepOutput:
        states = {"observation_text": e.text, "action_text": action_text, "label": e.label, "turn": turn,
                  "sampling_params": e.sampling}  # fmt: skip
        return normalize_step(await agent.step(states))

    def _after_step(self, e: Episode, out: StepOutput, last_turn: bool) -> None:
        e.turn_rewards.append(out.reward)
        e.turn_scores.append(out.score)
        e.step_rewards_ext.setdefault("turn_rewards", []).append(out.reward)
        for k, v in out.extra_logs.items():
            e.extra_logs.setdefault(k, []).append(v)
        e.sampling = out.sampling_params
        if out.done:
            e.done = True
            return
        ids = out.feedback_tokens if out.feedback_tokens is not None else self._encode(out.feedback_text)
        text = out.feedback_text if out.feedback_text is not None else self.tokenizer.decode(ids)
        start = len(e.tokens)
        e.add_environment(ids, text)
        e.step_meta["turn_spans"].append([start, len(e.tokens), "environment"])
        if last_turn or len(e.context()) >= self.cfg.max_len - 1:
            e.done = e.truncated = True

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []

    # ------------------------------------------------------------------ history / target dialogues
    def run_dialogues(self, batch: list[dict], n: int) -> list[Episode]:
        """Rows for every target turn of n episodes per dialogue, ordered (dialogue, target turn, sample) so
        that each target turn's n rows are one group."""
        loop = asyncio.new_event_loop()
        try:
            rows = loop.run_until_complete(self._dialogues(batch, n))
        finally:
            loop.close()
        rows.sort(key=lambda e: (e.step_meta["dialogue"], e.step_meta["turn_id"], e.step_meta["sample"]))
        groups: dict[tuple[int, int], int] = {}
        for e in rows:
            key = (e.step_meta["dialogue"], e.step_meta["turn_id"])
            e.group_id = e.step_meta["group_id"] = groups.setdefault(key, len(groups))
        return rows

    async def _dialogues(self, batch: list[dict], n: int) -> list[Episode]:
        episodes = [(d, j, self.agent_cls()) for d in range(len(batch)) for j in range(n)]
        memory = {(d, j): [] for d, j, _ in episodes}
        op_logs = {(d, j): [] for d, j, _ in episodes}
        rows: list[Episode] = []
        longest = max(len(item["prompt"]) for item in batch)
        for k in range(longest):
            targets = []
            for d, j, agent in episodes:
                turns = batch[d]["prompt"]
                if k >= len(turns):
                    continue
                turn = turns[k]
                if turn["role"] == "history":
                    out = await _process_history(agent, turn, k)
                    memory[(d, j)].append(out.get("memory", turn["content"]))
                    op_logs[(d, j)] += out.get("op_log", [])
                elif turn["role"] == "target":
                    prompt = _build_prompt(agent, turn, k, memory[(d, j)])
                    meta = {"episode_id": d * n + j, "dialogue": d, "sample": j, "turn_id": k, "turn_role": "target",
                            "group_id": -1, "op_log": op_logs[(d, j)]}  # fmt: skip
                    op_logs[(d, j)] = []
                    ids = encode_prompt(self.tokenizer, prompt, self.cfg.prompt_max_len)
                    label = turn.get("label", batch[d]["label"])
                    targets.append((agent, Episode(d * n + j, -1, prompt, label, ids, text=prompt, step_meta=meta)))
                else:
                    raise ValueError(f"dialogue {d} turn {k}: role must be 'history' or 'target', got {turn['role']!r}")
            if not targets:
                continue
            self._generate([e for _, e in targets])
            steps = await asyncio.gather(
                *(self._step(a, e, e.text[len(e.prompt) :], k) for a, e in targets)
            )  # fmt: skip
            for (_, e), out in zip(targets, steps, strict=True):
                e.turn_rewards.append(out.reward)
                e.turn_scores.append(out.score)
                e.step_rewards_ext = {"step_reward": out.reward}
                e.done = True
                d, j = e.step_meta["dialogue"], e.step_meta["sample"]
                turn = batch[d]["prompt"][k]
                memory[(d, j)].append(turn["content"] + e.text[len(e.prompt) :])  # later targets see this exchange
            rows += [e for _, e in targets]
        _broadcast_episode_reward(rows, self.cfg.reward_mode)
        return rows


async def _gather(*coroutines):
    """asyncio.gather inside the loop that runs it (outside, gather would bind to another loop)."""
    return await asyncio.gather(*coroutines)


async def _process_history(agent, turn: dict, k: int) -> dict:
    process = getattr(agent, "process_history", None)
    if process is None:
        return {"memory": turn["content"], "op_log": [{"op": "keep", "turn_id": k}]}
    out = await process({"content": turn["content"], "turn_id": k})
    return out or {}


def _build_prompt(agent, turn: dict, k: int, memory: list[str]) -> str:
    build = getattr(agent, "build_prompt", None)
    if build is None:
        return "".join(memory) + turn["content"]
    return build({"content": turn["content"], "turn_id": k, "memory": list(memory)})


def _broadcast_episode_reward(rows: list[Episode], mode: str) -> None:
    """Each target row's reward becomes its episode's reward (sum, or the last target's)."""
    by_episode: dict[int, list[Episode]] = {}
    for e in rows:
        by_episode.setdefault(e.episode_id, []).append(e)
    for members in by_episode.values():
        members.sort(key=lambda e: e.step_meta["turn_id"])
        rewards = [e.turn_rewards[-1] for e in members]
        total = rewards[-1] if mode == "last" else sum(rewards)
        for e in members:
            e.turn_rewards = [total]
