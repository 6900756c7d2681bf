"""What a real tokenizer brings that the built-in char model does not (tests/bpe_model.py): a response that
ends with EOS is a finished response, not a truncated one; a tokenizer without a pad token still pads;
the chat template's prompt is encoded without a BOS being invented. No engine here: Generations are
built by hand as the vLLM engine returns them."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("ray")

from bpe_model import build_bpe_llama  # noqa: E402

from reinforce_pro.data.prompts import PromptConfig, build_prompts  # noqa: E402
from reinforce_pro.rollout.sampler import RolloutConfig, Sampler, pad_token_id  # noqa: E402
from reinforce_pro.rollout.vllm_engine import Generation  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(build_bpe_llama(tmp_path_factory.mktemp("bpe") / "llama"))


def test_eos_ends_a_response_without_truncating_it_and_padding_needs_no_pad_token(tokenizer):
    eos = tokenizer.eos_token_id
    assert tokenizer.pad_token_id is None and pad_token_id(tokenizer) == eos
    sampler = Sampler(engines=None, tokenizer=tokenizer, cfg=RolloutConfig(max_new_tokens=4))
    answer = tokenizer("12", add_special_tokens=False)["input_ids"]
    generations = [
        Generation(answer + [eos], [-0.5] * (len(answer) + 1), "stop"),  # stopped on EOS
        Generation([7, 8, 9, 10], [-1.0] * 4, "length"),  # hit --max_new_tokens
    ]
    prompts = [[5, 6, 7], [5]]
    samples = sampler.to_samples(prompts, generations, ["p1", "p2"], ["12", "x"], torch.tensor([0, 1]))
    assert samples.truncated.tolist() == [False, True]
    # the EOS token is an action (the policy learns to stop), the response text does not carry it
    row0 = samples.action_mask[0].tolist()
    assert row0 == [True] * (len(answer) + 1) + [False] * (4 - len(answer) - 1)
    assert samples.responses[0] == "12"
    # padding: left of the short prompt, right of the short response, filled with EOS under attention 0
    assert samples.sequences[1, :2].tolist() == [eos, eos] and samples.attention_mask[1, :2].tolist() == [0, 0]
    width = samples.sequences.size(1)
    assert samples.attention_mask[0].tolist() == [1] * (3 + len(answer) + 1) + [0] * (width - 3 - len(answer) - 1)


def test_chat_template_prompt_is_encoded_as_rendered(tokenizer):
    prompts = build_prompts([{"q": "What is 3 + 4?", "a": "7"}], PromptConfig("q", "a", None, True), tokenizer, "x")
    text = prompts[0]["prompt"]
    assert text == "<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n<|im_start|>assistant\n"
    ids = Sampler(None, tokenizer, RolloutConfig(prompt_max_len=64)).encode(text)
    assert ids == tokenizer(text, add_special_tokens=False)["input_ids"]  # no BOS token invented
    assert tokenizer.decode(ids) == text  # special tokens survive the round trip
