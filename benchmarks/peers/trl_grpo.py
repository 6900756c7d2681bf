"""The TRL side of bench_peers.py: TRL's GRPOTrainer on a workload bench_peers.py wrote to a directory.

Runs in its own virtualenv (benchmarks/peers/setup_trl.sh) and imports nothing from reinforce_pro, so the
project's environment never gets TRL and TRL's never gets ours. Reads WORKDIR/workload.json (model dir,
prompts file, the GRPO settings), trains, and writes WORKDIR/trl_result.json: the wall time of every
optimizer step and the response tokens generated for it.

    .venv-trl/bin/python benchmarks/peers/trl_grpo.py WORKDIR
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(workdir: Path) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    w = json.loads((workdir / "workload.json").read_text())
    torch.manual_seed(w["seed"])
    records = [json.loads(line) for line in Path(w["prompts"]).read_text().splitlines()]
    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": r["question"]}], "label": r["answer"]} for r in records]
    )
    tokens_per_generation: list[int] = []

    def reward_contains_sum(prompts, completions, completion_ids, label, **_):
        """1.0 when the correct sum appears in the response (the same rule as the reward file ours uses)."""
        tokens_per_generation.append(sum(len(ids) for ids in completion_ids))
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [1.0 if lab in text else 0.0 for text, lab in zip(texts, label, strict=True)]

    step_ends: list[float] = []
    first_step_end_unix: list[float] = []  # the wall clock, for the time from the command to the first step

    class StepClock(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            step_ends.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            step_ends.append(time.perf_counter())
            if not first_step_end_unix:
                first_step_end_unix.append(time.time())

    micro = w["micro_batch_size"]
    config = GRPOConfig(
        output_dir=str(workdir / "trl_out"),
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=w["samples_per_step"] // micro,  # one optimizer step per generation batch
        num_generations=w["n_samples_per_prompt"],
        max_completion_length=w["max_new_tokens"],
        learning_rate=w["learning_rate"],
        lr_scheduler_type="constant",
        beta=0.0,  # no KL, no reference model (as on our side: --init_kl_coef 0)
        num_iterations=1,
        temperature=1.0,
        max_steps=w["warmup_steps"] + w["steps"],
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        seed=w["seed"],
        disable_tqdm=True,
        dataloader_num_workers=0,
        # bench_peers' equal-length work: no response ends before max_completion_length
        generation_kwargs={"min_new_tokens": w["max_new_tokens"]} if w.get("equal_lengths") else None,
    )
    tokenizer = AutoTokenizer.from_pretrained(w["model"])
    model = AutoModelForCausalLM.from_pretrained(w["model"], dtype=torch.float32)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_contains_sum,
        args=config,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[StepClock()],
    )
    start = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - start
    step_seconds = [b - a for a, b in zip(step_ends, step_ends[1:], strict=False)]
    result = {
        "step_seconds": step_seconds,
        "response_tokens": tokens_per_generation[: len(step_seconds)],
        "train_wall_s": total,
        "first_step_end_unix": first_step_end_unix[0],
        "torch_threads": torch.get_num_threads(),
        "trl": __import__("trl").__version__,
        "transformers": __import__("transformers").__version__,
        "torch": torch.__version__,
    }
    (workdir / "trl_result.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
