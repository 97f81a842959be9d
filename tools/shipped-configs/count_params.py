#!/usr/bin/env python3
"""The configs shipped in models/configs were typed from knowledge: instantiate each one with
diffusers / transformers on the meta device (no memory, no weights) and print its parameter
count beside the published one, so that a wrong depth, width or head count shows.

Usage: /work/venv/bin/python tools/shipped-configs/count_params.py [REPO_ROOT] > tools/shipped-configs/param_counts.txt
"""
import json
import os
import sys

import torch
import diffusers
import transformers

# published sizes (model cards / papers), in parameters
PUBLISHED = {
    "FluxTransformer2DModel": (11.9e9, "FLUX.1 [dev]/[schnell]: 12B (11.9B) transformer"),
    "SD3Transformer2DModel/sd3-medium": (2.0e9, "SD3 Medium: 2B MMDiT"),
    "SD3Transformer2DModel/sd3.5-medium": (2.5e9, "SD3.5 Medium: 2.5B MMDiT-X"),
    "SD3Transformer2DModel/sd3.5-large": (8.1e9, "SD3.5 Large: 8.1B MMDiT"),
    "Flux2Transformer2DModel": (32e9, "FLUX.2 [dev]: 32B flow transformer"),
    "AutoencoderKL": (83.8e6, "FLUX.1 / SD3 VAE: 83.8M (16 latent channels)"),
    "AutoencoderKLFlux2": (84e6, "FLUX.2 VAE: ~84M (32 latent channels; no published figure known)"),
    "CLIPTextModel": (123e6, "CLIP ViT-L/14 text tower: 123M"),
    "CLIPTextModelWithProjection/768": (124e6, "CLIP-L text tower with its 768x768 projection: 123.7M"),
    "CLIPTextModelWithProjection/1280": (695e6, "OpenCLIP bigG text tower with projection: 695M"),
    "T5EncoderModel": (4.76e9, "T5 v1.1 XXL encoder: 4.76B"),
}


def count(module):
    return sum(p.numel() for p in module.parameters())


def count_buffers(module):
    """Stored tensors that are not parameters (SD3's pos_embed table, part of the published
    sizes); CLIP's position_ids are indices, not weights."""
    return sum(b.numel() for n, b in module.named_buffers() if not n.endswith("position_ids"))


def build(cls_name, cfg_path):
    cfg = json.load(open(cfg_path))
    with torch.device("meta"):
        if cls_name in ("CLIPTextModel", "CLIPTextModelWithProjection"):
            c = transformers.CLIPTextConfig.from_json_file(cfg_path)
            return getattr(transformers, cls_name)(c), cfg
        if cls_name == "T5EncoderModel":
            return transformers.T5EncoderModel(transformers.T5Config.from_json_file(cfg_path)), cfg
        cls = getattr(diffusers, cls_name)
        return cls.from_config({k: v for k, v in cfg.items() if k != "_class_name"}), cfg


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "../..")
    base = os.path.join(root, "models/configs")
    print(f"# parameters of the shipped configs (models/configs), instantiated on the meta device with "
          f"diffusers {diffusers.__version__}, transformers {transformers.__version__}")
    print("# ratio = (params + buffers) / published; buffers: stored tables that are not parameters (SD3's pos_embed)")
    print(f"# {'model/component':34s} {'class':30s} {'params':>16s} {'buffers':>12s} {'published':>10s} ratio   note")
    for model in sorted(d for d in os.listdir(base) if os.path.isdir(os.path.join(base, d))):
        for comp in sorted(os.listdir(os.path.join(base, model))):
            cfg_path = os.path.join(base, model, comp, "config.json")
            if not os.path.isfile(cfg_path):
                continue
            cfg = json.load(open(cfg_path))
            cls_name = cfg.get("_class_name") or cfg["architectures"][0]
            m, cfg = build(cls_name, cfg_path)
            n, nb = count(m), count_buffers(m)
            key = cls_name
            if cls_name == "SD3Transformer2DModel":
                key += "/" + model
            elif cls_name == "CLIPTextModelWithProjection":
                key += "/" + str(cfg["hidden_size"])
            pub, note = PUBLISHED.get(key, (0, "?"))
            ratio = (n + nb) / pub if pub else float("nan")
            print(f"{model + '/' + comp:36s} {cls_name:30s} {n:16,d} {nb:12,d} {pub / 1e9:9.3f}B {ratio:5.3f}   {note}")


if __name__ == "__main__":
    main()
