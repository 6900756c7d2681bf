"""Agent frameworks against the live endpoint, through the rollout source that trains their episodes
(agents/openai_agents.py): the guide-style tool agent (OpenAI SDK), LangGraph's prebuilt ReAct agent on
ChatOpenAI, and the OpenAI Agents SDK on the Responses API, each from its example file. A scripted engine answers
the first turn with a tool call and the second with the answer, so each episode is: prompt, sampled call, the
tool's result (environment tokens), sampled answer; every trained row is checked id for id against what the
engine was given and sampled."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("openai")

from reinforce_pro.agents.agent_file import load_agent  # noqa: E402
from tests.test_openai_agents import ScriptedEngine, prompt_of, source_for  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "python"
CALL = '<tool_call>{"name":"add","arguments":{"a":3,"b":4}}</tool_call>'


@pytest.fixture(scope="module")
def tokenizer():
    pytest.importorskip("transformers")
    from reinforce_pro.models.tiny import build_tokenizer

    return build_tokenizer()


def episodes_of(tokenizer, example: str, n: int = 2):
    # a prompt that has the tool's result in it gets the answer; one that has not, the call
    engine = ScriptedEngine(tokenizer, {"3+4=": [CALL], "tool: 7": ["7"]})
    source = source_for(tokenizer, engine, load_agent(EXAMPLES / example), max_len=256, max_new=96)
    try:
        return engine, source.generate([{"prompt": "3+4=", "label": "7"}], n)
    finally:
        source.close()


def assert_rows_are_what_the_engine_sampled(tokenizer, engine, samples):
    """Each row: the first call's prompt, its sampled call, the tool result the framework sent back (mask 0),
    the sampled answer, with the engine's log-probs; the rows are distinct pairs of engine calls."""
    t, used = samples.num_actions, set()
    for row in range(samples.sequences.shape[0]):
        prompt = prompt_of(samples, row)
        pairs = [(a, b) for a, given in enumerate(engine.given) if given == prompt for b, later in
                 enumerate(engine.given) if later[: len(prompt) + len(engine.sampled[a].token_ids)] ==
                 prompt + engine.sampled[a].token_ids and len(later) > len(prompt)]  # fmt: skip
        matched = [pair for pair in pairs if _row_is(tokenizer, engine, samples, row, t, *pair)]
        assert len(matched) == 1 and matched[0] not in used, (row, pairs)
        used.add(matched[0])


def _row_is(tokenizer, engine, samples, row: int, t: int, first: int, second: int) -> bool:
    call, answer = engine.sampled[first], engine.sampled[second]
    prompt = engine.given[first]
    environment = engine.given[second][len(prompt) + len(call.token_ids) :]
    assert tokenizer.decode(environment, skip_special_tokens=False) == "\ntool: 7\nassistant: "
    want = call.token_ids + environment + answer.token_ids
    mask = [True] * len(call.token_ids) + [False] * len(environment) + [True] * len(answer.token_ids)
    lp = torch.tensor(call.log_probs + [0.0] * len(environment) + answer.log_probs)
    return (samples.sequences[row, -t:][: len(want)].tolist() == want
            and samples.action_mask[row, : len(want)].tolist() == mask
            and torch.equal(samples.rollout_log_probs[row, : len(want)], lp))  # fmt: skip


@pytest.mark.parametrize(
    "example, needs",
    [
        ("agent_calculator_tools.py", None),
        ("agent_langgraph.py", "langgraph"),
        ("agent_openai_agents_sdk.py", "agents"),
    ],
)
def test_a_frameworks_tool_agent_trains_the_ids_the_engine_sampled(tokenizer, example, needs):
    if needs:
        pytest.importorskip(needs)
    engine, samples = episodes_of(tokenizer, example)
    assert samples.metrics["agent/tool_calls_mean"] == 1.0 and samples.metrics["agent/tool_call_failures"] == 0
    assert samples.metrics["agent/segment_forks"] == 0 and samples.metrics["agent/rows"] == 2
    assert samples.metrics["agent/dropped_episodes"] == 0
    assert samples.rewards.rewards.tolist() == pytest.approx([0.8, 0.8] if "tools" in example else [1.0, 1.0])
    assert_rows_are_what_the_engine_sampled(tokenizer, engine, samples)
    first = tokenizer.decode(engine.given[0], skip_special_tokens=False)
    assert first.startswith("<bos>tools: add(a, b)\n")  # the tool was rendered for the model


def test_structured_output_from_langchain_and_the_agents_sdk_is_refused_by_name(tokenizer):
    """LangChain's with_structured_output and the Agents SDK's output_type on its chat model send response_format
    (a JSON schema); guided decoding would mask the distribution the trainer scores under, so the endpoint refuses
    it with a 400 naming the field (it had dropped it without a word, and the framework then failed to parse)."""
    langchain_openai = pytest.importorskip("langchain_openai")
    agents = pytest.importorskip("agents")
    import asyncio

    import openai
    from pydantic import BaseModel

    from reinforce_pro.agents.openai_endpoint import Endpoint
    from tests.test_openai_agents import RUN_SAMPLING

    class Sum(BaseModel):
        value: int

    endpoint = Endpoint(tokenizer, ScriptedEngine(tokenizer, {"": ['{"value": 7}']}), RUN_SAMPLING, max_len=128)
    endpoint.start()
    try:
        sid = endpoint.open_session()
        chat = langchain_openai.ChatOpenAI(base_url=f"{endpoint.url}/s/{sid}/v1", api_key="none", model="policy",
                                           max_retries=0)  # fmt: skip
        with pytest.raises(openai.BadRequestError, match="structured output is not served") as refused:
            chat.with_structured_output(Sum).invoke("3+4=")
        assert refused.value.body["param"] == "response_format"
        client = openai.AsyncOpenAI(base_url=f"{endpoint.url}/s/{sid}/v1", api_key="none", max_retries=0)
        model = agents.OpenAIChatCompletionsModel(model="policy", openai_client=client)
        agent = agents.Agent(name="adder", instructions="Add.", model=model, output_type=Sum)
        with pytest.raises(openai.BadRequestError, match="structured output is not served"):
            asyncio.run(agents.Runner.run(agent, "3+4=", run_config=agents.RunConfig(tracing_disabled=True)))
        assert endpoint.close_session(sid).trajectory.calls == 0
    finally:
        endpoint.stop()
