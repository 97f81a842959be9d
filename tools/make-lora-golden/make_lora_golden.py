#!/usr/bin/env python3
"""Reference data for LoRA adapters (issue #20), made with diffusers' and PEFT's own code.

For the tiny golden FLUX.1-dev and SD3 transformers (tests/data/golden/{flux1_dev,sd3}) this
writes random adapters in the file formats users meet, loads each with diffusers' loader (the
pipeline mixin's classmethods `lora_state_dict` + `load_lora_into_transformer`, which is what
`pipe.load_lora_weights` runs for the transformer) and records the transformer forward on the
golden inputs:

  out.base            no adapter (this torch build; the C side checks it agrees with its own run)
  out.runtime_s1      adapter at scale 1 (PEFT run-time path: W x + b + (alpha/r) * s * B(A x))
  out.runtime_s07     after set_adapters([name], [0.7])
  out.fused_s07       fresh load, then transformer.fuse_lora(lora_scale=0.7)
  out.multi           two adapters at once (this one and the "second" adapter), set_adapters weights 0.7 / 1.3

Files (tests/data/lora/):
  flux_peft.safetensors   diffusers/PEFT keys "transformer.<module>.lora_A/lora_B.weight" and
                          network alphas "transformer.<module>.alpha" (alpha != rank, ranks vary)
  flux_kohya.safetensors  kohya/sd-scripts keys "lora_unet_double_blocks_0_img_attn_qkv.lora_down/
                          lora_up.weight" + ".alpha": fused qkv, single-block linear1 (q, k, v, mlp),
                          linear2, modulation; one module without alpha
  flux_xlabs.safetensors  XLabs-AI keys "double_blocks.0.processor.qkv_lora1.down.weight" /
                          ".up.weight" (no alphas): qkv_lora1/2 split in q/k/v, proj_lora1/2,
                          single-block qkv_lora and proj_lora
  flux_second.safetensors a second diffusers-format adapter (no alphas) for the multi-adapter case
  flux2_dev_peft.safetensors, flux2_klein_peft.safetensors  diffusers/PEFT adapters on every
                          linear of the tiny golden Flux2Transformer2DModel folders (no alphas)
  flux2_dev_kohya / _aitk / _peftbm.safetensors  FLUX.2-dev adapters in kohya, ai-toolkit
                          ("diffusion_model.double_blocks.0.img_attn.qkv") and PEFT-saved
                          ("base_model.model." in place of "diffusion_model.", which
                          Flux2LoraLoaderMixin.lora_state_dict renames back) names
  sd3_peft.safetensors    SD3 transformer adapter in diffusers/PEFT keys (no alphas: SD3's loader
                          takes none)
  flux.safetensors / sd3.safetensors / flux2_dev.safetensors / flux2_klein.safetensors
                          the outputs above, one prefix per adapter
  flux_fused/, sd3_fused/  (written only with --fused-folders, not committed) transformer folders
                          with the adapter merged offline at scale 0.7 (fuse_lora + save_pretrained)

Deviation (documented in README.md here): diffusers' kohya converter splits `linear1` of the
single blocks with the real FLUX.1 widths hard-coded (dims=[3072, 3072, 3072, 12288]); this script
runs the same function with the tiny model's widths substituted in its source text, nothing else
changed.

Run:  /work/venv/bin/python tools/make-lora-golden/make_lora_golden.py [--out tests/data/lora]
"""
import argparse
import inspect
import json
import os
import sys
import textwrap

import torch
from safetensors.torch import load_file, save_file

import diffusers
from diffusers import Flux2Transformer2DModel, FluxTransformer2DModel, SD3Transformer2DModel
from diffusers.loaders import lora_conversion_utils as lcu
from diffusers.loaders.lora_pipeline import Flux2LoraLoaderMixin, FluxLoraLoaderMixin, SD3LoraLoaderMixin

torch.set_num_threads(1)
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GOLDEN = os.path.join(ROOT, "tests", "data", "golden")


def gen(seed):
    return torch.Generator("cpu").manual_seed(seed)


def rnd(g, *shape, std=1.0):
    return (torch.randn(*shape, generator=g) * std).float()


_KOHYA_SRC = textwrap.dedent(inspect.getsource(lcu._convert_kohya_flux_lora_to_diffusers))


def patch_kohya_dims(d, m):
    """diffusers' kohya FLUX converter with the tiny model's linear1 widths."""
    src = _KOHYA_SRC
    old = "dims=[3072, 3072, 3072, 12288]"
    assert src.count(old) == 1, "diffusers' converter changed: re-check the deviation"
    src = src.replace(old, f"dims=[{d}, {d}, {d}, {m}]")
    ns = dict(vars(lcu))
    exec(compile(src, lcu.__file__, "exec"), ns)
    lcu._convert_kohya_flux_lora_to_diffusers = ns["_convert_kohya_flux_lora_to_diffusers"]
    import diffusers.loaders.lora_pipeline as lp
    lp._convert_kohya_flux_lora_to_diffusers = ns["_convert_kohya_flux_lora_to_diffusers"]


# ---- adapters -----------------------------------------------------------------------------
FLUX_DOUBLE = {  # module -> (in, out) in units of D / M / F (filled per config)
    "attn.to_q": ("D", "D"), "attn.to_k": ("D", "D"), "attn.to_v": ("D", "D"), "attn.to_out.0": ("D", "D"),
    "attn.add_q_proj": ("D", "D"), "attn.add_k_proj": ("D", "D"), "attn.add_v_proj": ("D", "D"),
    "attn.to_add_out": ("D", "D"), "ff.net.0.proj": ("D", "F"), "ff.net.2": ("F", "D"),
    "ff_context.net.0.proj": ("D", "F"), "ff_context.net.2": ("F", "D"), "norm1.linear": ("D", "6D"),
    "norm1_context.linear": ("D", "6D"),
}
FLUX_SINGLE = {"attn.to_q": ("D", "D"), "attn.to_k": ("D", "D"), "attn.to_v": ("D", "D"), "proj_mlp": ("D", "M"),
               "proj_out": ("D+M", "D"), "norm.linear": ("D", "3D")}


def flux_dims(cfg):
    D = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    return {"D": D, "F": 4 * D, "M": 4 * D, "6D": 6 * D, "3D": 3 * D, "D+M": 5 * D}


def flux_peft_adapter(cfg, seed, alphas):
    g = gen(seed)
    dims = flux_dims(cfg)
    sd = {}
    mods = []
    for i in range(cfg["num_layers"]):
        mods += [(f"transformer_blocks.{i}.{k}", v) for k, v in FLUX_DOUBLE.items()]
    for i in range(cfg["num_single_layers"]):
        mods += [(f"single_transformer_blocks.{i}.{k}", v) for k, v in FLUX_SINGLE.items()]
    mods += [("x_embedder", (cfg["in_channels"], "D")), ("context_embedder", (cfg["joint_attention_dim"], "D")),
             ("proj_out", ("D", cfg["in_channels"])), ("norm_out.linear", ("D", "2D")),
             ("time_text_embed.timestep_embedder.linear_1", (256, "D"))]
    dims["2D"] = 2 * dims["D"]
    names = [m[0] for m in mods]
    for n, (name, (mi, mo)) in enumerate(mods):
        fin = dims[mi] if isinstance(mi, str) else mi
        fout = dims[mo] if isinstance(mo, str) else mo
        # PEFT matches diffusers' alpha/rank patterns as name suffixes: the top-level
        # "proj_out" pattern also catches "single_transformer_blocks.<i>.proj_out" (checked with
        # peft 0.21.2), so the two get the same rank and alpha here (see README.md)
        k = names.index("single_transformer_blocks.0.proj_out") if name == "proj_out" else n
        r = (4, 2, 3)[k % 3]
        sd[f"transformer.{name}.lora_A.weight"] = rnd(g, r, fin, std=fin ** -0.5)
        sd[f"transformer.{name}.lora_B.weight"] = rnd(g, fout, r, std=0.15)
        if alphas:
            sd[f"transformer.{name}.alpha"] = torch.tensor(float((8.0, 1.0, 6.0)[k % 3]))
    return sd


def flux_kohya_adapter(cfg, seed):
    g = gen(seed)
    d = flux_dims(cfg)
    D, M = d["D"], d["M"]
    sd = {}

    def add(name, fin, fout, r, alpha):
        sd[f"{name}.lora_down.weight"] = rnd(g, r, fin, std=fin ** -0.5)
        sd[f"{name}.lora_up.weight"] = rnd(g, fout, r, std=0.15)
        if alpha is not None:
            sd[f"{name}.alpha"] = torch.tensor(float(alpha))

    for i in range(cfg["num_layers"]):
        for s in ("img", "txt"):
            add(f"lora_unet_double_blocks_{i}_{s}_attn_qkv", D, 3 * D, 4, 2.0)
            add(f"lora_unet_double_blocks_{i}_{s}_attn_proj", D, D, 4, 8.0)
            add(f"lora_unet_double_blocks_{i}_{s}_mlp_0", D, 4 * D, 2, None)  # no alpha: alpha = rank
            add(f"lora_unet_double_blocks_{i}_{s}_mlp_2", 4 * D, D, 4, 4.0)
            add(f"lora_unet_double_blocks_{i}_{s}_mod_lin", D, 6 * D, 3, 1.5)
    for i in range(cfg["num_single_layers"]):
        add(f"lora_unet_single_blocks_{i}_linear1", D, 3 * D + M, 4, 3.0)
        add(f"lora_unet_single_blocks_{i}_linear2", D + M, D, 4, 4.0)
        add(f"lora_unet_single_blocks_{i}_modulation_lin", D, 3 * D, 2, 2.0)
    # Not written: img_in, txt_in, time_in, vector_in, guidance_in, final_layer. diffusers'
    # converter maps them to keys without the "transformer." prefix, which its transformer loader
    # then leaves out without an error (checked with diffusers 0.42.1): there is no reference for them.
    return sd


def flux_xlabs_adapter(cfg, seed):
    """XLabs-AI's x-flux keys: "double_blocks.<i>.processor.qkv_lora1.down.weight" / ".up.weight",
    no alphas. qkv_lora1/2 (image/text) are split in three equal parts by diffusers' converter,
    proj_lora1/2 are the attention outputs; single blocks have qkv_lora (q, k, v) and proj_lora
    (diffusers maps it to proj_out, so it takes proj_out's D + M inputs here). The single blocks
    use ComfyUI's "diffusion_model." prefix, which diffusers' converter also accepts."""
    g = gen(seed)
    d = flux_dims(cfg)
    D, M = d["D"], d["M"]
    sd = {}

    def add(name, fin, fout, r):
        sd[f"{name}.down.weight"] = rnd(g, r, fin, std=fin ** -0.5)
        sd[f"{name}.up.weight"] = rnd(g, fout, r, std=0.15)

    for i in range(cfg["num_layers"]):
        add(f"double_blocks.{i}.processor.qkv_lora1", D, 3 * D, 4)
        add(f"double_blocks.{i}.processor.qkv_lora2", D, 3 * D, 2)
        add(f"double_blocks.{i}.processor.proj_lora1", D, D, 3)
        add(f"double_blocks.{i}.processor.proj_lora2", D, D, 4)
    for i in range(cfg["num_single_layers"]):
        add(f"diffusion_model.single_blocks.{i}.processor.qkv_lora", D, 3 * D, 4)
        add(f"diffusion_model.single_blocks.{i}.processor.proj_lora", D + M, D, 2)
    return sd


def sd3_peft_adapter(cfg, seed):
    g = gen(seed)
    D = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    sd = {}
    n = 0
    for i in range(cfg["num_layers"]):
        pre_only = i == cfg["num_layers"] - 1
        mods = [("attn.to_q", D, D), ("attn.to_k", D, D), ("attn.to_v", D, D), ("attn.to_out.0", D, D),
                ("attn.add_q_proj", D, D), ("attn.add_k_proj", D, D), ("attn.add_v_proj", D, D),
                ("ff.net.0.proj", D, 4 * D), ("ff.net.2", 4 * D, D), ("norm1.linear", D, 6 * D)]
        if not pre_only:
            mods += [("attn.to_add_out", D, D), ("ff_context.net.0.proj", D, 4 * D), ("ff_context.net.2", 4 * D, D),
                     ("norm1_context.linear", D, 6 * D)]
        else:
            mods += [("norm1_context.linear", D, 2 * D)]
        for m, fin, fout in mods:
            r = (4, 2)[n % 2]
            n += 1
            sd[f"transformer.transformer_blocks.{i}.{m}.lora_A.weight"] = rnd(g, r, fin, std=fin ** -0.5)
            sd[f"transformer.transformer_blocks.{i}.{m}.lora_B.weight"] = rnd(g, fout, r, std=0.15)
    sd["transformer.context_embedder.lora_A.weight"] = rnd(g, 4, cfg["joint_attention_dim"], std=0.15)
    sd["transformer.context_embedder.lora_B.weight"] = rnd(g, D, 4, std=0.15)
    sd["transformer.proj_out.lora_A.weight"] = rnd(g, 4, D, std=D ** -0.5)
    sd["transformer.proj_out.lora_B.weight"] = rnd(g, cfg["patch_size"] ** 2 * cfg["out_channels"], 4, std=0.15)
    return sd


FLUX2_RANKS = {}  # last name component -> rank (see flux2_peft_adapter)


def flux2_peft_adapter(folder, seed):
    """A diffusers/PEFT adapter on every nn.Linear of a Flux2Transformer2DModel (no alphas:
    Flux2LoraLoaderMixin passes none). The rank depends only on the module's last name component:
    PEFT matches diffusers' rank patterns as name suffixes, so modules that share one get one rank."""
    g = gen(seed)
    m = Flux2Transformer2DModel.from_pretrained(folder, torch_dtype=torch.float32)
    sd = {}
    for name, mod in m.named_modules():
        if not isinstance(mod, torch.nn.Linear):
            continue
        last = name.rsplit(".", 1)[-1]
        r = FLUX2_RANKS.setdefault(last, (4, 2, 3)[len(FLUX2_RANKS) % 3])
        sd[f"transformer.{name}.lora_A.weight"] = rnd(g, r, mod.in_features, std=mod.in_features ** -0.5)
        sd[f"transformer.{name}.lora_B.weight"] = rnd(g, mod.out_features, r, std=0.15)
    return sd


# FLUX.2 kohya / ai-toolkit: original (BFL) module names -> diffusers modules, as diffusers'
# _convert_kohya_flux2_lora_to_diffusers / _convert_non_diffusers_flux2_lora_to_diffusers map them
FLUX2_DOUBLE_ORIG = {  # part -> diffusers modules (several: lora_B rows split in order)
    "img_attn.qkv": ["attn.to_q", "attn.to_k", "attn.to_v"], "txt_attn.qkv": ["attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"],
    "img_attn.proj": ["attn.to_out.0"], "txt_attn.proj": ["attn.to_add_out"], "img_mlp.0": ["ff.linear_in"],
    "img_mlp.2": ["ff.linear_out"], "txt_mlp.0": ["ff_context.linear_in"], "txt_mlp.2": ["ff_context.linear_out"],
}
FLUX2_SINGLE_ORIG = {"linear1": ["attn.to_qkv_mlp_proj"], "linear2": ["attn.to_out"]}
FLUX2_EXTRA_KOHYA = {"img_in": "x_embedder", "txt_in": "context_embedder",
                     "time_in_in_layer": "time_guidance_embed.timestep_embedder.linear_1",
                     "time_in_out_layer": "time_guidance_embed.timestep_embedder.linear_2", "final_layer_linear": "proj_out"}
FLUX2_EXTRA_AITK = {"img_in": "x_embedder", "txt_in": "context_embedder",
                    "time_in.in_layer": "time_guidance_embed.timestep_embedder.linear_1",
                    "time_in.out_layer": "time_guidance_embed.timestep_embedder.linear_2",
                    "guidance_in.in_layer": "time_guidance_embed.guidance_embedder.linear_1",
                    "guidance_in.out_layer": "time_guidance_embed.guidance_embedder.linear_2",
                    "final_layer.linear": "proj_out", "final_layer.adaLN_modulation.1": "norm_out.linear",
                    "single_stream_modulation.lin": "single_stream_modulation.linear",
                    "double_stream_modulation_img.lin": "double_stream_modulation_img.linear",
                    "double_stream_modulation_txt.lin": "double_stream_modulation_txt.linear"}


def flux2_orig_adapter(folder, seed, kohya):
    """A FLUX.2 adapter in kohya ("lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight" +
    ".alpha", one module in four without) or ai-toolkit ("diffusion_model.double_blocks.0.img_attn.qkv.
    lora_A.weight", no alphas: diffusers' converter rejects them) names on every module its
    converter knows. ai-toolkit: the last double block in diffusers' own block names, which that
    converter passes through ("diffusion_model.transformer_blocks.1.attn.to_q")."""
    g = gen(seed)
    m = Flux2Transformer2DModel.from_pretrained(folder, torch_dtype=torch.float32)
    lin = {n: mod for n, mod in m.named_modules() if isinstance(mod, torch.nn.Linear)}
    cfg = m.config
    mods = []  # (file module name, diffusers modules)
    for i in range(cfg.num_layers):
        for part, tgt in FLUX2_DOUBLE_ORIG.items():
            full = [f"transformer_blocks.{i}.{t}" for t in tgt]
            if kohya:
                mods.append((f"lora_unet_double_blocks_{i}_{part.replace('.', '_')}", full))
            elif i == cfg.num_layers - 1:
                mods += [(f"diffusion_model.{f}", [f]) for f in full]
            else:
                mods.append((f"diffusion_model.double_blocks.{i}.{part}", full))
    for i in range(cfg.num_single_layers):
        for part, tgt in FLUX2_SINGLE_ORIG.items():
            full = [f"single_transformer_blocks.{i}.{t}" for t in tgt]
            mods.append((f"lora_unet_single_blocks_{i}_{part}" if kohya else f"diffusion_model.single_blocks.{i}.{part}", full))
    for orig, tgt in (FLUX2_EXTRA_KOHYA if kohya else FLUX2_EXTRA_AITK).items():
        if tgt in lin:
            mods.append((f"lora_unet_{orig}" if kohya else f"diffusion_model.{orig}", [tgt]))
    sd = {}
    for n, (name, full) in enumerate(mods):
        fin = lin[full[0]].in_features
        fout = sum(lin[f].out_features for f in full)
        r = (4, 2, 3)[n % 3]
        A, B = rnd(g, r, fin, std=fin ** -0.5), rnd(g, fout, r, std=0.15)
        if kohya:
            sd[f"{name}.lora_down.weight"], sd[f"{name}.lora_up.weight"] = A, B
            if n % 4:
                sd[f"{name}.alpha"] = torch.tensor(float((8.0, 1.0, 6.0)[n % 3]))
        else:
            sd[f"{name}.lora_A.weight"], sd[f"{name}.lora_B.weight"] = A, B
    return sd


# ---- runs -----------------------------------------------------------------------------------
def load_into(mixin, model, path, name):
    """What pipe.load_lora_weights(path, adapter_name=name) does for the transformer."""
    sd, alphas = mixin.lora_state_dict(path, return_alphas=True) if mixin is FluxLoraLoaderMixin else (
        mixin.lora_state_dict(path), None)
    if mixin is FluxLoraLoaderMixin:
        mixin.load_lora_into_transformer(sd, network_alphas=alphas, transformer=model, adapter_name=name)
    else:
        mixin.load_lora_into_transformer(sd, transformer=model, adapter_name=name)


def run_case(cls, mixin, folder, io, call, adapters, second, out, prefix, fused_dir=None):
    def fresh():
        m = cls.from_pretrained(folder, torch_dtype=torch.float32).eval()
        return m

    with torch.no_grad():
        m = fresh()
        if "base" not in out:
            out["base"] = call(m, io)
        load_into(mixin, m, adapters, "a")
        out[f"{prefix}.runtime_s1"] = call(m, io)
        m.set_adapters(["a"], [0.7])
        out[f"{prefix}.runtime_s07"] = call(m, io)
        if second:
            load_into(mixin, m, second, "b")
            m.set_adapters(["a", "b"], [0.7, 1.3])
            out[f"{prefix}.multi"] = call(m, io)
        m = fresh()
        load_into(mixin, m, adapters, "a")
        m.fuse_lora(lora_scale=0.7)
        out[f"{prefix}.fused_s07"] = call(m, io)
        if fused_dir:
            m.unload_lora()
            m.save_pretrained(fused_dir)


def flux_call(m, io):
    return m(hidden_states=io["hidden_states"], encoder_hidden_states=io["encoder_hidden_states"],
             pooled_projections=io["pooled_projections"], timestep=io["timestep"], img_ids=io["img_ids"],
             txt_ids=io["txt_ids"], guidance=io.get("guidance"), return_dict=False)[0].contiguous()


def flux2_call(m, io):
    return m(hidden_states=io["hidden_states"], encoder_hidden_states=io["encoder_hidden_states"], timestep=io["timestep"],
             img_ids=io["img_ids"], txt_ids=io["txt_ids"], guidance=io.get("guidance"), return_dict=False)[0].contiguous()


def sd3_call(m, io):
    return m(hidden_states=io["hidden_states"], encoder_hidden_states=io["encoder_hidden_states"],
             pooled_projections=io["pooled_projections"], timestep=io["timestep"], return_dict=False)[0].contiguous()


# ---- text encoders, whole pipelines ----------------------------------------------------------
# Which text encoders diffusers 0.42 loads LoRA into (lora_pipeline.py): FluxLoraLoaderMixin
# `_lora_loadable_modules = ["transformer", "text_encoder"]` (CLIP-L only: its kohya/ComfyUI
# converter drops `text_encoders.t5xxl.*` and `text_projection` keys), SD3LoraLoaderMixin
# ["transformer", "text_encoder", "text_encoder_2"] (CLIP-L and CLIP-G, not T5),
# Flux2LoraLoaderMixin ["transformer"] only.
TE_PIPE_STEPS = 3


def te_adapter(pipe, components, seed, kohya=False, alphas=False):
    """Random adapters on every nn.Linear of the CLIP encoder layers of `components` (not
    text_projection: a bare parameter in cdiffusers' CLIP and filtered by diffusers' converters).
    kohya: sd-scripts names "lora_te1_text_model_encoder_layers_0_self_attn_q_proj.lora_down..."."""
    g = gen(seed)
    sd = {}
    n = 0
    for comp in components:
        enc = getattr(pipe, comp)
        for name, mod in enc.named_modules():
            if not isinstance(mod, torch.nn.Linear) or "encoder.layers." not in name:
                continue
            # files name the modules as transformers 4 did ("text_model.encoder..."); transformers 5
            # dropped the wrapper and diffusers' text-encoder loader strips the prefix again
            name = name if name.startswith("text_model.") else "text_model." + name
            r = (4, 2, 3)[n % 3]
            alpha = (6.0, 1.0, 3.0)[n % 3]
            n += 1
            A = rnd(g, r, mod.in_features, std=mod.in_features ** -0.5)
            B = rnd(g, mod.out_features, r, std=0.3)
            if kohya:
                k = "lora_te1_" + name.replace(".", "_")
                sd[f"{k}.lora_down.weight"], sd[f"{k}.lora_up.weight"] = A, B
                if n % 4:  # one in four without alpha (alpha = rank)
                    sd[f"{k}.alpha"] = torch.tensor(alpha)
            else:
                sd[f"{comp}.{name}.lora_A.weight"], sd[f"{comp}.{name}.lora_B.weight"] = A, B
                if alphas:
                    # one alpha for every module (ranks still vary, so alpha / rank does): with
                    # transformers 5 diffusers strips "text_model." from the text encoder's LoRA
                    # keys but not from its network alphas, so PEFT's alpha_pattern names match no
                    # module and every module gets the most common alpha (diffusers 0.42.1, peft
                    # 0.21.2); cdiffusers applies each module's own alpha (see README.md)
                    sd[f"{comp}.{name}.alpha"] = torch.tensor(6.0)
    return sd


def te_run(pipe, call):
    """prompt embeddings and the latents after the loop (pipeline call with output_type="latent")."""
    out = {}
    with torch.no_grad():
        if isinstance(pipe, diffusers.FluxPipeline):
            pe, pooled, _ = pipe.encode_prompt(prompt=call["prompt"], prompt_2=None,
                                               max_sequence_length=call["max_sequence_length"])
            out["prompt_embeds"], out["pooled_prompt_embeds"] = pe, pooled
        else:
            pe, npe, pooled, npooled = pipe.encode_prompt(
                prompt=call["prompt"], prompt_2=None, prompt_3=None, negative_prompt=call.get("negative_prompt"),
                do_classifier_free_guidance=call["guidance_scale"] > 1, max_sequence_length=call["max_sequence_length"])
            out["prompt_embeds"], out["pooled_prompt_embeds"] = pe, pooled
            out["negative_prompt_embeds"], out["negative_pooled_prompt_embeds"] = npe, npooled
        kw = {k: v for k, v in call.items() if k != "seed"}
        lat = pipe(**kw, generator=torch.Generator("cpu").manual_seed(call["seed"]), output_type="latent").images
        out["latents_final"] = lat
    return {k: v.contiguous().float() for k, v in out.items()}


def text_encoder_pipeline_cases(out_dir):
    """FluxPipeline (tests/data/pipelines/flux1_dev_tiny) and StableDiffusion3Pipeline (sd35m_tiny)
    with text-encoder adapters loaded by pipe.load_lora_weights: run time at 1 and (set_adapters)
    0.7, fused at 0.7 (pipe.fuse_lora), and fused then unfuse_lora + unload_lora_weights."""
    P = os.path.join(ROOT, "tests", "data", "pipelines")
    cases = {
        # name: (pipeline class, folder, adapter files (kind), call)
        "flux": (diffusers.FluxPipeline, "flux1_dev_tiny",
                 dict(prompt="A capybara wearing a tiny astronaut helmet, studio photo", height=64, width=64,
                      num_inference_steps=TE_PIPE_STEPS, guidance_scale=3.5, max_sequence_length=64, seed=1234)),
        "sd3": (diffusers.StableDiffusion3Pipeline, "sd35m_tiny",
                dict(prompt="A capybara holding a sign that reads Hello World", negative_prompt="blurry, low quality, distorted",
                     height=64, width=64, num_inference_steps=TE_PIPE_STEPS, guidance_scale=4.5, max_sequence_length=64,
                     seed=0)),
    }
    info = {}
    for name, (cls, folder, call) in cases.items():
        path = os.path.join(P, folder)
        pipe = cls.from_pretrained(path, torch_dtype=torch.float32)
        pipe.set_progress_bar_config(disable=True)
        if name == "flux":
            # a transformer module next to the text encoder's keeps the mixed-file path honest
            tsd = flux_peft_adapter(json.load(open(os.path.join(path, "transformer", "config.json"))), 21, alphas=False)
            tsd = {k: v for k, v in tsd.items() if "transformer_blocks.0.attn.to_q." in k and "single" not in k}
            adapters = {"pipe_flux_te_peft": {**te_adapter(pipe, ["text_encoder"], 22, alphas=True), **tsd},
                        "pipe_flux_te_kohya": te_adapter(pipe, ["text_encoder"], 23, kohya=True)}
        else:
            adapters = {"pipe_sd3_te_peft": te_adapter(pipe, ["text_encoder", "text_encoder_2"], 24)}
        res = {"base": te_run(pipe, call)}
        for aname, sd in adapters.items():
            f = os.path.join(out_dir, f"{aname}.safetensors")
            save_file(sd, f, metadata={"format": "pt"})
            pipe = cls.from_pretrained(path, torch_dtype=torch.float32)
            pipe.set_progress_bar_config(disable=True)
            pipe.load_lora_weights(f, adapter_name="a")
            res[f"{aname}.runtime_s1"] = te_run(pipe, call)
            pipe.set_adapters(["a"], [0.7])
            res[f"{aname}.runtime_s07"] = te_run(pipe, call)
            pipe = cls.from_pretrained(path, torch_dtype=torch.float32)
            pipe.set_progress_bar_config(disable=True)
            pipe.load_lora_weights(f, adapter_name="a")
            # every loadable component: FluxLoraLoaderMixin.fuse_lora's default is ["transformer"]
            # (its text encoder would stay a run-time adapter at scale 1)
            pipe.fuse_lora(components=list(pipe._lora_loadable_modules), lora_scale=0.7)
            res[f"{aname}.fused_s07"] = te_run(pipe, call)
            # cdf_pipeline_unload_lora after a fuse: unfuse_lora (PEFT subtracts the merged delta)
            # and unload_lora_weights (drops the adapter layers): the base model again, up to rounding
            pipe.unfuse_lora()
            pipe.unload_lora_weights()
            res[f"{aname}.unloaded"] = te_run(pipe, call)
        flat = {f"{k}.{t}": v for k, d in res.items() for t, v in d.items()}
        save_file(flat, os.path.join(out_dir, f"pipe_{name}_te.safetensors"))
        info[name] = {"call": call, "folder": f"tests/data/pipelines/{folder}",
                      "max_abs_diff_vs_base": {k: {t: float((v - res["base"][t]).abs().max()) for t, v in d.items()}
                                               for k, d in res.items() if k != "base"}}
    return info


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "data", "lora"))
    ap.add_argument("--fused-folders", action="store_true", help="also write the offline-fused transformer folders")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    meta = {"diffusers": diffusers.__version__, "torch": torch.__version__, "script": "tools/make-lora-golden/make_lora_golden.py"}
    import peft
    meta["peft"] = peft.__version__

    # FLUX.1-dev
    folder = os.path.join(GOLDEN, "flux1_dev", "transformer")
    cfg = json.load(open(os.path.join(folder, "config.json")))
    io = load_file(os.path.join(GOLDEN, "flux1_dev", "io.safetensors"))
    d = flux_dims(cfg)
    patch_kohya_dims(d["D"], d["M"])
    files = {
        "flux_peft": flux_peft_adapter(cfg, 1, alphas=True),
        "flux_kohya": flux_kohya_adapter(cfg, 2),
        "flux_second": flux_peft_adapter(cfg, 3, alphas=False),
        "flux_xlabs": flux_xlabs_adapter(cfg, 6),
    }
    for k, sd in files.items():
        save_file(sd, os.path.join(a.out, f"{k}.safetensors"), metadata={"format": "pt"})
    out = {}
    second = os.path.join(a.out, "flux_second.safetensors")
    for k in ("flux_peft", "flux_kohya", "flux_xlabs"):
        fdir = os.path.join(a.out, f"{k}_fused") if a.fused_folders else None
        run_case(FluxTransformer2DModel, FluxLoraLoaderMixin, folder, io, flux_call, os.path.join(a.out, f"{k}.safetensors"),
                 second, out, k, fdir)
    save_file({f"out.{k}": v for k, v in out.items()}, os.path.join(a.out, "flux.safetensors"))
    stats = {k: {"max_abs": float(v.abs().max()), "max_abs_diff_vs_base": float((v - out["base"]).abs().max())}
             for k, v in out.items()}

    # SD3
    folder = os.path.join(GOLDEN, "sd3", "transformer")
    cfg = json.load(open(os.path.join(folder, "config.json")))
    io = load_file(os.path.join(GOLDEN, "sd3", "io.safetensors"))
    save_file(sd3_peft_adapter(cfg, 4), os.path.join(a.out, "sd3_peft.safetensors"), metadata={"format": "pt"})
    out3 = {}
    run_case(SD3Transformer2DModel, SD3LoraLoaderMixin, folder, io, sd3_call, os.path.join(a.out, "sd3_peft.safetensors"),
             None, out3, "sd3_peft", os.path.join(a.out, "sd3_peft_fused") if a.fused_folders else None)
    save_file({f"out.{k}": v for k, v in out3.items()}, os.path.join(a.out, "sd3.safetensors"))
    stats.update({f"sd3.{k}": {"max_abs": float(v.abs().max()), "max_abs_diff_vs_base": float((v - out3["base"]).abs().max())}
                  for k, v in out3.items()})
    # FLUX.2 dev (guidance embedding) and klein
    for name, seed in (("flux2_dev", 7), ("flux2_klein", 8)):
        folder = os.path.join(GOLDEN, name, "transformer")
        io = load_file(os.path.join(GOLDEN, name, "io.safetensors"))
        adapter = os.path.join(a.out, f"{name}_peft.safetensors")
        save_file(flux2_peft_adapter(folder, seed), adapter, metadata={"format": "pt"})
        o = {}
        run_case(Flux2Transformer2DModel, Flux2LoraLoaderMixin, folder, io, flux2_call, adapter, None, o, f"{name}_peft")
        if name == "flux2_dev":  # kohya and ai-toolkit names (dev: the guidance embedder too)
            for kind, kseed in (("kohya", 9), ("aitk", 10), ("peftbm", 10)):
                adapter = os.path.join(a.out, f"{name}_{kind}.safetensors")
                sd = flux2_orig_adapter(folder, kseed, kind == "kohya")
                if kind == "peftbm":  # PEFT's save_pretrained spelling of the ai-toolkit adapter
                    sd = {"base_model.model." + k[len("diffusion_model."):]: v for k, v in sd.items()}
                save_file(sd, adapter, metadata={"format": "pt"})
                if kind != "peftbm":
                    run_case(Flux2Transformer2DModel, Flux2LoraLoaderMixin, folder, io, flux2_call, adapter, None, o,
                             f"{name}_{kind}")
                    continue
                # diffusers must give the ai-toolkit adapter's outputs bit for bit (the test reuses
                # them); its outputs are not saved, so the committed ones stay as they were made
                bm = {}
                run_case(Flux2Transformer2DModel, Flux2LoraLoaderMixin, folder, io, flux2_call, adapter, None, bm, "bm")
                for s in ("runtime_s1", "runtime_s07", "fused_s07"):
                    assert torch.equal(bm[f"bm.{s}"], o[f"{name}_aitk.{s}"]), f"base_model.model. spelling differs at {s}"
        save_file({f"out.{k}": v for k, v in o.items()}, os.path.join(a.out, f"{name}.safetensors"))
        stats.update({f"{name}.{k}": {"max_abs": float(v.abs().max()), "max_abs_diff_vs_base": float((v - o["base"]).abs().max())}
                      for k, v in o.items()})
    # The tiny FluxPipeline's transformer (tests/data/pipelines/flux1_dev_tiny): a kohya adapter and
    # that adapter merged offline by diffusers (fuse_lora at 0.8, unload_lora, save_pretrained):
    # the folder `--lora-mode fuse` must reproduce.
    folder = os.path.join(ROOT, "tests", "data", "pipelines", "flux1_dev_tiny", "transformer")
    cfg = json.load(open(os.path.join(folder, "config.json")))
    d = flux_dims(cfg)
    patch_kohya_dims(d["D"], d["M"])
    pipe_lora = os.path.join(a.out, "pipe_flux1_dev_tiny_kohya.safetensors")
    save_file(flux_kohya_adapter(cfg, 5), pipe_lora, metadata={"format": "pt"})
    with torch.no_grad():
        m = FluxTransformer2DModel.from_pretrained(folder, torch_dtype=torch.float32).eval()
        load_into(FluxLoraLoaderMixin, m, pipe_lora, "a")
        m.fuse_lora(lora_scale=0.8)
        m.unload_lora()
        fused_dir = os.path.join(a.out, "pipe_flux1_dev_tiny_fused_0.8", "transformer")
        m.save_pretrained(fused_dir)
        base = FluxTransformer2DModel.from_pretrained(folder, torch_dtype=torch.float32)
        q = "transformer_blocks.0.attn.to_q.weight"
        meta["pipe_fused_to_q_change"] = float((m.state_dict()[q] - base.state_dict()[q]).abs().max())
    meta["text_encoder_pipelines"] = text_encoder_pipeline_cases(a.out)
    meta["outputs"] = stats
    json.dump(meta, open(os.path.join(a.out, "reference.json"), "w"), indent=1, sort_keys=True)
    print(json.dumps(stats, indent=1))


if __name__ == "__main__":
    sys.exit(main())
