"""Prompts -> Samples (rollout engines) -> Experience (log-probs, values, rewards, KL, advantages)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import ray
import torch

from reinforce_pro.algos.advantages import AdvantageInputs, compute_advantages
from reinforce_pro.algos.kl import compute_approx_kl
from reinforce_pro.algos.length_penalty import apply_length_penalties
from reinforce_pro.algos.masked import masked_mean
from reinforce_pro.experience import Experience, Samples, pad_rows
from reinforce_pro.rewards.loader import NONFINITE_KEY, RewardFileError, RewardOutput, normalize_reward_output
from reinforce_pro.rollout.vllm_engine import Generation
from reinforce_pro.workers.group import ActorGroup


@dataclass
class RolloutConfig:
    n_samples_per_prompt: int = 1
    prompt_max_len: int = 1024
    max_new_tokens: int = 1024
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    advantage_estimator: str = "gae"
    gamma: float = 1.0
    lambd: float = 1.0
    std_norm: bool = True
    reward_clip_range: tuple[float, float] | None = (-10.0, 10.0)
    reward_nan_policy: str = "error"  # non-finite rewards: error / zero / drop (rewards/loader.py)
    overlong_buffer_len: float | None = None  # DAPO overlong penalty (algos/length_penalty.py)
    overlong_penalty_factor: float = 1.0
    stop_properly_penalty_coef: float | None = None  # ProRL: truncated responses' rewards scaled / replaced
    normalize_reward: bool = False
    kl_estimator: str = "k1"
    use_kl_loss: bool = False


def sampling_params(cfg: RolloutConfig) -> dict:
    """vLLM SamplingParams keywords for the rollout (log-probs are requested by the engine)."""
    return dict(
        temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k, max_tokens=cfg.max_new_tokens,
        skip_special_tokens=False,
    )  # fmt: skip


def encode_prompt(tokenizer, prompt: str, max_len: int) -> list[int]:
    """Prompt token ids with the BOS token (unless the text already starts with it), keeping the last
    `max_len` tokens: the question is usually at the end."""
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    if tokenizer.bos_token_id is not None and not prompt.startswith(tokenizer.bos_token or "\0"):
        ids = [tokenizer.bos_token_id] + ids
    return ids[-max_len:]


class RunningMoments:
    """Running mean / std of rewards over the whole run (Chan et al. parallel update), for --normalize_reward."""

    def __init__(self) -> None:
        self.mean, self.var, self.count = 0.0, 1.0, 1e-8

    def update(self, x: torch.Tensor) -> None:
        n, mean, var = x.numel(), float(x.mean()), float(x.var(unbiased=False))
        delta, total = mean - self.mean, self.count + n
        self.var = (self.var * self.count + var * n + delta**2 * self.count * n / total) / total
        self.mean, self.count = self.mean + delta * n / total, total

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / math.sqrt(max(self.var, 1e-8))


@dataclass
class PartialRollout:
    """--partial_rollout: responses are sampled `chunk` tokens at a time; before each chunk `between()` lets a
    waiting weight sync in and returns the engines' version (EngineGate.let_syncs_in)."""

    chunk: int
    between: Callable[[], int]


class ExperienceMaker:
    def __init__(self, engines, policy, reference, critic, reward_fn: Callable, tokenizer, cfg: RolloutConfig, kl_ctl):
        self.engines, self.policy, self.reference, self.critic = engines, policy, reference, critic
        self.reward_fn, self.tokenizer, self.cfg, self.kl_ctl = reward_fn, tokenizer, cfg, kl_ctl
        self.reward_moments = RunningMoments()
        self.partial: PartialRollout | None = None  # set by the trainer under --partial_rollout

    def state_dict(self) -> dict:
        """What a resume must restore of the experience side: the adaptive KL coefficient and the running
        reward statistics (--normalize_reward)."""
        return {"kl_coef": self.kl_ctl.value, "reward_moments": vars(self.reward_moments).copy()}

    def load_state_dict(self, state: dict) -> None:
        self.kl_ctl.value = state["kl_coef"]
        vars(self.reward_moments).update(state["reward_moments"])

    # ------------------------------------------------------------------ generation
    def generate(self, batch: list[dict]) -> Samples:
        """Sample n_samples_per_prompt responses for each prompt of `batch` ([{"prompt", "label"}])."""
        n = self.cfg.n_samples_per_prompt
        prompt_ids = [encode_prompt(self.tokenizer, item["prompt"], self.cfg.prompt_max_len) for item in batch]
        prompt_ids = [ids for ids in prompt_ids for _ in range(n)]
        versions = None
        if self.partial is None:
            generations = self.sample(prompt_ids)
        else:
            generations, versions = self.sample_in_chunks(prompt_ids, self.partial)
        prompts = [item["prompt"] for item in batch for _ in range(n)]
        labels = [item["label"] for item in batch for _ in range(n)]
        index = torch.arange(len(batch)).repeat_interleave(n)
        samples = self._to_samples(prompt_ids, generations, prompts, labels, index)
        if versions is not None:
            samples.token_version = torch.tensor(
                [v + [0] * (samples.num_actions - len(v)) for v in versions], dtype=torch.long
            )
        return samples

    def sample_in_chunks(
        self, prompt_ids: list[list[int]], partial: PartialRollout
    ) -> tuple[list[Generation], list[list[int]]]:
        """Like `sample`, `partial.chunk` tokens at a time: a response that has not stopped continues from
        its prompt plus its tokens so far, under whatever weights the engines hold by then. Returns the
        generations (each token's log-prob from the weights that sampled it) and each token's version."""
        sampling = sampling_params(self.cfg)
        limit, n = sampling["max_tokens"], len(prompt_ids)
        tokens, log_probs, versions = [[] for _ in range(n)], [[] for _ in range(n)], [[] for _ in range(n)]
        finish, active = ["length"] * n, list(range(n))
        while active:
            version = partial.between()
            size = min(partial.chunk, limit - len(tokens[active[0]]))  # every active row has the same length
            chunk = self.sample([prompt_ids[i] + tokens[i] for i in active], {**sampling, "max_tokens": size})
            still = []
            for i, g in zip(active, chunk, strict=True):
                tokens[i] += g.token_ids
                log_probs[i] += g.log_probs
                versions[i] += [version] * len(g.token_ids)
                finish[i] = g.finish_reason
                if g.finish_reason == "length" and len(g.token_ids) == size and len(tokens[i]) < limit:
                    still.append(i)
            active = still
        return [Generation(tokens[i], log_probs[i], finish[i]) for i in range(n)], versions

    def sample(self, prompt_ids: list[list[int]], sampling: dict | None = None, engines=None) -> list[Generation]:
        """One response per prompt, in order, the prompts split evenly over `engines` (the rollout engines
        by default), sampled with `sampling` (the rollout's sampling_params by default)."""
        engines = engines or self.engines
        sampling = sampling or sampling_params(self.cfg)
        chunk = math.ceil(len(prompt_ids) / len(engines))
        refs = [
            engine.generate.remote(prompt_ids[i * chunk : (i + 1) * chunk], sampling)
            for i, engine in enumerate(engines)
            if prompt_ids[i * chunk : (i + 1) * chunk]
        ]
        return [g for part in ray.get(refs) for g in part]

    def sample_texts(
        self, prompts: list[str], sampling: dict | None = None, engines=None
    ) -> tuple[list[list[int]], list[Generation], list[str]]:
        """Encode prompt texts, sample one response each (see sample), decode: (prompt ids, generations,
        response texts), in order."""
        ids = [encode_prompt(self.tokenizer, p, self.cfg.prompt_max_len) for p in prompts]
        generations = self.sample(ids, sampling, engines)
        return ids, generations, self._decode(generations)

    def _decode(self, generations: list[Generation]) -> list[str]:
        return self.tokenizer.batch_decode(
            [g.token_ids for g in generations], skip_special_tokens=True, clean_up_tokenization_spaces=False
        )

    def _to_samples(self, prompt_ids, generations: list[Generation], prompts, labels, index) -> Samples:
        ids = [list(g.token_ids) for g in generations]
        sequences, attention, action_mask, rollout_lp = pad_rows(
            prompt_ids, ids, [[True] * len(r) for r in ids], [g.log_probs for g in generations],
            self.tokenizer.pad_token_id,
        )  # fmt: skip
        truncated = torch.tensor([g.finish_reason == "length" for g in generations])
        responses = self._decode(generations)
        return Samples(sequences, attention, action_mask, rollout_lp, prompts, responses, labels, index, truncated)

    # ------------------------------------------------------------------ experience
    def rewards(self, samples: Samples) -> RewardOutput:
        """The samples' rewards: those their rollout source already gave (an agent's environment, a self-play
        task), else the reward function's."""
        if samples.rewards is not None:
            return samples.rewards
        return self.score(samples.prompts, samples.responses, samples.labels)

    def score(self, prompts: list[str], responses: list[str], labels: list) -> RewardOutput:
        """The reward function on prompt + response texts (OpenRLHF's queries), normalised."""
        queries = [p + r for p, r in zip(prompts, responses, strict=True)]
        try:
            out = self.reward_fn(queries, prompts, labels)
        except Exception as e:  # user code: reported as a one-line error by the CLI (cli/run.py)
            raise RewardFileError(f"reward_func raised {type(e).__name__}: {e}") from e
        return normalize_reward_output(out, len(queries), self.cfg.reward_nan_policy)

    def needs_old_log_probs(self) -> bool:
        """Whether the experience needs the policy's log-probs before training: the KL penalty in the
        reward is computed from them. Otherwise the trainer may skip that forward (see PPOTrainer)."""
        return self.reference is not None and not self.cfg.use_kl_loss

    def make_experience(self, samples: Samples, old_log_probs: bool = True) -> tuple[Experience, dict[str, float]]:
        """`old_log_probs=False`: leave Experience.old_log_probs None (the policy's training forward
        supplies them; the trainer then logs `old_log_prob_metrics` after training)."""
        seq, attn, t = samples.sequences, samples.attention_mask, samples.num_actions
        old_lp = _sharded_call(self.policy, "log_probs", seq, attn, t) if old_log_probs else None
        ref_lp = _sharded_call(self.reference, "log_probs", seq, attn, t) if self.reference else None
        values = _sharded_call(self.critic, "values", seq, attn, t) if self.critic else None
        reward = self.rewards(samples)
        action_mask = samples.action_mask
        if self.cfg.reward_nan_policy == "drop" and NONFINITE_KEY in reward.extra_logs:
            action_mask = action_mask & (reward.extra_logs[NONFINITE_KEY] == 0).unsqueeze(1)  # no tokens trained
        rewards, penalty_metrics = apply_length_penalties(
            reward.rewards, samples.attention_mask[:, -samples.num_actions :].sum(-1), samples.truncated,
            self.cfg.max_new_tokens, self.cfg.overlong_buffer_len, self.cfg.overlong_penalty_factor,
            self.cfg.stop_properly_penalty_coef,
        )  # fmt: skip
        if self.cfg.normalize_reward:
            self.reward_moments.update(rewards)
            rewards = self.reward_moments.normalize(rewards)
        kl = None  # only the reward penalty needs it before training (needs_old_log_probs)
        if ref_lp is not None and old_lp is not None:
            kl = compute_approx_kl(self.cfg.kl_estimator, old_lp, ref_lp, samples.action_mask)
        advantages, returns = self.advantages(samples, rewards, kl, values)
        exp = Experience(
            sequences=seq,
            attention_mask=attn,
            action_mask=action_mask,
            old_log_probs=old_lp,
            rollout_log_probs=samples.rollout_log_probs,
            advantages=advantages,
            returns=returns,
            rewards=rewards,
            ref_log_probs=ref_lp,
            values=values,
            info={"score": reward.scores},
            step_meta=samples.step_meta,
            step_rewards_ext=samples.step_rewards_ext,
        )
        metrics = {**self._metrics(samples, reward), **penalty_metrics, **samples.metrics}
        if old_lp is not None:
            metrics.update(self.old_log_prob_metrics(exp))
        return exp, metrics

    def old_log_prob_metrics(self, exp: Experience) -> dict[str, float]:
        """What is read off the old log-probs: the rollout/trainer mismatch before any update of this step
        (the quantity IS correction fights) and, with a reference model, the KL to it."""
        diff = (exp.old_log_probs - exp.rollout_log_probs).abs()
        m = {
            "rollout/logprob_abs_diff_mean": float(masked_mean(diff, exp.action_mask)),
            "rollout/logprob_abs_diff_max": float((diff * exp.action_mask).max()),
        }
        if exp.ref_log_probs is not None:
            kl = compute_approx_kl(self.cfg.kl_estimator, exp.old_log_probs, exp.ref_log_probs, exp.action_mask)
            m["kl/ref_kl_mean"] = float(masked_mean(kl, exp.action_mask))
            m["kl/coef"] = float(self.kl_ctl.value)
        return m

    def advantages(self, samples: Samples, rewards, kl, values) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T) advantages and returns, computed separately for each of samples.advantage_segments (self-play
        keeps solver groups and proposer samples apart), by default the whole batch as one segment."""
        segments = samples.advantage_segments or [(0, len(rewards), self.cfg.n_samples_per_prompt)]
        advantages = torch.zeros(samples.action_mask.shape, dtype=torch.float32)
        returns = torch.zeros_like(advantages)
        for start, end, group_size in segments:
            rows = slice(start, end)
            inp = AdvantageInputs(
                rewards=rewards[rows],
                action_mask=samples.action_mask[rows],
                group_size=group_size,
                kl=kl[rows] if kl is not None else None,
                kl_coef=0.0 if self.cfg.use_kl_loss else self.kl_ctl.value,
                values=values[rows] if values is not None else None,
                gamma=self.cfg.gamma,
                lambd=self.cfg.lambd,
                std_norm=self.cfg.std_norm,
                reward_clip_range=self.cfg.reward_clip_range,
                turn_rewards=samples.turn_rewards[rows] if samples.turn_rewards is not None else None,
            )
            advantages[rows], returns[rows] = compute_advantages(self.cfg.advantage_estimator, inp)
        return advantages, returns

    def _metrics(self, samples: Samples, reward: RewardOutput) -> dict[str, float]:
        lengths = samples.action_mask.sum(-1).float()
        m = {
            "rollout/reward_mean": float(reward.rewards.mean()),
            "rollout/reward_std": float(reward.rewards.std()) if len(reward.rewards) > 1 else 0.0,
            "rollout/score_mean": float(reward.scores.mean()),
            "rollout/response_length_mean": float(lengths.mean()),
            "rollout/truncated_frac": float(samples.truncated.float().mean()),
            "rollout/num_samples": float(len(lengths)),
        }
        for k, v in reward.extra_logs.items():
            m[f"reward/{k}"] = float(v.mean())
        return m


def _sharded_call(group: list, method: str, sequences, attention_mask, num_actions) -> torch.Tensor:
    """Split rows across the data-parallel ranks of `group`, call `method` on each, concatenate."""
    refs = ActorGroup(group).call_sharded(
        method, sequences.size(0), lambda idx: (sequences[idx], attention_mask[idx], num_actions)
    )
    return torch.cat(ray.get(refs), dim=0)
