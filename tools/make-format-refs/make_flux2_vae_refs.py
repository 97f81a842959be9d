#!/usr/bin/env python3
"""The tiny FLUX.2 test VAE in Black Forest Labs' key names (as BFL's `flux2-vae` file holds it).

Input: tests/data/pipelines/flux2_dev_tiny/vae (diffusers AutoencoderKLFlux2, f32).
Output: tests/data/formats/flux2_single/ae_flux2.safetensors — LDM names (encoder.down.N.block.M,
mid.block_1, mid.attn_1 with q/k/v/proj_out as 1x1 conv weights, norm_out), plus what FLUX.2's
autoencoder has beyond FLUX.1's: quant_conv inside the encoder (encoder.quant_conv), post_quant_conv
inside the decoder (decoder.post_quant_conv) and the latent BatchNorm's running statistics
(bn.running_mean / bn.running_var; no num_batches_tracked, which the conversion never reads).

Checked against diffusers' own conversion: `convert_flux2_vae_checkpoint_to_diffusers` of
diffusers' scripts/convert_flux2_to_diffusers.py (the loader diffusers ships for this VAE: its
single-file loader has no AutoencoderKLFlux2 entry). That script is not in the pip package and
parses arguments when imported, so its VAE functions and mapping are taken from its source (ast)
and run unchanged; converting the file must give back every tensor of the folder bit for bit
(the folder's bn.num_batches_tracked aside: torch's BatchNorm fills it in on load).

Usage: /work/venv/bin/python tools/make-format-refs/make_flux2_vae_refs.py CONVERT_SCRIPT [REPO_ROOT]
  CONVERT_SCRIPT: scripts/convert_flux2_to_diffusers.py of a diffusers checkout (checked with
  diffusers 58eb52c, 2026-08-23: `git show HEAD:scripts/convert_flux2_to_diffusers.py`).
"""
import ast
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_single_file_refs import diffusers_to_ldm_vae, same  # noqa: E402

VAE_NAMES = {"DIFFUSERS_VAE_TO_FLUX2_MAPPING", "conv_attn_to_linear", "update_vae_resnet_ldm_to_diffusers",
             "update_vae_attentions_ldm_to_diffusers", "convert_flux2_vae_checkpoint_to_diffusers"}


def diffusers_vae_conversion(script):
    """diffusers' FLUX.2 VAE conversion, its definitions executed from the script's own source."""
    tree = ast.parse(open(script).read())
    keep = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in VAE_NAMES:
            keep.append(node)
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) in VAE_NAMES for t in node.targets):
            keep.append(node)
    found = {n.name if isinstance(n, ast.FunctionDef) else n.targets[0].id for n in keep}
    assert found == VAE_NAMES, VAE_NAMES - found
    ns = {"torch": torch}
    exec(compile(ast.Module(body=keep, type_ignores=[]), script, "exec"), ns)
    return ns["convert_flux2_vae_checkpoint_to_diffusers"]


def diffusers_to_bfl_flux2_vae(sd, n_up):
    """The inverse of diffusers' FLUX.2 VAE conversion: LDM names for what FLUX.1's VAE also has,
    FLUX.2's quant convs inside the encoder / decoder, the BatchNorm statistics as they are."""
    moved = {"quant_conv": "encoder.quant_conv", "post_quant_conv": "decoder.post_quant_conv"}
    out = diffusers_to_ldm_vae({k: v for k, v in sd.items() if k.rsplit(".", 1)[0] not in moved and not k.startswith("bn.")}, n_up)
    for k, v in sd.items():
        stem, p = k.rsplit(".", 1)
        if stem in moved:
            out[f"{moved[stem]}.{p}"] = v.contiguous()
    out["bn.running_mean"] = sd["bn.running_mean"].contiguous()
    out["bn.running_var"] = sd["bn.running_var"].contiguous()
    return out


def main():
    script = sys.argv[1]
    root = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(__file__), "../..")
    vae_dir = os.path.join(root, "tests/data/pipelines/flux2_dev_tiny/vae")
    cfg = json.load(open(os.path.join(vae_dir, "config.json")))
    sd = load_file(os.path.join(vae_dir, "diffusion_pytorch_model.safetensors"))
    bfl = diffusers_to_bfl_flux2_vae(sd, len(cfg["up_block_types"]))
    assert "encoder.quant_conv.weight" in bfl and "decoder.post_quant_conv.weight" in bfl
    convert = diffusers_vae_conversion(script)
    back = convert(dict(bfl), cfg)
    same(back, {k: v for k, v in sd.items() if not k.endswith("num_batches_tracked")})
    out = os.path.join(root, "tests/data/formats/flux2_single")
    os.makedirs(out, exist_ok=True)
    save_file(bfl, os.path.join(out, "ae_flux2.safetensors"))
    print("wrote", os.path.join(out, "ae_flux2.safetensors"), len(bfl), "tensors")


if __name__ == "__main__":
    main()
