"""The flags of `train_ppo_ray` and every check of a command line, worded with the flags.

A flag is one dataclass field declared with `flag(...)` (reinforce_pro/flagspec.py: its name is the flat flag
and the argparse dest, its annotation the value type, its default the default, the FlagSpec the rest). A setting
a component takes as it is given is declared on that component's config (`CARRIED`: LoopConfig.async_queue_size,
with `group=` naming its --help group); a flag a section builder turns into something else, or that is refused
or has no effect, is declared here, in the section class of its --help group (`GROUPS`). `build_parser` makes
the argparse parser from both, like transformers' HfArgumentParser; cli/spellings.py derives the dotted table,
cli/flags_doc.py renders docs/flags.md, and cli/flags_to_config.py's section builders name the flags they read.
The checks: the bounds declared on each field (`out_of_bounds`) and the rules between flags (`RULES`), run by
`first_problem` before any section is built.

Every flag of OpenRLHF v0.9.10 (tests/data/openrlhf/flat-0.9.10-train_ppo_ray-flags.tsv) is recognised. One that
reinforce_pro does not implement is `refused=`: giving it a non-default value stops with "`--X` is recognised but
not supported by reinforce_pro: <why>". `no_effect=` flags are accepted so OpenRLHF's scripts run unchanged, and
their help says why they change nothing. Every other flag is read by a section of the run config
(tests/test_config.py).
Flags reinforce_pro adds are marked [reinforce_pro] in their help.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import inspect
import math
import types
from dataclasses import dataclass
from typing import Any, get_args, get_origin, get_type_hints

from reinforce_pro.agents.episode import REWARD_MODES
from reinforce_pro.algos.advantages import ADVANTAGE_ESTIMATORS
from reinforce_pro.algos.distill import DistillConfig
from reinforce_pro.algos.is_correction import DIVERGENCE_BANDS, IS_CORRECTIONS, OPENRLHF_LEVELS, openrlhf_correction
from reinforce_pro.algos.losses import DEFAULT_IS_THRESHOLD, SurrogateConfig
from reinforce_pro.flagspec import FlagSpec, flag
from reinforce_pro.rollout.collective import SYNC_BACKENDS
from reinforce_pro.rollout.sampler import RolloutConfig
from reinforce_pro.rollout.vllm_engine import ENGINE_QUANTIZATIONS, EngineConfig
from reinforce_pro.run.config import Data, Models
from reinforce_pro.selfplay.builtin_tasks import BUILTIN_TASKS
from reinforce_pro.selfplay.controller import DEFAULT_WEIGHTS, SELFPLAY, SelfPlayConfig
from reinforce_pro.trainer.experience_builder import ExperienceConfig
from reinforce_pro.trainer.ppo_trainer import CheckpointConfig, LoopConfig
from reinforce_pro.workers.configs import ForwardConfig, OptimConfig
from reinforce_pro.workers.policy import PolicyLossConfig


def _muon(role: str, name: str, default) -> Any:
    """A Muon setting: accepted in dotted form, and without effect since --<role>.optim muon is refused."""
    return flag(default, f"{role} Muon setting; has no effect unless --{role}.optim muon (which is refused)",
                flat=False, dotted=f"{role}.muon.{name}", off=f"--{role}.muon.no_{name}" if default is True else None,
                no_effect=f"a Muon setting, and --{role}.optim muon is refused")  # fmt: skip


# The flag sections, one field per flag, laid out by hand (the formatter would put each argument on a line).
# fmt: off


@dataclass(frozen=True)
class PlacementFlags:
    """placement (Ray placement groups: one bundle per rank = one GPU; without GPUs one per node)"""

    ref_num_nodes: int = flag(1, "nodes for the ref group", dotted="ref.num_nodes")
    ref_num_gpus_per_node: int = flag(8, "ref data-parallel ranks per node (GPUs per node; CPU slots without GPUs)",
        dotted="ref.num_gpus_per_node")
    reward_num_nodes: int = flag(1, "nodes for the reward group", dotted="reward.num_nodes",
        no_effect="the reward model is one actor, on one GPU or CPU slot, scoring each batch")
    reward_num_gpus_per_node: int = flag(8, "reward-model GPUs per node (GPUs per node; CPU slots without GPUs)",
        dotted="reward.num_gpus_per_node",
        no_effect="the reward model is one actor, on one GPU or CPU slot, scoring each batch")
    actor_num_nodes: int = flag(1, "nodes for the actor group", dotted="actor.num_nodes", at_least=1)
    actor_num_gpus_per_node: int = flag(8, "actor data-parallel ranks per node (GPUs per node; CPU slots without GPUs)",
        dotted="actor.num_gpus_per_node", at_least=1)
    critic_num_nodes: int = flag(1, "nodes for the critic group", dotted="critic.num_nodes")
    critic_num_gpus_per_node: int = flag(8,
        "critic data-parallel ranks per node (GPUs per node; CPU slots without GPUs)",
        dotted="critic.num_gpus_per_node")
    colocate_actor_ref: bool = flag(False, "put reference ranks on the policy's bundles",
        dotted="train.colocate_actor_ref")
    colocate_critic_reward: bool = flag(False, "put reward-model ranks on the critic's",
        dotted="train.colocate_critic_reward")
    colocate_all_models: bool = flag(False,
        "policy, reference and the rollout engines share the policy's bundles (0.4 / 0.3 / 0.3 of each; needs "
        "--vllm_tensor_parallel_size 1 and vllm_num_engines <= policy ranks); critic and RM keep their own",
        dotted="train.colocate_all")


@dataclass(frozen=True)
class EngineFlags:
    """rollout engines (vLLM)"""

    vllm_num_engines: int | None = flag(None, "number of vLLM engines (unset: 1)", dotted="vllm.num_engines",
        at_least=1)
    vllm_tensor_parallel_size: int = flag(1, "tensor-parallel size of each engine", dotted="vllm.tensor_parallel_size",
        at_least=1)
    vllm_sync_backend: str = flag("nccl",
        f"{' | '.join(SYNC_BACKENDS)}: how weights reach the engines: nccl / gloo broadcast from policy rank 0 to "
        "every engine worker, or object_store (safetensors bytes through Ray). Where nccl cannot run it is replaced,"
        " with a notice: by gloo without GPUs, by object_store with --colocate_all_models or --rollout_staleness",
        dotted="vllm.sync_backend")
    vllm_sync_bucket_mb: float = flag(256.0, "gloo / nccl: megabytes per broadcast bucket", above=0)
    vllm_sync_with_ray: bool = flag(False, "sync through Ray's object store (object_store)",
        dotted="vllm.sync_with_ray")
    vllm_enable_sleep: bool = flag(False,
        "sleep engines between phases (not implemented on GPU: refused; on CPU a notice, nothing to free)",
        dotted="vllm.enable_sleep")
    vllm_gpu_memory_utilization: float = flag(0.95, "vLLM GPU memory fraction", dotted="vllm.gpu_memory_utilization")
    vllm_dtype: str = flag("auto",
        "[reinforce_pro] engine dtype; auto: the trainer's --param_dtype. bfloat16 with an fp32 trainer gives a real "
        "rollout/training mismatch", choices=("auto", "float32", "bfloat16", "float16"))
    vllm_cpu_kvcache_gib: int = flag(1, "[reinforce_pro] KV cache of a CPU engine, GiB")
    vllm_quantization: str | None = flag(None,
        "[reinforce_pro] quantize the engine's linear weights when it loads them and at every weight sync, while the "
        "trainer keeps --param_dtype: fp8_per_channel (FP8 weights with a scale per output channel, each linear "
        "layer's input quantized to FP8 per token, the rest of the model in --vllm_dtype, which must be bfloat16 or "
        "float16; runs on vLLM's CPU build too): the FP8 rollouts of "
        "large-scale RL, a mismatch for the IS correction to handle", choices=ENGINE_QUANTIZATIONS)
    enable_vllm_is_correction: bool = flag(False,
        "correct the rollout/training mismatch with importance sampling in the policy loss",
        also="--vllm_enable_is_correction", dotted="algo.advantage.is_correction_enable")
    vllm_is_truncated_threshold: tuple[float, float] = flag(DEFAULT_IS_THRESHOLD,
        "IS band LOW HIGH, 0 <= LOW < HIGH, or HIGH alone (LOW 0): clamp bounds for tis, keep-band for the masking "
        "types, the upper bound of a divergence gate", dotted="algo.advantage.is_correction_threshold", nargs="+",
        metavar="LOW HIGH")
    vllm_is_correction_type: str = flag("tis",
        "tis: clamp; icepop: token mask; seq-mask-tis: sequence geometric-mean mask; reinforce_pro: prefix "
        "geometric-mean mask; and the published rivals minpro, ctpo, cppo, dppo-tv, kpop, trm, opsm, geo-seq-mask and "
        "OpenRLHF 0.11.2's divergence gates (see docs/algorithms.md)", dotted="algo.advantage.is_correction_type",
        choices=IS_CORRECTIONS)
    vllm_is_correction_args: list[str] | None = flag(None,
        "[reinforce_pro] the correction's own settings as KEY=VALUE, e.g. cppo's delta=0.2 w_min=0.8 delta_b=0.02 "
        "(each correction's settings and defaults: docs/algorithms.md)", nargs="*", metavar="KEY=VALUE")
    is_correction_level: str = flag("off",
        "OpenRLHF 0.11.2: off, token or seq (prefix: reinforce_pro's); with _mode and _gating it selects a correction "
        "(token clip ratio: tis; token mask ratio: icepop; seq mask ratio: seq-mask-tis; tv / binary_kl: the "
        "divergence gates), instead of --enable_vllm_is_correction --vllm_is_correction_type",
        dotted="algo.advantage.is_correction_level", choices=OPENRLHF_LEVELS)
    is_correction_mode: str = flag("mask",
        "OpenRLHF 0.11.2: mask drops an out-of-band unit, clip clamps the token ratio (token level, ratio gating only)",
        dotted="algo.advantage.is_correction_mode", choices=("mask", "clip"))
    is_correction_gating: str = flag("ratio",
        "OpenRLHF 0.11.2: the statistic the gate reads: ratio, or the sampled token's binary_kl / tv divergence "
        "(an upper bound: give --algo.advantage.is_correction_threshold HIGH)",
        dotted="algo.advantage.is_correction_gating", choices=("ratio", "binary_kl", "tv"))
    is_position_metrics: bool = flag(False,
        "[reinforce_pro] with --enable_vllm_is_correction: log where in the responses the mismatch is, per bucket of "
        "response positions: mean |log ratio| and the fraction every correction would mask (is_pos/*, "
        "docs/metrics.md)")
    partial_rollout: bool = flag(False,
        "with --async_train: a weight sync goes in between chunks of a batch; unfinished responses continue under the"
        " new weights, each token keeping the log-prob of the weights that sampled it. [reinforce_pro] With "
        "--rollout_staleness K instead: each response's first chunk is sampled by the weights K + 1 versions back, "
        "the rest by those K back (a set, repeatable version switch)",
        dotted="train.partial_rollout_enable")
    partial_rollout_chunk: int | None = flag(None,
        "[reinforce_pro] tokens sampled per chunk under --partial_rollout (default: max_new_tokens / 4)", at_least=1)


DEFAULT_CKPT_PATH = "./ckpt/checkpoints_ppo_ray"  # OpenRLHF's --ckpt_path default: here it means "not given"


@dataclass(frozen=True)
class RunningFlags:
    """checkpoints, evaluation, logging"""

    verbose: bool = flag(False,
        "[reinforce_pro] stream every actor's output (vLLM, DeepSpeed, workers) to the console; by default it goes to"
        " <save_path>/logs/ and the console keeps the progress bar, notices, errors and the summary")
    save_steps: int = flag(-1, "checkpoint every N steps under --ckpt_path (-1: never)", dotted="ckpt.save_steps")
    auto_checkpoint_minutes: float = flag(5.0,
        "[reinforce_pro] without --save_steps: checkpoint into <save_path>/checkpoints every this many minutes of "
        "training, the newest kept, for in-run recovery and --load_checkpoint (0: off)", at_least=0)
    ckpt_path: str = flag(DEFAULT_CKPT_PATH,
        "directory of the global_step<N> checkpoints (not given: <save_path>/checkpoints, a run's own)",
        dotted="ckpt.path")
    load_checkpoint: bool = flag(False,
        "resume from the latest complete checkpoint in --ckpt_path (none there: start from scratch)",
        dotted="ckpt.load_enable")
    best_metric_key: str = flag("",
        "an eval metric (eval/<dataset>/pass@1, or just pass@1): after each evaluation that raises it, the policy is "
        "saved to <save_path>/best_model (higher is better; needs --eval_dataset)", dotted="ckpt.best_metric_key")
    use_ds_universal_ckpt: bool = flag(False, "DeepSpeed universal checkpoints", dotted="ds.use_universal_ckpt",
        refused="resume needs the same number of policy ranks (no universal-checkpoint conversion)")
    use_wandb: str | None = flag(None, "wandb API key (or 'True' with a login)", dotted="logger.wandb.key")
    wandb_org: str | None = flag(None, "wandb entity", dotted="logger.wandb.org")
    wandb_group: str | None = flag(None, "wandb group", dotted="logger.wandb.group")
    wandb_project: str = flag("openrlhf_train_ppo", "wandb project", dotted="logger.wandb.project")
    wandb_run_name: str | None = flag(None, "wandb run name (default: ppo_<time>)", dotted="logger.wandb.run_name")
    use_tensorboard: str | None = flag(None, "TensorBoard log dir (default: <save_path>/tensorboard)",
        dotted="logger.tensorboard_dir")
    dynamic_filtering: bool = flag(False,
        "drop prompt groups whose mean score is not strictly inside --dynamic_filtering_reward_range and top the "
        "batch up with new prompts", dotted="algo.dynamic_filtering_enable")
    dynamic_filtering_reward_range: tuple[float, float] = flag((0, 1), "LOW HIGH: kept mean scores",
        dotted="algo.dynamic_filtering_range")
    perf: bool = flag(False, "print a throughput summary", refused="use the time/* and perf/* metrics instead")


@dataclass(frozen=True)
class DeepSpeedFlags:
    """DeepSpeed (policy and critic)"""

    local_rank: int = flag(-1, "rank given by torch launchers", no_effect="Ray places the ranks")
    deepcompile: bool = flag(False, "DeepSpeed compile", dotted="ds.deepcompile",
        refused="DeepSpeed compile is not wired in")
    param_dtype: str = flag("bf16", "trainer precision (fp32 added by reinforce_pro; the embedded default uses it)",
        dotted="ds.param_dtype", choices=("bf16", "fp16", "fp32"), shorthand=("--bf16", "bf16"))
    enable_ema: bool = flag(False, "keep an EMA of the policy", dotted="train.enable_ema",
        refused="no EMA copy of the policy is kept")
    ema_beta: float = flag(0.992, "EMA decay", dotted="train.ema_beta",
        no_effect="the EMA's decay, and --enable_ema is refused")
    zpg: int = flag(1, "ZeRO++ partition group size", dotted="ds.zpg",
        refused="ZeRO++ hierarchical partitioning is not wired in")
    actor_init_on_gpu: bool = flag(False, "initialise the policy directly on the GPU",
        refused="models are loaded on the host, then placed by DeepSpeed")
    use_liger_kernel: bool = flag(False, "Liger kernels", dotted="ds.use_liger_kernel",
        refused="Liger kernels are not wired in")
    grad_accum_dtype: str | None = flag(None, "gradient accumulation dtype", dotted="ds.grad_accum_dtype",
        refused="gradients accumulate in the parameter dtype")
    dataloader_num_workers: int = flag(0, "data loader workers", dotted="data.dataloader_num_workers",
        refused="prompts are held in memory")
    deepspeed_enable_sleep: bool = flag(False,
        "offload DeepSpeed states between phases (not implemented on GPU: refused; on CPU a notice)",
        dotted="ds.enable_sleep")
    ds_tensor_parallel_size: int = flag(1, "DeepSpeed tensor-parallel size", dotted="ds.tensor_parallel_size",
        refused="DeepSpeed tensor parallelism (AutoTP) is not wired in")
    use_dynamic_batch: bool = flag(False, "micro-batches cut by a token budget, not a count",
        dotted="train.dynamic_batch_enable")
    rollout_max_tokens_per_gpu: int | None = flag(None, "log-prob forward budget (default 2x train's)",
        dotted="rollout.max_tokens_per_gpu", at_least=1)
    train_max_tokens_per_gpu: int = flag(16192, "padded tokens per train micro-batch",
        dotted="train.max_tokens_per_gpu", at_least=1)
    load_in_4bit: bool = flag(False, "4-bit quantised base weights", dotted="ds.load_in_4bit",
        refused="no quantised training")
    lora_rank: int = flag(0,
        "LoRA rank of the policy's adapters (0: train every weight). The engines get merged weights; final_model/ "
        "holds the adapter (peft format)", dotted="ds.lora.rank")
    lora_alpha: int = flag(16, "LoRA alpha: the update is scaled by alpha / rank", dotted="ds.lora.alpha")
    target_modules: str | list[str] = flag("all-linear",
        "modules that get adapters (peft names, e.g. q_proj v_proj), or all-linear: every linear but lm_head",
        dotted="ds.lora.target_modules", nargs="*")
    lora_dropout: float = flag(0, "dropout on the LoRA input, in [0, 1)", dotted="ds.lora.dropout")


@dataclass(frozen=True)
class TrainingFlags:
    """training"""

    save_path: str | None = flag(None, "run directory (default: ./runs/<time>)", dotted="ckpt.output_dir")
    vllm_generate_batch_size: int | None = flag(None, "prompts per engine call",
        dotted="rollout.vllm_generate_batch_size",
        refused="each engine gets its share of the rollout batch in one call")
    micro_rollout_batch_size: int = flag(8, "rows per forward when scoring rollouts", dotted="rollout.micro_batch_size",
        at_least=1)
    max_len: int = flag(2048, "max prompt + response tokens (engine context)", dotted="data.max_len", at_least=1)
    max_new_tokens: int | None = flag(None, "max response tokens (--generate_max_len is the older name); unset: 1024",
        also="--generate_max_len", dotted="rollout.max_new_tokens", at_least=1)
    min_new_tokens: int = flag(0, "[reinforce_pro] tokens every response has before it may end (vLLM's min_tokens); "
        "for benchmarks that need equal-length work on both sides, not for training", at_least=0)
    prompt_max_len: int = flag(1024, "[reinforce_pro] max prompt tokens (keeps the end)", at_least=1)
    ptx_coef: float = flag(0.05, "pretraining (PTX) loss coefficient",
        no_effect="the PTX loss needs pretraining data, which train_ppo_ray takes no flag for")
    eps_clip: float = flag(0.2, "PPO clip range", dotted="actor.eps_clip")
    eps_clip_low_high: tuple[float, float] | None = flag(None, "asymmetric PPO clip (low, high)",
        dotted="actor.eps_clip_low_high")
    micro_train_batch_size: int = flag(4, "samples per forward on one rank", dotted="train.micro_batch_size",
        at_least=1)
    train_batch_size: int = flag(128, "samples per optimizer step (all ranks)", dotted="train.batch_size", at_least=1)
    top_p: float = flag(1.0, "nucleus sampling; the trainer scores the same truncated distribution (its log-probs "
        "renormalised over the tokens the filter keeps)", dotted="rollout.top_p")
    top_k: int = flag(-1, "[reinforce_pro] top-k sampling (-1: off); replayed by the trainer like --top_p")
    seed: int = flag(42, "random seed", dotted="train.seed")
    full_determinism: bool = flag(False, "deterministic torch algorithms (slower)",
        dotted="train.full_determinism_enable",
        refused="deterministic kernels are not wired in (torch's deterministic algorithms, vLLM's batch invariance); "
        "--seed fixes initialisation, data order and sampling seeds")
    actor_learning_rate: float = flag(1e-06, "policy learning rate", dotted="actor.adam.lr", at_least=0, finite=True)
    critic_learning_rate: float = flag(9e-06, "critic learning rate", dotted="critic.adam.lr", at_least=0, finite=True)
    kl_target: float | None = flag(None, "adaptive KL target (unset: fixed coefficient)", dotted="algo.kl.target")
    kl_horizon: int = flag(10000, "adaptive KL horizon", dotted="algo.kl.horizon")
    init_kl_coef: float = flag(0.01, "KL coefficient (0: no reference model)", dotted="algo.kl.init_coef",
        at_least=0)
    loss_agg_mode: str = flag("token-mean",
        "OpenRLHF 0.11.2: token-mean (every token of the batch weighs the same) or seq-mean-token-mean (every "
        "response weighs the same: the mean of its tokens' losses)", dotted="actor.loss_agg_mode",
        choices=("token-mean", "seq-mean-token-mean"))
    adam_betas: tuple[float, float] = flag((0.9, 0.95), "AdamW betas", dotted="actor.adam.betas")
    reward_clip_range: tuple[float, float] = flag((-10, 10), "clip rewards to this range", dotted="reward.clip_range")
    no_advantage_std_norm: bool = flag(False, "do not divide advantages by their std",
        dotted="algo.advantage.no_std_norm")
    ring_attn_size: int = flag(1,
        "ring attention: the policy's packed rows split along the sequence over rings of this many ranks (key / value"
        " blocks passed around the ring; needs --packing_samples; the reference and critic run unsplit)",
        dotted="ds.ring_attn_size")
    ring_head_stride: int = flag(1, "ring attention head stride", dotted="ds.ring_attn_head_stride",
        no_effect="the ring passes every head's keys and values in each hop (ring-flash-attn's stride trades memory "
        "for more hops)")


@dataclass(frozen=True)
class OptimizerFlags:
    """optimizers (OpenRLHF v0.11's per-role settings; dotted names only)

    v0.9.10 shared one --adam_betas / --l2 / --max_norm / LR schedule between policy and critic: the critic's
    settings left unset keep that meaning (they follow the policy's).
    """

    critic_adam_betas: tuple[float, float] | None = flag(None, "critic AdamW betas (unset: the policy's)", flat=False,
        dotted="critic.adam.betas", metavar=("B1", "B2"))
    critic_adam_eps: float | None = flag(None, "critic eps (unset: the policy's)", flat=False, dotted="critic.adam.eps")
    critic_l2: float | None = flag(None, "critic weight decay (unset: the policy's)", flat=False,
        dotted="critic.adam.weight_decay")
    critic_lr_scheduler: str | None = flag(None, "critic schedule (unset: the policy's)", flat=False,
        dotted="critic.lr_scheduler")
    critic_lr_warmup_ratio: float | None = flag(None, "critic warm-up fraction (unset: the policy's)", flat=False,
        dotted="critic.lr_warmup_ratio")
    critic_min_lr_ratio: float | None = flag(None, "critic LR floor fraction (unset: the policy's)", flat=False,
        dotted="critic.min_lr_ratio")
    critic_max_norm: float | None = flag(None, "critic gradient clipping (unset: the policy's)", flat=False,
        dotted="critic.max_norm")
    actor_optim: str = flag("adam", "actor optimizer", flat=False, dotted="actor.optim", choices=("adam", "muon"),
        refused="only AdamW is wired in (no Muon)")
    actor_muon_lr: float = _muon("actor", "lr", 0.02)
    actor_muon_momentum: float = _muon("actor", "momentum", 0.95)
    actor_muon_ns_steps: int = _muon("actor", "ns_steps", 5)
    actor_muon_nesterov: bool = _muon("actor", "nesterov", True)
    critic_optim: str = flag("adam", "critic optimizer", flat=False, dotted="critic.optim", choices=("adam", "muon"),
        refused="only AdamW is wired in (no Muon)")
    critic_muon_lr: float = _muon("critic", "lr", 0.02)
    critic_muon_momentum: float = _muon("critic", "momentum", 0.95)
    critic_muon_ns_steps: int = _muon("critic", "ns_steps", 5)
    critic_muon_nesterov: bool = _muon("critic", "nesterov", True)


@dataclass(frozen=True)
class ModelDataFlags:
    """models and data (local paths only)"""

    ref_reward_offload: bool = flag(False, "offload reference / reward models",
        dotted=("ref.offload", "reward.offload"), refused="reference / reward models are not offloaded")
    agent_func_path: str | None = flag(None,
        "a .py file defining AgentInstance (async reset / step): multi-turn rollouts whose environment tokens are "
        "never trained (docs/agents.md); the environment gives the rewards", dotted="train.agent_func_path")
    agent_max_turns: int = flag(4, "[reinforce_pro] with --agent_func_path: model turns per episode", at_least=1)
    agent_reward_mode: str = flag("sum",
        "[reinforce_pro] with --agent_func_path: the episode reward is the sum or the last of the turn rewards (on "
        "the last model token), or per_turn: each turn's reward on its own last model token (reinforce / gae only)",
        choices=REWARD_MODES)
    eval_dataset: str | None = flag(None, "evaluation prompts", dotted="eval.dataset")
    eval_split: str = flag("train", "evaluation split", dotted="eval.split")
    eval_temperature: float = flag(0.6, "evaluation temperature", dotted="eval.temperature", at_least=0)
    eval_n_samples_per_prompt: int = flag(4, "evaluation samples per prompt", dotted="eval.n_samples_per_prompt",
        at_least=1)
    use_ms: bool = flag(False, "load from ModelScope", refused="models load from local paths only (no ModelScope hub)")
    image_key: str = flag("images", "image field of a record (vision-language models)", dotted="data.image_key",
        no_effect="a vision-language field, and --max_images_per_prompt is refused")
    max_images_per_prompt: int = flag(0, "images per prompt (0: text only)", dotted="data.max_images_per_prompt",
        refused="no vision-language models (text prompts only)")
    freeze_visual_encoder: bool = flag(False, "train only a VLM's language model", dotted="actor.freeze_visual_encoder",
        refused="no vision-language models (text prompts only)")


@dataclass(frozen=True)
class SelfPlayFlags:
    """Absolute-Zero self-play (docs/selfplay.md)"""

    absolute_zero: bool = flag(False,
        "[reinforce_pro] self-play: the policy proposes questions from seed prompts and solves them; both roles are "
        "trained in one update. Seeds: --prompt_data records (unset: the task's built-in seeds)")
    selfplay_task: str = flag("arithmetic", f"{SELFPLAY} built-in task", choices=BUILTIN_TASKS)
    selfplay_task_path: str | None = flag(None, f"{SELFPLAY} a .py file defining TASK (overrides --selfplay_task)")
    selfplay_kb: str | None = flag(None,
        f"{SELFPLAY} --selfplay_task search: a knowledge base folder (corpus, train, heldout .jsonl, as "
        "python -m reinforce_pro.search.knowledge writes it; unset: the default base of 200 people, built in memory)")
    selfplay_retriever_url: str | None = flag(None,
        f"{SELFPLAY} --selfplay_task search: the retrieval service the solver searches (unset: the task serves "
        "the base's corpus itself on 127.0.0.1)")
    selfplay_reference_buffer: int = flag(0,
        f"{SELFPLAY} proposer prompts show a random one of the last N learnable questions instead of a seed (Absolute"
        " Zero's reference examples; 0: the seeds)", at_least=0)
    proposer_repetition_penalty: float = flag(0.0,
        f"{SELFPLAY} a question proposed k times among a step's n valid proposals loses this times k/n of its "
        "proposer reward (R-Zero's repetition penalty; 0: off). Above the task's format penalty (1) a valid question"
        " can earn less than an invalid one when few proposals are valid", at_least=0, finite=True)
    safety_reward_weight: float = flag(DEFAULT_WEIGHTS["safety"], f"{SELFPLAY} weight of a task's 'safety' score")
    task_completion_weight: float = flag(DEFAULT_WEIGHTS["completion"],
        f"{SELFPLAY} weight of a task's 'completion' score")
    selfplay_judge_pretrain: str | None = flag(None,
        f"{SELFPLAY} HF model dir of a frozen judge for the task's llm scorers (unset: the policy judges)")


@dataclass(frozen=True)
class DistillFlags:
    """on-policy distillation: a frozen teacher scores every sampled token (docs/distillation.md)"""
# fmt: on

# --help group key (a flag's `group=` on a config) -> the section of that group, in --help's order
GROUPS = {
    "placement": PlacementFlags,
    "engines": EngineFlags,
    "running": RunningFlags,
    "deepspeed": DeepSpeedFlags,
    "training": TrainingFlags,
    "optimizers": OptimizerFlags,
    "data": ModelDataFlags,
    "selfplay": SelfPlayFlags,
    "distill": DistillFlags,
}
# the configs that declare the flags they take as given (tests/test_config.py: every class a builder fills)
CARRIED = (
    RolloutConfig,
    EngineConfig,
    ForwardConfig,
    OptimConfig,
    SurrogateConfig,
    PolicyLossConfig,
    ExperienceConfig,
    LoopConfig,
    CheckpointConfig,
    Models,
    Data,
    SelfPlayConfig,
    DistillConfig,
)


@functools.cache
def flag_fields() -> tuple[tuple[type, dataclasses.Field, FlagSpec, Any], ...]:
    """(section, field, spec, resolved annotation) of every flag, in --help's order: a group's section's own flags,
    then those the configs declare for it. Read once per process (every parse and the derived tables use it)."""
    hints = {cls: get_type_hints(cls) for cls in (*GROUPS.values(), *CARRIED)}  # resolved once per class
    carried = [(cls, f) for cls in CARRIED for f in dataclasses.fields(cls) if "flag" in f.metadata]
    unknown = sorted(f.name for _, f in carried if f.metadata["flag"].group not in GROUPS)
    assert not unknown, f"flags of a config without a known --help group: {unknown}"
    out = []
    for key, section in GROUPS.items():
        out += [(section, f, f.metadata["flag"], hints[section][f.name]) for f in dataclasses.fields(section)]
        out += [(section, f, f.metadata["flag"], hints[cls][f.name]) for cls, f in carried
                if f.metadata["flag"].group == key]  # fmt: skip
    return tuple(out)


UNSUPPORTED = {f.name: spec.refused for _, f, spec, _ in flag_fields() if spec.refused}  # dest -> why refused
NO_EFFECT = {f.name: spec.no_effect for _, f, spec, _ in flag_fields() if spec.no_effect}  # dest -> why inert


def option_strings(name: str, spec: FlagSpec) -> list[str]:
    """`--name`, its other flat spellings, then its dotted name(s)."""
    return ([f"--{name}"] if spec.flat else []) + list(spec.also) + [f"--{d}" for d in spec.dotted]


def value_kwargs(hint, spec: FlagSpec) -> dict:
    """argparse's action / type / nargs for a field's annotation (a `convert` reads the text instead)."""
    if spec.convert:
        return {"type": spec.convert}
    if hint is bool:
        return {"action": "store_true"}
    if spec.nargs:  # a list of values: of the tuple's element type (a threshold band), else strings
        element = get_args(hint)[0] if get_origin(hint) is tuple else str
        return {"type": element, "nargs": spec.nargs}
    if isinstance(hint, types.UnionType):  # `X | None` -> X
        hint = next(t for t in get_args(hint) if t is not type(None))
    if get_origin(hint) is tuple:  # tuple[float, float]: two values
        return {"type": get_args(hint)[0], "nargs": len(get_args(hint))}
    return {"type": hint}


class BothSpellingsFormatter(argparse.HelpFormatter):
    """--help lists a flag's spellings once each with its value after them (`--zero_stage / --ds.zero_stage
    {0,1,2,3}`), instead of argparse's value-after-every-spelling."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        names = " / ".join(action.option_strings)
        if action.nargs == 0:
            return names
        return f"{names} {self._format_args(action, self._get_default_metavar_for_optional(action))}"


class OneLineParser(argparse.ArgumentParser):
    """Bad input ends with one line on stderr and exit status 2 (no usage dump, no traceback)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> OneLineParser:
    p = OneLineParser(
        prog="train_ppo_ray",
        allow_abbrev=False,  # `--rollout_batch` is an error naming the real flag, not a silent match
        usage="%(prog)s [flags]   (each flag has OpenRLHF's flat name and, most, its v0.11 dotted name)",
        formatter_class=BothSpellingsFormatter,
        description="OpenRLHF-style RL on Ray. With no model or data flags it runs the embedded CPU default. "
        "A script may mix the two spellings; docs/flags.md lists every flag.",
    )
    groups = {s: p.add_argument_group(s.__doc__.split("\n\n")[0]) for s in GROUPS.values()}
    for section, f, spec, hint in flag_fields():
        help_text = spec.help + (f" (no effect: {spec.no_effect})" if spec.no_effect else "")
        # switches (store_true) take no choices or metavar: pass them only where a flag has them
        kwargs = {"choices": spec.choices, "metavar": spec.metavar} if spec.choices or spec.metavar else {}
        groups[section].add_argument(*option_strings(f.name, spec), dest=f.name, default=f.default, help=help_text,
                                     **value_kwargs(hint, spec), **kwargs)  # fmt: skip
        if spec.shorthand:
            option, value = spec.shorthand
            groups[section].add_argument(option, dest=f.name, action="store_const", const=value,
                                         help=f"same as --{f.name} {value}")  # fmt: skip
        if spec.off:
            groups[section].add_argument(spec.off, dest=f.name, action="store_false", help=help_text)
    p.set_defaults(preset=None)  # the name of the preset (cli/presets.py) whose values are the defaults, if any
    return p


def out_of_bounds(args: argparse.Namespace) -> str | None:
    """The first flag whose value is outside its declared bounds (`at_least`, `above`, `finite`), or None."""
    for _, f, spec, _ in flag_fields():
        value = getattr(args, f.name)
        if value is None or (spec.at_least is None and spec.above is None):
            continue
        finite = "a finite number " if spec.finite else ""
        if spec.finite and not abs(value) < float("inf"):
            return f"--{f.name} must be {finite}>= {spec.at_least}, got {value}"
        if spec.at_least is not None and not value >= spec.at_least:
            return f"--{f.name} must be {finite}>= {spec.at_least}, got {value}"
        if spec.above is not None and not value > spec.above:
            return f"--{f.name} must be {finite}> {spec.above}, got {value}"
    return None


# ------------------------------------------------------------------------------------ checks across flags
# Every check of the command line lives here and speaks in flags: a flag's own bounds are declared on its field
# (out_of_bounds, above), and a rule between flags is one entry of RULES whose parameters are the flags it reads
# (their dests): (ok, message), where `ok` False stops with `message` filled with the flags' values, or a
# function that returns what is wrong, or None. A command line stops at its first problem, in RULES' order.

GROUP_ESTIMATORS = ("rloo", "reinforce_baseline", "group_norm", "dr_grpo")  # they compare a prompt's samples
assert set(GROUP_ESTIMATORS) <= set(ADVANTAGE_ESTIMATORS)


def _input_template(input_template) -> str | None:
    """An --input_template is filled with str.format, as in OpenRLHF: exactly one {} placeholder."""
    if input_template is None:
        return None
    try:
        filled = input_template.format("\0")
    except (IndexError, KeyError, ValueError) as e:
        problem = f"needs exactly one {{}} placeholder (write literal braces as {{{{ }}}}): {type(e).__name__}: {e}"
    else:
        problem = None if filled.count("\0") == 1 else "needs exactly one {} placeholder, where the prompt text goes"
    return problem and f"--input_template {input_template!r}: {problem}"


def _async_lag(async_lag_target, async_train, async_lag_metric, enable_vllm_is_correction) -> str | None:
    if async_lag_target is None:
        return None
    if not async_train:
        return "--async_lag_target moves the lead of --async_train's producer: add --async_train"
    if not (math.isfinite(async_lag_target) and async_lag_target > 0):
        return f"--async_lag_target must be a finite number > 0, got {async_lag_target}"
    if async_lag_metric == "is/token_masked_frac" and not enable_vllm_is_correction:
        return "--async_lag_metric is/token_masked_frac is logged by IS correction: add --enable_vllm_is_correction"
    return None


def _ranks(actor_num_nodes, actor_num_gpus_per_node, ring_attn_size, packing_samples, train_batch_size,
           micro_train_batch_size) -> str | None:  # fmt: skip
    world = actor_num_nodes * actor_num_gpus_per_node
    if not (ring_attn_size >= 1 and world % ring_attn_size == 0):
        return f"--ring_attn_size {ring_attn_size} must divide the {world} policy ranks"
    if ring_attn_size > 1 and not packing_samples:
        return "--ring_attn_size splits packed rows along the sequence: add --packing_samples"
    if train_batch_size % (micro_train_batch_size * world):
        return (f"--train_batch_size {train_batch_size} must be a multiple of --micro_train_batch_size "
                f"{micro_train_batch_size} x {world} policy ranks")  # fmt: skip
    return None


DEFAULT_MAX_NEW_TOKENS = 1024  # --max_new_tokens unset (OpenRLHF's default)


def response_budget(max_new_tokens, max_len) -> int:
    """The new tokens a response may take: --max_new_tokens (unset: OpenRLHF's 1024) within --max_len."""
    return min(max_new_tokens or DEFAULT_MAX_NEW_TOKENS, max_len - 1)


def threshold_band(values) -> tuple[float, float]:
    """--vllm_is_truncated_threshold LOW HIGH, or HIGH alone (LOW 0: an upper bound, as OpenRLHF 0.11.2 reads it)."""
    values = [float(v) for v in values]
    if len(values) not in (1, 2):
        raise ValueError(f"--vllm_is_truncated_threshold takes HIGH or LOW HIGH, got {len(values)} values")
    return (0.0, values[0]) if len(values) == 1 else (values[0], values[1])


def _is_band(vllm_is_truncated_threshold, vllm_is_correction_type, vllm_is_correction_path, is_correction_level,
             is_correction_mode, is_correction_gating) -> str | None:  # fmt: skip
    try:  # both raise in flag words: a band of three values, OpenRLHF 0.11.2's spelling of no correction
        low, high = threshold_band(vllm_is_truncated_threshold)
        chosen = openrlhf_correction(is_correction_level, is_correction_mode, is_correction_gating)
    except ValueError as e:
        return str(e)
    if chosen is not None and (vllm_is_correction_path or vllm_is_correction_type not in ("tis", chosen)):
        return (f"--algo.advantage.is_correction_level {is_correction_level} selects {chosen}, and "
                f"--vllm_is_correction_type / _path {vllm_is_correction_path or vllm_is_correction_type}: give one "
                "of them")  # fmt: skip
    if not 0 <= low < high:
        return f"--vllm_is_truncated_threshold must satisfy 0 <= low < high, got [{low}, {high}]"
    correction = chosen or vllm_is_correction_type
    if correction in DIVERGENCE_BANDS and low > 0:
        return (f"--vllm_is_correction_type {correction} gates a divergence, which takes an upper bound only: give "
                f"--vllm_is_truncated_threshold (--algo.advantage.is_correction_threshold) HIGH, e.g. "
                f"{DIVERGENCE_BANDS[correction][1]}, got [{low}, {high}]")  # fmt: skip
    return None


def engine_dtype(vllm_dtype: str, param_dtype: str) -> str:
    """--vllm_dtype, where auto means the trainer's --param_dtype."""
    from reinforce_pro.run.config import VLLM_DTYPES

    return VLLM_DTYPES[param_dtype] if vllm_dtype == "auto" else vllm_dtype


def _engine_dtype(vllm_quantization, vllm_dtype, param_dtype) -> str | None:
    dtype = engine_dtype(vllm_dtype, param_dtype)
    if vllm_quantization is not None and dtype not in ("bfloat16", "float16"):
        return f"--vllm_quantization {vllm_quantization} needs --vllm_dtype bfloat16 or float16, got {dtype}"
    return None


def _min_length(min_new_tokens, max_new_tokens, max_len) -> str | None:
    if min_new_tokens > (budget := response_budget(max_new_tokens, max_len)):
        return f"--min_new_tokens {min_new_tokens} exceeds the response budget of {budget} tokens"
    return None


def _samples_per_step(absolute_zero, rollout_batch_size, n_samples_per_prompt, train_batch_size) -> str | None:
    samples = rollout_batch_size * n_samples_per_prompt
    if absolute_zero or samples % train_batch_size == 0:  # self-play batches vary in size: cut near-equal
        return None
    return (f"--rollout_batch_size x --n_samples_per_prompt = {samples} samples per step must be a multiple of "
            f"--train_batch_size {train_batch_size}")  # fmt: skip


def _colocate_all(colocate_all_models, vllm_num_engines, vllm_tensor_parallel_size, actor_num_nodes,
                  actor_num_gpus_per_node) -> bool:  # fmt: skip
    tp, world = vllm_tensor_parallel_size, actor_num_nodes * actor_num_gpus_per_node
    return not colocate_all_models or ((vllm_num_engines or 1) * tp <= world and actor_num_gpus_per_node % tp == 0)


def _proposer_group(absolute_zero, proposer_train_scope, rollout_batch_size, n_questions_per_prompt,
                    advantage_estimator) -> str | None:  # fmt: skip
    """Proposer rows form one group per step (sampled scope) or one per prompt (group scope)."""
    sampled = proposer_train_scope == "sampled"
    group, flag = (rollout_batch_size, "--rollout_batch_size") if sampled else (n_questions_per_prompt,
                                                                                "--n_questions_per_prompt")  # fmt: skip
    if absolute_zero and advantage_estimator in GROUP_ESTIMATORS and group < 2:
        return (f"--advantage_estimator {advantage_estimator} compares proposer rows within a group of {group} "
                f"({flag}): it must be >= 2")  # fmt: skip
    return None


def _prompt_mixture(prompt_data, prompt_data_probs) -> str | None:
    if prompt_data_probs is None:
        return None
    if not prompt_data:
        return "--prompt_data_probs mixes the datasets of --prompt_data: give them (comma-separated)"
    from reinforce_pro.data.prompts import DataError, parse_mixture

    try:
        parse_mixture(prompt_data, prompt_data_probs)
    except DataError as e:
        return str(e)
    return None


def _best_metric(best_metric_key, eval_dataset, eval_n_samples_per_prompt) -> str | None:
    if not best_metric_key:
        return None
    from pathlib import Path

    from reinforce_pro.trainer.evaluation import eval_metric_names

    names = eval_metric_names(Path(eval_dataset).stem, eval_n_samples_per_prompt)
    if best_metric_key not in names + [n.rsplit("/", 1)[1] for n in names]:
        return f"--best_metric_key {best_metric_key}: not an eval metric of this run ({', '.join(names)})"
    return None


def _distill_flags(**given) -> str | None:
    """A distillation setting changed without a teacher to distil from."""
    if given.pop("teacher_pretrain"):
        return None
    fields = {f.name: f for f in dataclasses.fields(DistillConfig)}
    changed = [name for name, value in given.items() if value != fields[name].default]
    if not changed:
        return None
    spelled = ", ".join(f"--{(fields[n].metadata['flag'].dotted or (n,))[0]}" for n in changed)
    return f"{spelled} set without a teacher: add --teacher.model_name_or_path DIR"


_distill_flags.__signature__ = inspect.Signature(  # RULES pass a rule the flags its signature names
    [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY) for f in dataclasses.fields(DistillConfig)]
)


# fmt: off
RULES = [
    # ranges and texts
    (lambda reward_clip_range: reward_clip_range[0] < reward_clip_range[1],
     "--reward_clip_range must satisfy LOW < HIGH, got {reward_clip_range[0]} {reward_clip_range[1]}"),
    _input_template,
    _is_band,
    (lambda kl_target, kl_horizon: kl_target is None or (kl_target > 0 and kl_horizon > 0),
     "--kl_target and --kl_horizon must be > 0 for the adaptive KL, got {kl_target}, {kl_horizon}"),
    _engine_dtype,
    (lambda experts_implementation: experts_implementation != "deepgemm" or importlib.util.find_spec("deep_gemm"),
     "--ds.experts_implementation deepgemm needs DeepGEMM (CUDA), which is not installed here; eager, batched_mm "
     "and grouped_mm run anywhere"),
    _min_length,
    (lambda fp32_lm_head, vllm_quantization: not (fp32_lm_head and vllm_quantization),
     "--fp32_lm_head with --vllm_quantization {vllm_quantization}: vLLM computes an fp32 head only for an unquantized "
     "one, so the engine's side would be left out; drop one of them"),
    (lambda overlong_buffer_len, max_new_tokens: overlong_buffer_len is None
     or 0 < overlong_buffer_len <= (max_new_tokens if max_new_tokens is not None else float("inf")),
     "--overlong_buffer_len must be in (0, --max_new_tokens {max_new_tokens}], got {overlong_buffer_len}"),
    (lambda stop_properly_penalty_coef: stop_properly_penalty_coef is None or stop_properly_penalty_coef <= 1,
     "--stop_properly_penalty_coef must be <= 1 (in [0, 1] scales, < 0 replaces), got {stop_properly_penalty_coef}"),
    (lambda lora_rank, lora_alpha, lora_dropout: lora_rank >= 0 and lora_alpha > 0 and 0 <= lora_dropout < 1,
     "--lora_rank must be >= 0, --lora_alpha > 0 and --lora_dropout in [0, 1), got {lora_rank} / {lora_alpha} / "
     "{lora_dropout}"),
    (lambda lora_save_merged, lora_rank: not lora_save_merged or lora_rank,
     "--lora_save_merged merges a LoRA adapter: add --lora_rank"),
    # staleness, asynchronous training, partial rollouts and the weight-sync backend that serves them
    (lambda partial_rollout, async_train, rollout_staleness: not partial_rollout or async_train or rollout_staleness,
     "--partial_rollout continues rollouts across weight syncs of --async_train: add --async_train, or "
     "--rollout_staleness K to sample each response's first chunk K + 1 versions back and the rest K back"),
    (lambda partial_rollout, async_train, agent_func_path: async_train or not (partial_rollout and agent_func_path),
     "--partial_rollout with --rollout_staleness applies to prompt rollouts: agents need --async_train"),
    (lambda partial_rollout, absolute_zero: not (partial_rollout and absolute_zero),
     "--partial_rollout applies to prompt and agent rollouts, not to --absolute_zero"),
    (lambda vllm_sync_backend: vllm_sync_backend in SYNC_BACKENDS,
     f"--vllm_sync_backend must be one of {', '.join(SYNC_BACKENDS)}, got {{vllm_sync_backend}}"),
    (lambda vllm_sync_backend, vllm_sync_with_ray, rollout_staleness:
     not (vllm_sync_backend == "gloo" and not vllm_sync_with_ray and rollout_staleness > 0),
     "--rollout_staleness serves older weights, which only --vllm_sync_backend object_store keeps"),
    _async_lag,
    (lambda async_train, rollout_staleness: not (async_train and rollout_staleness > 0),
     "--rollout_staleness imitates the lag of asynchronous training: use it or --async_train, not both"),
    # sampling, batch arithmetic over the ranks, the reward source and colocation
    (lambda top_p: 0 < top_p <= 1, "--top_p must be in (0, 1], got {top_p}"),
    (lambda advantage_estimator, n_samples_per_prompt:
     advantage_estimator not in GROUP_ESTIMATORS or n_samples_per_prompt >= 2,
     "--advantage_estimator {advantage_estimator} compares samples of a prompt: --n_samples_per_prompt must be "
     ">= 2, got {n_samples_per_prompt}"),
    (lambda advantage_estimator, gamma: advantage_estimator not in GROUP_ESTIMATORS or gamma == 1,
     "--advantage_estimator {advantage_estimator} needs --gamma 1, got {gamma}"),
    _samples_per_step,
    _ranks,
    (lambda prompt_data, remote_rm_url, reward_pretrain, absolute_zero, agent_func_path, teacher_pretrain:
     prompt_data is None or remote_rm_url or reward_pretrain or absolute_zero or agent_func_path or teacher_pretrain,
     "--prompt_data needs a reward: --remote_rm_url file.py or --reward_pretrain DIR (or a teacher, "
     "--teacher.model_name_or_path DIR, to distil without one)"),
    (lambda remote_rm_url, reward_pretrain: not (remote_rm_url and reward_pretrain),
     "give --remote_rm_url or --reward_pretrain, not both"),
    (_colocate_all,
     "--colocate_all_models puts each engine's --vllm_tensor_parallel_size workers on as many policy ranks of one "
     "node: --vllm_num_engines x --vllm_tensor_parallel_size must be at most the policy ranks, and "
     "--vllm_tensor_parallel_size must divide --actor_num_gpus_per_node"),
    (lambda colocate_critic_reward, advantage_estimator, reward_pretrain:
     not colocate_critic_reward or (advantage_estimator == "gae" and reward_pretrain),
     "--colocate_critic_reward shares the critic's slots with the reward model: it needs both "
     "(--advantage_estimator gae and --reward_pretrain)"),
    (lambda min_new_tokens, partial_rollout, agent_func_path, absolute_zero:  # they cut a response's budget
     not min_new_tokens or not (partial_rollout or agent_func_path or absolute_zero),
     "--min_new_tokens applies to whole prompt rollouts: drop --partial_rollout / --agent_func_path / "
     "--absolute_zero, or --min_new_tokens"),
    # self-play
    (lambda absolute_zero, n_samples_per_prompt: not absolute_zero or n_samples_per_prompt >= 2,
     "--absolute_zero judges learnability from several solver responses: --n_samples_per_prompt must be >= 2, got "
     "{n_samples_per_prompt}"),
    (lambda absolute_zero, remote_rm_url, reward_pretrain: not (absolute_zero and (remote_rm_url or reward_pretrain)),
     "--absolute_zero scores with its task: drop --remote_rm_url / --reward_pretrain"),
    _proposer_group,
    # checkpoints, evaluation, logging and filtering
    (lambda eval_dataset, absolute_zero, eval_steps, eval_before_training:
     eval_dataset or absolute_zero or (eval_steps <= 0 and not eval_before_training),
     "--eval_steps / --eval_before_training need --eval_dataset (self-play: its task's ladder)"),
    (lambda best_metric_key, eval_dataset, eval_steps, eval_before_training:
     not best_metric_key or (eval_dataset and (eval_steps > 0 or eval_before_training)),
     "--best_metric_key picks by an eval metric: add --eval_dataset and --eval_steps"),
    (lambda dynamic_filtering_reward_range: dynamic_filtering_reward_range[0] < dynamic_filtering_reward_range[1],
     "--dynamic_filtering_reward_range must satisfy LOW < HIGH, got {dynamic_filtering_reward_range[0]} "
     "{dynamic_filtering_reward_range[1]}"),
    (lambda absolute_zero, dynamic_filtering, eval_dataset: not (absolute_zero and (dynamic_filtering or eval_dataset)),
     "--absolute_zero has its own filter (learnability): drop --dynamic_filtering / --eval_dataset"),
    (lambda save_hf_ckpt, disable_ds_ckpt, save_steps: not (save_hf_ckpt and disable_ds_ckpt and save_steps <= 0),
     "--save_hf_ckpt needs --save_steps"),
    _prompt_mixture,
    _best_metric,
    (lambda sft_warmup_target: 0 <= sft_warmup_target <= 1,
     "--sft_warmup_target is an accuracy in [0, 1], got {sft_warmup_target}"),
    (lambda embedded_model, pretrain: not pretrain or embedded_model == "dense",
     "--embedded_model {embedded_model} picks the built-in model: give it without --pretrain"),
    (lambda builtin_task, prompt_data: prompt_data is None or builtin_task == "arithmetic",
     "--builtin_task chooses the built-in prompts: give it without --prompt_data"),
    # on-policy distillation
    _distill_flags,
    (lambda opd_topk: opd_topk == 0,
     "--opd.topk {opd_topk}: the top-K reverse KL is not built; 0 (the sampled token's reverse KL) is"),
    (lambda teacher_pretrain, absolute_zero: not (teacher_pretrain and absolute_zero),
     "--teacher.model_name_or_path with --absolute_zero: distilling self-play's roles is not built (a teacher would "
     "score the proposer's questions too)"),
    (lambda teacher_backend, opd_kd_temperature: teacher_backend != "engine" or opd_kd_temperature == 1,
     "--teacher_backend engine scores with vLLM's prompt log-probs, which are taken at temperature 1: "
     "--opd.kd_temperature {opd_kd_temperature} needs --teacher_backend actor"),
    (lambda teacher_pretrain, pretrain: teacher_pretrain != "builtin" or not pretrain,
     "--teacher.model_name_or_path builtin is the embedded default's teacher: give it without --pretrain"),
    # multi-turn agents
    (lambda agent_func_path, remote_rm_url, reward_pretrain:
     not (agent_func_path and (remote_rm_url or reward_pretrain)),
     "--agent_func_path: the environment gives the rewards; drop --remote_rm_url / --reward_pretrain"),
    (lambda agent_func_path, agent_reward_mode, advantage_estimator:
     not agent_func_path or agent_reward_mode != "per_turn" or advantage_estimator in ("reinforce", "gae"),
     "--agent_reward_mode per_turn puts rewards on several tokens: --advantage_estimator must be reinforce or "
     "gae, got {advantage_estimator}"),
]
# fmt: on


def first_problem(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str | None:
    """The first thing wrong with a parsed command line: a refused flag given, a value out of its flag's bounds,
    or a rule of RULES broken; None if nothing is."""
    for dest, why in UNSUPPORTED.items():
        if getattr(args, dest) != parser.get_default(dest):
            spelling = " / ".join(o for a in parser._actions if a.dest == dest for o in a.option_strings)
            return f"{spelling} is recognised but not supported by reinforce_pro: {why}"
    if problem := out_of_bounds(args):
        return problem
    for rule in RULES:
        check, message = rule if isinstance(rule, tuple) else (rule, None)
        values = {name: getattr(args, name) for name in inspect.signature(check).parameters}
        outcome = check(**values)
        if message is None and outcome:
            return outcome
        if message is not None and not outcome:
            return message.format(**values)
    return None
