"""The FP8 engine's CPU kernel (rollout/cpu_fp8.py): vLLM picks it for --vllm_quantization fp8_per_channel, and
it computes what vLLM's own kernel does, to the bit, without oneDNN's reference matmul."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from vllm.model_executor.kernels import linear  # noqa: E402
from vllm.model_executor.kernels.linear.scaled_mm.pytorch import ChannelWiseTorchFP8ScaledMMLinearKernel  # noqa: E402
from vllm.model_executor.kernels.linear.scaled_mm.ScaledMMLinearKernel import (  # noqa: E402
    FP8ScaledMMLinearLayerConfig,
)
from vllm.model_executor.layers.quantization.utils.quant_utils import (  # noqa: E402
    kFp8DynamicTokenSym,
    kFp8StaticChannelSym,
)
from vllm.platforms import PlatformEnum  # noqa: E402

from reinforce_pro.rollout.cpu_fp8 import fp32_product_kernel, use_fp32_product_on_cpu  # noqa: E402


@pytest.fixture
def cpu_kernels(monkeypatch):
    """vLLM's list of CPU FP8 kernels, a copy of it for the test's duration."""
    kernels = list(linear._POSSIBLE_FP8_KERNELS[PlatformEnum.CPU])
    monkeypatch.setitem(linear._POSSIBLE_FP8_KERNELS, PlatformEnum.CPU, kernels)
    return kernels


def operands(rows: int, padded: int, k: int, n: int, seed: int, out_dtype: torch.dtype):
    """What the kernel gets for one layer: FP8 activations padded to `padded` rows with per-token scales, FP8
    weights (K, N) with per-channel scales, a bias."""
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(padded, k, generator=g) * 4).to(torch.float8_e4m3fn)
    b = (torch.randn(n, k, generator=g) * 4).to(torch.float8_e4m3fn).t()  # column-major, as vLLM keeps it
    scales_a, scales_b = torch.rand(padded, 1, generator=g) / 50, torch.rand(n, 1, generator=g) / 50
    return dict(A=a, B=b, As=scales_a, Bs=scales_b, bias=torch.randn(n, generator=g).to(out_dtype),
                out_dtype=out_dtype, output_shape=[rows, n])  # fmt: skip


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("rows, padded, k, n", [(17, 17, 128, 384), (5, 17, 384, 128), (40, 40, 128, 256)])
def test_the_kernel_computes_what_vllms_channel_wise_kernel_does_to_the_bit(rows, padded, k, n, out_dtype):
    """The 2-layer study model's shapes (hidden 128, MLP 384), decode-sized batches, one padded; the engine's
    bf16 output and fp32, where no rounding of the output could hide a difference. vLLM's kernel runs
    torch._scaled_mm as dispatched on this CPU (oneDNN's reference matmul on AMX-INT8 hosts, the widened
    product elsewhere)."""
    ours = fp32_product_kernel()
    for seed in range(3):
        inputs = operands(rows, padded, k, n, seed, out_dtype)
        expected = ChannelWiseTorchFP8ScaledMMLinearKernel.apply_scaled_mm(None, **inputs)
        got = ours.apply_scaled_mm(None, **inputs)
        assert got.shape == (rows, n) and got.dtype == out_dtype
        assert torch.equal(got, expected)
        with_scales = (inputs["A"][:rows].float() * inputs["As"][:rows]) @ (inputs["B"].float() * inputs["Bs"].t())
        assert (got.float() - inputs["bias"].float() - with_scales).abs().max() < 0.05 * with_scales.abs().max()


def test_vllm_picks_the_kernel_for_a_per_channel_fp8_layer_once_registered(cpu_kernels):
    """In place of vLLM's channel-wise kernel; a CPU with native AMX-FP8 keeps vLLM's kernel for it."""
    config = FP8ScaledMMLinearLayerConfig(
        weight_quant_key=kFp8StaticChannelSym,
        activation_quant_key=kFp8DynamicTokenSym,
        input_dtype=torch.bfloat16,
        out_dtype=torch.bfloat16,
        weight_shape=(384, 128),
    )

    def chosen():
        return linear.choose_scaled_mm_linear_kernel(config, linear._POSSIBLE_FP8_KERNELS, quantization="fp8_w8a8")

    before = chosen()
    use_fp32_product_on_cpu()
    use_fp32_product_on_cpu()  # twice: one entry
    names = [k.__name__ for k in cpu_kernels]
    assert names.count("CPUFp8Fp32ProductKernel") == 1
    assert names.index("CPUFp8Fp32ProductKernel") == names.index("ChannelWiseTorchFP8ScaledMMLinearKernel") - 1
    if before is ChannelWiseTorchFP8ScaledMMLinearKernel:
        assert chosen().__name__ == "CPUFp8Fp32ProductKernel"
    else:
        assert chosen() is before
