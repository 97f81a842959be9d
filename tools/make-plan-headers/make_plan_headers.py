#!/usr/bin/env python3
"""Tensor listings (name, dtype, shape) of the real FLUX.1 [dev] and SD3.5 Large components, for
tests/test_plan_real_configs.c, which writes header-only (sparse) safetensors files from them and
plans those pipelines: the planner must be fast and read no weight data at the real sizes.

The listings come from diffusers' / transformers' own model classes instantiated from the shipped
configs (models/configs/<model>/<component>/config.json) on the meta device (no memory, no
weights): the state_dict names and shapes a real checkpoint of that config holds, in bf16 as
the published files store them. Repeated blocks are folded: a line is `name dtype d0,d1,... idx`
where idx is `-` (no block index) or the block indices the `#` in name stands for, `0-N` (all of
0..N) or a comma-separated list; this keeps the files small.

Run: /work/venv/bin/python tools/make-plan-headers/make_plan_headers.py
Writes tests/data/plan_headers/<model>/<component>.txt."""
import json, os, re, sys
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "models", "configs")
OUT = os.path.join(ROOT, "tests", "data", "plan_headers")


def model_of(cls, cfg_path):
    import diffusers, transformers
    cfg = json.load(open(cfg_path))
    with torch.device("meta"):
        if hasattr(diffusers, cls) and cls not in ("CLIPTextModel",):
            c = getattr(diffusers, cls)
            return c.from_config(c.load_config(os.path.dirname(cfg_path)))
        conf_cls = {"CLIPTextModel": transformers.CLIPTextConfig, "CLIPTextModelWithProjection": transformers.CLIPTextConfig,
                    "T5EncoderModel": transformers.T5Config}[cls]
        return getattr(transformers, cls)(conf_cls.from_dict(cfg))


def fold(items):
    """[(name, dtype, shape)] -> lines with block indices folded into '#'."""
    groups, order = {}, []
    for name, dt, shape in items:
        m = re.search(r"(?:^|[._])(?:blocks|layers|block)\.(\d+)\.", name)
        key = (name[:m.start(1)] + "#" + name[m.end(1):] if m else name, dt, shape)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(m.group(1)) if m else None)
    lines = []
    for key in order:
        idx = groups[key]
        name, dt, shape = key
        dims = ",".join(str(d) for d in shape)
        if idx[0] is None:
            lines.append(f"{name} {dt} {dims} -")
        elif idx == list(range(len(idx))):
            lines.append(f"{name} {dt} {dims} 0-{len(idx) - 1}")
        else:
            lines.append(f"{name} {dt} {dims} " + ",".join(str(i) for i in idx))
    return lines


def main():
    for model in ("flux1-dev", "sd3.5-large"):
        idx = json.load(open(os.path.join(CONFIGS, model, "model_index.json")))
        for comp, entry in idx.items():
            if comp.startswith("_") or not isinstance(entry, list) or comp.startswith(("tokenizer", "scheduler")):
                continue
            cfg = os.path.join(CONFIGS, model, comp, "config.json")
            m = model_of(entry[1], cfg)
            seen = set()
            items = []
            for name, t in m.state_dict(keep_vars=True).items():
                if id(t) in seen and not name.startswith("encoder.embed_tokens"):  # tied copies
                    continue
                seen.add(id(t))
                if entry[1].startswith("CLIPTextModel") and not name.startswith(("text_model.", "text_projection")):
                    # this transformers version's CLIPTextModel state_dict drops the prefix the
                    # published checkpoints (and their loaders) use
                    name = "text_model." + name
                items.append((name, "BF16", tuple(t.shape)))
            os.makedirs(os.path.join(OUT, model), exist_ok=True)
            with open(os.path.join(OUT, model, comp + ".txt"), "w") as f:
                f.write("\n".join(fold(items)) + "\n")
            print(model, comp, len(items), "tensors")


if __name__ == "__main__":
    main()
