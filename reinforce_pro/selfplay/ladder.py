"""The held-out ladder of a self-play task: the solver's greedy accuracy on fixed questions per
difficulty level, so a run shows how far the solver follows the proposer's curriculum. The trainer runs it
like an --eval_dataset (every --eval_steps, and before training with --eval_before_training)."""

from __future__ import annotations

from collections.abc import Callable

from reinforce_pro.rollout.sampler import Sampler, sampling_params
from reinforce_pro.selfplay.solve import solve
from reinforce_pro.selfplay.tasks import Question, SelfPlayTask, role_sampling


class LadderEval:
    name = "ladder"

    def __init__(self, task: SelfPlayTask, levels: dict[str, list[Question]], max_len: int = 2048, sdk_agent=None):
        self.task, self.levels, self.max_len = task, levels, max_len  # max_len bounds an agent task's episodes
        self.sdk_agent = sdk_agent  # --agent_func_path: the OpenAI-SDK solver (selfplay/solve.py)

    def metric_names(self) -> list[str]:
        return [f"eval/ladder/{level}/accuracy" for level in self.levels] + ["eval/ladder/accuracy_mean"]

    def run(self, sampler: Sampler, score: Callable | None = None) -> dict[str, float]:
        """One greedy response (or episode, for an agent task) per question. A response is right when it scores
        >= the threshold of every learnability dimension of the task (for arithmetic: the exact value)."""
        questions = [q for level in self.levels.values() for q in level]
        sampling = {**role_sampling(sampling_params(sampler.cfg), self.task.sampling.get("solver")), "temperature": 0.0}
        responses = [r.text for r in solve(sampler, self.task, questions, sampling, self.max_len, self.sdk_agent)]
        right = [self._right(q, r) for q, r in zip(questions, responses, strict=True)]
        metrics, start = {}, 0
        for level, items in self.levels.items():
            metrics[f"eval/ladder/{level}/accuracy"] = sum(right[start : start + len(items)]) / len(items)
            start += len(items)
        metrics["eval/ladder/accuracy_mean"] = sum(right) / len(right)
        return metrics

    def _right(self, question: Question, response: str) -> bool:
        scored = self.task.score(question, [response])
        return all(scored.scores[d][0] >= threshold for d, (threshold, _, _) in self.task.thresholds.items())
