"""A vLLM engine as a Ray actor: generate token ids with per-token log-probs, and take new weights.

The same class runs vLLM's CPU build on a machine without a GPU and CUDA vLLM with one; vLLM picks its
platform from what it finds. On CPU the engine runs in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0: a
2-3 s start instead of ~20 s) with an explicit KV-cache size (else it asks for 92% of memory).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from reinforce_pro.flagspec import flag

WORKER_EXTENSION = "reinforce_pro.rollout.weight_receiver.WeightSyncExtension"
# --colocate_all_models with tensor parallelism on GPUs: the devices of the policy ranks whose bundles the
# engine spans (run/actors.engine_options); Ray gave the actor only the first, its TP workers need them all
ENGINE_DEVICES_ENV = "REINFORCE_PRO_ENGINE_DEVICES"


# --vllm_quantization: vLLM's online weight quantizations that were run here on vLLM 0.32's CPU build, a
# reload (weight sync) included. Tried and not offered: fp8_per_tensor (the CPU build lacks its quantize op),
# int8 (only MoE layers online; dense int8 needs a pre-quantized compressed-tensors checkpoint)
ENGINE_QUANTIZATIONS = ("fp8_per_channel",)


# Tokens a CPU engine schedules per forward, per tensor-parallel worker (vLLM's CPU default: 4096; it must stay
# >= vLLM's 256 sequences per worker). Its start runs one dummy forward of that many tokens, so a smaller budget
# starts faster at the same decode speed (docs/results/real-model-limit.md); longer prompts are prefilled in
# chunks of this size.
CPU_MAX_BATCHED_TOKENS = 512


@dataclass
class EngineConfig:
    model_path: str
    dtype: str = "bfloat16"  # vLLM dtype: float32 | bfloat16 | float16 | auto (--vllm_dtype bf16)
    seed: int = 42
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.95
    # fmt: off
    enforce_eager: bool = flag(False, "disable CUDA graphs in vLLM", dotted="vllm.enforce_eager", group="engines")
    enable_prefix_caching: bool = flag(False, "vLLM prefix caching (reset at every sync)",
        dotted="vllm.enable_prefix_caching", group="engines")
    # fmt: on
    max_model_len: int = 2048
    cpu_kv_cache_gib: int = 1
    quantization: str | None = None  # vLLM online weight quantization (--vllm_quantization), None: off
    cpu_max_batched_tokens: int = CPU_MAX_BATCHED_TOKENS
    # CPU: which compile cache a start loads (the VLLM_USE_AOT_COMPILE environment variable overrides it).
    # True: vLLM's ahead-of-time cache, keyed by the model's path: a later start from the same directory skips
    # Dynamo's trace, a start from a new directory compiles from scratch (benchmarks/bench_engine_start.py
    # measures both). False: Inductor's graph cache, keyed by the graph: any directory of an architecture
    # compiled before hits it, and every start traces the model again.
    aot_compile: bool = False
    # MoE models: record the experts each layer picked for every token (rollout/route_capture.py), for routing
    # replay (--routing_replay r3). Hooks run only in eager mode, and a prefix-cache hit skips the forward of
    # the cached tokens: the engine then runs eager, and refuses prefix caching.
    capture_routes: bool = False
    fp32_head: bool = False  # --fp32_lm_head: vLLM's head_dtype float32 (models/fp32_head.py does the trainer's)


@dataclass
class Generation:
    token_ids: list[int]  # response tokens
    log_probs: list[float]  # the engine's log-prob of each response token (after temperature)
    finish_reason: str  # "stop" or "length"
    # (prompt + response - 1, L, K) int16 with capture_routes: the top-k experts of each MoE layer for every
    # token the engine fed through the model (the prompt's, then each sampled token but the last); -1 where no
    # forward covered a position. None: not captured.
    routes: Any = None
    # with sampling["top_logprobs"] = k > 0 (an endpoint request's top_logprobs): each position's k most likely
    # tokens as (id, log-prob), most likely first, from the distribution the token was sampled from. None: not asked.
    top_log_probs: list[list[tuple[int, float]]] | None = None


class _DropBenignReloadWarning(logging.Filter):
    """vLLM warns at every in-place reload that RotaryEmbedding got no weights: its inv_freq buffer is
    computed, never stored in a checkpoint. With a tied LM head it warns the same of the head, which a sync
    does not send (it is the embedding, which is sent; tests/test_e2e.py checks a synced engine samples as one
    that loaded the weights). Nothing is wrong; without the filter it floods the log."""

    def __init__(self, tied_head: bool):
        super().__init__()
        self.benign = ("RotaryEmbedding",) + (("ParallelLMHead",) if tied_head else ())

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(f"{layer}: Failed to load weights" in message for layer in self.benign)


def uses_aot_cache(cfg: EngineConfig) -> bool:
    """Whether a CPU engine of `cfg` loads vLLM's ahead-of-time compile cache: `cfg.aot_compile` on one worker
    (TP workers are processes of their own, which let_cpu_aot_cache_load might not reach: the graph cache),
    unless the VLLM_USE_AOT_COMPILE environment variable says otherwise."""
    default = "1" if cfg.aot_compile and cfg.tensor_parallel_size == 1 else "0"
    return os.environ.get("VLLM_USE_AOT_COMPILE", default) == "1"


def let_cpu_aot_cache_load() -> None:
    """vLLM 0.32 cannot load back the ahead-of-time compiled model its CPU build saves: the CPU build compiles
    with Inductor's own backend, so the saved callable is torch's BundledAOTAutogradSerializableCallable, fully
    loaded when it is read, and vLLM's loader then calls `finalize_loading`, a method of its own backend's
    callable only. The lookup falls through to the wrapped function, raises AttributeError, and every start
    compiled again from scratch (SmolLM2: a 54-62 s warm-up on 2 cores, against 4-5 s loaded). Give the bundled
    callable the method as the no-op it is for it. Checked: an engine loaded from the cache and then sent new
    weights samples the same tokens and log-probs as a freshly compiled engine given those weights
    (tests/test_engine_compile_cache.py)."""
    from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable as Bundled

    if "finalize_loading" not in vars(Bundled):
        Bundled.finalize_loading = lambda self, vllm_config: None


def cpu_bind(workers: int, cores: list[int] | None = None) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for a tensor-parallel engine on CPU: this process's cores split into
    `workers` contiguous groups, one per TP worker ("0|1", "0-3|4-7"). Without it vLLM 0.32 binds one worker
    per NUMA node and refuses TP 2 on a one-node host ("Not enough allowed NUMA nodes"). Fewer cores than
    workers: the workers share them (a one-line error otherwise would refuse a run that still works)."""
    cores = sorted(os.sched_getaffinity(0)) if cores is None else cores
    if len(cores) < workers:
        return "|".join(str(cores[i % len(cores)]) for i in range(workers))
    size = len(cores) // workers
    groups = [cores[i * size : (i + 1) * size] for i in range(workers)]
    return "|".join(str(g[0]) if len(g) == 1 else f"{g[0]}-{g[-1]}" for g in groups)


def sampled_log_probs(completion) -> list[float]:
    """The engine's log-prob of each sampled token of a vLLM CompletionOutput. A position vLLM returned without
    one (no log-probs at all, fewer positions than tokens, the token missing from its entry) gets NaN, as does a
    NaN it returned: the trainer then gives that token IS weight 0 and counts it (is/nonfinite_tokens,
    rollout/logprob_nonfinite_frac) instead of failing the step. A -inf (a token the engine's own filter had
    removed) passes through and is treated the same way."""
    steps = list(completion.logprobs or [])
    return [logprob_at(steps, i, token) for i, token in enumerate(completion.token_ids)]


def logprob_at(steps: list, i: int, token: int) -> float:
    """`token`'s log-prob in vLLM's per-position entries `steps` at position `i`; NaN where vLLM gave none (fewer
    positions, no entry, the token missing from it, or a None log-prob)."""
    entry = steps[i].get(token) if i < len(steps) and steps[i] is not None else None
    return float("nan") if entry is None or entry.logprob is None else float(entry.logprob)


def top_log_probs(completion, k: int) -> list[list[tuple[int, float]]]:
    """Each position's `k` most likely tokens (vLLM's ranks 1..k) as (id, log-prob), most likely first."""
    steps = list(completion.logprobs or [])
    return [sorted(((t, float(e.logprob)) for t, e in (step or {}).items() if e.rank is not None and e.rank <= k),
                   key=lambda pair: -pair[1]) for step in steps[: len(completion.token_ids)]]  # fmt: skip


def fitted_routes(routes, positions: int):
    """Routes for exactly `positions` tokens: cut after the last fed token, or -1 (the trainer's own routing)
    where the engine recorded none."""
    import torch

    if routes.size(0) >= positions:
        return routes[:positions]
    missing = torch.full((positions - routes.size(0), *routes.shape[1:]), -1, dtype=routes.dtype)
    return torch.cat([routes, missing])


def llm_kwargs(cfg: EngineConfig, engine_index: int, on_gpu: bool) -> dict:
    """vllm.LLM's keywords for an engine of `cfg`."""
    kwargs = dict(
        model=cfg.model_path,
        dtype=cfg.dtype,
        seed=cfg.seed + engine_index,
        enforce_eager=cfg.enforce_eager,
        enable_prefix_caching=cfg.enable_prefix_caching,
        max_model_len=cfg.max_model_len,
        tensor_parallel_size=cfg.tensor_parallel_size,
        worker_extension_cls=WORKER_EXTENSION,
        # log-probs of the distribution actually sampled from (temperature applied), which is what
        # the trainer recomputes; "raw" would ignore the temperature.
        logprobs_mode="processed_logprobs",
    )
    if cfg.tensor_parallel_size > 1:
        # TP workers as processes of this actor, on the devices (or cores) it was given. Inside a Ray
        # placement group vLLM would otherwise pick its Ray executor, which its CPU build refuses.
        kwargs["distributed_executor_backend"] = "mp"
    if on_gpu:
        kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
    else:
        kwargs["max_num_batched_tokens"] = cfg.cpu_max_batched_tokens * cfg.tensor_parallel_size
    if cfg.quantization is not None:  # re-applied to the new weights at every in-place reload
        kwargs["quantization"] = cfg.quantization
    if cfg.fp32_head:
        kwargs["hf_overrides"] = {"head_dtype": "float32"}
    if cfg.capture_routes:
        if cfg.enable_prefix_caching:
            raise ValueError("route capture needs prefix caching off: a cached prefix is never fed again")
        kwargs["enforce_eager"] = True  # a compiled graph would not run the capture's hooks at every step
    return kwargs


class VLLMEngine:
    """Wrapped with ray.remote by the launcher (workers/launcher.py) or by the caller."""

    def __init__(self, cfg: EngineConfig, engine_index: int = 0, name: str = "engine"):
        if os.environ.get(ENGINE_DEVICES_ENV):  # before anything asks CUDA for its devices
            os.environ["CUDA_VISIBLE_DEVICES"] = os.environ[ENGINE_DEVICES_ENV]
        import torch

        from reinforce_pro.procs import capture_output

        capture_output(f"{name}{engine_index}")

        on_gpu = torch.cuda.is_available()
        if not on_gpu:
            from reinforce_pro.procs import use_host_threads

            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(cfg.cpu_kv_cache_gib))
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            aot = uses_aot_cache(cfg)
            os.environ["VLLM_USE_AOT_COMPILE"] = "1" if aot else "0"
            if aot:
                let_cpu_aot_cache_load()
            use_host_threads()  # before vLLM binds its threads
            if cfg.tensor_parallel_size > 1:
                os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_bind(cfg.tensor_parallel_size))
            if cfg.quantization is not None:
                from reinforce_pro.rollout.cpu_fp8 import use_fp32_product_on_cpu

                use_fp32_product_on_cpu()  # in this process: tensor-parallel workers, spawned, keep vLLM's
        from vllm import LLM

        kwargs = llm_kwargs(cfg, engine_index, on_gpu)
        self.llm = LLM(**kwargs)
        if cfg.fp32_head and self.llm.llm_engine.model_config.head_dtype != torch.float32:
            raise RuntimeError("--fp32_lm_head: vLLM fell back to the model's dtype for the LM head on this platform, "
                               "so only the trainer's side would be fp32")  # fmt: skip
        self.capture_routes = cfg.capture_routes
        if cfg.capture_routes:
            experts_per_token = self.llm.llm_engine.model_config.hf_text_config.num_experts_per_tok
            self.llm.collective_rpc("start_route_capture", args=(int(experts_per_token),))
        tied_head = getattr(self.llm.llm_engine.model_config.hf_text_config, "tie_word_embeddings", False)
        for handler in logging.getLogger("vllm").handlers:  # configured by now
            handler.addFilter(_DropBenignReloadWarning(tied_head))
        self.device = "cuda" if on_gpu else "cpu"

    def generate(self, prompt_token_ids: list[list[int]], sampling: dict) -> list[Generation]:
        """One response per prompt (repeat a prompt to sample it several times), in order. Only ids and log-probs
        come back, so the engine makes no text unless stop strings need it (`sampling` may ask for it)."""
        from vllm import SamplingParams

        sampling = dict(sampling)
        top = sampling.pop("top_logprobs", 0)  # vLLM returns the top-k beside the sampled token's
        params = SamplingParams(**{"detokenize": bool(sampling.get("stop")), **sampling}, logprobs=top)
        outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in prompt_token_ids], params, use_tqdm=False)
        routes = {}
        if self.capture_routes:  # the first worker's: every tensor-parallel worker routes alike
            routes = self.llm.collective_rpc("take_routes", args=([o.request_id for o in outputs],))[0]
        result = []
        for prompt, out in zip(prompt_token_ids, outputs, strict=True):
            completion = out.outputs[0]
            ids = list(completion.token_ids)
            fed = routes.get(out.request_id)
            if fed is not None:
                fed = fitted_routes(fed, len(prompt) + len(ids) - 1)
            result.append(Generation(ids, sampled_log_probs(completion), completion.finish_reason or "length", fed,
                                     top_log_probs(completion, top) if top else None))  # fmt: skip
        return result

    def score(self, sequences: list[list[int]], starts: list[int]) -> list[list[float]]:
        """Prefill only: each sequence's log-probs of its own tokens from position `starts[i]` on, under the model's
        own distribution (temperature 1): a frozen model scoring tokens another one sampled (a teacher scoring a
        student's responses, for on-policy distillation). vLLM needs one sampled token a request; it is dropped. A
        position vLLM returned no log-prob for is NaN, as in sampled_log_probs."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in sequences], params, use_tqdm=False)
        result = []
        for ids, start, out in zip(sequences, starts, outputs, strict=True):
            steps = list(out.prompt_logprobs or [])
            # position 0 has no log-prob: nothing comes before it
            result.append([logprob_at(steps, i, ids[i]) for i in range(max(start, 1), len(ids))])
        return result

    def update_weights(self, blob: bytes) -> int:
        """Load new policy weights (safetensors bytes) into every worker of this engine."""
        counts = self.llm.collective_rpc("load_weights_from_bytes", args=(blob,))
        self.llm.reset_prefix_cache()  # cached KV was computed with the old weights
        return int(counts[0])

    def join_weight_group(self, spec, rank_offset: int) -> list[int]:
        """--vllm_sync_backend gloo|nccl: every worker of this engine joins the weight-sync group
        (rollout/collective.py) as rank_offset + its rank; blocks until the whole group has joined."""
        import ray

        return self.llm.collective_rpc("join_weight_group", args=(spec, rank_offset, ray.util.get_node_ip_address()))

    def receive_weights(self, manifest, bucket_bytes: int) -> int:
        """Take one broadcast of the policy's weights into every worker (policy rank 0 sends at the same time)."""
        counts = self.llm.collective_rpc("receive_weights", args=(manifest, bucket_bytes))
        self.llm.reset_prefix_cache()
        return int(counts[0])

    def reset_prefix_cache(self) -> None:
        self.llm.reset_prefix_cache()

    def reseed(self, seed: int) -> None:
        """Restart the sampling random stream at `seed` in every worker: an engine shared by several runs (the
        tests, studies/is_study.py's paired runs) then samples each run's first batch the same way."""
        self.llm.collective_rpc("reseed", args=(seed,))
