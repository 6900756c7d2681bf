"""The collective weight sync's parts without Ray or vLLM: buckets, a real gloo broadcast between processes,
and the ZeRO-3 walk that gathers one layer at a time (rollout/collective.py, models/lora.py)."""

from __future__ import annotations

import contextlib
import multiprocessing
import tempfile

import pytest

torch = pytest.importorskip("torch")

from reinforce_pro.models.lora import LoraAdapterConfig, apply_lora, merged_state_dict, merged_weights, weight_blocks  # noqa: E402
from reinforce_pro.rollout.collective import TensorInfo, WeightGroupSpec, buckets, open_group, receive, send  # noqa: E402


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "small": torch.randn(3, 4, generator=g),
        "large": torch.randn(100, generator=g),  # 400 bytes: over the 256-byte bucket, sent alone
        "half": torch.randn(5, 5, generator=g).to(torch.bfloat16),  # another dtype: a bucket of its own
        "last": torch.randn(7, generator=g),
    }


def test_buckets_keep_order_split_on_size_and_dtype():
    manifest = [TensorInfo(k, tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in _tensors().items()]
    assert [[i.name for i in b] for b in buckets(manifest, 256)] == [["small"], ["large"], ["half"], ["last"]]
    assert [[i.name for i in b] for b in buckets(manifest, 10**6)] == [["small", "large"], ["half"], ["last"]]


def _member(rank: int, spec: WeightGroupSpec, results) -> None:
    group = open_group(spec, rank, "127.0.0.1")
    tensors = _tensors()
    manifest = [TensorInfo(k, tuple(v.shape), str(v.dtype).removeprefix("torch.")) for k, v in tensors.items()]
    if rank == 0:
        results.put((0, send(group, tensors.items(), manifest, 256, torch.device("cpu"))))
        return
    got = dict(receive(group, manifest, 256, torch.device("cpu")))
    results.put((rank, list(got) == list(tensors) and all(torch.equal(got[k], tensors[k]) for k in tensors)))


def test_gloo_broadcast_reaches_every_member_intact():
    spec = WeightGroupSpec("gloo", f"file://{tempfile.mktemp(prefix='rp_weights_')}", world_size=3, timeout_s=60)
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_member, args=(rank, spec, results)) for rank in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    got = dict(results.get(timeout=5) for _ in range(3))
    assert got[1] is True and got[2] is True
    assert got[0] == sum(t.numel() * t.element_size() for t in _tensors().values())


def test_send_refuses_tensors_out_of_manifest_order():
    tensors = _tensors()
    manifest = [TensorInfo(k, tuple(v.shape), "float32") for k, v in reversed(tensors.items())]
    with pytest.raises(RuntimeError, match="manifest says"):
        send(None, tensors.items(), manifest, 256, torch.device("cpu"))


def _model(path, lora: bool):
    from transformers import AutoModelForCausalLM

    from reinforce_pro.models.tiny import build_tiny_model

    model = AutoModelForCausalLM.from_pretrained(build_tiny_model(path, seed=0), dtype=torch.float32)
    return apply_lora(model, LoraAdapterConfig(rank=2, alpha=4, target_modules=["all-linear"])) if lora else model


def test_weight_blocks_are_layers_and_single_modules():
    keys = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.base_layer.weight",
            "model.layers.0.self_attn.q_proj.lora_A.default.weight", "model.layers.0.mlp.up_proj.weight",
            "model.layers.1.input_layernorm.weight", "lm_head.base_layer.weight", "lm_head.lora_B.default.weight",
            "model.norm.weight"]  # fmt: skip
    assert weight_blocks(keys) == [
        ["model.embed_tokens.weight"],
        keys[1:4],
        ["model.layers.1.input_layernorm.weight"],
        ["lm_head.base_layer.weight", "lm_head.lora_B.default.weight"],
        ["model.norm.weight"],
    ]


@pytest.mark.parametrize("lora", [False, True])
def test_merged_weights_gathers_one_layer_at_a_time_and_equals_the_merged_state_dict(tmp_path, lora):
    model = _model(tmp_path / "tiny", lora)
    if lora:  # a non-zero adapter, so the merge is visible
        for name, p in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p)
    owner = {id(p): name.split(".layers.")[1].split(".")[0] if ".layers." in name else name
             for name, p in model.named_parameters()}  # fmt: skip
    gathered: list[set[str]] = []

    @contextlib.contextmanager
    def gather(params):
        gathered.append({owner[id(p)] for p in params})
        yield

    streamed = {name: t.float().clone() for name, t in merged_weights(model, gather)}
    assert all(len(units) == 1 for units in gathered), gathered  # never two layers (or modules) at once
    assert {u for units in gathered for u in units} == set(owner.values())  # every parameter was gathered
    whole = merged_state_dict(model)
    assert streamed.keys() == whole.keys() and all(torch.equal(streamed[k], whole[k]) for k in whole)
    assert not any("lora_" in k or "base_layer" in k for k in streamed)


@pytest.mark.parametrize("lora", [False, True])
def test_a_sync_sends_a_tied_lm_head_once_and_gathers_nothing_for_it(tmp_path, lora):
    """The tiny model ties its LM head to the embedding: a sync sends the weight once, under the embedding's
    name (vLLM's loader skips a tied head's weight), and opens no ZeRO-3 gather for the head's block, since
    rank 0 stops reading after the last weight it sends while the other ranks walk every block."""
    model = _model(tmp_path / "tiny", lora)
    assert model.config.tie_word_embeddings
    gathered: list[int] = []

    @contextlib.contextmanager
    def gather(params):
        gathered.append(len(params))
        yield

    whole = merged_state_dict(model)
    sent = {name: t.float().clone() for name, t in merged_weights(model, gather, skip_tied=True)}
    assert "lm_head.weight" in whole and sent.keys() == whole.keys() - {"lm_head.weight"}
    assert all(torch.equal(sent[k], whole[k]) for k in sent)
    assert torch.equal(whole["lm_head.weight"], sent["model.embed_tokens.weight"])
    blocks = {tuple(block) for block in weight_blocks(list(model.state_dict()))}
    assert len(gathered) == len(blocks) - 1  # every block but the head's


@pytest.mark.parametrize(
    "argv, use_gpu, want",
    [
        ([], False, "gloo"),  # OpenRLHF's default nccl on a CPU-only cluster: the same broadcast over gloo
        ([], True, "nccl"),
        (["--colocate_all_models"], True, "object_store"),  # NCCL refuses two ranks on one GPU
        (["--colocate_all_models"], False, "gloo"),
        (["--rollout_staleness", "1"], False, "object_store"),  # only the object store keeps older weights
        (["--vllm_sync_backend", "gloo"], True, "gloo"),
        (["--vllm_sync_backend", "object_store"], False, "object_store"),
        (["--vllm_sync_with_ray"], True, "object_store"),
    ],
)
def test_sync_backend_resolution(argv, use_gpu, want, capsys):
    pytest.importorskip("ray")
    from reinforce_pro.cli.flags_to_config import run_config
    from reinforce_pro.cli.train_ppo_ray import parse_args
    from reinforce_pro.run.start import sync_backend

    assert sync_backend(run_config(parse_args(argv)), use_gpu) == want
    notice = capsys.readouterr().out
    assert ("[weight sync]" in notice) == (want != "nccl" and not any("sync" in a for a in argv))


def test_gloo_with_staleness_is_refused_in_one_line(capsys):
    from reinforce_pro.cli.train_ppo_ray import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--vllm_sync_backend", "gloo", "--rollout_staleness", "1"])
    assert "only --vllm_sync_backend object_store keeps" in capsys.readouterr().err
