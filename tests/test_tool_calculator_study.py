"""studies/tool_calculator.py: the warm start shows the model exactly the prompts the agents' episodes give the
engine, in each arm's format, so what RL starts from is what the warm start taught."""

from __future__ import annotations

import pytest

pytest.importorskip("openai")
pytest.importorskip("fastapi")

from reinforce_pro.agents.agent_file import load_agent  # noqa: E402
from studies import tool_calculator as study  # noqa: E402
from tests.test_openai_agents import ScriptedEngine, source_for  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer():
    pytest.importorskip("transformers")
    from reinforce_pro.models.tiny import build_tokenizer

    return build_tokenizer()


@pytest.mark.parametrize("arm", list(study.ARMS))
def test_the_warm_starts_tool_demonstration_is_what_an_episode_gives_the_engine(tokenizer, arm):
    examples = study.demonstrations(arm, 16, 0, tokenizer)
    call, answer = next((a, b) for a, b in zip(examples, examples[1:], strict=False) if b["prompt"].startswith(
        a["prompt"]) and len(b["prompt"]) > len(a["prompt"]))  # fmt: skip
    direct = next(e for e in examples if e["label"].isdigit() and e["prompt"] != answer["prompt"])
    # an episode in which the model samples the demonstrated call, then the demonstrated answer
    record = call["prompt"].split("user: ")[-1].split("\n")[0] if arm == "tools" else call["prompt"]
    engine = ScriptedEngine(tokenizer, {record: [call["label"]], call["label"]: ["0"]})  # the longest key wins
    source = source_for(tokenizer, engine, load_agent(study.ARMS[arm]), max_len=256, max_new=96)
    try:
        source.generate([{"prompt": record, "label": answer["label"]}], 1)
    finally:
        source.close()
    given = [tokenizer.decode(ids, skip_special_tokens=False) for ids in engine.given]
    assert given == [tokenizer.bos_token + call["prompt"], tokenizer.bos_token + answer["prompt"]]
    assert direct["prompt"].endswith("assistant: " if arm == "tools" else "=")
    share = sum(e["label"].startswith(("<tool_call>", "calc(")) for e in examples) / 16
    assert 0.2 < share < 0.8  # about TOOL_SHARE of the records carry a call
