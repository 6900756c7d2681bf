"""vLLM's ahead-of-time compile cache on CPU (EngineConfig.aot_compile): a second start from the same model
directory loads the compiled model instead of compiling it, and the loaded model computes with the weights
the engine holds now (a weight sync reaches it), exactly as the freshly compiled one does.

Each start is its own process with its own empty vLLM cache directory (the suite otherwise keeps the graph
cache: tests/conftest.py); the first compiles the tiny model from scratch (~20 s on 2 cores)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytestmark = pytest.mark.e2e  # starts vLLM engines

ROOT = Path(__file__).resolve().parents[1]

ENGINE_START = """
import json, sys
from safetensors.torch import load_file, save
from reinforce_pro.rollout.vllm_engine import EngineConfig, VLLMEngine
from vllm.compilation.counter import compilation_counter

model, perturbed = sys.argv[1], sys.argv[2]
engine = VLLMEngine(EngineConfig(model_path=model, dtype="float32", max_model_len=64, aot_compile=True))
loaded = compilation_counter.num_aot_artifacts_loaded
prompts = [[1, 20, 21, 14, 30], [1, 40, 41], [1, 25, 11, 25, 29, 30, 17]]
greedy = {"temperature": 0.0, "max_tokens": 12}
before = [(g.token_ids, g.log_probs) for g in engine.generate(prompts, greedy)]
engine.update_weights(save(load_file(perturbed)))
after = [(g.token_ids, g.log_probs) for g in engine.generate(prompts, greedy)]
print("RESULT " + json.dumps({"loaded": loaded, "before": before, "after": after}), flush=True)
"""


def start_engine(model: Path, perturbed: Path, cache: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "VLLM_USE_AOT_COMPILE"}  # the engine's own choice
    env.update(VLLM_CACHE_ROOT=str(cache), PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", ENGINE_START, str(model), str(perturbed)],
        env=env, capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stdout[-3000:] + out.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


def test_a_second_start_loads_the_compiled_model_and_it_follows_weight_syncs(tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    from reinforce_pro.models.tiny import build_tiny_model

    model = build_tiny_model(tmp_path / "model", seed=0)
    weights = load_file(model / "model.safetensors")
    generator = torch.Generator().manual_seed(0)
    perturbed = {k: v + 0.5 * v.std() * torch.randn(v.shape, generator=generator) for k, v in weights.items()}
    save_file(perturbed, tmp_path / "perturbed.safetensors", metadata={"format": "pt"})

    cache = tmp_path / "vllm_cache"
    first = start_engine(model, tmp_path / "perturbed.safetensors", cache)
    assert first["loaded"] == 0  # an empty cache: compiled, then saved
    assert list(cache.rglob("model")), "no ahead-of-time artifact was saved"
    second = start_engine(model, tmp_path / "perturbed.safetensors", cache)
    assert second["loaded"] == 1  # loaded, not compiled again

    assert second["before"] == first["before"]  # the same tokens and log-probs, to the bit
    assert second["after"] == first["after"]
    # the synced weights reached the loaded model: its log-probs moved (a random model's greedy tokens may not)
    pairs = zip(second["after"], second["before"], strict=True)
    moved = [abs(a - b) for (_, after), (_, before) in pairs for a, b in zip(after, before, strict=False)]
    assert max(moved) > 1e-3


@pytest.mark.parametrize(
    "aot_compile, tp, env, want",
    [
        (True, 1, None, True),  # a model directory the user named
        (False, 1, None, False),  # one the run made: the graph cache
        (True, 2, None, False),  # TP workers keep the graph cache
        (True, 1, "0", False),  # VLLM_USE_AOT_COMPILE overrides either way
        (False, 2, "1", True),
    ],
)
def test_which_compile_cache_an_engine_uses(monkeypatch, aot_compile, tp, env, want):
    """The one rule the engine applies and the run's start-up line reports (announce_engines)."""
    from reinforce_pro.rollout.vllm_engine import EngineConfig, uses_aot_cache

    if env is None:
        monkeypatch.delenv("VLLM_USE_AOT_COMPILE", raising=False)
    else:
        monkeypatch.setenv("VLLM_USE_AOT_COMPILE", env)
    assert uses_aot_cache(EngineConfig(model_path="m", aot_compile=aot_compile, tensor_parallel_size=tp)) is want
