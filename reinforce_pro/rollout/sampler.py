"""The rollout side's two pieces: a `Sampler` (encode prompts, sample over the engines, decode) and the plain
rollout source, `PromptSource`. Every rollout source (this one, self-play's, the agents') is composed around
one Sampler and turns a batch of prompt records into `Samples`; none of them scores for the loss or touches
the trainer's workers (that is trainer/experience_builder.py).

A rollout source has one method and a resumable state:
    generate(batch: list[dict]) -> Samples         # batch: [{"prompt", "label"}], the prompt stream's records
    state_dict() -> dict / load_state_dict(dict)  # e.g. self-play's question sampler; {} for plain prompts
The producer (trainer/rollout_stream.py) calls `generate` in the trainer's thread or in its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from reinforce_pro.experience import Samples, extend_routes, layout_routes, pad_rows
from reinforce_pro.flagspec import flag
from reinforce_pro.rollout.engine_wait import wait_for_engines
from reinforce_pro.rollout.vllm_engine import Generation


@dataclass
class RolloutConfig:
    """How responses are sampled; what is made of them is ExperienceConfig's (trainer/experience_builder.py)."""

    # fmt: off
    prompt_max_len: int = 1024
    max_new_tokens: int = 1024
    min_new_tokens: int = 0  # no end of response before this many tokens (equal-length benchmark work)
    temperature: float = flag(1.0, "sampling temperature (the trainer uses the same)", dotted="rollout.temperature",
        above=0, group="training")
    top_p: float = 1.0
    top_k: int = -1
    # seconds an engine may take to answer one generate call before it counts as hung (rollout/engine_wait.py);
    # 0: wait as long as it takes
    engine_timeout_s: float = flag(1800.0,
        "[reinforce_pro] seconds a rollout engine may take to answer one generate or weight-sync call before it "
        "counts as hung and is recovered from like a lost actor (0: wait as long as it takes)", at_least=0,
        group="running")
    # fmt: on


def sampling_params(cfg: RolloutConfig) -> dict:
    """vLLM SamplingParams keywords for the rollout (log-probs are requested by the engine)."""
    minimum = {"min_tokens": cfg.min_new_tokens} if cfg.min_new_tokens else {}
    return dict(
        temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, max_tokens=cfg.max_new_tokens,
        skip_special_tokens=False, **minimum,
    )  # fmt: skip


def encode_prompt(tokenizer, prompt: str, max_len: int) -> list[int]:
    """Prompt token ids with the BOS token (unless the text already starts with it), keeping the last
    `max_len` tokens: the question is usually at the end."""
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    if tokenizer.bos_token_id is not None and not prompt.startswith(tokenizer.bos_token or "\0"):
        ids = [tokenizer.bos_token_id] + ids
    return ids[-max_len:]


def pad_token_id(tokenizer) -> int:
    """The id that fills padding positions. Many pretrained tokenizers define no pad token (Llama, SmolLM2's
    GGUF export); padding sits under attention_mask 0 and is never attended or trained, so any id serves:
    EOS, else 0."""
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if candidate is not None:
            return candidate
    return 0


# Markup that tool-call and reasoning parsers read: kept in a client's text even where a vocabulary makes it a
# special token (Hermes-2-Pro's <tool_call>), as vLLM's hermes parser turns skip_special_tokens off for it
VISIBLE_SPECIAL = ("<tool_call>", "</tool_call>", "<think>", "</think>")


def client_text(tokenizer, ids: list[int]) -> str:
    """The text a client is shown for sampled `ids`: special tokens (<eos>, <|im_end|>) skipped, VISIBLE_SPECIAL
    kept."""
    size, hidden = getattr(tokenizer, "_reinforce_pro_hidden", (None, None))
    if size != len(tokenizer):  # found once per vocabulary (a token added later finds it again)
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        special = set(tokenizer.all_special_ids) | {i for i, t in added.items() if getattr(t, "special", False)}
        hidden = frozenset(i for i in special if tokenizer.convert_ids_to_tokens(i) not in VISIBLE_SPECIAL)
        tokenizer._reinforce_pro_hidden = (len(tokenizer), hidden)
    return tokenizer.decode([t for t in ids if t not in hidden], skip_special_tokens=False)


def stop_end(tokenizer, ids: list[int], checked: int, stops) -> int | None:
    """The length of the shortest prefix of `ids` whose text holds one of `stops`, where the first `checked` ids'
    text held none (as the client's text is cut, client_text); None when the whole text holds none."""

    def holds(k: int) -> bool:
        text = client_text(tokenizer, ids[:k])
        return any(stop in text for stop in stops)

    if not holds(len(ids)):
        return None
    return next(k for k in range(checked + 1, len(ids) + 1) if holds(k))


def token_versions(versions: list[list[int]], width: int) -> torch.Tensor:
    """[rows, width] weight versions of each response token (partial rollouts), right-padded with 0 like
    the action columns they align with."""
    return torch.tensor([v + [0] * (width - len(v)) for v in versions], dtype=torch.long)


@dataclass
class PartialRollout:
    """--partial_rollout: responses are sampled `chunk` tokens at a time; before each chunk `between(i)` (i = 0
    for a call's first chunk) lets a waiting weight sync in and returns the engines' version
    (EngineGate.let_syncs_in), or, synchronously, sets the version chunk i is sampled by
    (PPOTrainer.chunk_weights). `settled`: the chunk from which the weights no longer change within a call
    (synchronously, 1: every chunk after the first has one version), so the rest of every response is sampled
    in one engine call instead of one a chunk; None (asynchronously) keeps every chunk a call of its own, as
    a sync may land between any two."""

    chunk: int
    between: Callable[[int], int]
    settled: int | None = None


class Sampler:
    """Prompt texts or token ids in, engine generations out, spread evenly over the rollout engines."""

    def __init__(self, engines, tokenizer, cfg: RolloutConfig):
        self.engines, self.tokenizer, self.cfg = engines, tokenizer, cfg

    def encode(self, prompt: str) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, self.cfg.prompt_max_len)

    def sample(self, prompt_ids: list[list[int]], sampling: dict | None = None, engines=None) -> list[Generation]:
        """One response per prompt, in order, the prompts split evenly over `engines` (the rollout engines
        by default), sampled with `sampling` (the rollout's sampling_params by default)."""
        if not prompt_ids:  # nothing to sample (a self-play round with no valid question): no engine call
            return []
        engines = engines or self.engines
        sampling = sampling or sampling_params(self.cfg)
        chunk = math.ceil(len(prompt_ids) / len(engines))
        used = [(i, engine) for i, engine in enumerate(engines) if prompt_ids[i * chunk : (i + 1) * chunk]]
        refs = [engine.generate.remote(prompt_ids[i * chunk : (i + 1) * chunk], sampling) for i, engine in used]
        index = [(self.engine_index(engine, i), engine) for i, engine in used]
        return [g for part in wait_for_engines(refs, index, "generate", self.cfg.engine_timeout_s) for g in part]

    def engine_index(self, engine, fallback: int) -> int:
        """`engine`'s place among the run's engines (a session pinned to one passes only that one)."""
        return next((i for i, e in enumerate(self.engines or ()) if e is engine), fallback)

    def sample_in_chunks(
        self, prompt_ids: list[list[int]], partial: PartialRollout, sampling: dict | None = None
    ) -> tuple[list[Generation], list[list[int]]]:
        """Like `sample`, `partial.chunk` tokens at a time (the rest at once from chunk `partial.settled` on):
        a response that has not stopped continues from its prompt plus its tokens so far, under whatever weights
        the engines hold by then. Returns the generations (each token's log-prob from the weights that sampled
        it) and each token's version."""
        sampling = sampling or sampling_params(self.cfg)
        limit, n, stops = sampling["max_tokens"], len(prompt_ids), sampling.get("stop") or ()
        tokens, log_probs, versions = [[] for _ in range(n)], [[] for _ in range(n)], [[] for _ in range(n)]
        finish, active, chunks, routes, tops = ["length"] * n, list(range(n)), 0, [None] * n, [None] * n
        while active:
            version = partial.between(chunks)
            room = limit - len(tokens[active[0]])  # every active row has the same length
            size = room if partial.settled is not None and chunks >= partial.settled else min(partial.chunk, room)
            chunks += 1
            chunk = self.sample([prompt_ids[i] + tokens[i] for i in active], {**sampling, "max_tokens": size})
            still = []
            for i, g in zip(active, chunk, strict=True):
                before = len(tokens[i])
                routes[i] = extend_routes(routes[i], g.routes)
                tokens[i] += g.token_ids
                log_probs[i] += g.log_probs
                versions[i] += [version] * len(g.token_ids)
                if g.top_log_probs is not None:
                    tops[i] = (tops[i] or []) + g.top_log_probs
                finish[i] = g.finish_reason
                # a stop string split across two chunks: each chunk is a request of its own, so the engine saw
                # neither half whole; the ids past it would be trained, and fed to an agent's next turn
                cut = stop_end(self.tokenizer, tokens[i], before, stops) if stops and before else None
                if cut is not None:
                    tokens[i], log_probs[i], versions[i] = tokens[i][:cut], log_probs[i][:cut], versions[i][:cut]
                    tops[i] = tops[i][:cut] if tops[i] is not None else None
                    if routes[i] is not None:  # the positions fed: the prompt's and each kept token's but the last
                        routes[i] = routes[i][: len(prompt_ids[i]) + cut - 1]
                    finish[i] = "stop"
                elif g.finish_reason == "length" and len(g.token_ids) == size and len(tokens[i]) < limit:
                    still.append(i)
            active = still
        return [Generation(tokens[i], log_probs[i], finish[i], routes[i], tops[i]) for i in range(n)], versions

    def sample_texts(
        self, prompts: list[str], sampling: dict | None = None, engines=None
    ) -> tuple[list[list[int]], list[Generation], list[str]]:
        """Encode prompt texts, sample one response each (see sample), decode: (prompt ids, generations,
        response texts), in order."""
        ids = [self.encode(p) for p in prompts]
        generations = self.sample(ids, sampling, engines)
        return ids, generations, self.decode(generations)

    def decode(self, generations: list[Generation]) -> list[str]:
        """One text per generation. HF fast tokenizers decode an empty batch to [""], one text for no
        generation (self-play once crashed on an empty round): nothing in, nothing out."""
        if not generations:
            return []
        return self.tokenizer.batch_decode(
            [g.token_ids for g in generations], skip_special_tokens=True, clean_up_tokenization_spaces=False
        )

    def to_samples(self, prompt_ids, generations: list[Generation], prompts, labels, index) -> Samples:
        """Generations -> the padded Samples layout (experience.py), responses decoded."""
        ids = [list(g.token_ids) for g in generations]
        sequences, attention, action_mask, rollout_lp = pad_rows(
            prompt_ids, ids, [[True] * len(r) for r in ids], [g.log_probs for g in generations],
            pad_token_id(self.tokenizer),
        )  # fmt: skip
        truncated = torch.tensor([g.finish_reason == "length" for g in generations])
        responses = self.decode(generations)
        samples = Samples(sequences, attention, action_mask, rollout_lp, prompts, responses, labels, index, truncated)
        routes = [g.routes for g in generations]
        samples.routes = layout_routes([len(p) for p in prompt_ids], routes, sequences.size(1))
        return samples


@runtime_checkable
class RolloutSource(Protocol):
    """What the trainer needs from where a step's samples come from: PromptSource (plain prompts),
    selfplay.selfplay_source.SelfPlaySource (--absolute_zero), agents.agent_source.AgentSource (--agent_func_path)."""

    sampler: Sampler  # the engines' sampler: held-out evaluation samples through it

    def generate(self, batch: list[dict], n: int) -> Samples:
        """The step's samples for a batch of prompt records ({"prompt", "label"}), `n` responses (episodes; under
        self-play, solver responses per question) to each, in groups of n consecutive rows (Samples.group_size);
        rewards set when the source scores its own rollouts (self-play, agents), else left to the reward
        function."""
        ...

    def state_dict(self) -> dict:
        """What a resume must restore beyond the prompt stream (JSON-serialisable)."""
        ...

    def load_state_dict(self, state: dict) -> None: ...

    def use_partial(self, partial: PartialRollout) -> None:
        """--partial_rollout: sample in chunks with weight syncs in between; a source that cannot raises."""
        ...


class PromptSource:
    """Plain prompts: n responses to each prompt of the batch, scored later by the reward
    function. After `use_partial` (--partial_rollout, by the trainer) responses are sampled in chunks."""

    def __init__(self, sampler: Sampler):
        self.sampler = sampler
        self.partial: PartialRollout | None = None

    def use_partial(self, partial: PartialRollout) -> None:
        self.partial = partial

    def generate(self, batch: list[dict], n: int) -> Samples:
        """Sample n responses for each prompt of `batch` ([{"prompt", "label"}])."""
        prompt_ids = [ids for ids in (self.sampler.encode(item["prompt"]) for item in batch) for _ in range(n)]
        versions = None
        if self.partial is None:
            generations = self.sampler.sample(prompt_ids)
        else:
            generations, versions = self.sampler.sample_in_chunks(prompt_ids, self.partial)
        prompts = [item["prompt"] for item in batch for _ in range(n)]
        labels = [item["label"] for item in batch for _ in range(n)]
        index = torch.arange(len(batch)).repeat_interleave(n)
        samples = self.sampler.to_samples(prompt_ids, generations, prompts, labels, index)
        samples.group_size = n
        if versions is not None:
            samples.token_version = token_versions(versions, samples.num_actions)
        return samples

    def state_dict(self) -> dict:
        return {}  # nothing beyond the prompt stream, which the trainer's PromptLoader holds

    def load_state_dict(self, state: dict) -> None:
        pass
