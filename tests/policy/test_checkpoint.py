"""Checkpoints in compressed-tensors' layout, checked by compressed-tensors itself in both directions, and by
transformers' compressed-tensors loader."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from qerl.formats import mxfp4, nvfp4
from qerl.layers import MXFP4Config, NVFP4Config, QuantLinear, quantize_
from qerl.policy.checkpoint import load_quantized, save_quantized

ct = pytest.importorskip("compressed_tensors")
CONFIGS = {"nvfp4": NVFP4Config(), "mxfp4": MXFP4Config()}
FMTS = ["nvfp4", "mxfp4"]


def tiny_qwen2(seed: int = 0, tie: bool = True):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=tie)
    return Qwen2ForCausalLM(cfg).eval()


def _quant_layers(model):
    return {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}


@pytest.fixture(scope="module", params=FMTS)
def saved(request, tmp_path_factory):
    fmt = request.param
    model = quantize_(tiny_qwen2(), CONFIGS[fmt])
    path = save_quantized(model, tmp_path_factory.mktemp(fmt) / "ckpt")
    return fmt, model, path


def test_files_names_and_config(saved):
    from compressed_tensors.quantization import QuantizationConfig

    fmt, model, path = saved
    tensors = load_file(str(path / "model.safetensors"))
    q = "model.layers.0.self_attn.q_proj"
    assert tensors[f"{q}.weight_packed"].dtype == torch.uint8 and tensors[f"{q}.weight_packed"].shape == (64, 32)
    if fmt == "nvfp4":
        assert tensors[f"{q}.weight_scale"].dtype == torch.float8_e4m3fn
        assert tensors[f"{q}.weight_scale"].shape == (64, 4)
        gs = tensors[f"{q}.weight_global_scale"]
        assert gs.shape == (1,) and gs.dtype == torch.float32
        layer = model.get_submodule(q)  # compressed-tensors stores the reciprocal: 448 * 6 / amax
        torch.testing.assert_close(gs[0], 1 / layer.global_scale, rtol=1e-7, atol=0)
    else:
        assert tensors[f"{q}.weight_scale"].dtype == torch.uint8 and tensors[f"{q}.weight_scale"].shape == (64, 2)
        assert f"{q}.weight_global_scale" not in tensors
    assert f"{q}.bias" in tensors and f"{q}.weight" not in tensors
    assert "lm_head.weight" not in tensors  # tied to embed_tokens
    cfg = json.loads((path / "config.json").read_text())["quantization_config"]
    assert cfg["format"] == f"{fmt}-pack-quantized" and cfg["ignore"] == ["lm_head"]
    parsed = QuantizationConfig.model_validate(cfg)  # compressed-tensors accepts it
    preset = ct.quantization.preset_name_to_scheme(f"{fmt.upper()}A16", ["Linear"])
    # (compared as dumped: compressed-tensors does not serialise zp_dtype, which symmetric schemes never use)
    assert parsed.config_groups["group_0"].weights.model_dump() == preset.weights.model_dump()


def test_save_load_roundtrip(saved):
    fmt, model, path = saved
    loaded = load_quantized(path)
    ours, theirs = _quant_layers(model), _quant_layers(loaded)
    assert ours.keys() == theirs.keys() and len(ours) == 14
    for n in ours:
        assert torch.equal(ours[n].codes, theirs[n].codes) and torch.equal(ours[n].scale_bits, theirs[n].scale_bits)
        if fmt == "nvfp4":  # one float32 rounding each way through the reciprocal
            torch.testing.assert_close(theirs[n].global_scale, ours[n].global_scale, rtol=1.2e-7, atol=0)
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    ids = torch.randint(0, 96, (2, 10))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=1e-5, atol=1e-5)


def test_load_builds_on_meta_and_fills_every_tensor(tmp_path):
    """load_quantized builds the modules on the meta device (no random initialization of a 7B's linears): every
    parameter and buffer ends up real, in the asked dtype, the rotary inv_freq (not saved) computed from the config,
    an untied lm_head read from the file."""
    model = quantize_(tiny_qwen2(seed=3, tie=False), NVFP4Config())
    path = save_quantized(model, tmp_path / "ckpt")
    loaded = load_quantized(path, dtype=torch.bfloat16)
    tensors = dict(loaded.named_parameters()) | dict(loaded.named_buffers())
    assert not [n for n, t in tensors.items() if t.is_meta]
    assert loaded.model.embed_tokens.weight.dtype == torch.bfloat16 and loaded.model.norm.weight.dtype == torch.bfloat16
    assert loaded.lm_head.weight is not loaded.model.embed_tokens.weight
    torch.testing.assert_close(loaded.lm_head.weight, model.lm_head.weight.to(torch.bfloat16), rtol=0, atol=0)
    torch.testing.assert_close(loaded.model.rotary_emb.inv_freq, model.model.rotary_emb.inv_freq, rtol=0, atol=0)
    ids = torch.randint(0, 96, (2, 10))
    with torch.no_grad():
        ref = load_quantized(path)(ids).logits  # float32
        torch.testing.assert_close(loaded(ids).logits.float(), ref, rtol=0.05, atol=0.05)


def test_compressed_tensors_decompresses_our_file_to_our_values(saved):
    from compressed_tensors.entrypoints.convert import CompressedTensorsDequantizer

    fmt, model, path = saved
    dense = CompressedTensorsDequantizer(path, dtype=torch.float32).validate(load_file(str(path / "model.safetensors")))
    for name, layer in _quant_layers(model).items():
        theirs = dense[f"{name}.weight"]  # their decompressor computes in bfloat16
        ours = layer.weight.to(torch.bfloat16).float()
        if fmt == "mxfp4":
            assert torch.equal(theirs, ours), name
        else:  # they divide by the stored reciprocal, we multiply by ours: at most one bf16 step apart
            torch.testing.assert_close(theirs, ours, rtol=2**-7, atol=0, msg=name)
            assert (theirs == ours).float().mean() > 0.99


def test_transformers_loads_our_file_through_compressed_tensors(saved):
    from transformers import AutoModelForCausalLM
    from transformers.utils.quantization_config import CompressedTensorsConfig

    fmt, model, path = saved
    dense = AutoModelForCausalLM.from_pretrained(path, quantization_config=CompressedTensorsConfig(dequantize=True),
                                                 dtype=torch.float32)
    ids = torch.randint(0, 96, (2, 10))
    with torch.no_grad():
        a, b = dense(ids).logits, model(ids).logits
    assert (a - b).norm() / b.norm() < 1e-2  # bf16 rounding of the decompressed weights only


def _ct_compress(w: torch.Tensor, fmt: str) -> dict[str, torch.Tensor]:
    """compressed-tensors' own quantization of one weight (its qparam helpers + its compressor)."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam

    scheme = ct.quantization.preset_name_to_scheme(f"{fmt.upper()}A16", ["Linear"])
    args = scheme.weights
    groups = w.reshape(w.shape[0], -1, args.group_size)
    gmin, gmax = groups.amin(-1), groups.amax(-1)
    sd = {"weight": w}
    gs = None
    if fmt == "nvfp4":
        gs = generate_gparam(w.min(), w.max())
        sd["weight_global_scale"] = gs
    scale, _ = calculate_qparams(gmin, gmax, args, global_scale=gs)
    sd["weight_scale"] = scale
    compressor = BaseCompressor.get_value_from_registry(f"{fmt}-pack-quantized")
    return compressor.compress(sd, scheme), compressor, scheme


@pytest.mark.parametrize("fmt", FMTS)
def test_our_loader_reads_compressed_tensors_output(fmt, tmp_path):
    from compressed_tensors.quantization import QuantizationConfig

    model = tiny_qwen2(seed=1, tie=False)
    targets = {n: m for n, m in model.named_modules() if n.rsplit(".", 1)[-1] in CONFIGS[fmt].targets}
    tensors, expected = {}, {}
    for name, module in model.state_dict().items():
        if name.rpartition(".")[0] not in targets or name.endswith(".bias"):
            tensors[name] = module
    for name, lin in targets.items():
        packed, compressor, scheme = _ct_compress(lin.weight.detach(), fmt)
        tensors.update({f"{name}.{k}": v for k, v in packed.items()})
        expected[name] = compressor.decompress(dict(packed), scheme)["weight"].float()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp_path / "model.safetensors"))
    qc = QuantizationConfig(config_groups={"group_0": ct.quantization.preset_name_to_scheme(f"{fmt.upper()}A16",
                                                                                            ["Linear"])},
                            ignore=["lm_head"], quantization_status="compressed", format=f"{fmt}-pack-quantized")
    config = model.config.to_dict()
    config["quantization_config"] = {"quant_method": "compressed-tensors", **qc.model_dump(exclude=["quant_method"])}
    (tmp_path / "config.json").write_text(json.dumps(config, default=str))

    loaded = load_quantized(tmp_path)
    layers = _quant_layers(loaded)
    assert layers.keys() == targets.keys()
    for name, layer in layers.items():
        ours = layer.weight.to(torch.bfloat16).float()
        if fmt == "mxfp4":
            assert torch.equal(ours, expected[name]), name
        else:
            torch.testing.assert_close(ours, expected[name], rtol=2**-7, atol=0, msg=name)
        # ... and their codes/scales against our own quantizer on the same weight
        w = targets[name].weight.detach()
        if fmt == "nvfp4":  # same recipe; only float32 rounding order differs (exact E2M1 ties are rare)
            ref = nvfp4.quantize(w)
            assert torch.equal(layer.scale_bits, ref.scales.view(torch.uint8))
            assert (layer.codes == ref.codes).float().mean() > 0.999
        else:  # OCP's floor(log2 amax) - 2 vs compressed-tensors' power of two rounded at E2M1 precision:
            ref = mxfp4.quantize(w)  # theirs is one step larger exactly where amax's mantissa is >= 1.75
            amax = w.reshape(w.shape[0], -1, 32).abs().amax(-1)
            mantissa = amax / torch.exp2(torch.floor(torch.log2(amax)))
            diff = layer.scale_bits.int() - ref.scales.int()
            assert torch.equal(diff, (mantissa >= 1.75).int()), name


def test_bad_quantization_config_is_rejected(saved, tmp_path):
    fmt, model, path = saved
    for f in path.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"]["format"] = "int-quantized"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"format is 'int-quantized'"):
        load_quantized(tmp_path)
    cfg["quantization_config"]["format"] = f"{fmt}-pack-quantized"
    cfg["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] = 64
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"group_size is 64"):
        load_quantized(tmp_path)


def test_save_refuses_unquantized_model(tmp_path):
    with pytest.raises(ValueError, match="exactly one format"):
        save_quantized(tiny_qwen2(), tmp_path / "x")
