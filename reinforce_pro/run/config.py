"""A run's typed config: one section per concern, each the dataclass its consumer takes.

    RunConfig -> prepare (run/prepare.py) -> RunPlan -> build_and_fit (run/driver.py)

The command line builds it from the flags (cli/flags_to_config.py: run_config), the benchmarks build or vary it
directly. A section carries its own defaults and checks (`KLPenalty` of the adaptive KL pair, `Engines` of
the engine count and quantization, ...); a check's ValueError starts with the flag's name, so the command line
reports it in one line. The sections have no defaults of their own: every value comes from a flag (whose
field in cli/args.py holds the one default) or is given by whoever builds the config.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from reinforce_pro.agents.runner import AgentConfig
from reinforce_pro.algos.distill import DistillConfig
from reinforce_pro.data import EMBEDDED_TASKS
from reinforce_pro.data.prompts import PromptConfig
from reinforce_pro.flagspec import flag
from reinforce_pro.models.lora import LoraAdapterConfig
from reinforce_pro.rollout.sampler import RolloutConfig
from reinforce_pro.rollout.vllm_engine import EngineConfig
from reinforce_pro.selfplay.controller import SelfPlayConfig
from reinforce_pro.trainer.experience_builder import ExperienceConfig
from reinforce_pro.trainer.logger import WandbConfig
from reinforce_pro.trainer.ppo_trainer import LoopConfig
from reinforce_pro.workers.configs import ForwardConfig, OptimConfig
from reinforce_pro.workers.launcher import GroupSpec
from reinforce_pro.workers.policy import PolicyLossConfig

VLLM_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}  # trainer --param_dtype -> engine dtype


@dataclass(frozen=True)
class Placement:
    actor: GroupSpec
    ref: GroupSpec
    critic: GroupSpec
    colocate_actor_ref: bool  # reference ranks on the policy's bundles
    colocate_critic_reward: bool  # the reward model in the critic's first bundle
    colocate_all_models: bool  # policy, reference and engines share the policy's bundles


@dataclass(frozen=True)
class Engines:
    count: int
    config: EngineConfig  # model_path: filled in once the starting weights exist
    sync_backend: str  # as asked (object_store with --vllm_sync_with_ray); resolved per machine
    sync_bucket_mb: float
    sleep_flags: tuple[str, ...]  # --vllm_enable_sleep / --deepspeed_enable_sleep as given

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"vllm_num_engines must be >= 1, got {self.count}")
        if self.sync_bucket_mb <= 0:
            raise ValueError(f"vllm_sync_bucket_mb must be > 0, got {self.sync_bucket_mb}")
        quantization, dtype = self.config.quantization, self.config.dtype
        if quantization is not None and dtype not in ("bfloat16", "float16"):
            raise ValueError(f"vllm_quantization {quantization} needs --vllm_dtype bfloat16 or float16, got {dtype}")


@dataclass(frozen=True)
class KLPenalty:
    init_coef: float
    target: float | None  # None: a fixed coefficient
    horizon: int

    def __post_init__(self) -> None:
        if self.init_coef < 0:
            raise ValueError(f"init_kl_coef must be >= 0, got {self.init_coef}")
        if self.target is not None and not (self.target > 0 and self.horizon > 0):
            raise ValueError(f"kl_target and kl_horizon must be > 0 for the adaptive KL, got {self.target}, "
                             f"{self.horizon}")  # fmt: skip


@dataclass(frozen=True)
class Models:
    lora: LoraAdapterConfig | None
    # fmt: off
    # None: the built-in tiny model (run/prepare builds it and fills Engines.config)
    pretrain: str | None = flag(None, "policy HF model dir (unset: the built-in tiny model)",
        dotted="actor.model_name_or_path", group="data")
    critic_pretrain: str | None = flag(None, "critic HF dir (gae; unset: --pretrain)",
        dotted="critic.model_name_or_path", group="data")
    reward_pretrain: str | None = flag(None, "reward model HF dir (sequence classification)",
        dotted="reward.model_name_or_path", group="data")
    remote_rm_url: str | None = flag(None, "a .py file defining reward_func(queries, prompts, labels)",
        dotted="reward.remote_url", group="data")
    value_head_prefix: str = flag("score", "name of the critic's value head", dotted="ds.value_head_prefix",
        group="data")
    value_clip: float = flag(0.5, "value clipping range for the critic", dotted="critic.value_clip", group="training")
    sft_warmup_steps: int = flag(200, "[reinforce_pro] embedded default only: supervised warm-start steps before RL",
        group="training")
    disable_fast_tokenizer: bool = flag(False, "use the slow (Python) tokenizer", dotted="data.disable_fast_tokenizer",
        group="deepspeed")
    lora_save_merged: bool = flag(False,
        "[reinforce_pro] with --lora_rank: also write final_model_merged/, the base model with the adapter merged in "
        "(an ordinary HF model directory)", group="deepspeed")
    save_value_network: bool = flag(False, "also save the critic at the end", dotted="critic.save_value_network",
        group="training")
    sft_warmup_target: float = flag(0.0,
        "[reinforce_pro] embedded default only: stop the warm start once its greedy accuracy on 64 training prompts "
        "reaches this (checked every 50 steps; --sft_warmup_steps is then the most it runs); 0 runs every step. A "
        "task whose accuracy jumps within a few hundred steps starts RL from the same place at every seed. With "
        "--selfplay_task search the accuracy is of greedy search episodes on 48 questions of another generated base, "
        "checked every 10 steps", group="training")
    embedded_model: str = flag("dense",
        "[reinforce_pro] with --pretrain unset: the built-in model is dense (a tiny Qwen2) or moe (its "
        "mixture-of-experts twin, a tiny Qwen3-MoE with 8 experts, 2 per token: routing replay, docs/models.md)",
        choices=("dense", "moe"), group="data")
    # fmt: on

    def __post_init__(self) -> None:
        if not 0.0 <= self.sft_warmup_target <= 1.0:
            raise ValueError(f"--sft_warmup_target is an accuracy in [0, 1], got {self.sft_warmup_target}")
        if self.pretrain and self.embedded_model != "dense":
            raise ValueError(
                f"--embedded_model {self.embedded_model} picks the built-in model: give it without --pretrain"
            )


@dataclass(frozen=True)
class Data:
    prompt_max_len: int
    max_len: int
    # fmt: off
    prompt_data: str | None = flag(None,
        "jsonl file or local HF dataset dir, or several comma-separated (unset: built-in)",
        dotted="data.prompt_dataset", group="data")
    prompt_data_probs: str | None = flag(None,
        "comma-separated share of each --prompt_data dataset in the mixture (unset: equal shares)",
        dotted="data.prompt_probs", group="data")
    prompt_split: str = flag("train", "split of a dataset dir", dotted="data.prompt_split", group="data")
    max_samples: int = flag(100_000_000, "use at most this many prompts", dotted="data.max_samples", group="training")
    input_key: str = flag("input", "prompt field of a record", dotted="data.input_key", group="data")
    label_key: str | None = flag(None, "label field passed to the reward function", dotted="data.label_key",
        group="data")
    input_template: str | None = flag(None, "prompt template with one {} placeholder", dotted="data.input_template",
        group="data")
    apply_chat_template: bool = flag(False, "wrap the prompt with the tokenizer's chat template",
        dotted="data.apply_chat_template", group="data")
    builtin_task: str = flag("arithmetic",
        "[reinforce_pro] embedded default only: arithmetic (a+b=, answers of 1-3 tokens); running_sum (the running "
        "sum of ten labelled digits, ~60-token responses whose every step the total depends on); scratchpad "
        "(four-digit additions worked column by column, ~55 tokens, on a 4-layer model). Each long task has its "
        "preset, embedded-running-sum / embedded-scratchpad, that sizes the run for it", choices=EMBEDDED_TASKS,
        group="training")
    # fmt: on

    def __post_init__(self) -> None:
        if self.prompt_data is not None and self.builtin_task != "arithmetic":
            raise ValueError("--builtin_task chooses the built-in prompts: give it without --prompt_data")

    @property
    def built_in(self) -> bool:
        """No --prompt_data: the built-in prompts (a built-in task's, or the self-play task's seeds)."""
        return self.prompt_data is None

    def prompt_spec(self, input_key: str, label_key: str | None) -> PromptConfig:
        """How records with these keys become prompts: --input_template, then --apply_chat_template."""
        return PromptConfig(input_key, label_key, self.input_template, self.apply_chat_template)


@dataclass(frozen=True)
class Evaluation:
    dataset: str
    split: str
    n_samples: int  # --eval_n_samples_per_prompt: responses to each held-out prompt
    temperature: float


@dataclass(frozen=True)
class SelfPlay:
    task: str
    task_path: str | None
    judge_pretrain: str | None
    config: SelfPlayConfig  # weights: the flags' safety / completion weights; the task's own are merged in
    kb: str | None = None  # --selfplay_kb: the search task's knowledge base folder
    retriever_url: str | None = None  # --selfplay_retriever_url: the search task's retrieval service


@dataclass(frozen=True)
class Agent:
    func_path: str  # the user's file defining AgentInstance
    config: AgentConfig


@dataclass(frozen=True)
class Output:
    save_path: str | None  # None: ./runs/<time>
    verbose: bool
    tensorboard: str | None
    wandb: WandbConfig | None  # its `config` is the run's config, filled in at start


@dataclass(frozen=True)
class RunConfig:
    seed: int
    placement: Placement
    engines: Engines
    forward: ForwardConfig  # the workers' model loading and scoring forwards
    actor_optim: OptimConfig
    critic_optim: OptimConfig
    loss: PolicyLossConfig
    kl: KLPenalty
    rollout: RolloutConfig  # sampling
    experience: ExperienceConfig  # rewards, KL, advantages
    loop: LoopConfig
    models: Models
    data: Data
    evaluation: Evaluation | None
    selfplay: SelfPlay | None
    agent: Agent | None
    output: Output
    distill: DistillConfig | None = None  # a teacher to distil from (algos/distill.py); None: no teacher

    @property
    def needs_reference(self) -> bool:
        return self.kl.init_coef > 0 or self.loss.use_kl_loss

    @property
    def needs_critic(self) -> bool:
        return self.experience.advantage_estimator == "gae"

    def as_dict(self) -> dict:
        """JSON-ready (config.json, wandb), never the wandb key."""
        out = asdict(self)
        if out["output"]["wandb"]:
            out["output"]["wandb"] = {k: v for k, v in out["output"]["wandb"].items() if k not in ("key", "config")}
        return out


@dataclass
class RunPlan:
    """What prepare (run/prepare.py) made of a RunConfig before any actor starts: the run's directory, the
    starting weights, the prompts, where rewards come from, and the loaded task or agent."""

    run_dir: Path
    model_path: str  # the policy's starting weights (after the warm start for the embedded default)
    prompts: list[dict]  # [{"prompt", "label"}]; with --absolute_zero the seed records
    # "builtin:exact_match" (prompt data, no reward given) | "builtin:<embedded task>" | path of a reward file |
    # "model:<dir>" | "selfplay:<task>"
    reward_source: str
    summary: dict
    task: object = None  # --absolute_zero: the SelfPlayTask, loaded once here
    agent_cls: object | None = None  # --agent_func_path: the AgentInstance class or an OpenAIAgent, loaded once here
    log_dir: Path | None = None  # where actors write their output (run_dir/logs); None with --verbose
    teacher_path: str | None = None  # --teacher.model_name_or_path, the built-in teacher's directory for "builtin"
