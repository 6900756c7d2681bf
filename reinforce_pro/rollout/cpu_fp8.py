"""An FP8 engine's matmuls on CPU, kept off oneDNN's reference kernel.

vLLM's CPU build serves `--vllm_quantization fp8_per_channel` (FP8 weights, activations quantized to FP8 per
token) with its ChannelWiseTorchFP8ScaledMMLinearKernel: one `torch._scaled_mm` of the two FP8 operands with
unit scales and an fp32 output, then both scales applied. PyTorch hands that call to oneDNN whenever the CPU
reports AMX-INT8 (Sapphire Rapids and later), and oneDNN has no FP8 matmul for such a CPU: it runs its
reference kernel, a scalar loop orders of magnitude slower than the product PyTorch computes on any other CPU
(the operands widened to fp32, one fp32 matmul). An FP8 engine then spends seconds on an engine step of a
2-layer model (benchmarks/bench_cpu_fp8.py measures both).

The kernel here is vLLM's, with that product computed as on those other CPUs. FP8 values widen to fp32
exactly and each product of two is exact in fp32, so only the order of the sums could differ from the
reference kernel's; benchmarks/bench_cpu_fp8.py checks the engine's tokens and log-probs are equal. CPUs with
native AMX-FP8 keep vLLM's own kernel for them, which comes first in vLLM's list.
"""

from __future__ import annotations

import functools
import math


@functools.cache
def fp32_product_kernel():
    """The kernel class (one per process): vLLM's channel-wise FP8 kernel whose matmul is `A.float() @ B.float()`."""
    import torch
    from vllm.model_executor.kernels.linear.scaled_mm.pytorch import ChannelWiseTorchFP8ScaledMMLinearKernel
    from vllm.platforms import current_platform

    class CPUFp8Fp32ProductKernel(ChannelWiseTorchFP8ScaledMMLinearKernel):
        @classmethod
        def is_supported(cls, compute_capability: int | None = None) -> tuple[bool, str | None]:
            return (True, None) if current_platform.is_cpu() else (False, "a CPU kernel")

        def apply_scaled_mm(self, *, A, B, out_dtype, As, Bs, bias, output_shape):
            # A (M', K) FP8 activations (M' >= M rows when padded), B (K, N) FP8 weights,
            # As (M', 1) per-token scales, Bs (N, 1) per-channel scales; returns output_shape
            rows = math.prod(output_shape[:-1])
            output = torch.mm(A.to(torch.float32), B.to(torch.float32))[:rows]
            output = output * As[:rows] * Bs.t()  # the parent's order of the two scalings
            if bias is not None:
                output = output + bias
            return output.to(out_dtype).view(*output_shape)

    return CPUFp8Fp32ProductKernel


def use_fp32_product_on_cpu() -> None:
    """Put the kernel ahead of vLLM's channel-wise FP8 kernel in this process's list of CPU FP8 kernels, so the
    engine built next picks it. Idempotent; a vLLM that moved the list fails here, not silently slow."""
    from vllm.model_executor.kernels import linear
    from vllm.model_executor.kernels.linear.scaled_mm.pytorch import ChannelWiseTorchFP8ScaledMMLinearKernel
    from vllm.platforms import PlatformEnum

    kernels, ours = linear._POSSIBLE_FP8_KERNELS[PlatformEnum.CPU], fp32_product_kernel()
    if ours not in kernels:
        kernels.insert(kernels.index(ChannelWiseTorchFP8ScaledMMLinearKernel), ours)
