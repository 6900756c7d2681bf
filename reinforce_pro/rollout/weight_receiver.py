"""vLLM worker extension that loads new policy weights in place, without restarting the engine.

vLLM instantiates this mixin inside each of its workers (`LLM(worker_extension_cls=...)`), so its
methods can be called with `llm.collective_rpc(name, args=...)`. The weights arrive as the bytes of a
safetensors file: tensors inside Python containers would be converted to lists on the way, and a
function cannot be sent at all. `reload_weights(..., is_checkpoint_format=True)` runs the model's own
checkpoint loader, which also repacks weights the CPU backend keeps in a different layout.
With --vllm_sync_backend gloo|nccl the workers instead join a process group with policy rank 0 and receive
the weights by broadcast (rollout/collective.py).
This module must stay importable without Ray or the trainer: vLLM imports it in its workers.
"""

from __future__ import annotations


class WeightSyncExtension:
    def load_weights_from_bytes(self, blob: bytes) -> int:
        """Load a safetensors-serialised HF state dict; returns the number of tensors received."""
        from safetensors.torch import load

        state_dict = load(blob)
        self.reload_weights(weights_iterator=iter(state_dict.items()), is_checkpoint_format=True)
        self._repack_cpu_embedding_gemms()
        self._repack_cpu_moe_experts()
        return len(state_dict)

    def join_weight_group(self, spec, rank_offset: int, host: str) -> int:
        """Join the weight-sync group as rank `rank_offset` + this worker's rank in its engine (replacing any
        group of an earlier run). Returns that rank."""
        from reinforce_pro.rollout.collective import device_for, open_group

        rank = rank_offset + int(getattr(self, "rank", 0))
        self._weight_group = None  # an earlier run's group: dropped before the new rendezvous
        self._weight_group = open_group(spec, rank, host)
        self._weight_device = device_for(spec.backend)
        return rank

    def receive_weights(self, manifest, bucket_bytes: int) -> int:
        """Take one broadcast of the policy's weights, streaming it into the model bucket by bucket."""
        from reinforce_pro.rollout.collective import receive

        stream = receive(self._weight_group, manifest, bucket_bytes, self._weight_device)
        self.reload_weights(weights_iterator=stream, is_checkpoint_format=True)
        self._repack_cpu_embedding_gemms()
        self._repack_cpu_moe_experts()
        return len(manifest)

    def _repack_cpu_embedding_gemms(self) -> None:
        """vLLM's CPU backend computes an LM head with a packed copy of its weight, made when the weights are
        processed after loading (dispatch_cpu_unquantized_gemm: sgl-kernel or oneDNN, chosen by the CPU). A
        tied LM head (tie_word_embeddings: the tiny model, SmolLM2, Qwen2.5-0.5B) is never loaded itself, so an
        in-place reload left it packed from the first weights: on a host whose CPU takes the packed path
        (AVX-512 BF16) every sync after the first sampled with the old LM head over the new model. Re-pack
        every embedding-shaped GEMM from the weights it now shares."""
        from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

        for module in self.model_runner.model.modules():
            method = getattr(module, "quant_method", None)
            if isinstance(method, UnquantizedEmbeddingMethod) and hasattr(module, "cpu_linear"):
                method.process_weights_after_loading(module)

    def _repack_cpu_moe_experts(self) -> None:
        """vLLM's CPU MoE kernel computes with the experts' weights prepacked into its grouped-GEMM layout, made
        when the weights are first processed. On an in-place reload vLLM 0.32 copies the new weights into the
        parameters and skips that step (it sets the kernel up on the first load only), so every sync after the
        first left an MoE engine computing with unpacked weights read as packed ones: samples and log-probs from
        a model nobody trained. Prepack them again. An intermediate size the kernel pads (not a multiple of 32)
        would need the padding redone as well, which is not done here: such a model is refused."""
        from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

        for module in self.model_runner.model.modules():
            kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
            experts = getattr(kernel, "fused_experts", None)
            if not isinstance(experts, CPUUnquantizedExperts) or getattr(experts, "_use_zentorch", False):
                continue
            if (
                experts._padded_intermediate_size(experts.moe_config)
                != experts.moe_config.intermediate_size_per_partition
            ):
                raise NotImplementedError(
                    "in-place weight sync of a CPU MoE engine whose expert size is not a multiple of 32"
                )
            experts.process_weights_after_loading(module)

    def start_route_capture(self, experts_per_token: int) -> int:
        """Record each MoE layer's top-k experts of every token this worker's forwards see
        (rollout/route_capture.py); returns the number of MoE layers."""
        from reinforce_pro.rollout.route_capture import RouteRecorder

        self._route_recorder = RouteRecorder(self.model_runner, experts_per_token)
        return len(self._route_recorder.routers)

    def take_routes(self, request_ids: list[str]) -> dict:
        """The routes recorded for these requests (RouteRecorder.take)."""
        return self._route_recorder.take(request_ids)

    def reseed(self, seed: int) -> None:
        """Reset the sampler's random state: requests without a seed of their own draw from torch's default
        generator of this worker (and Python's random), so the same seed and weights sample the same tokens."""
        import random

        import torch

        random.seed(seed)
        torch.manual_seed(seed)
