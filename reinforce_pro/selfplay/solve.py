"""How a self-play solver answers: one completion per question, or, for a task with a solver agent (the search
task), one multi-turn episode of that agent per question, or, with --agent_func_path naming an OpenAI-SDK agent,
one episode of that agent against the trainer's endpoint (agents/openai_agents.py). The training step and the
held-out ladder both answer through `solve`, so they see the solver the same way.
"""

from __future__ import annotations

from reinforce_pro.agents.episode import Episode
from reinforce_pro.agents.runner import AgentConfig, AgentRunner
from reinforce_pro.rollout.sampler import Sampler
from reinforce_pro.selfplay.controller import Rollout
from reinforce_pro.selfplay.tasks import Question, SelfPlayTask


def solve(
    sampler: Sampler, task: SelfPlayTask, questions: list[Question], sampling: dict, max_len: int, sdk_agent=None
) -> list[Rollout]:
    """One solver Rollout per question, in order, sampled with `sampling` (vLLM keywords, complete). A single
    completion keeps (prompt ids, Generation) as its `generation`; an episode keeps its agents.episode.Episode,
    and its `text` is the episode's last model turn (what the task scores: the search agent's <answer>).
    `max_len` bounds an episode (prompt and every turn). `sdk_agent`: an OpenAIAgentSource whose agent answers
    instead of the task's own (an episode's rewritten history: its earlier segments are the Rollout's `forks`)."""
    prompts = [task.solver_prompt(q) for q in questions]
    labels = [q.meta.get("label", q.answer) for q in questions]
    if sdk_agent is not None:
        if not questions:
            return []
        answered = sdk_agent.answer(prompts, labels, sampling)
        return [Rollout(p, last_model_turn(lead, sampler.tokenizer), lead, forks)
                for p, (lead, forks, _) in zip(prompts, answered, strict=True)]  # fmt: skip
    agent = getattr(task, "solver_agent", lambda: None)()  # task files are duck-typed
    if agent is None:
        ids, generations, texts = sampler.sample_texts(prompts, sampling)
        return [Rollout(p, t, (i, g)) for p, t, i, g in zip(prompts, texts, ids, generations, strict=True)]
    if not questions:
        return []
    cfg = AgentConfig(max_turns=task.solver_turns, max_len=max_len, prompt_max_len=sampler.cfg.prompt_max_len)
    runner = AgentRunner(agent, sampler.tokenizer, sampler.sample, sampling, cfg)
    batch = [{"prompt": p, "label": label} for p, label in zip(prompts, labels, strict=True)]
    episodes = runner.run_episodes(batch, n=1)
    return [Rollout(p, last_model_turn(e, sampler.tokenizer), e) for p, e in zip(prompts, episodes, strict=True)]


def last_model_turn(episode: Episode, tokenizer) -> str:
    spans = [(start, end) for start, end, kind in episode.step_meta.get("turn_spans", []) if kind == "model"]
    if not spans:
        return ""
    start, end = spans[-1]
    return tokenizer.decode(episode.tokens[start:end], skip_special_tokens=True)
