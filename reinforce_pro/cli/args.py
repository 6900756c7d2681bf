"""The flag parser of `train_ppo_ray`: OpenRLHF v0.9.10's flat flags, defined once, each with help.

Every flag of shared/reference/openrlhf-0.9.10-train_ppo_ray-flags.tsv is recognised. Those reinforce_pro
does not implement are in `UNSUPPORTED`: giving one a non-default value stops with
"`--X` is recognised but not supported by reinforce_pro: <why>". Flags reinforce_pro adds are marked
[reinforce_pro] in their help.
"""

from __future__ import annotations

import argparse

from reinforce_pro.agents.episode import REWARD_MODES
from reinforce_pro.algos.advantages import ADVANTAGE_ESTIMATORS
from reinforce_pro.algos.is_correction import IS_CORRECTIONS
from reinforce_pro.algos.kl import KL_ESTIMATORS
from reinforce_pro.algos.losses import DEFAULT_IS_THRESHOLD, POLICY_LOSSES
from reinforce_pro.cli.spellings import both_spellings
from reinforce_pro.rewards.loader import NAN_POLICIES
from reinforce_pro.rollout.collective import SYNC_BACKENDS
from reinforce_pro.rollout.vllm_engine import ENGINE_QUANTIZATIONS
from reinforce_pro.selfplay.builtin_tasks import BUILTIN_TASKS
from reinforce_pro.selfplay.controller import DEFAULT_WEIGHTS, PROPOSER_SCOPES
from reinforce_pro.selfplay.learnability import PROPOSER_REWARDS
from reinforce_pro.trainer.rollout_stream import LAG_METRICS

# dest -> why it is not supported. Checked only when the value differs from the default. (Flags that work on
# one kind of machine only are checked where the machine is known: SLEEP_FLAGS in cli/wiring.py.)
UNSUPPORTED: dict[str, str] = {
    "use_ds_universal_ckpt": "resume needs the same number of policy ranks (no universal-checkpoint conversion)",
    "deepcompile": "DeepSpeed compile is not wired in",
    "enable_ema": "no EMA copy of the policy is kept",
    "zpg": "ZeRO++ hierarchical partitioning is not wired in",
    "actor_init_on_gpu": "models are loaded on the host, then placed by DeepSpeed",
    "use_liger_kernel": "Liger kernels are not wired in",
    "grad_accum_dtype": "gradients accumulate in the parameter dtype",
    "ds_tensor_parallel_size": "DeepSpeed tensor parallelism (AutoTP) is not wired in",
    "load_in_4bit": "no quantised training",
    "aux_loss_coef": "no MoE auxiliary loss",
    "ref_reward_offload": "reference / reward models are not offloaded",
    "dataloader_num_workers": "prompts are held in memory",
    "perf": "use the time/* and perf/* metrics instead",
    "use_ms": "models load from local paths only (no ModelScope hub)",
    "vllm_generate_batch_size": "each engine gets its share of the rollout batch in one call",
    "experts_implementation": "no MoE expert kernels are wired in",
    "full_determinism": "deterministic kernels are not wired in (torch's deterministic algorithms, vLLM's batch "
    "invariance); --seed fixes initialisation, data order and sampling seeds",
    "actor_optim": "only AdamW is wired in (no Muon)",
    "critic_optim": "only AdamW is wired in (no Muon)",
    "max_images_per_prompt": "no vision-language models (text prompts only)",
    "freeze_visual_encoder": "no vision-language models (text prompts only)",
}


# dest -> why its value changes nothing. Settings of a refused feature, and launcher artefacts that OpenRLHF's
# scripts pass: accepted so those scripts run unchanged, and docs/flags.md says why they do nothing. Every
# other flag is read by a section of the run config (cli/config.py; tests/test_config.py checks it).
NO_EFFECT: dict[str, str] = {
    "local_rank": "Ray places the ranks",
    "reward_num_nodes": "the reward model is one actor, on one GPU or CPU slot, scoring each batch",
    "reward_num_gpus_per_node": "the reward model is one actor, on one GPU or CPU slot, scoring each batch",
    "ptx_coef": "the PTX loss needs pretraining data, which train_ppo_ray takes no flag for",
    "ema_beta": "the EMA's decay, and --enable_ema is refused",
    "image_key": "a vision-language field, and --max_images_per_prompt is refused",
    "ring_head_stride": "the ring passes every head's keys and values in each hop (ring-flash-attn's stride "
    "trades memory for more hops)",
    **{
        f"{role}_muon_{name}": f"a Muon setting, and --{role}.optim muon is refused"
        for role in ("actor", "critic")
        for name in ("lr", "momentum", "ns_steps", "nesterov")
    },
}


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


def _add_placement(p) -> None:
    g = both_spellings(
        p.add_argument_group(
            "placement (Ray placement groups: one bundle per rank = one GPU; without GPUs one per node)"
        )
    )
    for role in ("ref", "reward", "actor", "critic"):
        ranks = "reward-model GPUs" if role == "reward" else f"{role} data-parallel ranks"
        g.add_argument(f"--{role}_num_nodes", type=int, default=1, help=f"nodes for the {role} group")
        g.add_argument(
            f"--{role}_num_gpus_per_node",
            type=int,
            default=8,
            help=f"{ranks} per node (GPUs per node; CPU slots without GPUs)",
        )
    g.add_argument("--colocate_actor_ref", action="store_true", help="put reference ranks on the policy's bundles")
    g.add_argument("--colocate_critic_reward", action="store_true", help="put reward-model ranks on the critic's")
    g.add_argument(
        "--colocate_all_models",
        action="store_true",
        help="policy, reference and the rollout engines share the policy's bundles (0.4 / 0.3 / 0.3 of each; "
        "needs --vllm_tensor_parallel_size 1 and vllm_num_engines <= policy ranks); critic and RM keep their own",
    )


def _add_vllm(p) -> None:
    g = both_spellings(p.add_argument_group("rollout engines (vLLM)"))
    _add_engine_flags(g)
    _add_is_correction_flags(g)
    _add_async_flags(g)


def _add_engine_flags(g) -> None:
    """Engines: count, parallelism, weight sync, memory, dtype."""
    g.add_argument("--vllm_num_engines", type=int, default=None, help="number of vLLM engines (unset: 1)")
    g.add_argument("--vllm_tensor_parallel_size", type=int, default=1, help="tensor-parallel size of each engine")
    g.add_argument(
        "--vllm_sync_backend",
        type=str,
        default="nccl",
        help=f"{' | '.join(SYNC_BACKENDS)}: how weights reach the engines: nccl / gloo broadcast from policy "
        "rank 0 to every engine worker, or object_store (safetensors bytes through Ray). Where nccl cannot "
        "run it is replaced, with a notice: by gloo without GPUs, by object_store with --colocate_all_models "
        "or --rollout_staleness",
    )
    g.add_argument(
        "--vllm_sync_bucket_mb", type=float, default=256.0, help="gloo / nccl: megabytes per broadcast bucket"
    )
    g.add_argument("--vllm_sync_with_ray", action="store_true", help="sync through Ray's object store (object_store)")
    g.add_argument("--enable_prefix_caching", action="store_true", help="vLLM prefix caching (reset at every sync)")
    g.add_argument("--enforce_eager", action="store_true", help="disable CUDA graphs in vLLM")
    g.add_argument(
        "--vllm_enable_sleep",
        action="store_true",
        help="sleep engines between phases (not implemented on GPU: refused; on CPU a notice, nothing to free)",
    )
    g.add_argument("--vllm_gpu_memory_utilization", type=float, default=0.95, help="vLLM GPU memory fraction")
    g.add_argument(
        "--vllm_dtype",
        type=str,
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="[reinforce_pro] engine dtype; auto: the trainer's --param_dtype. bfloat16 with an fp32 trainer "
        "gives a real rollout/training mismatch",
    )
    g.add_argument("--vllm_cpu_kvcache_gib", type=int, default=1, help="[reinforce_pro] KV cache of a CPU engine, GiB")
    g.add_argument(
        "--vllm_quantization", default=None, choices=list(ENGINE_QUANTIZATIONS),
        help="[reinforce_pro] quantize the engine's linear weights when it loads them and at every weight sync, "
        "while the trainer keeps --param_dtype: fp8_per_channel (FP8 weights with a scale per output channel, "
        "activations in --vllm_dtype, which must be bfloat16 or float16; runs on vLLM's CPU build too): the "
        "FP8 rollouts of large-scale RL, a mismatch for the IS correction to handle",
    )  # fmt: skip


def _add_is_correction_flags(g) -> None:
    """The importance-sampling correction of the rollout/training mismatch."""
    g.add_argument(
        "--enable_vllm_is_correction",
        "--vllm_enable_is_correction",  # the spelling of OpenRLHF v0.9.10's own DAPO script (its parser lacks it)
        dest="enable_vllm_is_correction",
        action="store_true",
        help="correct the rollout/training mismatch with importance sampling in the policy loss",
    )
    g.add_argument(
        "--vllm_is_truncated_threshold",
        dest="vllm_is_truncated_threshold",
        type=float,
        nargs=2,
        default=list(DEFAULT_IS_THRESHOLD),
        metavar=("LOW", "HIGH"),
        help="IS band [LOW, HIGH], 0 <= LOW < HIGH: clamp bounds for tis, keep-band for the masking types",
    )
    g.add_argument(
        "--vllm_is_correction_type",
        dest="vllm_is_correction_type",
        type=str,
        default="tis",
        choices=list(IS_CORRECTIONS),
        help="tis: clamp; icepop: token mask; seq-mask-tis: sequence geometric-mean mask; reinforce_pro: "
        "prefix geometric-mean mask (see docs/algorithms.md)",
    )
    g.add_argument(
        "--vllm_is_correction_path",
        type=str,
        default=None,
        help="[reinforce_pro] with --enable_vllm_is_correction: a .py file defining correction(inp: ISInputs) -> "
        "(weights, keep, metrics), used instead of --vllm_is_correction_type (docs/algorithms.md)",
    )
    g.add_argument(
        "--is_position_metrics",
        action="store_true",
        help="[reinforce_pro] with --enable_vllm_is_correction: log where in the responses the mismatch is, per "
        "bucket of response positions: mean |log ratio| and the fraction every correction would mask "
        "(is_pos/*, docs/metrics.md)",
    )


def _add_async_flags(g) -> None:
    """Off-policy lag: staleness, asynchronous training, partial rollouts."""
    g.add_argument(
        "--rollout_staleness",
        type=int,
        default=0,
        help="[reinforce_pro] engines sample with the policy of K steps ago (K weight versions are kept in the "
        "object store): the off-policy lag of asynchronous RL, reproduced for studying IS correction",
    )
    g.add_argument(
        "--async_train",
        action="store_true",
        help="generate the next rollout batches in a producer thread while the policy trains on this one; "
        "rollouts are then up to --async_queue_size policy versions stale (logged as async/staleness_*)",
    )
    g.add_argument(
        "--async_queue_size",
        type=int,
        default=1,
        help="with --async_train: how many batches (= policy versions) the producer may run ahead of the "
        "trainer; the bound on a trained sample's staleness (>= 1)",
    )
    g.add_argument(
        "--async_lag_target", type=float, default=None,
        help="[reinforce_pro] with --async_train: adaptive staleness. After each step the producer's lead moves "
        "within [0, --async_queue_size]: one version less while --async_lag_metric is above this target, one "
        "more while it is below half of it (logged as async/max_lag)",
    )  # fmt: skip
    g.add_argument(
        "--async_lag_metric", default=LAG_METRICS[0], choices=list(LAG_METRICS),
        help="[reinforce_pro] the mismatch --async_lag_target holds: the IS correction's masked token fraction "
        "(needs --enable_vllm_is_correction) or the mean |trainer - engine log-prob|",
    )  # fmt: skip
    g.add_argument(
        "--partial_rollout", action="store_true",
        help="with --async_train: a weight sync goes in between chunks of a batch; unfinished responses continue "
        "under the new weights, each token keeping the log-prob of the weights that sampled it",
    )  # fmt: skip
    g.add_argument(
        "--partial_rollout_chunk", type=int, default=None,
        help="[reinforce_pro] tokens sampled per chunk under --partial_rollout (default: max_new_tokens / 4)",
    )  # fmt: skip


def _add_checkpoint_logging(p) -> None:
    g = both_spellings(p.add_argument_group("checkpoints, evaluation, logging"))
    _add_eval_checkpoint_flags(g)
    _add_logging_flags(g)


def _add_eval_checkpoint_flags(g) -> None:
    """Evaluation, console and sample logging, checkpoints."""
    g.add_argument(
        "--eval_steps",
        type=int,
        default=-1,
        help="evaluate on --eval_dataset (self-play: the task's held-out ladder) every N steps (-1: never)",
    )
    g.add_argument(
        "--eval_before_training", action="store_true", help="[reinforce_pro] evaluate once before the first step"
    )
    g.add_argument(
        "--verbose",
        action="store_true",
        help="[reinforce_pro] stream every actor's output (vLLM, DeepSpeed, workers) to the console; by default "
        "it goes to <save_path>/logs/ and the console keeps the progress bar, notices, errors and the summary",
    )
    g.add_argument("--save_steps", type=int, default=-1, help="checkpoint every N steps under --ckpt_path (-1: never)")
    g.add_argument(
        "--logging_steps",
        type=int,
        default=1,
        help="log metrics (TensorBoard, wandb) every N steps (jsonl: every step)",
    )
    g.add_argument(
        "--samples_log_steps",
        type=int,
        default=0,
        help="[reinforce_pro] write a prompt / response / reward table (samples.jsonl, wandb) every N steps (0: never)",
    )
    g.add_argument(
        "--ckpt_path",
        type=str,
        default="./ckpt/checkpoints_ppo_ray",
        help="directory of the global_step<N> checkpoints",
    )
    g.add_argument("--save_hf_ckpt", action="store_true", help="also save the policy as an HF model in each checkpoint")
    g.add_argument(
        "--disable_ds_ckpt", action="store_true", help="skip DeepSpeed states in checkpoints (then no resume from them)"
    )
    g.add_argument("--max_ckpt_num", type=int, default=3, help="keep the newest N checkpoints")
    g.add_argument(
        "--max_ckpt_mem", type=float, default=float("inf"), help="delete the oldest checkpoints beyond this many GB"
    )
    g.add_argument(
        "--load_checkpoint",
        action="store_true",
        help="resume from the latest complete checkpoint in --ckpt_path (none there: start from scratch)",
    )
    g.add_argument(
        "--best_metric_key",
        type=str,
        default="",
        help="an eval metric (eval/<dataset>/pass@1, or just pass@1): after each evaluation that raises it, the "
        "policy is saved to <save_path>/best_model (higher is better; needs --eval_dataset)",
    )


def _add_logging_flags(g) -> None:
    """wandb / TensorBoard, dynamic filtering, and two refused flags."""
    g.add_argument("--use_ds_universal_ckpt", action="store_true", help="DeepSpeed universal checkpoints")
    g.add_argument("--use_wandb", type=str, default=None, help="wandb API key (or 'True' with a login)")
    g.add_argument("--wandb_org", type=str, default=None, help="wandb entity")
    g.add_argument("--wandb_group", type=str, default=None, help="wandb group")
    g.add_argument("--wandb_project", type=str, default="openrlhf_train_ppo", help="wandb project")
    g.add_argument("--wandb_run_name", type=str, default=None, help="wandb run name (default: ppo_<time>)")
    g.add_argument(
        "--use_tensorboard", type=str, default=None, help="TensorBoard log dir (default: <save_path>/tensorboard)"
    )
    g.add_argument(
        "--dynamic_filtering",
        action="store_true",
        help="drop prompt groups whose mean score is not strictly inside --dynamic_filtering_reward_range and top "
        "the batch up with new prompts",
    )
    g.add_argument(
        "--dynamic_filtering_reward_range", type=float, nargs=2, default=(0, 1), help="LOW HIGH: kept mean scores"
    )
    g.add_argument("--perf", action="store_true", help="print a throughput summary")


def _add_deepspeed(p) -> None:
    g = both_spellings(p.add_argument_group("DeepSpeed (policy and critic)"))
    _add_deepspeed_engine_flags(g)
    _add_lora_flags(g)


def _add_deepspeed_engine_flags(g) -> None:
    """ZeRO, precision, memory, packing and dynamic batches."""
    g.add_argument("--local_rank", type=int, default=-1, help="rank given by torch launchers")
    g.add_argument("--zero_stage", type=int, default=2, choices=[0, 1, 2, 3], help="ZeRO stage")
    g.add_argument("--gradient_checkpointing", action="store_true", help="recompute activations in backward")
    g.add_argument("--deepcompile", action="store_true", help="DeepSpeed compile")
    g.add_argument(
        "--param_dtype",
        type=str,
        default="bf16",
        choices=["bf16", "fp16", "fp32"],
        help="trainer precision (fp32 added by reinforce_pro; the embedded default uses it)",
    )
    g.add_argument("--bf16", dest="param_dtype", action="store_const", const="bf16", help="same as --param_dtype bf16")
    g.add_argument("--enable_ema", action="store_true", help="keep an EMA of the policy")
    g.add_argument("--ema_beta", type=float, default=0.992, help="EMA decay")
    g.add_argument("--zpg", type=int, default=1, help="ZeRO++ partition group size")
    g.add_argument("--adam_offload", action="store_true", help="offload Adam states to host memory")
    g.add_argument("--actor_init_on_gpu", action="store_true", help="initialise the policy directly on the GPU")
    g.add_argument(
        "--attn_implementation",
        type=str,
        default="flash_attention_2",
        help="HF attention kernel for trainer models; flash_attention_2 falls back to sdpa when flash-attn "
        "is not installed (always on CPU), with a notice",
    )
    g.add_argument(
        "--ds.experts_implementation", dest="experts_implementation", default=None,
        choices=["eager", "batched_mm", "grouped_mm", "deepgemm"], help="MoE expert kernels (OpenRLHF v0.11)",
    )  # fmt: skip
    g.add_argument("--use_liger_kernel", action="store_true", help="Liger kernels")
    g.add_argument("--grad_accum_dtype", type=str, default=None, help="gradient accumulation dtype")
    g.add_argument("--overlap_comm", action="store_true", help="overlap ZeRO communication with compute")
    g.add_argument("--gradient_checkpointing_use_reentrant", action="store_true", help="reentrant checkpointing")
    g.add_argument("--disable_fast_tokenizer", action="store_true", help="use the slow (Python) tokenizer")
    g.add_argument("--dataloader_num_workers", type=int, default=0, help="data loader workers")
    g.add_argument(
        "--deepspeed_enable_sleep",
        action="store_true",
        help="offload DeepSpeed states between phases (not implemented on GPU: refused; on CPU a notice)",
    )
    g.add_argument("--ds_tensor_parallel_size", type=int, default=1, help="DeepSpeed tensor-parallel size")
    g.add_argument(
        "--packing_samples", action="store_true",
        help="padding-free forwards: each micro-batch's sequences packed back to back, positions restarting per "
        "sequence, attention within each (flash-attn varlen on GPU, a block-diagonal mask with sdpa/eager)",
    )  # fmt: skip
    g.add_argument("--use_dynamic_batch", action="store_true", help="micro-batches cut by a token budget, not a count")
    g.add_argument(
        "--rollout_max_tokens_per_gpu", type=int, default=None, help="log-prob forward budget (default 2x train's)"
    )
    g.add_argument("--train_max_tokens_per_gpu", type=int, default=16192, help="padded tokens per train micro-batch")
    g.add_argument("--load_in_4bit", action="store_true", help="4-bit quantised base weights")


def _add_lora_flags(g) -> None:
    """LoRA adapters."""
    g.add_argument(
        "--lora_rank", type=int, default=0,
        help="LoRA rank of the policy's adapters (0: train every weight). The engines get merged weights; "
        "final_model/ holds the adapter (peft format)",
    )  # fmt: skip
    g.add_argument("--lora_alpha", type=int, default=16, help="LoRA alpha: the update is scaled by alpha / rank")
    g.add_argument(
        "--target_modules", type=str, nargs="*", default="all-linear",
        help="modules that get adapters (peft names, e.g. q_proj v_proj), or all-linear: every linear but lm_head",
    )  # fmt: skip
    g.add_argument("--lora_dropout", type=float, default=0, help="dropout on the LoRA input, in [0, 1)")
    g.add_argument(
        "--lora_save_merged", action="store_true",
        help="[reinforce_pro] with --lora_rank: also write final_model_merged/, the base model with the adapter "
        "merged in (an ordinary HF model directory)",
    )  # fmt: skip


def _add_training(p) -> None:
    g = both_spellings(p.add_argument_group("training"))
    _add_batch_flags(g)
    _add_loss_flags(g)
    _add_kl_reward_flags(g)


def _add_batch_flags(g) -> None:
    """Output path, episodes, batch sizes, lengths, prompt count."""
    g.add_argument("--save_path", type=str, default=None, help="run directory (default: ./runs/<time>)")
    g.add_argument("--num_episodes", type=int, default=1, help="passes over the prompt data")
    g.add_argument("--rollout_batch_size", type=int, default=1024, help="prompts per step")
    g.add_argument("--vllm_generate_batch_size", type=int, default=None, help="prompts per engine call")
    g.add_argument("--micro_rollout_batch_size", type=int, default=8, help="rows per forward when scoring rollouts")
    g.add_argument("--max_epochs", type=int, default=1, help="training passes over each rollout batch")
    g.add_argument("--max_len", type=int, default=2048, help="max prompt + response tokens (engine context)")
    g.add_argument(
        "--max_new_tokens",
        "--generate_max_len",
        dest="max_new_tokens",
        type=int,
        default=None,
        help="max response tokens (--generate_max_len is the older name); unset: 1024",
    )
    g.add_argument("--prompt_max_len", type=int, default=1024, help="[reinforce_pro] max prompt tokens (keeps the end)")
    g.add_argument("--max_samples", type=int, default=100_000_000, help="use at most this many prompts")
    g.add_argument("--max_norm", type=float, default=1.0, help="gradient clipping norm")
    g.add_argument("--l2", type=float, default=0.0, help="AdamW weight decay")
    g.add_argument("--ptx_coef", type=float, default=0.05, help="pretraining (PTX) loss coefficient")


def _add_loss_flags(g) -> None:
    """Clipping, discounting, batch sizes, sampling, seed, learning rates."""
    g.add_argument("--eps_clip", type=float, default=0.2, help="PPO clip range")
    g.add_argument("--eps_clip_low_high", type=float, nargs=2, default=None, help="asymmetric PPO clip (low, high)")
    g.add_argument("--dual_clip", type=float, default=None, help="dual-clip constant (> 1)")
    g.add_argument("--value_clip", type=float, default=0.5, help="value clipping range for the critic")
    g.add_argument("--lambd", type=float, default=1, help="GAE lambda")
    g.add_argument("--gamma", type=float, default=1, help="discount")
    g.add_argument("--micro_train_batch_size", type=int, default=4, help="samples per forward on one rank")
    g.add_argument("--train_batch_size", type=int, default=128, help="samples per optimizer step (all ranks)")
    g.add_argument("--normalize_reward", action="store_true", help="standardise rewards with running moments")
    g.add_argument("--top_p", type=float, default=1.0, help="nucleus sampling")
    g.add_argument("--top_k", type=int, default=-1, help="[reinforce_pro] top-k sampling (-1: off)")
    g.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (the trainer uses the same)")
    g.add_argument("--seed", type=int, default=42, help="random seed")
    g.add_argument("--full_determinism", action="store_true", help="deterministic torch algorithms (slower)")
    g.add_argument("--freezing_actor_steps", type=int, default=-1, help="train only the critic for N steps")
    g.add_argument("--n_samples_per_prompt", type=int, default=1, help="responses per prompt (group size)")
    g.add_argument("--save_value_network", action="store_true", help="also save the critic at the end")
    g.add_argument("--actor_learning_rate", type=float, default=1e-6, help="policy learning rate")
    g.add_argument("--critic_learning_rate", type=float, default=9e-6, help="critic learning rate")
    g.add_argument("--lr_warmup_ratio", type=float, default=0.03, help="warm-up fraction of the LR schedule")
    g.add_argument("--lr_scheduler", type=str, default="cosine_with_min_lr", help="transformers scheduler name")


def _add_kl_reward_flags(g) -> None:
    """KL, the policy loss's type and extra terms, advantages, reward shaping."""
    g.add_argument("--kl_target", type=float, default=None, help="adaptive KL target (unset: fixed coefficient)")
    g.add_argument("--kl_horizon", type=int, default=10000, help="adaptive KL horizon")
    g.add_argument("--init_kl_coef", type=float, default=0.01, help="KL coefficient (0: no reference model)")
    g.add_argument("--policy_loss_type", type=str, default="ppo", choices=list(POLICY_LOSSES), help="policy loss")
    g.add_argument("--kl_estimator", type=str, default="k1", choices=list(KL_ESTIMATORS), help="KL estimator")
    g.add_argument("--aux_loss_coef", type=float, default=0, help="MoE auxiliary loss coefficient")
    g.add_argument("--entropy_loss_coef", type=float, default=None, help="entropy bonus coefficient")
    g.add_argument("--adam_betas", type=float, nargs=2, default=(0.9, 0.95), help="AdamW betas")
    g.add_argument("--reward_clip_range", type=float, nargs=2, default=(-10, 10), help="clip rewards to this range")
    g.add_argument(
        "--reward_nan_policy", choices=NAN_POLICIES, default="error",
        help="non-finite rewards from the reward function: error (stop the run, one line), zero (use 0), drop "
        "(use 0 and train on none of the row's tokens); zero and drop log reward/nonfinite, the fraction of rows",
    )  # fmt: skip
    g.add_argument(
        "--advantage_estimator", type=str, default="gae", choices=list(ADVANTAGE_ESTIMATORS), help="advantages"
    )
    g.add_argument("--use_kl_loss", action="store_true", help="KL as a loss term instead of a reward penalty")
    g.add_argument("--no_advantage_std_norm", action="store_true", help="do not divide advantages by their std")
    g.add_argument(
        "--overlong_buffer_len", type=float, default=None, help="DAPO: penalise the last B tokens before the limit"
    )
    g.add_argument("--overlong_penalty_factor", type=float, default=1, help="DAPO: the penalty at the token limit")
    g.add_argument(
        "--stop_properly_penalty_coef", type=float, default=None, help="ProRL: truncated rewards x c (c<0: set to c)"
    )
    g.add_argument(
        "--ring_attn_size", type=int, default=1,
        help="ring attention: the policy's packed rows split along the sequence over rings of this many ranks "
        "(key / value blocks passed around the ring; needs --packing_samples; the reference and critic run "
        "unsplit)",
    )  # fmt: skip
    g.add_argument("--ring_head_stride", type=int, default=1, help="ring attention head stride")
    g.add_argument(
        "--recompute_old_log_probs",
        action="store_true",
        help="[reinforce_pro] always compute the old log-probs in a forward pass before training. By default "
        "that pass is skipped when a step trains the policy once on one mini-batch (--max_epochs 1, samples "
        "per step <= --train_batch_size, no KL penalty in the reward): the training forward's own log-probs, "
        "detached, are then the same numbers",
    )
    g.add_argument(
        "--sft_warmup_steps",
        type=int,
        default=200,
        help="[reinforce_pro] embedded default only: supervised warm-start steps before RL",
    )


def _add_optimizers(p) -> None:
    """OpenRLHF v0.11's per-role optimizer settings, which only exist in dotted form. v0.9.10 shared one
    --adam_betas / --l2 / --max_norm / LR schedule between policy and critic: the critic's settings left
    unset keep that meaning (they follow the policy's)."""
    g = p.add_argument_group("optimizers (OpenRLHF v0.11's per-role settings; dotted names only)")
    g.add_argument("--actor.adam.eps", dest="adam_eps", type=float, default=1e-8, help="policy AdamW epsilon")
    g.add_argument(
        "--actor.min_lr_ratio", dest="min_lr_ratio", type=float, default=0.1,
        help="policy LR floor of cosine_with_min_lr, as a fraction of the LR",
    )  # fmt: skip
    same = "(unset: the policy's)"
    g.add_argument("--critic.adam.betas", dest="critic_adam_betas", type=float, nargs=2, default=None,
                   metavar=("B1", "B2"), help=f"critic AdamW betas {same}")  # fmt: skip
    g.add_argument("--critic.adam.eps", dest="critic_adam_eps", type=float, default=None, help=f"critic eps {same}")
    g.add_argument("--critic.adam.weight_decay", dest="critic_l2", type=float, default=None,
                   help=f"critic weight decay {same}")  # fmt: skip
    g.add_argument("--critic.lr_scheduler", dest="critic_lr_scheduler", default=None, help=f"critic schedule {same}")
    g.add_argument("--critic.lr_warmup_ratio", dest="critic_lr_warmup_ratio", type=float, default=None,
                   help=f"critic warm-up fraction {same}")  # fmt: skip
    g.add_argument("--critic.min_lr_ratio", dest="critic_min_lr_ratio", type=float, default=None,
                   help=f"critic LR floor fraction {same}")  # fmt: skip
    g.add_argument("--critic.max_norm", dest="critic_max_norm", type=float, default=None,
                   help=f"critic gradient clipping {same}")  # fmt: skip
    for role in ("actor", "critic"):
        g.add_argument(f"--{role}.optim", dest=f"{role}_optim", default="adam", choices=["adam", "muon"],
                       help=f"{role} optimizer")  # fmt: skip
        muon = f"{role} Muon setting; has no effect unless --{role}.optim muon (which is refused)"
        g.add_argument(f"--{role}.muon.lr", dest=f"{role}_muon_lr", type=float, default=0.02, help=muon)
        g.add_argument(f"--{role}.muon.momentum", dest=f"{role}_muon_momentum", type=float, default=0.95, help=muon)
        g.add_argument(f"--{role}.muon.ns_steps", dest=f"{role}_muon_ns_steps", type=int, default=5, help=muon)
        g.add_argument(f"--{role}.muon.nesterov", dest=f"{role}_muon_nesterov", action="store_true", default=True,
                       help=muon)  # fmt: skip
        g.add_argument(f"--{role}.muon.no_nesterov", dest=f"{role}_muon_nesterov", action="store_false", help=muon)


def _add_models_data(p) -> None:
    g = both_spellings(p.add_argument_group("models and data (local paths only)"))
    g.add_argument("--pretrain", type=str, default=None, help="policy HF model dir (unset: the built-in tiny model)")
    g.add_argument("--reward_pretrain", type=str, default=None, help="reward model HF dir (sequence classification)")
    g.add_argument(
        "--remote_rm_url", type=str, default=None, help="a .py file defining reward_func(queries, prompts, labels)"
    )
    g.add_argument("--critic_pretrain", type=str, default=None, help="critic HF dir (gae; unset: --pretrain)")
    g.add_argument("--value_head_prefix", type=str, default="score", help="name of the critic's value head")
    g.add_argument("--ref_reward_offload", action="store_true", help="offload reference / reward models")
    g.add_argument(
        "--agent_func_path",
        type=str,
        default=None,
        help="a .py file defining AgentInstance (async reset / step): multi-turn rollouts whose environment "
        "tokens are never trained (docs/agents.md); the environment gives the rewards",
    )
    g.add_argument(
        "--agent_max_turns", type=int, default=4, help="[reinforce_pro] with --agent_func_path: model turns per episode"
    )
    g.add_argument(
        "--agent_reward_mode",
        type=str,
        default="sum",
        choices=REWARD_MODES,
        help="[reinforce_pro] with --agent_func_path: the episode reward is the sum or the last of the turn "
        "rewards (on the last model token), or per_turn: each turn's reward on its own last model token "
        "(reinforce / gae only)",
    )
    g.add_argument(
        "--prompt_data",
        type=str,
        default=None,
        help="jsonl file or local HF dataset dir, or several comma-separated (unset: built-in)",
    )
    g.add_argument(
        "--prompt_data_probs",
        type=str,
        default=None,
        help="comma-separated share of each --prompt_data dataset in the mixture (unset: equal shares)",
    )
    g.add_argument("--prompt_split", type=str, default="train", help="split of a dataset dir")
    g.add_argument("--eval_dataset", type=str, default=None, help="evaluation prompts")
    g.add_argument("--eval_split", type=str, default="train", help="evaluation split")
    g.add_argument("--eval_temperature", type=float, default=0.6, help="evaluation temperature")
    g.add_argument("--eval_n_samples_per_prompt", type=int, default=4, help="evaluation samples per prompt")
    g.add_argument("--input_key", type=str, default="input", help="prompt field of a record")
    g.add_argument("--label_key", type=str, default=None, help="label field passed to the reward function")
    g.add_argument("--input_template", type=str, default=None, help="prompt template with one {} placeholder")
    g.add_argument(
        "--apply_chat_template", action="store_true", help="wrap the prompt with the tokenizer's chat template"
    )
    g.add_argument("--use_ms", action="store_true", help="load from ModelScope")
    g.add_argument("--image_key", type=str, default="images", help="image field of a record (vision-language models)")
    g.add_argument("--max_images_per_prompt", type=int, default=0, help="images per prompt (0: text only)")
    g.add_argument("--freeze_visual_encoder", action="store_true", help="train only a VLM's language model")


SELFPLAY = "[reinforce_pro] --absolute_zero:"  # how the self-play flags' help begins


def _add_selfplay(p) -> None:
    g = both_spellings(p.add_argument_group("Absolute-Zero self-play (docs/selfplay.md)"))
    _add_selfplay_task_flags(g)
    _add_selfplay_reward_flags(g)


def _add_selfplay_task_flags(g) -> None:
    """The task and its proposals."""
    g.add_argument(
        "--absolute_zero",
        action="store_true",
        help="[reinforce_pro] self-play: the policy proposes questions from seed prompts and solves them; both "
        "roles are trained in one update. Seeds: --prompt_data records (unset: the task's built-in seeds)",
    )
    g.add_argument(
        "--selfplay_task", type=str, default="arithmetic", choices=list(BUILTIN_TASKS), help=f"{SELFPLAY} built-in task"
    )
    g.add_argument(
        "--selfplay_task_path",
        type=str,
        default=None,
        help=f"{SELFPLAY} a .py file defining TASK (overrides --selfplay_task)",
    )
    g.add_argument(
        "--n_questions_per_prompt", type=int, default=4, help=f"{SELFPLAY} questions proposed per seed prompt"
    )
    g.add_argument(
        "--selfplay_reference_buffer",
        type=int,
        default=0,
        help=f"{SELFPLAY} proposer prompts show a random one of the last N learnable questions instead of a seed "
        "(Absolute Zero's reference examples; 0: the seeds)",
    )
    g.add_argument(
        "--proposer_repetition_penalty",
        type=float,
        default=0.0,
        help=f"{SELFPLAY} a question proposed k times among a step's n valid proposals loses this times k/n of its "
        "proposer reward (R-Zero's repetition penalty; 0: off). Above the task's format penalty (1) a valid question "
        "can earn less than an invalid one when few proposals are valid",
    )
    g.add_argument(
        "--proposer_reward",
        type=str,
        default="learnable",
        choices=list(PROPOSER_REWARDS),
        help=f"{SELFPLAY} what a learnable question earns its proposer: learnable: 1.0; difficulty: 1 - the solver's "
        "success rate on it (Absolute Zero's r_propose: the hard edge of what the solver can do earns most)",
    )


def _add_selfplay_reward_flags(g) -> None:
    """Re-proposal and rewards."""
    g.add_argument(
        "--max_repropose_attempts",
        type=int,
        default=3,
        help=f"{SELFPLAY} re-proposal rounds after the first proposal for prompts whose questions are all or none "
        "learnable (0: never re-propose)",
    )
    g.add_argument(
        "--proposer_train_scope",
        type=str,
        default="sampled",
        choices=list(PROPOSER_SCOPES),
        help=f"{SELFPLAY} sampled: train the sampled question's proposer trajectory only (1.0 / -0.5 unresolved); "
        "group: every proposed question (learnable 1.0, not 0.0, invalid the task's format penalty)",
    )
    for dimension, flag in (("safety", "--safety_reward_weight"), ("completion", "--task_completion_weight")):
        g.add_argument(
            flag,
            type=float,
            default=DEFAULT_WEIGHTS[dimension],
            help=f"{SELFPLAY} weight of a task's '{dimension}' score",
        )
    g.add_argument(
        "--format_reward_coef", type=float, default=0.5, help=f"{SELFPLAY} weight of the solver's format reward"
    )
    g.add_argument(
        "--proposer_reward_coef",
        type=float,
        default=0.1,
        help=f"{SELFPLAY} a solver sample's reward adds this times its prompt's proposer reward",
    )
    g.add_argument(
        "--selfplay_judge_pretrain",
        type=str,
        default=None,
        help=f"{SELFPLAY} HF model dir of a frozen judge for the task's llm scorers (unset: the policy judges)",
    )


def build_parser() -> OneLineParser:
    p = OneLineParser(
        prog="train_ppo_ray",
        allow_abbrev=False,  # `--rollout_batch` is an error naming the real flag, not a silent match
        usage="%(prog)s [flags]   (each flag has OpenRLHF's flat name and, most, its v0.11 dotted name)",
        formatter_class=BothSpellingsFormatter,
        description="OpenRLHF-style RL on Ray. With no model or data flags it runs the embedded CPU default. "
        "A script may mix the two spellings; docs/flags.md lists every flag.",
    )
    for add in (
        _add_placement, _add_vllm, _add_checkpoint_logging, _add_deepspeed, _add_training, _add_optimizers,
        _add_models_data, _add_selfplay,
    ):  # fmt: skip
        add(p)
    p.set_defaults(preset=None)  # the name of the preset (cli/presets.py) whose values are the defaults, if any
    for action in p._actions:
        if action.dest in NO_EFFECT:
            action.help = f"{action.help} (no effect: {NO_EFFECT[action.dest]})"
    return p
