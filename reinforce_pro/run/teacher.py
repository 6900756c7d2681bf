"""The distillation teacher, checked before any actor starts (a bad one stops the run in one line) or, for the
embedded default, made once and cached: a larger tiny model of the same tokenizer, trained by supervised steps on
the built-in task until its greedy accuracy is high (docs/distillation.md)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path

from reinforce_pro.run.config import RunConfig
from reinforce_pro.run.errors import UserInputError

FLAG = "--teacher.model_name_or_path"
BUILTIN = "builtin"


def cache_root() -> Path:
    """Where made models are kept between runs: $REINFORCE_PRO_CACHE, else ~/.cache/reinforce_pro."""
    return Path(os.environ.get("REINFORCE_PRO_CACHE") or Path.home() / ".cache" / "reinforce_pro")


# The built-in teacher of each embedded task: twice the default model's width and layers, trained with the
# warm start's examples for up to `steps` steps, stopping once greedy accuracy on 64 training prompts reaches
# `target`. At the warm start's lr (3e-3) this model stalled at 0.12 after 3000 steps on arithmetic; at 1e-3 it
# reached 0.95 at 750 and 1.0 at 1000 (checks every 250 steps). The version is part of the cache key: change it
# whenever the recipe changes, so no stale teacher is reused.
BUILTIN_TEACHER = {"hidden_size": 256, "intermediate_size": 768, "layer_factor": 2, "steps": 2000, "lr": 1e-3,
                   "target": 0.95, "seed": 1234, "version": 2}  # fmt: skip


def builtin_teacher(task_name: str) -> Path:
    """The embedded task's teacher directory, made on first use (minutes on 2 cores) and reused after; two runs
    making it at once wait for each other (a lock file), and a half-made one is never left under the final name."""
    from reinforce_pro.data import EMBEDDED_TASKS
    from reinforce_pro.models.tiny import build_tiny_model
    from reinforce_pro.trainer.sft_warmup import embedded_warm_start

    spec = BUILTIN_TEACHER
    layers = EMBEDDED_TASKS[task_name]().model_layers * spec["layer_factor"]
    root = cache_root() / "teachers"
    final = root / f"{task_name}-h{spec['hidden_size']}-l{layers}-v{spec['version']}"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "teacher.json").is_file():
            return final
        work = root / f".{final.name}.building"
        shutil.rmtree(work, ignore_errors=True)
        print(f"[teacher] making the built-in teacher for {task_name} (once; cached at {final})", flush=True)
        base = build_tiny_model(work / "base", hidden_size=spec["hidden_size"], num_layers=layers,
                                intermediate_size=spec["intermediate_size"], seed=spec["seed"])  # fmt: skip
        stats = embedded_warm_start(task_name, base, work / "model", spec["steps"], spec["seed"], spec["target"],
                                    lr=spec["lr"])  # fmt: skip
        (work / "model" / "teacher.json").write_text(json.dumps({"task": task_name, **spec, **stats}, indent=1))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(work / "model", final)
        shutil.rmtree(work, ignore_errors=True)
        accuracy = stats.get("sft/stop_accuracy")
        said = f", greedy accuracy {accuracy:.2f} on 64 training prompts" if accuracy is not None else ""
        print(f"[teacher] {stats['sft/steps']} SFT steps{said}", flush=True)
        return final


def resolve_teacher(cfg: RunConfig, student_path: str) -> str:
    """The teacher's directory (the built-in one made if asked), after the checks that stop a run in one line:
    a local causal LM, the student's tokenizer, and weights that fit in the memory this machine has free."""
    given = cfg.distill.teacher_pretrain
    path = str(builtin_teacher(cfg.data.builtin_task)) if given == BUILTIN else given
    params = check_teacher(path, student_path, cfg.actor_optim.param_dtype)
    d = cfg.distill
    served = f"{d.teacher_num_engines} prefill-only vLLM engine(s)" if d.teacher_backend == "engine" else "an actor"
    print(f"[teacher] {path}: {params / 1e6:.2f}M parameters in {cfg.actor_optim.param_dtype} on {served}, logits / "
          f"{d.opd_kd_temperature:g}; reward = {d.opd_kl_coef:g} x (teacher - student log-prob) of each sampled "
          f"token, student log-probs from the {d.opd_student_logprobs}; task advantage x {d.opd_task_coef:g}",
          flush=True)  # fmt: skip
    return path


def check_teacher(path: str, student_path: str, param_dtype: str) -> int:
    """The checks of resolve_teacher, in one line each; returns the teacher's parameter count."""
    from transformers import AutoConfig, AutoTokenizer

    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        raise UserInputError(f"{FLAG} {path}: not a local HF model directory (no config.json)")
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise UserInputError(f"{FLAG} {path}: transformers cannot read its config ({str(e).splitlines()[0]})") from None
    architectures = getattr(config, "architectures", None) or []
    if architectures and not any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures):
        raise UserInputError(f"{FLAG} {path}: not a causal language model ({', '.join(architectures)}); a teacher "
                             "scores next tokens")  # fmt: skip
    try:
        teacher_vocab = AutoTokenizer.from_pretrained(path).get_vocab()
    except (OSError, ValueError) as e:
        raise UserInputError(f"{FLAG} {path}: no tokenizer to compare with the policy's ({e})") from None
    student_vocab = AutoTokenizer.from_pretrained(student_path).get_vocab()
    if teacher_vocab != student_vocab:
        differ = len(set(teacher_vocab.items()) ^ set(student_vocab.items()))
        raise UserInputError(
            f"{FLAG} {path}: its vocabulary differs from the policy's ({len(teacher_vocab)} vs {len(student_vocab)} "
            f"tokens, {differ} entries differ); the teacher must score the policy's own token ids (cross-tokenizer "
            "distillation is not built)"
        )
    vocab_size = getattr(config, "vocab_size", None)
    if vocab_size is not None and vocab_size < len(student_vocab):
        raise UserInputError(f"{FLAG} {path}: its head has {vocab_size} outputs, fewer than the {len(student_vocab)} "
                             "tokens of the policy's vocabulary")  # fmt: skip
    params = parameter_count(path)
    need, (free, where) = params * {"fp32": 4}.get(param_dtype, 2), free_memory()
    if need > free:
        raise UserInputError(f"{FLAG} {path}: its weights take {need / 2**30:.1f} GiB in {param_dtype}, more than the "
                             f"{free / 2**30:.1f} GiB free {where}")  # fmt: skip
    return params


def parameter_count(path: str) -> int:
    """The model's parameters, from its safetensors headers (without them, its weight files' bytes over 4)."""
    count = 0
    files = sorted(Path(path).glob("*.safetensors"))
    for f in files:
        with open(f, "rb") as fh:
            header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
        for name, entry in header.items():
            if name != "__metadata__":
                n = 1
                for d in entry["shape"]:
                    n *= d
                count += n
    if not files:
        count = sum(f.stat().st_size for f in Path(path).glob("*.bin")) // 4
    return count


def free_memory() -> tuple[int, str]:
    """(bytes, where): the first GPU's free memory when there is one, else the host's available memory."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.mem_get_info(0)[0], "on GPU 0"
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024, "in host memory"
    return 1 << 62, "in host memory"
