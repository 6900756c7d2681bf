"""The algorithm core and a real model's train path on a GPU: CUDA against a CPU reference, and speed.

Runs on: a CUDA machine with PyTorch and transformers alone (no Ray, vLLM or DeepSpeed); `--device cpu
--small` runs the same code on small shapes here, to check the script before a GPU lease.
Takes:   ~2 minutes on one H100 (model build and CUDA start-up included).

    python -m benchmarks.gpu_check --output DIR        # measure, write DIR/gpu_check.json, render the tables
    python -m benchmarks.gpu_check --render FILE       # re-render from a JSON

Three parts:
1. **Algorithm core**: the policy loss with every IS correction (and none), every advantage estimator and
   every KL estimator, computed in float32 on the device and in float32 on the CPU, each compared with a
   float64 CPU reference (max error of the loss, its gradient, the `is/*` metrics); for the corrections, how
   many tokens' keep/mask decision differs from the reference's.
2. **Token log-probs** (models/logprobs._TokenLogProbs, the hand-written backward) against autograd's
   log_softmax + gather on a (tokens, 49,152) fp32 logit block: value and gradient error, time, peak memory.
3. **SmolLM2-135M's train step** (its architecture from config, random weights: no download): forward over the
   rollout batch, the response log-probs, the `reinforce_pro` policy loss, backward, one AdamW step; padded
   and packed (--packing_samples), fp32 and bf16 autocast, W3's 32 rows and 256 rows; seconds per step,
   tokens/s, the achieved TFLOP/s (6 x matmul parameters x real tokens, the LM head on response tokens only)
   against the device's own GEMM rate, and packed vs padded log-probs.
4. **Log-probs under the engine's sampling filters** (models/sampling_filter.py, replayed by the trainer): for
   each sampling setting, the filtered token log-probs and their gradient on a (tokens, 49,152) fp32 logit block,
   on the device and on the CPU in float32, against a float64 CPU reference; how many (position, token) pairs
   of the kept support differ from the reference's, and how far the full softmax sits from the filtered
   distribution (the mismatch a trainer that ignores the filter reports); forward + backward time with and
   without the filter.
5. **MoE routing replay** (models/routing.py) on a Qwen3-MoE from config (random weights, transformers' own
   router initialisation): the experts a float32 CPU forward picks, replayed in a float32 forward on the device
   (logit error against the CPU forward; how many (token, layer) top-k sets the device would have picked
   otherwise), and the route agreement between a bf16 and a float32 forward on the device, with the log-prob gap
   with and without replaying the float32 routes in the bf16 forward.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.bench_peers import layer_matmul_params
from benchmarks.bench_train_phase import padded_batch
from benchmarks.common import bench_main
from reinforce_pro.algos import (  # noqa: I001
    ADVANTAGE_ESTIMATORS,
    KL_ESTIMATORS,
    AdvantageInputs,
    PolicyLoss,
    compute_advantages,
    compute_approx_kl,
)
from reinforce_pro.algos.is_correction import IS_CORRECTIONS, compute_is_weights, default_band
from reinforce_pro.models.logprobs import _TokenLogProbs, response_log_probs, token_log_probs
from reinforce_pro.models.sampling_filter import SamplingFilter, kept_support

NAME = "gpu_check"
THRESHOLD = (0.5, 2.0)
ANCHORED = ("reinforce_pro", "icepop", "cppo", "dppo-tv")  # checked again under the rollout anchor
SMOLLM2 = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
           "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152, "tie_word_embeddings": True}  # fmt: skip
# part 4: the sampling settings the CLI accepts that filter (bench_sampling_filter.py's), as (temperature, filter)
FILTERS = {
    "top_p 0.8": (1.0, SamplingFilter(top_p=0.8)),
    "top_k 5": (1.0, SamplingFilter(top_k=5)),
    "min_p 0.05": (1.0, SamplingFilter(min_p=0.05)),
    "temperature 0.7, top_p 0.9, top_k 20": (0.7, SamplingFilter(top_p=0.9, top_k=20)),
    "min_new_tokens 3": (1.0, SamplingFilter(min_tokens=3, stop_token_ids=(0, 2))),
}
# part 5: Qwen3-30B-A3B's router (128 experts, 8 per token, renormalised) on a model small enough for one check
MOE_MODEL = {"hidden_size": 1024, "intermediate_size": 3072, "moe_intermediate_size": 384, "num_hidden_layers": 8,
             "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 64, "num_experts": 128,
             "num_experts_per_tok": 8, "vocab_size": 32768}  # fmt: skip
SMALL_MOE = {"hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_experts": 8,
             "num_experts_per_tok": 2, "vocab_size": 512}  # fmt: skip
SMALL_MODEL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512, "tie_word_embeddings": True}  # fmt: skip


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# ---- 1. algorithm core --------------------------------------------------------------------------------------
def core_inputs(rows: int, width: int, seed: int = 0) -> dict:
    """float64 CPU tensors shaped like a rollout batch with a real mismatch: responses of width/8..width
    tokens, rollout log-probs of a peaked policy, old = rollout + a bias per row (sd 0.5: the prefix filters
    mask some rows) + noise (sd 0.3, a drift of +-1 on 2% of tokens), the current policy a little off old,
    +-1 advantages per row, groups of 8 rows."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(width // 8, width + 1, (rows,), generator=g)
    mask = torch.arange(width)[None, :] < lengths[:, None]
    rollout = -torch.randn(rows, width, generator=g, dtype=torch.float64).abs() * 1.5
    drift = (torch.rand(rows, width, generator=g) < 0.02) * torch.randn(rows, width, generator=g).sign()
    bias = 0.5 * torch.randn(rows, 1, generator=g, dtype=torch.float64)
    old = rollout + bias + 0.3 * torch.randn(rows, width, generator=g, dtype=torch.float64) + drift
    new = old + 0.05 * torch.randn(rows, width, generator=g, dtype=torch.float64)
    rewards = torch.randint(0, 2, (rows,), generator=g).double()
    adv = (rewards * 2 - 1)[:, None] * mask
    values = torch.randn(rows, width, generator=g, dtype=torch.float64)
    return {"new": new, "old": old, "rollout": rollout, "adv": adv, "mask": mask, "rewards": rewards,
            "values": values}  # fmt: skip


def _on(inp: dict, device: str, dtype) -> dict:
    return {k: (v.to(device) if v.dtype == torch.bool else v.to(device, dtype)) for k, v in inp.items()}


def _loss_run(inp: dict, correction: str | None, anchor: str = "old") -> dict:
    band = default_band(correction, THRESHOLD) if correction else THRESHOLD
    fields = {"enable_vllm_is_correction": True, "vllm_is_correction_type": correction} if correction else {}
    loss_fn = PolicyLoss(vllm_is_truncated_threshold=band, vllm_is_anchor=anchor, **fields)
    new = inp["new"].clone().requires_grad_(True)
    loss, metrics = loss_fn(new, inp["old"], inp["adv"], inp["mask"], inp["rollout"])
    loss.backward()
    out = {"loss": loss.detach().double().cpu().reshape(1), "grad": new.grad.double().cpu()}
    out.update({f"m:{k}": torch.tensor([float(s.value)], dtype=torch.float64) for k, s in metrics.items()})
    if correction:
        gated = inp["new"] if anchor == "rollout" else inp["old"]
        weights, _ = compute_is_weights(correction, gated, inp["rollout"], inp["mask"], *band, advantages=inp["adv"])
        out["keep"] = (weights != 0).cpu()
    return out


def _error(a: dict, ref: dict) -> tuple[float, int]:
    """Largest error over the outputs, each relative to its reference's largest magnitude (so a loss, a
    gradient and a metric are on one scale), and how many keep decisions differ from the reference's."""
    err = 0.0
    for key, value in ref.items():
        if key != "keep":
            scale = max(float(value.abs().max()), 1e-12)
            err = max(err, float((a[key] - value).abs().max()) / scale)
    return err, int((a["keep"] != ref["keep"]).sum()) if "keep" in ref else 0


def _compare(name: str, run, inp: dict, device: str) -> dict:
    ref = run(_on(inp, "cpu", torch.float64))
    dev_err, dev_flips = _error(run(_on(inp, device, torch.float32)), ref)
    cpu_err, cpu_flips = _error(run(_on(inp, "cpu", torch.float32)), ref)
    masked = 1 - float(ref["keep"].sum()) / float(inp["mask"].sum()) if "keep" in ref else None
    return {"what": name, "device_rel_err": dev_err, "cpu_fp32_rel_err": cpu_err, "device_flips": dev_flips,
            "cpu_fp32_flips": cpu_flips, "masked_frac": masked}  # fmt: skip


def _advantage_run(estimator: str):
    def run(inp: dict) -> dict:
        kl = compute_approx_kl("k3", inp["new"], inp["old"], inp["mask"])
        fields = {"values": inp["values"], "gamma": 0.99, "lambd": 0.95} if estimator == "gae" else {}
        adv, ret = compute_advantages(estimator, AdvantageInputs(inp["rewards"], inp["mask"], group_size=8, kl=kl,
                                                                 kl_coef=0.01, **fields))  # fmt: skip
        return {"advantages": adv.double().cpu(), "returns": ret.double().cpu()}

    return run


def _kl_run(estimator: str):
    return lambda inp: {"kl": compute_approx_kl(estimator, inp["new"], inp["rollout"], inp["mask"]).double().cpu()}


def check_core(device: str, rows: int, width: int) -> list[dict]:
    inp = core_inputs(rows, width)
    results = []
    for correction in [None, *IS_CORRECTIONS]:
        results.append(_compare(f"policy loss, IS {correction or 'off'}", lambda x, c=correction: _loss_run(x, c),
                                inp, device))  # fmt: skip
    for correction in ANCHORED:  # the rollout anchor: the gate reads the current policy
        results.append(_compare(f"policy loss, IS {correction}, rollout anchor",
                                lambda x, c=correction: _loss_run(x, c, "rollout"), inp, device))  # fmt: skip
    for estimator in ADVANTAGE_ESTIMATORS:
        results.append(_compare(f"advantages {estimator}", _advantage_run(estimator), inp, device))
    for estimator in KL_ESTIMATORS:
        results.append(_compare(f"KL {estimator}", _kl_run(estimator), inp, device))
    for r in results:
        print(f"  {r['what']}: device {r['device_rel_err']:.2e}, cpu fp32 {r['cpu_fp32_rel_err']:.2e}", flush=True)
    return results


# ---- 2. token log-probs -------------------------------------------------------------------------------------
def _autograd_token_log_probs(logits, targets):
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def _time_log_probs(fn, logits, targets, grad, device: str, reps: int) -> tuple[float, float, torch.Tensor]:
    """(median seconds of forward + backward, peak bytes above the inputs, the logits' gradient)."""
    times = []
    for _ in range(reps + 1):
        x = logits.detach().requires_grad_(True)
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        sync(device)
        start = time.perf_counter()
        fn(x, targets).backward(grad)
        sync(device)
        times.append(time.perf_counter() - start)
        peak = torch.cuda.max_memory_allocated() - base if device.startswith("cuda") else float("nan")
    return statistics.median(times[1:]), peak, x.grad


def check_token_log_probs(device: str, tokens: int, vocab: int, reps: int) -> dict:
    g = torch.Generator().manual_seed(1)
    logits = (3 * torch.randn(tokens, vocab, generator=g)).to(device)
    targets = torch.randint(0, vocab, (tokens,), generator=g).to(device)
    grad = torch.randn(tokens, generator=g).to(device)
    ref = _autograd_token_log_probs(logits.double(), targets)
    t_auto, m_auto, g_auto = _time_log_probs(_autograd_token_log_probs, logits, targets, grad, device, reps)
    t_ours, m_ours, g_ours = _time_log_probs(_TokenLogProbs.apply, logits, targets, grad, device, reps)
    value_err = float((_TokenLogProbs.apply(logits, targets).double() - ref).abs().max())
    result = {"tokens": tokens, "vocab": vocab, "autograd_s": t_auto, "ours_s": t_ours,
              "autograd_peak_mb": m_auto / 2**20, "ours_peak_mb": m_ours / 2**20, "value_abs_err": value_err,
              "grad_abs_diff": float((g_auto - g_ours).abs().max())}  # fmt: skip
    print(f"  token log-probs: {result}", flush=True)
    return result


# ---- 4. log-probs under the sampling filters -----------------------------------------------------------------
def filter_inputs(tokens: int, vocab: int, temperature: float, filt: SamplingFilter, seed: int = 2):
    """CPU float32 logits of a peaked policy, each position's index in its response (0..63), and targets
    sampled (float64, on the CPU) from the filtered distribution, as the engine would have sampled them."""
    g = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(tokens, vocab, generator=g)
    positions = torch.arange(tokens) % 64
    scaled = logits.double() / temperature
    keep = kept_support(scaled, filt, positions)
    probs = scaled.masked_fill(~keep, float("-inf")).softmax(dim=-1)
    return logits, positions, torch.multinomial(probs, 1, generator=g).squeeze(-1)


def _filtered(logits, targets, positions, temperature: float, filt: SamplingFilter | None, grad):
    """(log-probs, the logits' gradient) of the trainer's token_log_probs under `filt` (None: full softmax)."""
    x = logits.detach().requires_grad_(True)
    values, _ = token_log_probs(x, targets, temperature, sampling_filter=filt, positions=positions)
    values.backward(grad)
    return values.detach(), x.grad


def _log_probs_under(temperature: float, filt: SamplingFilter | None, positions):
    """token_log_probs under `filt` as a (logits, targets) -> log-probs function, for _time_log_probs."""
    return lambda x, t: token_log_probs(x, t, temperature, sampling_filter=filt, positions=positions)[0]


def _reference(logits, targets, positions, temperature: float, filt: SamplingFilter | None, grad):
    """The same in float64 on the CPU (token_log_probs computes in float32): the log-softmax over the support
    the trainer's rule keeps on the CPU (the sampled token always in it), and its gradient by autograd;
    also that support. `filt` None: the full softmax."""
    x = logits.detach().double().requires_grad_(True)
    scaled = x / temperature
    keep = torch.ones_like(scaled, dtype=torch.bool) if filt is None else kept_support(scaled, filt, positions)
    keep[torch.arange(len(targets)), targets] = True
    values = scaled.masked_fill(~keep, float("-inf")).log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)
    values.backward(grad.double())
    return values.detach(), x.grad, keep


def check_sampling_filters(device: str, tokens: int, vocab: int, reps: int) -> list[dict]:
    results = []
    for name, (temperature, filt) in FILTERS.items():
        logits, positions, targets = filter_inputs(tokens, vocab, temperature, filt)
        grad = torch.randn(tokens, generator=torch.Generator().manual_seed(3))
        ref, ref_grad, ref_keep = _reference(logits, targets, positions, temperature, filt, grad)
        full, _, _ = _reference(logits, targets, positions, temperature, None, grad)
        cpu, cpu_grad = _filtered(logits, targets, positions, temperature, filt, grad)
        on = [t.to(device) for t in (logits, targets, positions, grad)]
        dev, dev_grad = _filtered(on[0], on[1], on[2], temperature, filt, on[3])
        dev_keep = kept_support(on[0] / temperature, filt, on[2]).cpu()
        dev_keep[torch.arange(tokens), targets] = True
        times = {label: _time_log_probs(_log_probs_under(temperature, f, on[2]), on[0], on[1], on[3], device, reps)[0]
                 for label, f in (("full", None), ("filtered", filt))}  # fmt: skip
        results.append({
            "setting": name, "kept_tokens_mean": float(ref_keep.sum(-1).double().mean()),
            "full_softmax_gap_mean": float((full - ref).abs().mean()),
            "device_abs_err_max": float((dev.double().cpu() - ref).abs().max()),
            "cpu_fp32_abs_err_max": float((cpu.double() - ref).abs().max()),
            "device_grad_err_max": float((dev_grad.double().cpu() - ref_grad).abs().max()),
            "cpu_fp32_grad_err_max": float((cpu_grad.double() - ref_grad).abs().max()),
            "device_support_diff": int((dev_keep != ref_keep).sum()),
            "device_rows_support_diff": int((dev_keep != ref_keep).any(-1).sum()),
            "full_ms": times["full"] * 1e3, "filtered_ms": times["filtered"] * 1e3,
        })  # fmt: skip
        print(f"  {name}: {results[-1]}", flush=True)
    return results


# ---- 3. SmolLM2's train step ---------------------------------------------------------------------------------
def _moe_forward(model, replay, ids, routes=None):
    """(logits (B, S, V) float32 on the CPU, own routes (N, L, K)) of one forward under the RouteReplay `replay`,
    replaying `routes` if given."""
    replay.use(routes.to(ids.device) if routes is not None else None)
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits.float().cpu()
    return logits, replay.own_routes().cpu()


def _differ(a: torch.Tensor, b: torch.Tensor) -> float:
    """Fraction of (token, layer) pairs whose top-k sets differ."""
    return float((a.sort(-1).values != b.sort(-1).values).any(-1).float().mean())


def _gap(logits: torch.Tensor, ref: torch.Tensor, ids: torch.Tensor) -> float:
    """Mean |log-prob gap| of the next tokens of `ids` between two forwards' logits."""
    target = ids[:, 1:].cpu().unsqueeze(-1)
    lp = lambda x: torch.log_softmax(x[:, :-1].double(), -1).gather(-1, target)  # noqa: E731
    return float((lp(logits) - lp(ref)).abs().mean())


def check_moe(device: str, shape: dict, rows: int, width: int) -> dict:
    """Part 5: the replayed forward on `device` against the CPU's, and bf16 against fp32 routing on `device`."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from reinforce_pro.models.routing import RouteReplay

    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**shape, norm_topk_prob=True, attn_implementation="sdpa")).eval()
    ids = torch.randint(0, shape["vocab_size"], (rows, width), generator=torch.Generator().manual_seed(1))
    replay = RouteReplay.install(model)
    cpu_logits, cpu_routes = _moe_forward(model, replay, ids)
    model.to(device)
    torch.backends.cuda.matmul.allow_tf32 = False
    dev_ids = ids.to(device)
    own_logits, own_routes = _moe_forward(model, replay, dev_ids)
    replayed_logits, _ = _moe_forward(model, replay, dev_ids, cpu_routes)
    fp32 = {"flip_frac_vs_cpu": _differ(own_routes, cpu_routes),
            "logit_err_own": float((own_logits - cpu_logits).abs().max()),
            "logit_err_replayed": float((replayed_logits - cpu_logits).abs().max())}  # fmt: skip
    model.to(torch.bfloat16)
    bf16_logits, bf16_routes = _moe_forward(model, replay, dev_ids)
    bf16_replayed, _ = _moe_forward(model, replay, dev_ids, own_routes)
    bf16 = {"flip_frac_vs_fp32": _differ(bf16_routes, own_routes),
            "logprob_gap_own": _gap(bf16_logits, own_logits, ids),
            "logprob_gap_replayed": _gap(bf16_replayed, own_logits, ids)}  # fmt: skip
    return {"shape": shape, "rows": rows, "width": width, "fp32": fp32, "bf16": bf16}


def gemm_tflops(device: str, n: int, dtype, tf32: bool = False) -> float:
    torch.backends.cuda.matmul.allow_tf32 = tf32
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    sync(device)
    start, reps = time.perf_counter(), 10
    for _ in range(reps):
        a @ b
    sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - start) / 1e12


def rollout_batch(rows: int, prompt: int, response: int, vocab: int, seed: int = 0):
    """W3's shape (bench_train_phase.padded_batch): chat-templated prompts of ~36 tokens, responses of 16-64."""
    return padded_batch(rows, prompt, response, vocab, torch.Generator().manual_seed(seed))


def build_model(shape: dict, device: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**shape, max_position_embeddings=2048, attn_implementation="sdpa")
    return LlamaForCausalLM(config).to(device).train()


def step_flops(model, mask: torch.Tensor, response: int) -> float:
    """6 x (matmul parameters of the layers) x real tokens + 6 x the LM head x real response tokens."""
    head = model.config.hidden_size * model.config.vocab_size
    layers = layer_matmul_params(model.config)
    return 6.0 * layers * float(mask.sum()) + 6.0 * head * float(mask[:, -response:].sum())


def train_step(model, opt, loss_fn, seq, mask, response: int, micro: int, packed: bool, autocast: bool) -> None:
    opt.zero_grad(set_to_none=True)
    tokens = float(mask[:, -response:].sum())
    for i in range(0, len(seq), micro):
        s, m = seq[i : i + micro], mask[i : i + micro]
        with torch.autocast(seq.device.type, dtype=torch.bfloat16, enabled=autocast):
            lp, _ = response_log_probs(model, s, m, response, packed=packed)
        action = m[:, -response:].bool()
        old = lp.detach().float()
        loss, _ = loss_fn(lp.float(), old, torch.where(action, 1.0, 0.0), action, old + 0.01, batch_num_tokens=tokens)
        loss.backward()
    opt.step()


def _busy_fraction(step, device: str) -> float | None:
    """Share of one step's wall time the device spends in kernels (torch profiler): how far a step is from
    being launch-bound. None off CUDA."""
    if not device.startswith("cuda"):
        return None
    from torch.profiler import ProfilerActivity, profile

    sync(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        step()
        sync(device)
        wall = time.perf_counter() - start
    kernels = sum(e.device_time for e in prof.events() if e.device_type.name == "CUDA") / 1e6
    return kernels / wall


def measure_model(model, seq, mask, response: int, micro: int, packed: bool, dtype: str, steps: int) -> dict:
    """One configuration's step time; `dtype` "fp32", "bf16 autocast" (fp32 weights) or "bf16 weights" (the
    model as given, already in bf16: what a bf16 DeepSpeed rank trains)."""
    device = str(seq.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=device.startswith("cuda"))
    loss_fn = PolicyLoss(enable_vllm_is_correction=True, vllm_is_correction_type="reinforce_pro",
                         vllm_is_truncated_threshold=THRESHOLD)  # fmt: skip

    def step():
        train_step(model, opt, loss_fn, seq, mask, response, micro, packed, dtype == "bf16 autocast")

    times = []
    for _ in range(steps + 2):  # two warm-ups: kernels chosen, allocator grown
        sync(device)
        start = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times[2:])
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        step()
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None
    flops = step_flops(model, mask, response)
    return {"rows": len(seq), "micro": micro, "packed": packed, "dtype": dtype, "step_s": seconds,
            "tokens_per_s": float(mask.sum()) / seconds, "tflops": flops / seconds / 1e12, "peak_gib": peak,
            "busy": _busy_fraction(step, device)}  # fmt: skip


def packed_vs_padded(model, seq, mask, response: int) -> float:
    """Largest |log-prob| difference between the packed and the padded forward (fp32, response tokens)."""
    with torch.no_grad():
        padded, _ = response_log_probs(model, seq, mask, response)
        packed, _ = response_log_probs(model, seq, mask, response, packed=True)
    action = mask[:, -response:].bool()
    return float((padded - packed).abs()[action].max())


DTYPES = {"fp32": "fp32", "autocast": "bf16 autocast", "bf16": "bf16 weights"}  # --dtypes key -> row label


def check_model(device: str, shape: dict, row_counts: list[int], micros: list[int], paths: list[str], steps: int,
                dtypes: list[str]):  # fmt: skip
    torch.backends.cuda.matmul.allow_tf32 = False
    model = build_model(shape, device)
    low = build_model(shape, device).to(torch.bfloat16) if "bf16" in dtypes else None
    seq, mask = (t.to(device) for t in rollout_batch(16, 36, 64, shape["vocab_size"]))
    result = {"params": sum(p.numel() for p in model.parameters()), "packed_vs_padded_max_abs": packed_vs_padded(
        model, seq, mask, 64), "steps": []}  # fmt: skip
    for rows in row_counts:
        seq, mask = (t.to(device) for t in rollout_batch(rows, 36, 64, shape["vocab_size"], seed=rows))
        for micro in (m for m in micros if m <= rows):
            for key in dtypes:
                for path in paths:
                    net = low if key == "bf16" else model
                    r = measure_model(net, seq, mask, 64, micro, path == "packed", DTYPES[key], steps)
                    print(f"  {r}", flush=True)
                    result["steps"].append(r)
    return result


# ---- table ----------------------------------------------------------------------------------------------------
def render(payload: dict, out_dir: Path) -> str:
    cfg, res = payload["config"], payload["results"]
    where = payload["machine"].get("cuda") or payload["machine"].get("cpu")
    machine = payload["machine"]
    lines = [f"# GPU check: the algorithm core and SmolLM2's train step on {cfg['device']} ({where})", "",
             f"Commit {payload['commit'][:12]}{_tree_note(payload)}, torch {machine['torch']}, "
             f"{payload['created']}."]  # fmt: skip
    if "core" in res:
        lines += _core_lines(res["core"], cfg)
    if "token_log_probs" in res:
        lines += _log_prob_lines(res["token_log_probs"])
    if "model" in res:
        lines += _model_lines(res["model"], res["gemm_tflops"], cfg)
    if "sampling_filters" in res:
        lines += _filter_lines(res["sampling_filters"], cfg)
    if "moe" in res:
        lines += _moe_lines(res["moe"], cfg)
    text = "\n".join(lines) + "\n"
    (out_dir / f"{payload['benchmark']}.md").write_text(text)
    return text


def _moe_lines(moe: dict, cfg: dict) -> list[str]:
    shape, fp32, bf16 = moe["shape"], moe["fp32"], moe["bf16"]
    return [
        "", f"## 5. MoE routing replay ({shape['num_hidden_layers']} layers, {shape['num_experts']} experts, top-"
        f"{shape['num_experts_per_tok']}; {moe['rows']} x {moe['width']} tokens, random weights)", "",
        "| check | value |", "|---|---|",
        f"| fp32 on {cfg['device']}: (token, layer) top-k sets unlike the CPU's | {fp32['flip_frac_vs_cpu']:.4%} |",
        f"| fp32 on {cfg['device']}: max logit error against the CPU, own routing | {fp32['logit_err_own']:.2e} |",
        f"| fp32 on {cfg['device']}: max logit error against the CPU, CPU's routes replayed | "
        f"{fp32['logit_err_replayed']:.2e} |",
        f"| bf16 vs fp32 on {cfg['device']}: (token, layer) top-k sets that differ | {bf16['flip_frac_vs_fp32']:.4%} |",
        f"| bf16 vs fp32: mean log-prob gap, own routing | {bf16['logprob_gap_own']:.2e} |",
        f"| bf16 vs fp32: mean log-prob gap, fp32 routes replayed | {bf16['logprob_gap_replayed']:.2e} |",
    ]  # fmt: skip


def _tree_note(payload: dict) -> str:
    """A lease's copy of the checkout keeps git metadata older than the tree it runs: the JSON then names the
    tree's commit apart (tree_commit, added here after the lease)."""
    if "tree_commit" not in payload:
        return ""
    tree = payload["tree_commit"][:12]
    return f" as recorded on the device; the tree it ran is {tree}'s (see tree_commit_note in the JSON)"


def _core_lines(core: list[dict], cfg: dict) -> list[str]:
    lines = ["", "## 1. Algorithm core: float32 on the device and on the CPU, against a float64 CPU reference", "",
             f"{cfg['core_rows']} rows x {cfg['core_width']} tokens; error = max |x - ref| / max |ref| over the "
             "loss, its gradient and the metrics (advantages and returns; the KL). Flips: tokens whose IS keep "
             f"decision differs from the reference's (threshold {THRESHOLD}).", "",
             "| computation | device fp32 error | CPU fp32 error | device flips | CPU fp32 flips | weight 0 |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for r in core:
        masked = "" if r["masked_frac"] is None else f"{r['masked_frac']:.3f}"
        lines.append(f"| {r['what']} | {r['device_rel_err']:.1e} | {r['cpu_fp32_rel_err']:.1e} | {r['device_flips']} | "
                     f"{r['cpu_fp32_flips']} | {masked} |")  # fmt: skip
    return lines


def _log_prob_lines(t: dict) -> list[str]:
    return ["", f"## 2. Token log-probs: {t['tokens']} tokens x {t['vocab']} vocabulary, fp32, forward + backward",
              "", "| implementation | ms | peak MiB above the logits |", "|---|---|---|",
              f"| autograd log_softmax + gather | {t['autograd_s'] * 1e3:.2f} | {t['autograd_peak_mb']:.0f} |",
              f"| _TokenLogProbs (models/logprobs.py) | {t['ours_s'] * 1e3:.2f} | {t['ours_peak_mb']:.0f} |", "",
              f"Value error vs float64: {t['value_abs_err']:.1e}; the two gradients differ by at most "
              f"{t['grad_abs_diff']:.1e}."]  # fmt: skip


def _filter_lines(rows: list[dict], cfg: dict) -> list[str]:
    tokens, vocab = cfg["filter_shape"]
    lines = ["", f"## 4. Log-probs under the engine's sampling filters: {tokens} tokens x {vocab} vocabulary", "",
             "The trainer's filtered token log-probs (models/sampling_filter.py) and their gradient in float32, "
             "against a float64 CPU reference over the support the trainer's rule keeps on the CPU; targets "
             "sampled from the filtered distribution. "
             "Full-softmax gap: mean |log p| difference between the full softmax and the filtered distribution, "
             "the mismatch a trainer that ignores the filter would report (min_new_tokens hides 2 ids at 3 of "
             "every 64 positions, so its gap is small). Support: (position, token) pairs the "
             "device's kept set differs on from the reference's (rows with any).", "",
             "| setting | kept tokens (mean) | full-softmax gap | device max err | CPU fp32 max err | device grad err "
             "| CPU fp32 grad err | support pairs differing (rows) | ms full / filtered |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['setting']} | {r['kept_tokens_mean']:.1f} | {r['full_softmax_gap_mean']:.3f} | "
                     f"{r['device_abs_err_max']:.1e} | {r['cpu_fp32_abs_err_max']:.1e} | "
                     f"{r['device_grad_err_max']:.1e} | {r['cpu_fp32_grad_err_max']:.1e} | "
                     f"{r['device_support_diff']} ({r['device_rows_support_diff']}) | "
                     f"{r['full_ms']:.2f} / {r['filtered_ms']:.2f} |")  # fmt: skip
    return lines


def _model_lines(model: dict, peaks: dict, cfg: dict) -> list[str]:
    lines = ["", f"## 3. SmolLM2-135M's train step ({model['params'] / 1e6:.1f}M parameters, random weights)", "",
             f"GEMM rate of the device ({cfg['gemm_n']}^3): fp32 {peaks['fp32']:.1f}, TF32 {peaks['tf32']:.1f}, "
             f"bf16 {peaks['bf16']:.1f} TFLOP/s. Packed vs padded log-probs (fp32): max difference "
             f"{model['packed_vs_padded_max_abs']:.1e}. Prompts ~36 tokens, "
             "responses 16-64, the `reinforce_pro` loss, fused AdamW; median of "
             f"{cfg['steps']} steps after 2 warm-ups. Busy: share of the step's wall time the GPU runs kernels.", "",
             "| rows | micro | dtype | path | s / step | real tokens / s | TFLOP/s | of GEMM peak | peak GiB | busy |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in model["steps"]:
        peak = peaks["fp32"] if r["dtype"] == "fp32" else peaks["bf16"]  # both bf16 rows: against bf16's rate
        gib = "" if r["peak_gib"] is None else f"{r['peak_gib']:.1f}"
        busy = "" if r["busy"] is None else f"{r['busy']:.0%}"
        path = "packed" if r["packed"] else "padded"
        micro = r.get("micro", cfg.get("micro"))
        lines.append(f"| {r['rows']} | {micro} | {r['dtype']} | {path} | {r['step_s']:.3f} | "
                     f"{r['tokens_per_s']:,.0f} | {r['tflops']:.1f} | {r['tflops'] / peak:.0%} | {gib} | "
                     f"{busy} |")  # fmt: skip
    return lines


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cuda")
    p.add_argument("--small", action="store_true", help="small shapes: checks the script on a CPU")
    p.add_argument("--steps", type=int, default=5, help="timed train steps per configuration")
    p.add_argument("--parts", default="core,log-probs,model,filters,moe", help="which parts to run (comma-separated)")
    p.add_argument("--rows", default="32,256", help="rows per optimizer step of part 3 (comma-separated)")
    p.add_argument("--micros", default="16", help="rows per micro-batch of part 3 (comma-separated)")
    p.add_argument("--paths", default="padded,packed", help="forwards of part 3: padded, packed")
    p.add_argument("--dtypes", default="fp32,autocast", help="part 3: fp32, autocast (bf16), bf16 (weights)")
    p.add_argument("--suffix", default="", help="appended to the result's name (gpu_check<suffix>.json)")


def measured(args) -> tuple[dict, dict]:
    small = args.small
    cfg = {"device": args.device, "small": small, "steps": args.steps, "parts": args.parts, "micros": args.micros,
           "dtypes": args.dtypes,
           "core_rows": 32 if small else 256, "core_width": 64 if small else 1024,
           "gemm_n": 512 if small else 8192, "filter_shape": (64, 512) if small else (2048, 49152)}  # fmt: skip
    parts = args.parts.split(",")
    results = {}
    if "core" in parts:
        print("1. algorithm core", flush=True)
        results["core"] = check_core(args.device, cfg["core_rows"], cfg["core_width"])
    if "log-probs" in parts:
        print("2. token log-probs", flush=True)
        shape = (64, 512) if small else (2048, 49152)
        results["token_log_probs"] = check_token_log_probs(args.device, *shape, reps=5)
    if "model" in parts:
        print("3. model", flush=True)
        results.update(_model_part(args, cfg))
    if "filters" in parts:
        print("4. sampling filters", flush=True)
        results["sampling_filters"] = check_sampling_filters(args.device, *cfg["filter_shape"], reps=5)
    if "moe" in parts:
        print("5. MoE routing replay", flush=True)
        results["moe"] = check_moe(
            args.device, SMALL_MOE if small else MOE_MODEL, 4 if small else 16, 64 if small else 512
        )
    return cfg, results


def main(argv=None) -> int:
    return bench_main(argv, lambda args: NAME + args.suffix, __doc__, options, measured, render)


def _model_part(args, cfg: dict) -> dict:
    n = cfg["gemm_n"]
    low = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    peaks = {
        "fp32": gemm_tflops(args.device, n, torch.float32),
        "tf32": gemm_tflops(args.device, n, torch.float32, tf32=True),
        "bf16": gemm_tflops(args.device, n, low),
    }
    ints = lambda text: [int(x) for x in text.split(",")]  # noqa: E731
    shape = SMALL_MODEL if cfg["small"] else SMOLLM2
    model = check_model(args.device, shape, ints(args.rows), ints(args.micros), args.paths.split(","), args.steps,
                        args.dtypes.split(","))  # fmt: skip
    return {"gemm_tflops": peaks, "model": model}


if __name__ == "__main__":
    sys.exit(main())
