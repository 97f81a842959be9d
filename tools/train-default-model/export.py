"""Configs of the shapes-flux-tiny pipeline and its export to a diffusers-layout folder."""
import json
import os
import shutil
import struct

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
T5_LEN = 24  # max_sequence_length of this model (the longest caption is 16 T5 tokens)

VAE_CFG = {
    "_class_name": "AutoencoderKL", "_diffusers_version": "0.40.0.dev0", "act_fn": "silu",
    "block_out_channels": [16, 32, 32, 32],
    "down_block_types": ["DownEncoderBlock2D"] * 4, "up_block_types": ["UpDecoderBlock2D"] * 4,
    "force_upcast": True, "in_channels": 3, "out_channels": 3, "latent_channels": 16,
    "latents_mean": None, "latents_std": None, "layers_per_block": 1, "mid_block_add_attention": True,
    "norm_num_groups": 8, "sample_size": 64, "scaling_factor": 1.0, "shift_factor": 0.0,
    "use_post_quant_conv": False, "use_quant_conv": False,
}
CLIP_CFG = {
    "architectures": ["CLIPTextModel"], "attention_dropout": 0.0, "bos_token_id": 0, "dropout": 0.0,
    "eos_token_id": 2, "hidden_act": "quick_gelu", "hidden_size": 64, "initializer_factor": 1.0,
    "initializer_range": 0.02, "intermediate_size": 128, "layer_norm_eps": 1e-05,
    "max_position_embeddings": 77, "model_type": "clip_text_model", "num_attention_heads": 2,
    "num_hidden_layers": 2, "pad_token_id": 1, "projection_dim": 64, "torch_dtype": "bfloat16",
    "vocab_size": 49408,
}
T5_CFG = {
    "architectures": ["T5EncoderModel"], "classifier_dropout": 0.0, "d_ff": 128, "d_kv": 32, "d_model": 64,
    "decoder_start_token_id": 0, "dense_act_fn": "gelu_new", "dropout_rate": 0.0, "eos_token_id": 1,
    "feed_forward_proj": "gated-gelu", "initializer_factor": 1.0, "is_encoder_decoder": True,
    "is_gated_act": True, "layer_norm_epsilon": 1e-06, "model_type": "t5", "num_decoder_layers": 2,
    "num_heads": 2, "num_layers": 2, "output_past": True, "pad_token_id": 0,
    "relative_attention_max_distance": 128, "relative_attention_num_buckets": 32,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "vocab_size": 32128,
}
FLUX_CFG = {
    "_class_name": "FluxTransformer2DModel", "_diffusers_version": "0.40.0.dev0",
    "attention_head_dim": 32, "axes_dims_rope": [8, 12, 12], "guidance_embeds": False, "in_channels": 64,
    "joint_attention_dim": 64, "num_attention_heads": 3, "num_layers": 2, "num_single_layers": 3,
    "out_channels": None, "patch_size": 1, "pooled_projection_dim": 64,
}
SCHED_CFG = {
    "_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.40.0.dev0",
    "base_image_seq_len": 256, "base_shift": 0.5, "invert_sigmas": False, "max_image_seq_len": 4096,
    "max_shift": 1.15, "num_train_timesteps": 1000, "shift": 1.0, "shift_terminal": None,
    "stochastic_sampling": False, "time_shift_type": "exponential", "use_beta_sigmas": False,
    "use_dynamic_shifting": False, "use_exponential_sigmas": False, "use_karras_sigmas": False,
}
MODEL_INDEX = {
    "_class_name": "FluxPipeline", "_diffusers_version": "0.40.0.dev0",
    "feature_extractor": [None, None], "image_encoder": [None, None],
    "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
    "text_encoder": ["transformers", "CLIPTextModel"], "text_encoder_2": ["transformers", "T5EncoderModel"],
    "tokenizer": ["transformers", "CLIPTokenizer"], "tokenizer_2": ["transformers", "T5TokenizerFast"],
    "transformer": ["diffusers", "FluxTransformer2DModel"], "vae": ["diffusers", "AutoencoderKL"],
}
# read by `cdiffusers generate` for whatever the user does not pass (cli/main.c)
CLI_DEFAULTS = {"height": 64, "width": 64, "num_inference_steps": 20, "guidance_scale": 0.0,
                "max_sequence_length": T5_LEN, "true_cfg_scale": 3.0, "negative_prompt": ""}


def save_safetensors(path, tensors, dtype="bf16"):
    """Plain safetensors writer (header JSON + raw little-endian data), names sorted."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().float().contiguous()
        if dtype == "bf16":
            b = t.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
            dt = "BF16"
        elif t.dtype == torch.int64:
            b, dt = t.numpy().tobytes(), "I64"
        else:
            b, dt = t.numpy().astype(np.float32).tobytes(), "F32"
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def save_inputs(path, tensors):
    """Inputs/outputs for run-model: float32 and int64 kept as they are."""
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        if t.dtype == torch.int64:
            b, dt = t.numpy().tobytes(), "I64"
        else:
            b, dt = t.float().numpy().tobytes(), "F32"
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        raw = data[a:b]
        if v["dtype"] == "F32":
            arr = np.frombuffer(raw, np.float32).copy()
            t = torch.from_numpy(arr)
        elif v["dtype"] == "BF16":
            arr = np.frombuffer(raw, np.int16).copy()
            t = torch.from_numpy(arr).view(torch.bfloat16).float()
        elif v["dtype"] == "I64":
            t = torch.from_numpy(np.frombuffer(raw, np.int64).copy())
        else:
            raise ValueError(v["dtype"])
        out[k] = t.reshape(v["shape"])
    return out


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def export_pipeline(out_dir, vae, clip, t5, flux, vae_cfg, dtype="bf16"):
    """Writes the whole FluxPipeline folder (weights in `dtype`, tokenizer files copied)."""
    os.makedirs(out_dir, exist_ok=True)
    write_json(os.path.join(out_dir, "model_index.json"), MODEL_INDEX)
    write_json(os.path.join(out_dir, "cdiffusers_defaults.json"), CLI_DEFAULTS)
    parts = [("vae", vae, vae_cfg, "diffusion_pytorch_model.safetensors"),
             ("text_encoder", clip, CLIP_CFG, "model.safetensors"),
             ("text_encoder_2", t5, T5_CFG, "model.safetensors"),
             ("transformer", flux, FLUX_CFG, "diffusion_pytorch_model.safetensors")]
    for name, model, cfg, fname in parts:
        d = os.path.join(out_dir, name)
        os.makedirs(d, exist_ok=True)
        write_json(os.path.join(d, "config.json"), cfg)
        save_safetensors(os.path.join(d, fname), model.state_dict(), dtype)
    os.makedirs(os.path.join(out_dir, "scheduler"), exist_ok=True)
    write_json(os.path.join(out_dir, "scheduler", "scheduler_config.json"), SCHED_CFG)
    for sub, src in (("tokenizer", "clip_l"), ("tokenizer_2", "t5")):
        d = os.path.join(out_dir, sub)
        os.makedirs(d, exist_ok=True)
        sdir = os.path.join(REPO, "tests", "data", "tokenizers", src)
        for f in sorted(os.listdir(sdir)):
            shutil.copyfile(os.path.join(sdir, f), os.path.join(d, f))


def round_bf16(model):
    """Rounds every parameter to bfloat16 in place (what the exported folder holds)."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
