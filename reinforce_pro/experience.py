"""Typed records that travel between the rollout engines, the rollout sources, the experience builder
and the trainers.

Token layout (as in OpenRLHF): a sequence is the prompt, left-padded to P tokens, followed by the
response, right-padded to T tokens, so S = P + T. Per-token quantities of the response ("actions") are
(B, T) and aligned with the last T positions of the sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

from reinforce_pro.rewards.loader import RewardOutput


@dataclass
class Samples:
    """What the rollout engines produced for one batch of prompts."""

    sequences: torch.Tensor  # (B, S) long, prompt (left-padded) + response (right-padded)
    attention_mask: torch.Tensor  # (B, S) long, 1 on real prompt and response tokens
    action_mask: torch.Tensor  # (B, T) bool, 1 on response tokens that are trained
    rollout_log_probs: torch.Tensor  # (B, T) float32, the engine's log-prob of each response token
    prompts: list[str]  # (B,) prompt text as given to the engine
    responses: list[str]  # (B,) decoded response text
    labels: list  # (B,) the dataset's label for the prompt (None if the data has none)
    prompt_index: torch.Tensor  # (B,) long, index of the prompt in the batch: samples of one prompt share it
    truncated: torch.Tensor  # (B,) bool, the response hit the token limit instead of stopping
    # Set by rollout sources that score rows while generating (self-play, agents); None: the reward function
    # scores them.
    rewards: RewardOutput | None = None
    # rows of each prompt, consecutive: the group of a group-relative estimator (the source sampled this many)
    group_size: int = 1
    # (start, end, group_size) row ranges whose advantages are computed separately, each with its own
    # group size; None: the whole batch in groups of group_size.
    advantage_segments: list[tuple[int, int, int]] | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # produced while generating, logged with the step
    # (B, T) extra token rewards (multi-turn agents, --agent_reward_mode per_turn); None: none
    turn_rewards: torch.Tensor | None = None
    # Per-row sidecars of agent episodes (docs/agents.md); exported with the experience, never in the loss.
    step_meta: list[dict] | None = None
    step_rewards_ext: list[dict] | None = None
    # (B,) long, the engines' weight version (policy optimizer steps) when the row was sampled; None: unknown
    policy_version: torch.Tensor | None = None
    # (B, T) long, --partial_rollout: the engines' version that sampled each response token (0 on padding)
    token_version: torch.Tensor | None = None
    # (B, S, L, K) int16, MoE engines that capture routes (rollout/route_capture.py): each MoE layer's top-k
    # experts for every token the engine fed, aligned with `sequences`; -1 where there is none. None: not captured
    routes: torch.Tensor | None = None
    # (F,) the last F rows are extra segments of agent episodes (agents/trajectory.py): the index of the row whose
    # advantage each shares (its episode's lead row, among the first B - F rows); None: no such rows
    fork_of: list[int] | None = None

    @property
    def num_actions(self) -> int:
        return self.action_mask.size(1)

    def select(self, rows: torch.Tensor) -> Samples:
        """Rows `rows` (1-D long) of every per-row field; batch-level fields (metrics, advantage_segments,
        fork_of) do not survive a row selection and are dropped."""
        picked = rows.tolist()
        kwargs = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("metrics", "advantage_segments", "fork_of"):
                continue
            if isinstance(value, torch.Tensor):
                kwargs[f.name] = value[rows]
            elif isinstance(value, list):
                kwargs[f.name] = [value[i] for i in picked]
            elif isinstance(value, RewardOutput):
                kwargs[f.name] = RewardOutput(
                    value.rewards[rows], value.scores[rows], {k: v[rows] for k, v in value.extra_logs.items()}
                )
            else:
                kwargs[f.name] = value
        return Samples(**kwargs)


def pad_rows(
    prompt_ids: list[list[int]], response_ids: list[list[int]], action: list[list[bool]],
    log_probs: list[list[float]], pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """Token lists -> the layout above: (sequences, attention_mask, action_mask, rollout_log_probs) with
    prompts left-padded to the longest and responses right-padded to the longest (at least 1).
    `action` / `log_probs` give, per response token, whether it is trained and its rollout log-prob."""
    p_len = max(len(p) for p in prompt_ids)
    t_len = max(1, max(len(r) for r in response_ids))
    # Rows are built as Python lists and converted once: a tensor per row costs a small allocation each, on the
    # rollout's critical path.
    seq_rows, attn_rows, act_rows, lp_rows = [], [], [], []
    for p, r, a, lp in zip(prompt_ids, response_ids, action, log_probs, strict=True):
        left, right = p_len - len(p), t_len - len(r)
        seq_rows.append([pad_id] * left + list(p) + list(r) + [pad_id] * right)
        attn_rows.append([0] * left + [1] * (len(p) + len(r)) + [0] * right)
        act_rows.append(list(a) + [False] * right)
        lp_rows.append(list(lp) + [0.0] * right)
    sequences = torch.tensor(seq_rows, dtype=torch.long)
    attention = torch.tensor(attn_rows, dtype=torch.long)
    action_mask = torch.tensor(act_rows, dtype=torch.bool)
    rollout_lp = torch.tensor(lp_rows, dtype=torch.float32)
    return sequences, attention, action_mask, rollout_lp


def extend_routes(kept: torch.Tensor | None, fed: torch.Tensor | None) -> torch.Tensor | None:
    """A row's routes after one more engine call on it (a partial rollout's next chunk, an agent's next turn):
    the positions earlier calls fed keep the routes they were sampled under (a later call re-feeds them as its
    prompt, possibly under newer weights, only to rebuild the KV cache); the call adds the positions it fed
    first. None when the engine captures none."""
    if fed is None:
        return None
    if kept is None:
        return fed
    return torch.cat([kept, fed[len(kept) :]])


def layout_routes(prompt_lens: list[int], routes: list[torch.Tensor | None], width: int) -> torch.Tensor | None:
    """(B, S, L, K) int16 routes aligned with the padded sequences (each row's (positions, L, K) routes start
    where its prompt does, prompts left-padded to the longest, S = `width`), -1 on padding and on positions no
    engine call fed (a response's last token, every position of a row that has None: an agent episode that
    never called the engine); None when no row has any (the engine captures none)."""
    given = [r for r in routes if r is not None]
    if not given:
        return None
    out = torch.full((len(routes), width, *given[0].shape[1:]), -1, dtype=torch.int16)
    p_len = max(prompt_lens)
    for row, (n, r) in enumerate(zip(prompt_lens, routes, strict=True)):
        if r is not None:
            out[row, p_len - n : p_len - n + len(r)] = r
    return out


def concat_samples(parts: list[Samples]) -> Samples:
    """One Samples from several (dynamic filtering keeps groups from several rounds): prompts re-padded on
    the left to the longest prompt, responses (and per-token fields) on the right to the longest response;
    prompt_index renumbered so that groups stay distinct. An optional field is kept when every part has it;
    batch-level fields (metrics, advantage_segments) are dropped; the parts share one group size."""
    p_len = max(s.sequences.size(1) - s.num_actions for s in parts)
    t_len = max(s.num_actions for s in parts)

    def pad(x: torch.Tensor, left: int, right: int, value) -> torch.Tensor:
        return torch.nn.functional.pad(x, (left, right), value=value)

    def every(name: str) -> list | None:
        values = [getattr(s, name) for s in parts]
        return None if any(v is None for v in values) else values

    seqs, attn, masks, lps, index, offset, routes = [], [], [], [], [], 0, []
    for s in parts:
        left, right = p_len - (s.sequences.size(1) - s.num_actions), t_len - s.num_actions
        if s.routes is not None:  # (B, S, L, K): the sequence columns are dim 1
            routes.append(torch.nn.functional.pad(s.routes, (0, 0, 0, 0, left, right), value=-1))
        seqs.append(pad(s.sequences, left, right, 0))  # under attention_mask 0: never attended or trained
        attn.append(pad(s.attention_mask, left, right, 0))
        masks.append(pad(s.action_mask, 0, right, False))
        lps.append(pad(s.rollout_log_probs, 0, right, 0.0))
        index.append(s.prompt_index + offset)
        offset += int(s.prompt_index.max()) + 1 if len(s.prompt_index) else 0
    optional = {}
    if rewards := every("rewards"):
        optional["rewards"] = RewardOutput(
            torch.cat([r.rewards for r in rewards]),
            torch.cat([r.scores for r in rewards]),
            {k: torch.cat([r.extra_logs[k] for r in rewards]) for k in rewards[0].extra_logs},
        )
    for name in ("turn_rewards", "token_version"):  # (B, T) per-token fields: padded on the right
        if per_token := every(name):
            optional[name] = torch.cat([pad(t, 0, t_len - t.size(1), 0) for t in per_token])
    if len(routes) == len(parts):
        optional["routes"] = torch.cat(routes)
    if versions := every("policy_version"):
        optional["policy_version"] = torch.cat(versions)
    for name in ("step_meta", "step_rewards_ext"):
        if rows := every(name):
            optional[name] = [row for part in rows for row in part]
    return Samples(
        torch.cat(seqs), torch.cat(attn), torch.cat(masks), torch.cat(lps),
        [p for s in parts for p in s.prompts], [r for s in parts for r in s.responses],
        [label for s in parts for label in s.labels], torch.cat(index), torch.cat([s.truncated for s in parts]),
        group_size=parts[0].group_size, **optional,
    )  # fmt: skip


@dataclass
class Experience:
    """One micro-batch ready for training."""

    sequences: torch.Tensor  # (B, S) long
    attention_mask: torch.Tensor  # (B, S) long
    action_mask: torch.Tensor  # (B, T) bool
    # (B, T) float32, trainer's log-probs before this update. None: the step trains once on one mini-batch,
    # so they equal the training forward's own (detached) log-probs and the policy fills them in there.
    old_log_probs: torch.Tensor | None
    rollout_log_probs: torch.Tensor  # (B, T) float32, engine's log-probs
    advantages: torch.Tensor  # (B, T) float32
    returns: torch.Tensor  # (B, T) float32
    rewards: torch.Tensor  # (B,) float32, the reward of each sample after shaping inputs (clip, normalise)
    ref_log_probs: torch.Tensor | None = None  # (B, T) float32, reference model (when a KL term is used)
    values: torch.Tensor | None = None  # (B, T) float32, critic values (gae only)
    info: dict[str, torch.Tensor] = field(default_factory=dict)  # per-sample (B,) values for logging
    step_meta: list[dict] | None = None  # (B,) agent sidecars, see Samples
    step_rewards_ext: list[dict] | None = None  # (B,)
    # (B, S, L, K) int16, MoE under --routing_replay: the routes the training forward replays (models/routing.py)
    routes: torch.Tensor | None = None

    @property
    def num_actions(self) -> int:
        return self.action_mask.size(1)

    def select(self, index: torch.Tensor | slice) -> Experience:
        """Rows `index` of every tensor field."""
        kwargs = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                kwargs[f.name] = value[index]
            elif isinstance(value, dict):
                kwargs[f.name] = {k: v[index] for k, v in value.items()}
            elif isinstance(value, list):
                rows = range(len(value))[index] if isinstance(index, slice) else index.tolist()
                kwargs[f.name] = [value[i] for i in rows]
            else:
                kwargs[f.name] = value
        return Experience(**kwargs)

    def __len__(self) -> int:
        return self.sequences.size(0)

    def trim_padding(self) -> Experience:
        """The same rows without the columns that are padding in every row: leading prompt columns and
        trailing response columns. Causal attention and positions counted from the mask make the logits of
        the kept tokens the same; a micro-batch of short responses no longer pays for the batch's longest."""
        columns, keep = padding_columns(self.attention_mask, self.num_actions)
        if columns == slice(0, self.sequences.size(1)):
            return self
        kwargs = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("sequences", "attention_mask", "routes") and value is not None:
                value = value[:, columns]
            elif isinstance(value, torch.Tensor) and value.dim() == 2:  # (B, T) per-token fields
                value = value[:, :keep]
            kwargs[f.name] = value
        return Experience(**kwargs)


def padding_bounds(attention_mask: torch.Tensor, num_actions: int) -> tuple[int, int]:
    """(leading columns that are padding in every row, response columns to keep: up to the last one that
    holds a token in some row, at least 1)."""
    used = attention_mask.bool().any(dim=0)
    prompt_len = attention_mask.size(1) - num_actions
    left = int(used[:prompt_len].long().argmax()) if bool(used[:prompt_len].any()) else 0
    response = used[prompt_len:].nonzero()
    return left, int(response[-1]) + 1 if len(response) else 1


def padding_columns(attention_mask: torch.Tensor, num_actions: int) -> tuple[slice, int]:
    """(the sequence columns that hold a token in some row, the response columns among them): what
    trim_padding keeps."""
    left, keep = padding_bounds(attention_mask, num_actions)
    return slice(left, attention_mask.size(1) - (num_actions - keep)), keep


def consecutive_slices(sizes: list[int]) -> list[slice]:
    """Row ranges of consecutive chunks of these sizes."""
    bounds = [0, *torch.tensor(sizes, dtype=torch.long).cumsum(0).tolist()]
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def pad_actions(per_token: torch.Tensor, num_actions: int) -> torch.Tensor:
    """(B, t) -> (B, num_actions), zeros on the right: undoes trim_padding on a per-token result."""
    return torch.nn.functional.pad(per_token, (0, num_actions - per_token.size(1)))


def budget_chunks(lengths: list[int], max_tokens: int, packed: bool = False) -> list[int]:
    """Sizes of consecutive chunks of rows, in order, each costing at most max_tokens (a row longer than the
    budget goes alone). The cost of a chunk is what its forward holds: rows x its longest row when padded,
    the sum of its lengths when packed (--packing_samples concatenates them). Rows sorted by length
    (length_grouped) pack best."""
    sizes, rows, longest, total = [], 0, 0, 0
    for length in lengths:
        cost = total + length if packed else (rows + 1) * max(longest, length)
        if rows and cost > max_tokens:
            sizes.append(rows)
            rows, longest, total = 0, 0, 0
        rows, longest, total = rows + 1, max(longest, length), total + length
    return sizes + [rows] if rows else sizes


def split_by_tokens(exp: Experience, parts: int, packed: bool = False) -> list[Experience]:
    """`parts` consecutive micro-batches (1 <= parts <= rows) of about equal cost (budget_chunks: padded or
    packed tokens): the smallest token budget whose chunks number at most `parts`, then the chunks with the
    most rows halved until there are `parts` (data-parallel ranks must all run the same number of
    micro-batches)."""
    lengths = exp.attention_mask.sum(-1).tolist()
    low, high = max(lengths), len(lengths) * max(lengths)
    while low < high:  # smallest budget with at most `parts` chunks
        mid = (low + high) // 2
        low, high = (low, mid) if len(budget_chunks(lengths, mid, packed)) <= parts else (mid + 1, high)
    sizes = budget_chunks(lengths, low, packed)
    while len(sizes) < parts:
        i = max(range(len(sizes)), key=lambda k: sizes[k])
        sizes[i : i + 1] = [sizes[i] - sizes[i] // 2, sizes[i] // 2]
    return [exp.select(rows) for rows in consecutive_slices(sizes)]


def split_experience(exp: Experience, num_micro_batches: int) -> list[Experience]:
    """`num_micro_batches` consecutive micro-batches of near-equal size (sizes differ by at most one)."""
    if num_micro_batches > len(exp):
        raise ValueError(f"cannot split {len(exp)} rows into {num_micro_batches} non-empty micro-batches")
    return [exp.select(idx) for idx in torch.tensor_split(torch.arange(len(exp)), num_micro_batches)]
