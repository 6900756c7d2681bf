"""Multi-turn agents without Ray: environment tokens carry action_mask 0 and get no gradient, the
reinforce_pro prefix statistic ignores them, the rollout loop builds the right token sequence, and
history/target dialogues produce training rows only for target turns with aligned sidecars."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from reinforce_pro.agents.contract import AgentFileError, load_agent_class, normalize_step
from reinforce_pro.agents.episode import episodes_to_samples
from reinforce_pro.agents.runner import AgentConfig, AgentRunner
from reinforce_pro.algos.is_correction import compute_is_weights
from reinforce_pro.algos.losses import PolicyLoss
from reinforce_pro.rollout.vllm_engine import Generation

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "python"

# ---------------------------------------------------------------------------------------------- token level


def _interleave(action_lp: torch.Tensor, pattern: list[bool], junk: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Spread (B, A) action values over a (B, T) row whose `pattern` marks action positions; the others get
    `junk` (an environment token's log-prob, which must not matter)."""
    b, t = action_lp.size(0), len(pattern)
    out = torch.full((b, t), junk, dtype=action_lp.dtype)
    mask = torch.tensor(pattern).expand(b, t)
    out[mask] = action_lp.reshape(-1)
    return out, mask.clone()


PATTERN = [True, True, False, False, True, False, True, True, True, False, False, True, True]  # 8 action tokens


@pytest.mark.parametrize("junk", [0.0, -3.0, float("nan"), float("inf")])
def test_reinforce_pro_prefix_statistic_ignores_environment_tokens(junk):
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 8, generator=gen, dtype=torch.float64)
    rollout = old - 0.4 * torch.randn(3, 8, generator=gen, dtype=torch.float64)  # drift: some prefixes leave the band
    w_plain, m_plain = compute_is_weights("reinforce_pro", old, rollout, torch.ones(3, 8, dtype=torch.bool), 0.8, 1.25)
    old_i, mask = _interleave(old, PATTERN, junk)
    rollout_i, _ = _interleave(rollout, PATTERN, -junk if junk == junk else junk)
    w_mixed, m_mixed = compute_is_weights("reinforce_pro", old_i, rollout_i, mask, 0.8, 1.25)
    assert torch.equal(w_mixed[mask].reshape(3, 8), w_plain)
    assert torch.all(w_mixed[~mask] == 0)
    assert 0 < float(m_plain["is/token_masked_frac"]) < 1  # the case masks some tokens, so it can fail
    for key in m_plain:
        if key != "is/first_masked_pos_mean":  # counts positions, environment tokens included
            assert float(m_mixed[key]) == pytest.approx(float(m_plain[key]), abs=1e-12), key


def test_environment_tokens_get_no_gradient():
    gen = torch.Generator().manual_seed(1)
    b, t = 2, len(PATTERN)
    mask = torch.tensor(PATTERN).expand(b, t).clone()
    log_probs = (-torch.rand(b, t, generator=gen)).requires_grad_()
    old = log_probs.detach() + 0.05 * torch.randn(b, t, generator=gen)
    rollout = old + 0.05 * torch.randn(b, t, generator=gen)
    advantages = torch.randn(b, t, generator=gen)
    loss_fn = PolicyLoss(enable_vllm_is_correction=True, vllm_is_correction_type="reinforce_pro",
                         vllm_is_truncated_threshold=[0.5, 5.0])  # fmt: skip
    loss, _ = loss_fn(log_probs, old, advantages, action_mask=mask, rollout_log_probs=rollout)
    loss.backward()
    assert torch.all(log_probs.grad[~mask] == 0)
    assert torch.count_nonzero(log_probs.grad[mask]) == mask.sum()


# ---------------------------------------------------------------------------------------------- rollout loop


@pytest.fixture(scope="module")
def tokenizer():
    pytest.importorskip("transformers")
    from reinforce_pro.models.tiny import build_tokenizer

    return build_tokenizer()


class ScriptedEngine:
    """Answers each prompt with the next scripted reply of its episode (keyed by the prompt's first turn)."""

    def __init__(self, tokenizer, replies: dict[str, list[str]]):
        self.tok, self.replies, self.calls = tokenizer, {k: list(v) for k, v in replies.items()}, []

    def __call__(self, prompt_ids: list[list[int]], sampling: dict) -> list[Generation]:
        self.calls.append((len(prompt_ids), sampling["max_tokens"]))
        out = []
        for ids in prompt_ids:
            text = self.tok.decode(ids, skip_special_tokens=True)
            key = max((k for k in self.replies if text.startswith(k)), key=len)  # the most specific script
            reply = self.tok(self.replies[key].pop(0), add_special_tokens=False)["input_ids"]
            out.append(Generation(reply, [-0.1 * (i + 1) for i in range(len(reply))], "stop"))
        return out


def test_calculator_episode_token_layout(tokenizer):
    agent = load_agent_class(EXAMPLES / "agent_calculator.py")
    engine = ScriptedEngine(tokenizer, {"3+4=": ["calc(3+4)", "7"], "5+5=": ["9"]})
    cfg = AgentConfig(max_turns=3, max_len=64, prompt_max_len=32, reward_mode="sum")
    runner = AgentRunner(agent, tokenizer, engine, {"temperature": 1.0, "max_tokens": 12}, cfg)
    first, second = runner.run_episodes([{"prompt": "3+4=", "label": "7"}, {"prompt": "5+5=", "label": "10"}], n=1)
    # episode 1: call (model) -> result (environment) -> answer (model)
    call, feedback, answer = "calc(3+4)", " -> 7; answer: ", "7"
    assert tokenizer.decode(first.tokens) == call + feedback + answer
    assert first.action == [True] * len(call) + [False] * len(feedback) + [True] * len(answer)
    assert first.log_probs[len(call) : len(call) + len(feedback)] == [0.0] * len(feedback)
    assert first.turn_rewards == [0.0, 0.8] and first.done and not first.truncated
    assert first.step_meta["turn_spans"] == [[0, 9, "model"], [9, 24, "environment"], [24, 25, "model"]]
    assert second.turn_rewards == [0.0] and len(second.tokens) == 1  # wrong answer: done at once
    assert engine.calls[0] == (2, 12) and engine.calls[1][0] == 1  # the second turn: only the live episode

    samples = episodes_to_samples([first, second], tokenizer.pad_token_id, ["", ""], "sum")
    assert samples.action_mask[0].tolist() == first.action
    assert samples.action_mask[1].tolist() == [True] + [False] * 24
    assert samples.rewards.rewards.tolist() == pytest.approx([0.8, 0.0])
    assert samples.attention_mask[1].sum() == 1 + 4 + 1  # <bos>, the prompt, one answer token
    per_turn = episodes_to_samples([first, second], tokenizer.pad_token_id, ["", ""], "per_turn")
    assert per_turn.rewards.rewards.tolist() == [0.0, 0.0]
    assert per_turn.turn_rewards[0, 8].item() == 0.0 and per_turn.turn_rewards[0, 24].item() == pytest.approx(0.8)


class RoutingEngine(ScriptedEngine):
    """A scripted MoE engine: every call's routes cover what it fed (its prompt and its reply but the last
    token), each position's one expert set to the call's number, so a row shows which call each route came from."""

    def __call__(self, prompt_ids: list[list[int]], sampling: dict) -> list[Generation]:
        out = super().__call__(prompt_ids, sampling)
        for ids, g in zip(prompt_ids, out, strict=True):
            g.routes = torch.full((len(ids) + len(g.token_ids) - 1, 1, 1), len(self.calls), dtype=torch.int16)
        return out


def test_an_episodes_routes_are_those_of_the_call_that_fed_each_position_first(tokenizer):
    """MoE engines: a turn's call re-feeds the whole episode so far as its prompt; each position keeps the routes
    of the first call that fed it (the tokens a turn sampled, those they were sampled under), the environment's
    tokens and a turn's last sampled token get the next call's, and the padded layout puts every route under its
    token, -1 on padding and on the never-fed last token."""
    agent = load_agent_class(EXAMPLES / "agent_calculator.py")
    engine = RoutingEngine(tokenizer, {"3+4=": ["calc(3+4)", "7"], "5+5=": ["9"]})
    cfg = AgentConfig(max_turns=3, max_len=64, prompt_max_len=32, reward_mode="sum")
    runner = AgentRunner(agent, tokenizer, engine, {"temperature": 1.0, "max_tokens": 12}, cfg)
    first, second = runner.run_episodes([{"prompt": "3+4=", "label": "7"}, {"prompt": "5+5=", "label": "10"}], n=1)
    p, call, feedback = len(first.prompt_ids), 9, 15  # calc(3+4) and " -> 7; answer: " in tokens
    assert first.routes.flatten().tolist() == [1] * (p + call - 1) + [2] * (1 + feedback)
    assert second.routes.flatten().tolist() == [1] * len(second.prompt_ids)  # its one turn: 1 token, never fed
    samples = episodes_to_samples([first, second], tokenizer.pad_token_id, ["", ""], "sum")
    assert samples.routes.shape == (*samples.sequences.shape, 1, 1)
    real = samples.attention_mask.bool()
    assert samples.routes[0][real[0]].flatten().tolist() == first.routes.flatten().tolist() + [-1]
    assert samples.routes[1][real[1]].flatten().tolist() == second.routes.flatten().tolist() + [-1]
    assert (samples.routes[~real] == -1).all()
    plain = ScriptedEngine(tokenizer, {"3+4=": ["7"]})  # an engine that captures no routes: none travel
    rows = AgentRunner(agent, tokenizer, plain, {"max_tokens": 12}, cfg).run_episodes(
        [{"prompt": "3+4=", "label": "7"}], 1
    )
    assert rows[0].routes is None and episodes_to_samples(rows, 0, [""], "sum").routes is None


def test_a_segments_routes_follow_its_calls():
    """The SDK endpoint's calls (agents/trajectory.py): a segment's row keeps each position's routes from the
    first call of the segment that fed it, as the episode runner does."""
    from reinforce_pro.agents.trajectory import Call, segment_episode

    def call(prompt, completion, number):
        routes = torch.full((len(prompt) + len(completion) - 1, 1, 1), number, dtype=torch.int16)
        return Call(prompt, completion, [-0.5] * len(completion), "stop", routes=routes)

    first = call([1, 2, 3], [10, 11], 1)
    second = call([1, 2, 3, 10, 11, 20, 21], [12], 2)  # the tool's reply (20, 21) between the two
    e = segment_episode([first, second], 0, 0, "q", None, "q")
    assert e.tokens == [10, 11, 20, 21, 12] and e.action == [True, True, False, False, True]
    assert e.routes.flatten().tolist() == [1, 1, 1, 1, 2, 2, 2]


def test_partial_rollout_agent_tokens_keep_the_version_and_log_prob_that_sampled_them(tokenizer):
    """--partial_rollout with --agent_func_path (OpenRLHF's async agent script): every model turn is sampled in
    chunks and a weight sync may land before any chunk, so one episode holds tokens of several versions; each
    model token keeps the version and the log-prob of the weights that sampled it."""
    from reinforce_pro.agents.agent_source import AgentSource
    from reinforce_pro.rollout.sampler import PartialRollout, RolloutConfig, Sampler

    replies, engine = ["calc(3+4)", "7"], {"version": 0}

    def continue_turn(prompt_ids, sampling, engines=None):
        """The scripted reply of the turn the context is in, from where it stops; log-prob = -version."""
        out = []
        for ids in prompt_ids:
            after = tokenizer.decode(ids, skip_special_tokens=True).split("3+4=", 1)[1]
            turn, written = (1, after.split("answer: ")[1]) if "answer: " in after else (0, after)
            rest = replies[turn][len(written) :]
            piece = tokenizer(rest[: sampling["max_tokens"]], add_special_tokens=False)["input_ids"]
            finish = "stop" if len(piece) == len(rest) else "length"
            out.append(Generation(piece, [-float(engine["version"])] * len(piece), finish))
        return out

    def sync_before_each_chunk(chunk: int) -> int:
        engine["version"] += 1
        return engine["version"]

    sampler = Sampler(engines=None, tokenizer=tokenizer, cfg=RolloutConfig(max_new_tokens=12))
    sampler.sample = continue_turn
    source = AgentSource(sampler, load_agent_class(EXAMPLES / "agent_calculator.py"), AgentConfig(max_len=64))
    source.use_partial(PartialRollout(chunk=4, between=sync_before_each_chunk))
    samples = source.generate([{"prompt": "3+4=", "label": "7"}], 1)

    call, feedback = "calc(3+4)", " -> 7; answer: "
    assert samples.responses == [call + feedback + "7"] and samples.rewards.rewards.tolist() == pytest.approx([0.8])
    # the call in chunks of 4 (versions 1, 2, 3), the tool's reply (not trained), the answer after one more sync
    versions = [1] * 4 + [2] * 4 + [3] + [3] * len(feedback) + [4]
    assert samples.token_version[0].tolist() == versions
    action = samples.action_mask[0]
    assert samples.rollout_log_probs[0][action].tolist() == [-1.0] * 4 + [-2.0] * 4 + [-3.0, -4.0]
    assert action.tolist() == [True] * len(call) + [False] * len(feedback) + [True]


def test_turn_limit_truncates(tokenizer):
    agent = load_agent_class(EXAMPLES / "agent_calculator.py")
    engine = ScriptedEngine(tokenizer, {"1+1=": ["calc(1+1)", "calc(1+1)"]})
    runner = AgentRunner(agent, tokenizer, engine, {"max_tokens": 12}, AgentConfig(max_turns=2, max_len=64))
    (e,) = runner.run_episodes([{"prompt": "1+1=", "label": "2"}], n=1)
    assert e.truncated and e.done and len(e.turn_ends) == 2 and e.turn_rewards == [0.0, 0.0]


DIALOGUE_AGENT = """
class AgentInstance:
    def __init__(self):
        self.notes = 0

    async def reset(self, states):
        return {"observation": ""}

    async def process_history(self, states):
        self.notes += 1
        op = {"op": "write", "turn_id": states["turn_id"]}
        return {"memory": "[" + states["content"].upper() + "]", "op_log": [op]}

    def build_prompt(self, states):
        return "".join(states["memory"]) + states["content"]

    async def step(self, states):
        return {"rewards": float(states["action_text"] == "ok"), "done": True}
"""


def test_history_and_target_turns(tokenizer, tmp_path):
    path = tmp_path / "dialogue_agent.py"
    path.write_text(DIALOGUE_AGENT)
    turns = [{"role": "history", "content": "hi"}, {"role": "target", "content": "q1="},
             {"role": "history", "content": "x"}, {"role": "target", "content": "q2="}]  # fmt: skip
    batch = [{"prompt": turns, "label": None}, {"prompt": turns[:2], "label": None}]
    # every target turn's prompt starts with the memory of the history before it
    engine = ScriptedEngine(tokenizer, {"[HI]q1=": ["ok", "no", "ok", "ok"], "[HI]q1=ok[X]q2=": ["ok"],
                                        "[HI]q1=no[X]q2=": ["no"]})  # fmt: skip
    runner = AgentRunner(load_agent_class(path), tokenizer, engine, {"max_tokens": 4}, AgentConfig(max_len=64))
    rows = runner.run_dialogues(batch, n=2)
    meta = [(r.step_meta["dialogue"], r.step_meta["turn_id"], r.step_meta["sample"]) for r in rows]
    assert meta == [(0, 1, 0), (0, 1, 1), (0, 3, 0), (0, 3, 1), (1, 1, 0), (1, 1, 1)]  # target turns only
    assert [r.group_id for r in rows] == [0, 0, 1, 1, 2, 2]  # n rows per group, contiguous
    assert all(r.step_meta["turn_role"] == "target" and all(r.action) for r in rows)
    assert [r.prompt for r in rows[:4]] == ["[HI]q1=", "[HI]q1=", "[HI]q1=ok[X]q2=", "[HI]q1=no[X]q2="]
    assert rows[0].step_meta["op_log"] == [{"op": "write", "turn_id": 0}]
    assert rows[2].step_meta["op_log"] == [{"op": "write", "turn_id": 2}]
    # episode reward (sum over its targets) broadcast to its target rows; per-step reward kept aside
    assert [r.turn_rewards for r in rows] == [[2.0], [0.0], [2.0], [0.0], [1.0], [1.0]]
    assert [r.step_rewards_ext["step_reward"] for r in rows] == [1.0, 0.0, 1.0, 0.0, 1.0, 1.0]


# ---------------------------------------------------------------------------------------------- contract


def test_agent_file_errors(tmp_path):
    (tmp_path / "none.py").write_text("x = 1\n")
    with pytest.raises(AgentFileError, match="defines no class AgentInstance"):
        load_agent_class(tmp_path / "none.py")
    (tmp_path / "sync.py").write_text(
        "class AgentInstance:\n    async def reset(self, s): ...\n    def step(self, s): ...\n"
    )
    with pytest.raises(AgentFileError, match="step must be an async method"):
        load_agent_class(tmp_path / "sync.py")
    with pytest.raises(AgentFileError, match="'rewards' and 'done'"):
        normalize_step({"rewards": 1.0})
    with pytest.raises(AgentFileError, match="non-numeric reward"):
        normalize_step({"rewards": "good", "done": True})
    out = normalize_step({"rewards": torch.tensor([0.5]), "done": False, "environment_feedback_tokens": [5, 6]})
    assert out.reward == 0.5 and out.score == 0.5 and out.feedback_tokens == [5, 6] and out.feedback_text is None
