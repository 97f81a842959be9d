#!/usr/bin/env python3
"""Single-file checkpoints of the tiny FLUX.1-dev test transformer in the original layouts.

Input: tests/data/pipelines/flux1_dev_tiny/transformer (diffusers layout, f32). Output in
tests/data/formats/flux_single/:

  flux_bfl.safetensors    BFL (Black Forest Labs) key names: fused img/txt qkv, single blocks'
                          linear1 = [q; k; v; mlp], final_layer.adaLN_modulation.1 in (shift,
                          scale) order, time_in / vector_in / guidance_in / txt_in / img_in
  flux_bfl_f32.gguf       the same tensors as GGUF (gguf.GGUFWriter, architecture "flux", all F32)
  flux_bfl_q8.gguf        the same with the 2-D weights quantized by gguf.quants.quantize (Q8_0,
                          the feed-forward weights Q4_0, Q5_1 for the single blocks' linear2),
                          1-D tensors F32, as city96's files do; the two 256-wide input layers
                          as random Q4_K / Q6_K blocks (gguf-py cannot quantize K types)
  q8_dequant/transformer  a diffusers folder holding what gguf.quants.dequantize gives for
                          flux_bfl_q8.gguf, converted back to diffusers names (config copied)

flux_single/ae_ldm.safetensors: the tiny FLUX.1-dev VAE in LDM names (as BFL's ae.safetensors),
checked against diffusers' `convert_ldm_vae_checkpoint` (bare, under "vae." and under
"first_stage_model."); and tests/data/formats/sd3_single/sd3_sai.safetensors: the tiny SD3.5-Medium test transformer
(tests/data/pipelines/sd35m_tiny, dual attention in blocks 0 and 1, RMS qk norms) in
Stability's key names (joint_blocks.N.{x,context}_block..., fused qkv, the last block's context
modulation and the final one in (shift, scale) order), checked the same way against diffusers'
`convert_sd3_transformer_checkpoint_to_diffusers` (run unchanged).

tests/data/formats/flux2_single/: the tiny FLUX.2-dev test transformer
(tests/data/pipelines/flux2_dev_tiny/transformer: 2 double and 2 single blocks, no biases) in
BFL's FLUX.2 key names:

  flux2_bfl.safetensors   fused img/txt qkv, single blocks' linear1 / linear2 as diffusers'
                          to_qkv_mlp_proj / to_out (same layout, renamed), the modulations shared
                          by all blocks (double_stream_modulation_img/_txt.lin,
                          single_stream_modulation.lin), final_layer.adaLN_modulation.1 in
                          (shift, scale) order, time_in / guidance_in / txt_in / img_in
  flux2_bfl_q8.gguf       the same as city96's FLUX.2 GGUFs hold it: original names, 2-D weights
                          quantized by gguf.quants.quantize (Q8_0; the feed-forward weights Q4_0,
                          the single blocks' linear2 Q5_1), the 1-D norm scales F32
  q8_dequant/transformer  a diffusers folder holding gguf.quants.dequantize of flux2_bfl_q8.gguf
                          converted by diffusers (config copied)

checked against diffusers' own `convert_flux2_transformer_checkpoint_to_diffusers` (run
unchanged: it takes its widths from the tensors). That function handles bare names only (under
"model.diffusion_model." its block handlers misread the block index), so no prefixed FLUX.2
file is made here. The F32 GGUF of this model is written by the tests themselves (cdiffusers'
GGUF writer, from flux2_bfl.safetensors): it would be a third 1.7 MB copy of the same values.

The BFL file is checked against diffusers' own
`single_file_utils.convert_flux_transformer_checkpoint_to_diffusers`: converting it (and the
same dict under ComfyUI's "model.diffusion_model." prefix) must give back exactly the diffusers
tensors. That function hard-codes FLUX.1's inner_dim 3072 for the linear1 split; the check runs
its source with inner_dim replaced by the tiny model's (heads x head dim), nothing else changed.

Usage: /work/venv/bin/python tools/make-format-refs/make_single_file_refs.py [REPO_ROOT]
"""
import inspect
import json
import os
import shutil
import sys

import numpy as np
import torch
import gguf
from gguf import GGMLQuantizationType as Q
from safetensors.torch import load_file, save_file
from diffusers.loaders import single_file_utils


def diffusers_to_bfl(sd, n_double, n_single):
    """The inverse of diffusers' conversion, written from it."""
    out = {}
    top = {
        "time_text_embed.timestep_embedder.linear_1": "time_in.in_layer",
        "time_text_embed.timestep_embedder.linear_2": "time_in.out_layer",
        "time_text_embed.text_embedder.linear_1": "vector_in.in_layer",
        "time_text_embed.text_embedder.linear_2": "vector_in.out_layer",
        "time_text_embed.guidance_embedder.linear_1": "guidance_in.in_layer",
        "time_text_embed.guidance_embedder.linear_2": "guidance_in.out_layer",
        "context_embedder": "txt_in",
        "x_embedder": "img_in",
        "proj_out": "final_layer.linear",
    }
    for d, b in top.items():
        for p in ("weight", "bias"):
            if f"{d}.{p}" in sd:
                out[f"{b}.{p}"] = sd[f"{d}.{p}"]
    for p in ("weight", "bias"):
        scale, shift = sd[f"norm_out.linear.{p}"].chunk(2, dim=0)
        out[f"final_layer.adaLN_modulation.1.{p}"] = torch.cat([shift, scale], dim=0)
    dbl = {"norm1.linear": "img_mod.lin", "norm1_context.linear": "txt_mod.lin", "ff.net.0.proj": "img_mlp.0",
           "ff.net.2": "img_mlp.2", "ff_context.net.0.proj": "txt_mlp.0", "ff_context.net.2": "txt_mlp.2",
           "attn.to_out.0": "img_attn.proj", "attn.to_add_out": "txt_attn.proj"}
    for i in range(n_double):
        pre = f"transformer_blocks.{i}."
        for d, b in dbl.items():
            for p in ("weight", "bias"):
                out[f"double_blocks.{i}.{b}.{p}"] = sd[pre + f"{d}.{p}"]
        for p in ("weight", "bias"):
            out[f"double_blocks.{i}.img_attn.qkv.{p}"] = torch.cat([sd[pre + f"attn.to_{x}.{p}"] for x in "qkv"])
            out[f"double_blocks.{i}.txt_attn.qkv.{p}"] = torch.cat([sd[pre + f"attn.add_{x}_proj.{p}"] for x in "qkv"])
        out[f"double_blocks.{i}.img_attn.norm.query_norm.scale"] = sd[pre + "attn.norm_q.weight"]
        out[f"double_blocks.{i}.img_attn.norm.key_norm.scale"] = sd[pre + "attn.norm_k.weight"]
        out[f"double_blocks.{i}.txt_attn.norm.query_norm.scale"] = sd[pre + "attn.norm_added_q.weight"]
        out[f"double_blocks.{i}.txt_attn.norm.key_norm.scale"] = sd[pre + "attn.norm_added_k.weight"]
    for i in range(n_single):
        pre = f"single_transformer_blocks.{i}."
        for p in ("weight", "bias"):
            out[f"single_blocks.{i}.modulation.lin.{p}"] = sd[pre + f"norm.linear.{p}"]
            out[f"single_blocks.{i}.linear1.{p}"] = torch.cat(
                [sd[pre + f"attn.to_{x}.{p}"] for x in "qkv"] + [sd[pre + f"proj_mlp.{p}"]])
            out[f"single_blocks.{i}.linear2.{p}"] = sd[pre + f"proj_out.{p}"]
        out[f"single_blocks.{i}.norm.query_norm.scale"] = sd[pre + "attn.norm_q.weight"]
        out[f"single_blocks.{i}.norm.key_norm.scale"] = sd[pre + "attn.norm_k.weight"]
    return {k: v.contiguous() for k, v in out.items()}


def diffusers_to_bfl_flux2(sd, n_double, n_single):
    """The inverse of diffusers' FLUX.2 conversion, written from it."""
    out = {}
    top = {
        "x_embedder": "img_in",
        "context_embedder": "txt_in",
        "time_guidance_embed.timestep_embedder.linear_1": "time_in.in_layer",
        "time_guidance_embed.timestep_embedder.linear_2": "time_in.out_layer",
        "time_guidance_embed.guidance_embedder.linear_1": "guidance_in.in_layer",
        "time_guidance_embed.guidance_embedder.linear_2": "guidance_in.out_layer",
        "double_stream_modulation_img.linear": "double_stream_modulation_img.lin",
        "double_stream_modulation_txt.linear": "double_stream_modulation_txt.lin",
        "single_stream_modulation.linear": "single_stream_modulation.lin",
        "proj_out": "final_layer.linear",
    }
    for d, b in top.items():
        for p in ("weight", "bias"):
            if f"{d}.{p}" in sd:
                out[f"{b}.{p}"] = sd[f"{d}.{p}"]
    scale, shift = sd["norm_out.linear.weight"].chunk(2, dim=0)
    out["final_layer.adaLN_modulation.1.weight"] = torch.cat([shift, scale], dim=0)
    dbl = {"attn.to_out.0": "img_attn.proj", "ff.linear_in": "img_mlp.0", "ff.linear_out": "img_mlp.2",
           "attn.to_add_out": "txt_attn.proj", "ff_context.linear_in": "txt_mlp.0", "ff_context.linear_out": "txt_mlp.2"}
    dnorm = {"attn.norm_q": "img_attn.norm.query_norm", "attn.norm_k": "img_attn.norm.key_norm",
             "attn.norm_added_q": "txt_attn.norm.query_norm", "attn.norm_added_k": "txt_attn.norm.key_norm"}
    for i in range(n_double):
        pre = f"transformer_blocks.{i}."
        for d, b in dbl.items():
            out[f"double_blocks.{i}.{b}.weight"] = sd[pre + f"{d}.weight"]
        for d, b in dnorm.items():
            out[f"double_blocks.{i}.{b}.scale"] = sd[pre + f"{d}.weight"]
        out[f"double_blocks.{i}.img_attn.qkv.weight"] = torch.cat([sd[pre + f"attn.to_{x}.weight"] for x in "qkv"])
        out[f"double_blocks.{i}.txt_attn.qkv.weight"] = torch.cat([sd[pre + f"attn.add_{x}_proj.weight"] for x in "qkv"])
    for i in range(n_single):
        pre = f"single_transformer_blocks.{i}."
        out[f"single_blocks.{i}.linear1.weight"] = sd[pre + "attn.to_qkv_mlp_proj.weight"]
        out[f"single_blocks.{i}.linear2.weight"] = sd[pre + "attn.to_out.weight"]
        out[f"single_blocks.{i}.norm.query_norm.scale"] = sd[pre + "attn.norm_q.weight"]
        out[f"single_blocks.{i}.norm.key_norm.scale"] = sd[pre + "attn.norm_k.weight"]
    return {k: v.contiguous() for k, v in out.items()}


def diffusers_to_sai(sd, n_layers):
    """The inverse of diffusers' SD3 conversion, written from it."""
    out = {"pos_embed": sd["pos_embed.pos_embed"]}
    top = {"pos_embed.proj": "x_embedder.proj", "time_text_embed.timestep_embedder.linear_1": "t_embedder.mlp.0",
           "time_text_embed.timestep_embedder.linear_2": "t_embedder.mlp.2",
           "time_text_embed.text_embedder.linear_1": "y_embedder.mlp.0",
           "time_text_embed.text_embedder.linear_2": "y_embedder.mlp.2", "context_embedder": "context_embedder",
           "proj_out": "final_layer.linear"}
    swap = lambda w: torch.cat(list(reversed(w.chunk(2, dim=0))), dim=0)
    for d, b in top.items():
        for p in ("weight", "bias"):
            out[f"{b}.{p}"] = sd[f"{d}.{p}"]
    for p in ("weight", "bias"):
        out[f"final_layer.adaLN_modulation.1.{p}"] = swap(sd[f"norm_out.linear.{p}"])
    blk = {"attn.norm_q": "x_block.attn.ln_q", "attn.norm_k": "x_block.attn.ln_k",
           "attn.norm_added_q": "context_block.attn.ln_q", "attn.norm_added_k": "context_block.attn.ln_k",
           "attn2.norm_q": "x_block.attn2.ln_q", "attn2.norm_k": "x_block.attn2.ln_k",
           "attn.to_out.0": "x_block.attn.proj", "attn.to_add_out": "context_block.attn.proj",
           "attn2.to_out.0": "x_block.attn2.proj", "norm1.linear": "x_block.adaLN_modulation.1",
           "ff.net.0.proj": "x_block.mlp.fc1", "ff.net.2": "x_block.mlp.fc2",
           "ff_context.net.0.proj": "context_block.mlp.fc1", "ff_context.net.2": "context_block.mlp.fc2"}
    for i in range(n_layers):
        pre = f"transformer_blocks.{i}."
        for d, b in blk.items():
            for p in ("weight", "bias"):
                if pre + f"{d}.{p}" in sd:
                    out[f"joint_blocks.{i}.{b}.{p}"] = sd[pre + f"{d}.{p}"]
        for p in ("weight", "bias"):
            w = sd[pre + f"norm1_context.linear.{p}"]
            out[f"joint_blocks.{i}.context_block.adaLN_modulation.1.{p}"] = swap(w) if i == n_layers - 1 else w
            out[f"joint_blocks.{i}.x_block.attn.qkv.{p}"] = torch.cat([sd[pre + f"attn.to_{x}.{p}"] for x in "qkv"])
            out[f"joint_blocks.{i}.context_block.attn.qkv.{p}"] = torch.cat(
                [sd[pre + f"attn.add_{x}_proj.{p}"] for x in "qkv"])
            if pre + f"attn2.to_q.{p}" in sd:
                out[f"joint_blocks.{i}.x_block.attn2.qkv.{p}"] = torch.cat([sd[pre + f"attn2.to_{x}.{p}"] for x in "qkv"])
    return {k: v.contiguous() for k, v in out.items()}


def diffusers_to_ldm_vae(sd, n_up):
    """The inverse of diffusers' convert_ldm_vae_checkpoint, written from it: LDM names, the mid
    attention's q/k/v/proj_out as 1x1 conv weights [C, C, 1, 1] as LDM stores them."""
    out = {}
    top = {"encoder.conv_norm_out": "encoder.norm_out", "decoder.conv_norm_out": "decoder.norm_out"}
    attn = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "proj_out"}
    for k, v in sd.items():
        stem, p = k.rsplit(".", 1)
        parts = stem.split(".")
        side = parts[0]
        if stem in top:
            n = top[stem]
        elif parts[1:3] == ["mid_block", "resnets"]:
            n = f"{side}.mid.block_{int(parts[3]) + 1}." + ".".join(parts[4:]).replace("conv_shortcut", "nin_shortcut")
        elif parts[1:4] == ["mid_block", "attentions", "0"]:
            n = f"{side}.mid.attn_1." + attn[".".join(parts[4:])]
            if p == "weight" and v.ndim == 2:
                v = v[:, :, None, None]
        elif parts[1] in ("down_blocks", "up_blocks"):
            i = int(parts[2])
            b = i if side == "encoder" else n_up - 1 - i
            d = "down" if side == "encoder" else "up"
            if parts[3] == "resnets":
                n = f"{side}.{d}.{b}.block.{parts[4]}." + ".".join(parts[5:]).replace("conv_shortcut", "nin_shortcut")
            else:
                n = f"{side}.{d}.{b}.{'downsample' if side == 'encoder' else 'upsample'}.conv"
        else:
            n = stem
        out[f"{n}.{p}"] = v.contiguous()
    return out


def diffusers_convert(bfl, inner_dim):
    """diffusers' function, run from its own source with the inner width of this model."""
    src = inspect.getsource(single_file_utils.convert_flux_transformer_checkpoint_to_diffusers)
    assert "inner_dim = 3072" in src
    src = src.replace("inner_dim = 3072", f"inner_dim = {inner_dim}")
    ns = {"torch": torch}
    exec(src, ns)
    return ns["convert_flux_transformer_checkpoint_to_diffusers"](dict(bfl))


def same(a, b):
    assert sorted(a) == sorted(b), set(a) ^ set(b)
    for k in a:
        assert a[k].shape == b[k].shape and torch.equal(a[k].view(torch.int32), b[k].view(torch.int32)), k


def quant_type(name, t):
    if t.ndim != 2 or t.shape[1] % 32:
        return None
    if name == "time_in.in_layer.weight":
        return Q.Q4_K
    if name == "guidance_in.in_layer.weight":
        return Q.Q6_K
    if "linear2" in name:
        return Q.Q5_1
    if "_mlp." in name:
        return Q.Q4_0
    return Q.Q8_0


def k_blocks(shape, qt):
    bs, ts = gguf.constants.GGML_QUANT_SIZES[qt]
    rng = np.random.default_rng(1919)
    n = shape[0] * shape[1] // bs
    raw = rng.integers(0, 256, size=(n, ts), dtype=np.uint8)
    offs = [0, 2] if qt == Q.Q4_K else [208]
    for off in offs:
        raw[:, off:off + 2] = (rng.uniform(1e-4, 1e-3, size=n)).astype(np.float16).view(np.uint8).reshape(n, 2)
    return raw.reshape(shape[0], shape[1] // bs * ts)


def quant_type_flux2(name, t):
    if t.ndim != 2 or t.shape[1] % 32:
        return None
    if "linear2" in name:
        return Q.Q5_1
    if "_mlp." in name:
        return Q.Q4_0
    return Q.Q8_0


def write_gguf(path, bfl, quantize, qtype=quant_type, arch="flux"):
    w = gguf.GGUFWriter(path, arch=arch)
    deq = {}
    for k in sorted(bfl):
        a = bfl[k].numpy()
        qt = qtype(k, a) if quantize else None
        if qt is None:
            w.add_tensor(k, a)
            deq[k] = bfl[k]
        else:
            if qt in (Q.Q4_K, Q.Q6_K):
                # gguf-py has no K-quant quantizer: random blocks with small scales stand in
                # for these weights (the folder below holds whatever they decode to)
                q = k_blocks(a.shape, qt)
            else:
                q = gguf.quants.quantize(a, qt)
            w.add_tensor(k, q, raw_dtype=qt)
            deq[k] = torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(q, qt).astype(np.float32)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return deq


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../..")
    src_dir = os.path.join(root, "tests/data/pipelines/flux1_dev_tiny/transformer")
    out = os.path.join(root, "tests/data/formats/flux_single")
    os.makedirs(out, exist_ok=True)
    cfg = json.load(open(os.path.join(src_dir, "config.json")))
    sd = load_file(os.path.join(src_dir, "diffusion_pytorch_model.safetensors"))
    inner = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    bfl = diffusers_to_bfl(sd, cfg["num_layers"], cfg["num_single_layers"])
    same(diffusers_convert(bfl, inner), sd)
    same(diffusers_convert({"model.diffusion_model." + k: v for k, v in bfl.items()}, inner), sd)
    save_file(bfl, os.path.join(out, "flux_bfl.safetensors"))
    write_gguf(os.path.join(out, "flux_bfl_f32.gguf"), bfl, False)
    deq = write_gguf(os.path.join(out, "flux_bfl_q8.gguf"), bfl, True)
    qdir = os.path.join(out, "q8_dequant/transformer")
    os.makedirs(qdir, exist_ok=True)
    save_file(diffusers_convert(deq, inner), os.path.join(qdir, "diffusion_pytorch_model.safetensors"))
    shutil.copy(os.path.join(src_dir, "config.json"), os.path.join(qdir, "config.json"))

    sd3_dir = os.path.join(root, "tests/data/pipelines/sd35m_tiny/transformer")
    sd3_cfg = json.load(open(os.path.join(sd3_dir, "config.json")))
    sd3 = load_file(os.path.join(sd3_dir, "diffusion_pytorch_model.safetensors"))
    sai = diffusers_to_sai(sd3, sd3_cfg["num_layers"])
    same(single_file_utils.convert_sd3_transformer_checkpoint_to_diffusers(dict(sai)), sd3)
    same(single_file_utils.convert_sd3_transformer_checkpoint_to_diffusers(
        {"model.diffusion_model." + k: v for k, v in sai.items()}), sd3)
    os.makedirs(os.path.join(root, "tests/data/formats/sd3_single"), exist_ok=True)
    save_file(sai, os.path.join(root, "tests/data/formats/sd3_single/sd3_sai.safetensors"))

    vae_dir = os.path.join(root, "tests/data/pipelines/flux1_dev_tiny/vae")
    vae_cfg = json.load(open(os.path.join(vae_dir, "config.json")))
    vae = load_file(os.path.join(vae_dir, "diffusion_pytorch_model.safetensors"))
    ldm = diffusers_to_ldm_vae(vae, len(vae_cfg["up_block_types"]))
    same(single_file_utils.convert_ldm_vae_checkpoint(dict(ldm), vae_cfg), vae)
    same(single_file_utils.convert_ldm_vae_checkpoint({"vae." + k: v for k, v in ldm.items()}, vae_cfg), vae)
    same(single_file_utils.convert_ldm_vae_checkpoint({"first_stage_model." + k: v for k, v in ldm.items()}, vae_cfg), vae)
    save_file(ldm, os.path.join(out, "ae_ldm.safetensors"))
    flux2_dir = os.path.join(root, "tests/data/pipelines/flux2_dev_tiny/transformer")
    f2_cfg = json.load(open(os.path.join(flux2_dir, "config.json")))
    f2 = load_file(os.path.join(flux2_dir, "diffusion_pytorch_model.safetensors"))
    f2_bfl = diffusers_to_bfl_flux2(f2, f2_cfg["num_layers"], f2_cfg["num_single_layers"])
    assert "single_stream_modulation.lin.weight" in f2_bfl  # what infer_diffusers_model_type looks for
    same(single_file_utils.convert_flux2_transformer_checkpoint_to_diffusers(dict(f2_bfl)), f2)
    f2_out = os.path.join(root, "tests/data/formats/flux2_single")
    os.makedirs(f2_out, exist_ok=True)
    save_file(f2_bfl, os.path.join(f2_out, "flux2_bfl.safetensors"))
    f2_deq = write_gguf(os.path.join(f2_out, "flux2_bfl_q8.gguf"), f2_bfl, True, quant_type_flux2, "flux2")
    f2_qdir = os.path.join(f2_out, "q8_dequant/transformer")
    os.makedirs(f2_qdir, exist_ok=True)
    save_file(single_file_utils.convert_flux2_transformer_checkpoint_to_diffusers(dict(f2_deq)),
              os.path.join(f2_qdir, "diffusion_pytorch_model.safetensors"))
    shutil.copy(os.path.join(flux2_dir, "config.json"), os.path.join(f2_qdir, "config.json"))
    print("wrote", out, f2_out)


if __name__ == "__main__":
    main()
