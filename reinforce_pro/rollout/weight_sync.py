"""vLLM worker extension that loads new policy weights in place, without restarting the engine.

vLLM instantiates this mixin inside each of its workers (`LLM(worker_extension_cls=...)`), so its
methods can be called with `llm.collective_rpc(name, args=...)`. The weights arrive as the bytes of a
safetensors file: tensors inside Python containers would be converted to lists on the way, and a
function cannot be sent at all. `reload_weights(..., is_checkpoint_format=True)` runs the model's own
checkpoint loader, which also repacks weights the CPU backend keeps in a different layout.
This module must stay importable without Ray or the trainer: vLLM imports it in its workers.
"""

from __future__ import annotations


class WeightSyncExtension:
    def load_weights_from_bytes(self, blob: bytes) -> int:
        """Load a safetensors-serialised HF state dict; returns the number of tensors received."""
        from safetensors.torch import load

        state_dict = load(blob)
        self.reload_weights(weights_iterator=iter(state_dict.items()), is_checkpoint_format=True)
        return len(state_dict)
