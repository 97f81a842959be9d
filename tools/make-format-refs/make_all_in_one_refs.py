#!/usr/bin/env python3
"""All-in-one single files (tests/test_formats_all_in_one.c): what the test composes, checked
against diffusers' own single-file code on the tiny test pipelines.

Writes tests/data/formats/sd3_single/vae_ldm.safetensors: the tiny SD3.5-Medium VAE in LDM names
(the inverse of diffusers' convert_ldm_vae_checkpoint, from make_single_file_refs.py), checked
against convert_ldm_vae_checkpoint under Stability's "first_stage_model." and ComfyUI's "vae.".

Checks (nothing written) the rules the test's all-in-one files rely on, on the same tiny models:
  - a text encoder under "text_encoders.<clip_l|clip_g|t5xxl>.transformer." is its transformers
    state dict unchanged: convert_ldm_clip_checkpoint(ckpt, prefix) and
    convert_sd3_t5_checkpoint_to_diffusers(ckpt) give back exactly the folder's tensors;
  - create_diffusers_clip_model_from_ldm (what from_single_file runs for SD3's text_encoder and
    text_encoder_2) loads CLIP-L with the identity as its text_projection whatever the file
    holds, and CLIP-G with the file's own;
  - the tokenizers models/shapes-flux-tiny ships (which the shipped configs in models/configs
    reference) are byte for byte the golden pipelines' (the real FLUX.1 / SD3 ones).

Usage: /work/venv/bin/python tools/make-format-refs/make_all_in_one_refs.py [REPO_ROOT]
"""
import filecmp
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from diffusers.loaders import single_file_utils as sfu
from transformers import CLIPTextModelWithProjection

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_single_file_refs import diffusers_to_ldm_vae, same  # noqa: E402


def same_values(a, b):
    """Same names, shapes and values (bit for bit once widened to f32: the tiny text encoders
    are stored in bf16 / f16)."""
    assert sorted(a) == sorted(b), set(a) ^ set(b)
    for k in a:
        assert a[k].shape == b[k].shape and torch.equal(a[k].float(), b[k].float()), k


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../..")
    sd3 = os.path.join(root, "tests/data/pipelines/sd35m_tiny")
    flux = os.path.join(root, "tests/data/pipelines/flux1_dev_tiny")

    vae_cfg = json.load(open(os.path.join(sd3, "vae/config.json")))
    vae = load_file(os.path.join(sd3, "vae/diffusion_pytorch_model.safetensors"))
    ldm = diffusers_to_ldm_vae(vae, len(vae_cfg["up_block_types"]))
    for pfx in ("first_stage_model.", "vae."):
        same(sfu.convert_ldm_vae_checkpoint({pfx + k: v for k, v in ldm.items()}, vae_cfg), vae)
    save_file(ldm, os.path.join(root, "tests/data/formats/sd3_single/vae_ldm.safetensors"))

    # the text encoders as the test puts them into its all-in-one files
    te = {k: load_file(os.path.join(sd3, k, "model.safetensors")) for k in ("text_encoder", "text_encoder_2", "text_encoder_3")}
    parts = {"text_encoder": "clip_l", "text_encoder_2": "clip_g", "text_encoder_3": "t5xxl"}
    ckpt = {}
    for k, p in parts.items():
        ckpt.update({f"text_encoders.{p}.transformer.{n}": v for n, v in te[k].items()})
    same_values(sfu.convert_ldm_clip_checkpoint(ckpt, "text_encoders.clip_l.transformer."), te["text_encoder"])
    same_values(sfu.convert_ldm_clip_checkpoint(ckpt, "text_encoders.clip_g.transformer."), te["text_encoder_2"])
    same_values(sfu.convert_sd3_t5_checkpoint_to_diffusers(ckpt), te["text_encoder_3"])
    flux_te = {k: load_file(os.path.join(flux, k, "model.safetensors")) for k in ("text_encoder", "text_encoder_2")}
    fck = {f"text_encoders.clip_l.transformer.{n}": v for n, v in flux_te["text_encoder"].items()}
    fck.update({f"text_encoders.t5xxl.transformer.{n}": v for n, v in flux_te["text_encoder_2"].items()})
    same_values(sfu.convert_ldm_clip_checkpoint(fck, "text_encoders.clip_l.transformer."), flux_te["text_encoder"])
    same_values(sfu.convert_sd3_t5_checkpoint_to_diffusers(fck), flux_te["text_encoder_2"])

    # from_single_file's CLIP models: CLIP-L's projection is the identity, CLIP-G's the file's
    for sub, eye in (("text_encoder", True), ("text_encoder_2", False)):
        m = sfu.create_diffusers_clip_model_from_ldm(CLIPTextModelWithProjection, ckpt, subfolder=sub, config=sd3,
                                                     torch_dtype=torch.float32, local_files_only=True)
        got = {k: v.detach() for k, v in m.state_dict().items() if not k.endswith("position_ids")}
        want = dict(te[sub])
        if eye:
            d = want["text_projection.weight"].shape[0]
            assert not torch.equal(want["text_projection.weight"].float(), torch.eye(d))
            want["text_projection.weight"] = torch.eye(d)
        same_values(got, want)

    for tok, gold in (("tokenizer", "flux1_dev_tiny/tokenizer"), ("tokenizer_2", "flux1_dev_tiny/tokenizer_2"),
                      ("tokenizer", "sd35m_tiny/tokenizer")):
        a = os.path.join(root, "models/shapes-flux-tiny", tok)
        b = os.path.join(root, "tests/data/pipelines", gold)
        for f in os.listdir(b):
            if os.path.exists(os.path.join(a, f)):
                assert filecmp.cmp(os.path.join(a, f), os.path.join(b, f), shallow=False), (a, f)
    # SD3's CLIP-G and T5 tokenizers: the same vocabulary / sentencepiece files
    for a, b in (("shapes-flux-tiny/tokenizer/vocab.json", "sd35m_tiny/tokenizer_2/vocab.json"),
                 ("shapes-flux-tiny/tokenizer/merges.txt", "sd35m_tiny/tokenizer_2/merges.txt"),
                 ("shapes-flux-tiny/tokenizer_2/spiece.model", "sd35m_tiny/tokenizer_3/spiece.model")):
        assert filecmp.cmp(os.path.join(root, "models", a), os.path.join(root, "tests/data/pipelines", b), shallow=False), a
    print("ok: text encoder parts and the CLIP-L identity as diffusers loads them; wrote sd3_single/vae_ldm.safetensors")


if __name__ == "__main__":
    main()
