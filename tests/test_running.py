"""Checkpoint files, the prompt stream, dynamic-filtering selection and sample concatenation, without Ray."""

from __future__ import annotations

import json

import pytest
import torch

from reinforce_pro.experience import Samples, concat_samples
from reinforce_pro.rewards.loader import RewardOutput
from reinforce_pro.trainer.checkpoint import (
    complete_checkpoints,
    find_latest,
    load_state,
    rotate,
    save_checkpoint,
    truncate_jsonl,
)
from reinforce_pro.trainer.dynamic_filter import group_pass_mask
from reinforce_pro.trainer.prompt_loader import PromptLoader

# ---------------------------------------------------------------------------------------------- checkpoints


def _parts(size: int):
    def write(tmp):
        (tmp / "policy").mkdir()
        (tmp / "policy" / "weights.bin").write_bytes(b"x" * size)

    return write


def test_save_is_atomic_and_latest_points_at_the_last_complete(tmp_path):
    save_checkpoint(tmp_path, 2, {"loader": {"position": 16}}, _parts(10))
    assert (tmp_path / "latest").read_text().strip() == "global_step2"
    assert load_state(tmp_path / "global_step2") == {"step": 2, "loader": {"position": 16}}

    def crash(tmp):  # a kill while writing step 4: the .tmp directory is left behind
        _parts(10)(tmp)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 4, {}, crash)
    assert (tmp_path / "global_step4.tmp").is_dir()
    assert find_latest(tmp_path) == tmp_path / "global_step2"
    assert complete_checkpoints(tmp_path) == [tmp_path / "global_step2"]
    save_checkpoint(tmp_path, 6, {}, _parts(10))  # the next save sweeps the stale .tmp
    assert not (tmp_path / "global_step4.tmp").exists()
    assert find_latest(tmp_path) == tmp_path / "global_step6"


def test_find_latest_ignores_a_dangling_pointer(tmp_path):
    save_checkpoint(tmp_path, 1, {}, _parts(1))
    save_checkpoint(tmp_path, 3, {}, _parts(1))
    (tmp_path / "latest").write_text("global_step9\n")  # names a checkpoint that never completed
    assert find_latest(tmp_path) == tmp_path / "global_step3"
    assert find_latest(tmp_path / "nothing") is None


def test_rotate_by_count_and_by_size(tmp_path):
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path, step, {}, _parts(1000))
    deleted = rotate(tmp_path, max_num=3, max_mem_gb=float("inf"))
    assert [d.name for d in deleted] == ["global_step1"]
    deleted = rotate(tmp_path, max_num=3, max_mem_gb=2500 / 1024**3)  # room for two of ~1 KB each
    assert [d.name for d in deleted] == ["global_step2"]
    assert [d.name for d in complete_checkpoints(tmp_path)] == ["global_step3", "global_step4"]
    rotate(tmp_path, max_num=3, max_mem_gb=1e-12)  # the newest is kept whatever the limit
    assert [d.name for d in complete_checkpoints(tmp_path)] == ["global_step4"]


def test_truncate_jsonl_keeps_rows_up_to_the_step_and_drops_a_cut_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "x": s}) + "\n" for s in range(1, 6)) + '{"step": 6, "x"')
    truncate_jsonl(path, 3)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]


# ---------------------------------------------------------------------------------------------- prompt stream


def _old_batches(prompts, batch_size, episodes, seed):
    """The trainer's order before the loader existed (kept identical on purpose)."""
    import random

    rng = random.Random(seed)
    for _ in range(episodes):
        order = list(range(len(prompts)))
        rng.shuffle(order)
        for start in range(0, len(prompts) // batch_size * batch_size, batch_size):
            yield order[start : start + batch_size]


def test_loader_matches_the_old_order_and_resumes_mid_stream():
    prompts = [{"i": i} for i in range(23)]
    loader = PromptLoader(prompts, 5, num_episodes=3, seed=7)
    assert loader.steps() == 12
    batches = []
    while not loader.exhausted():
        batches.append([i for i, _ in loader.take(5)])
    assert batches == list(_old_batches(prompts, 5, 3, 7))
    # a fresh loader restored at position 27 continues exactly where the first was at that point
    again = PromptLoader(prompts, 5, num_episodes=3, seed=7)
    again.load_state_dict({"position": 27, "num_prompts": 23, "seed": 7})
    flat = [i for b in batches for i in b]
    assert [i for i, _ in again.take(9)] == flat[27:36]
    with pytest.raises(ValueError, match="same data and --seed"):
        again.load_state_dict({"position": 0, "num_prompts": 23, "seed": 8})


# ---------------------------------------------------------------------------------------------- dynamic filtering


def test_group_pass_mask_is_strict():
    scores = torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.5, 0.5, 1.0, 1.0])
    assert group_pass_mask(scores, 2, 0.0, 1.0).tolist() == [False, False, True, True, False]
    assert group_pass_mask(scores, 2, -0.1, 1.0).tolist() == [True, False, True, True, False]


def _samples(p_len: int, t_len: int, rows: int, fill: int) -> Samples:
    seq = torch.full((rows, p_len + t_len), fill)
    return Samples(
        seq, torch.ones_like(seq), torch.ones(rows, t_len, dtype=torch.bool), torch.full((rows, t_len), -0.5),
        [f"p{fill}"] * rows, [f"r{fill}"] * rows, [fill] * rows, torch.arange(rows) // 2,
        torch.zeros(rows, dtype=torch.bool),
        rewards=RewardOutput(torch.full((rows,), float(fill)), torch.full((rows,), float(fill)), {}),
    )  # fmt: skip


def test_concat_samples_repads_prompts_left_and_responses_right():
    a, b = _samples(3, 2, 2, fill=7), _samples(5, 4, 4, fill=9)
    out = concat_samples([a, b])
    assert out.sequences.shape == (6, 9) and out.num_actions == 4
    # row 0 (from a): 2 pad columns on the left, its 3 prompt and 2 response tokens, 2 pad columns on the right
    assert out.attention_mask[0].tolist() == [0, 0, 1, 1, 1, 1, 1, 0, 0]
    assert out.sequences[0, 2:7].tolist() == [7] * 5
    assert out.action_mask[0].tolist() == [True, True, False, False]
    assert out.rollout_log_probs[0].tolist() == [-0.5, -0.5, 0.0, 0.0]
    assert out.attention_mask[2].tolist() == [1] * 9
    assert out.prompt_index.tolist() == [0, 0, 1, 1, 2, 2]  # b's groups renumbered after a's
    assert out.rewards.rewards.tolist() == [7, 7, 9, 9, 9, 9] and out.labels == [7, 7, 9, 9, 9, 9]


def test_pad_rows_left_pads_prompts_and_right_pads_responses():
    from reinforce_pro.experience import pad_rows

    seq, attn, act, lp = pad_rows([[5], [6, 7]], [[8, 9], []], [[True, False], []], [[-0.5, -1.0], []], pad_id=0)
    assert seq.tolist() == [[0, 5, 8, 9], [6, 7, 0, 0]]
    assert attn.tolist() == [[0, 1, 1, 1], [1, 1, 0, 0]]
    assert act.tolist() == [[True, False], [False, False]] and act.dtype == torch.bool
    assert lp.tolist() == [[-0.5, -1.0], [0.0, 0.0]] and lp.dtype == torch.float32


def test_select_and_concat_keep_every_optional_per_row_field():
    a, b = _samples(3, 2, 2, fill=7), _samples(5, 4, 4, fill=9)
    for s, fill in ((a, 7), (b, 9)):
        s.turn_rewards = torch.full(s.action_mask.shape, float(fill))
        s.policy_version = torch.full((len(s.prompts),), fill)
        s.step_meta = [{"row": fill}] * len(s.prompts)
        s.step_rewards_ext = [{"ext": fill}] * len(s.prompts)
    out = concat_samples([a, b])
    assert out.turn_rewards.tolist()[0] == [7.0, 7.0, 0.0, 0.0] and out.turn_rewards.tolist()[2] == [9.0] * 4
    assert out.policy_version.tolist() == [7, 7, 9, 9, 9, 9]
    assert out.step_meta == [{"row": 7}] * 2 + [{"row": 9}] * 4 and out.step_rewards_ext[3] == {"ext": 9}
    picked = out.select(torch.tensor([4, 0]))
    assert picked.policy_version.tolist() == [9, 7] and picked.labels == [9, 7]
    assert picked.turn_rewards[1].tolist() == [7.0, 7.0, 0.0, 0.0] and picked.step_meta == [{"row": 9}, {"row": 7}]
    assert picked.rewards.scores.tolist() == [9.0, 7.0] and torch.equal(picked.sequences[1], out.sequences[0])
    a.policy_version = None  # a field only some parts have is dropped, not half-filled
    assert concat_samples([a, b]).policy_version is None


def test_dynamic_filtering_judges_agent_groups_on_their_lead_rows_and_keeps_a_kept_episodes_forks():
    """Rows of an SDK agent's step: 2 groups x 2 lead rows, then forks (extra segments) of leads 1 and 2. Group 0
    (scores 0, 1) passes, group 1 (1, 1) does not; round 2's one group passes with its fork of lead 0."""
    from reinforce_pro.trainer.dynamic_filter import generate_filtered

    def step(scores: list[float], fork_of: list[int]) -> Samples:
        s = _samples(3, 2, len(scores) + len(fork_of), fill=len(scores))
        values = torch.tensor(scores + [scores[lead] for lead in fork_of])  # a fork carries its episode's score
        s.rewards = RewardOutput(values, values, {})
        s.labels = [f"lead{i}" for i in range(len(scores))] + [f"fork-of-{lead}" for lead in fork_of]
        s.fork_of, s.group_size = fork_of, 2
        return s

    rounds = [step([0.0, 1.0, 1.0, 1.0], [1, 2]), step([1.0, 0.0], [0])]
    out, consumed, metrics = generate_filtered(
        lambda records: rounds.pop(0), lambda s: s.rewards, [(0, {}), (1, {})],
        lambda k: [(2, {})][:k], batch_size=2, reward_range=(0.0, 1.0),
    )  # fmt: skip
    assert consumed == [0, 1, 2] and metrics["dynamic_filtering/groups_kept"] == 2
    # leads of the kept groups first (round 1's group 0, round 2's group), then the kept forks in round order
    assert out.labels == ["lead0", "lead1", "lead0", "lead1", "fork-of-1", "fork-of-0"]
    assert out.fork_of == [1, 2]  # each fork points at its lead's row in the kept batch
    assert out.rewards.scores.tolist() == [0.0, 1.0, 1.0, 0.0, 1.0, 1.0]


# ---------------------------------------------------------------------------------------------- old log-probs


class _Builder:
    def __init__(self, kl_in_reward: bool):
        self.kl_in_reward = kl_in_reward

    def needs_old_log_probs(self) -> bool:
        return self.kl_in_reward


@pytest.mark.parametrize(
    "overrides, kl_in_reward, step, needed",
    [
        pytest.param({}, False, 0, False, id="one-epoch-one-minibatch-reuses"),
        pytest.param({"max_epochs": 2}, False, 0, True, id="second-epoch-sees-moved-weights"),
        pytest.param({"train_batch_size": 8}, False, 0, True, id="second-minibatch-sees-moved-weights"),
        pytest.param({}, True, 0, True, id="kl-penalty-in-reward-needs-them-first"),
        pytest.param({"recompute_old_log_probs": True}, False, 0, True, id="flag-forces-the-forward"),
        pytest.param({"freezing_actor_steps": 3}, False, 2, True, id="frozen-policy-has-no-training-forward"),
        pytest.param({"freezing_actor_steps": 3}, False, 3, False, id="first-trained-step-reuses"),
    ],
)
def test_old_log_prob_forward_is_skipped_only_when_it_equals_the_training_forward(
    overrides, kl_in_reward, step, needed
):
    from reinforce_pro.rollout.sampler import PromptSource
    from reinforce_pro.trainer.ppo_trainer import LoopConfig, PPOTrainer

    cfg = LoopConfig(**{"rollout_batch_size": 4, "train_batch_size": 16, **overrides})
    trainer = PPOTrainer(
        PromptSource(sampler=None),
        _Builder(kl_in_reward),
        [],
        None,
        [],
        [{"prompt": "p", "label": None}] * 8,
        None,
        cfg,
    )
    trainer.step = step
    samples = Samples(*[None] * 4, prompts=["p"] * 16, responses=[], labels=[], prompt_index=None, truncated=None)
    assert trainer.old_log_probs_needed(samples) is needed


def test_actor_group_shards_rows_and_calls_every_rank_with_its_own():
    from reinforce_pro.workers.group import ActorGroup

    class Rank:
        def __init__(self, k):
            self.log_probs = type("Method", (), {"remote": staticmethod(lambda rows, k=k: (k, rows.tolist()))})

    group = ActorGroup([Rank(0), Rank(1), Rank(2)])
    assert [s.tolist() for s in group.shards(7)] == [[0, 1, 2], [3, 4], [5, 6]]
    data = torch.arange(70).view(7, 10)
    out = group.call_sharded("log_probs", 7, lambda idx: (data[idx, 0],))
    assert out == [(0, [0, 10, 20]), (1, [30, 40]), (2, [50, 60])]
    assert group[0] is not None and len(group) == 3 and isinstance(group, list)
