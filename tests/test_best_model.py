"""--best_metric_key across resumes (trainer/best_model.py): best_model/ always holds the best model of the history
the run continues. The trainer's calls are replayed here without Ray: a best model is saved as PolicyWorker.save_hf
saves one (written beside, then renamed over the old one) with its best.json, and checkpoints are written by
save_checkpoint with the same part writer the trainer uses."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from reinforce_pro.trainer import best_model
from reinforce_pro.trainer.checkpoint import save_checkpoint


class Run:
    """The files one run writes: best_model/ and checkpoints, as PPOTrainer writes them."""

    def __init__(self, root: Path):
        self.best_dir, self.ckpts, self.best = root / "best_model", root / "ckpt", None

    def evaluate(self, step: int, value: float) -> None:  # keep_best
        if self.best is not None and value <= self.best["value"]:
            return
        tmp = self.best_dir.with_name("best_model.tmp")  # save_hf: write beside, then replace whole
        tmp.mkdir()
        (tmp / "model.safetensors").write_text(f"weights of step {step}")
        shutil.rmtree(self.best_dir, ignore_errors=True)
        tmp.rename(self.best_dir)
        self.best = {"step": step, "key": "eval/held_out/score_mean", "value": value}
        (self.best_dir / best_model.RECORD).write_text(json.dumps(self.best) + "\n")

    def checkpoint(self, step: int) -> Path:
        parts = lambda tmp: best_model.keep_in_checkpoint(self.best_dir, self.best, tmp)  # noqa: E731
        return save_checkpoint(self.ckpts, step, {"best": self.best, "run_id": "r"}, parts)

    def weights(self) -> str:
        return (self.best_dir / "model.safetensors").read_text()


def test_a_resume_puts_back_the_checkpoints_best_model_and_moves_the_discarded_one_aside(tmp_path):
    run = Run(tmp_path)
    run.evaluate(3, 0.6)
    ckpt = run.checkpoint(5)
    run.evaluate(7, 0.8)  # after the checkpoint: the steps a resume from step 5 discards
    assert run.weights() == "weights of step 7"

    state = json.loads((ckpt / "trainer_state.json").read_text())
    best, said = best_model.put_back(run.best_dir, state["best"], ckpt)
    assert best == {"step": 3, "key": "eval/held_out/score_mean", "value": 0.6}
    assert run.weights() == "weights of step 3" and best_model.recorded(run.best_dir) == best
    aside = tmp_path / "best_model.discarded-step7"
    assert (aside / "model.safetensors").read_text() == "weights of step 7"  # kept, never deleted
    assert said == ("[best] best_model/ held a model of steps this resume discards; moved to "
                    "best_model.discarded-step7/; best_model/ is step 3's again (eval/held_out/score_mean = 0.6000), "
                    "from global_step5")  # fmt: skip

    # the resumed history goes on: a worse evaluation than step 3's keeps step 3's model, a better one replaces it
    run.best = best
    run.evaluate(6, 0.7)
    assert run.weights() == "weights of step 6"
    run.evaluate(8, 0.65)
    assert run.weights() == "weights of step 6"


def test_the_copy_in_a_checkpoint_outlives_later_saves_of_best_model(tmp_path):
    run = Run(tmp_path)
    run.evaluate(1, 0.2)
    ckpt = run.checkpoint(2)
    copy = ckpt / best_model.IN_CHECKPOINT
    assert (copy / "model.safetensors").stat().st_ino == (run.best_dir / "model.safetensors").stat().st_ino  # linked
    run.evaluate(3, 0.9)  # best_model/ replaced whole: the checkpoint's links still name step 1's files
    assert (copy / "model.safetensors").read_text() == "weights of step 1"
    assert best_model.recorded(copy) == {"step": 1, "key": "eval/held_out/score_mean", "value": 0.2}


def test_a_resume_that_finds_the_best_model_of_its_own_history_changes_nothing(tmp_path):
    run = Run(tmp_path)
    run.evaluate(2, 0.5)
    ckpt = run.checkpoint(4)
    run.evaluate(5, 0.4)  # not better: best_model/ is still step 2's
    assert best_model.put_back(run.best_dir, run.best, ckpt) == (run.best, None)
    assert run.weights() == "weights of step 2"
    assert not list(tmp_path.glob("best_model.discarded*"))
    assert best_model.put_back(None, run.best, ckpt) == (run.best, None)  # no --best_metric_key: nothing to do


def test_a_checkpoint_before_any_best_leaves_no_best_model_of_discarded_steps(tmp_path):
    run = Run(tmp_path)
    ckpt = run.checkpoint(2)  # no evaluation yet
    assert not (ckpt / best_model.IN_CHECKPOINT).exists()
    run.evaluate(3, 0.5)
    best, said = best_model.put_back(run.best_dir, None, ckpt)
    assert best is None and not run.best_dir.exists()
    assert (tmp_path / "best_model.discarded-step3" / "model.safetensors").is_file()
    assert said == "[best] best_model/ held a model of steps this resume discards; moved to best_model.discarded-step3/"


def test_a_checkpoint_without_a_copy_says_the_next_evaluation_saves_one(tmp_path):
    """A checkpoint written before checkpoints kept best_model/, or whose copy was removed by hand."""
    run = Run(tmp_path)
    run.evaluate(1, 0.3)
    ckpt = run.checkpoint(2)
    shutil.rmtree(ckpt / best_model.IN_CHECKPOINT)
    run.evaluate(3, 0.4)
    run.evaluate(4, 0.5)
    best, said = best_model.put_back(run.best_dir, {"step": 1, "key": "eval/held_out/score_mean", "value": 0.3}, ckpt)
    assert best is None and not run.best_dir.exists()  # the next evaluation of the resumed history saves one
    assert said.endswith("global_step2 keeps no copy of step 1's best model: the next evaluation saves one")
    # a second resume of the same kind does not overwrite what the first moved aside
    run.best = None
    run.evaluate(4, 0.1)
    best_model.put_back(run.best_dir, None, ckpt)
    assert sorted(p.name for p in tmp_path.glob("best_model.discarded*")) == [
        "best_model.discarded-step4",
        "best_model.discarded-step4.1",
    ]
