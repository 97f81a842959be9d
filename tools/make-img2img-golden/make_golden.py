"""Reference data for img2img, inpainting and batches, computed by diffusers' own pipelines.

Runs FluxImg2ImgPipeline, StableDiffusion3Img2ImgPipeline, FluxInpaintPipeline,
StableDiffusion3InpaintPipeline, and FluxPipeline / StableDiffusion3Pipeline with batches, unmodified,
on the tiny golden pipeline folders of tests/data/pipelines/, CPU, float32, 1 thread. Nothing of
cdiffusers is used. Every intermediate is taken from the running pipeline through hooks that do not
change the computation (a wrapper that records the scheduler's scale_noise arguments, a forward
pre-hook on the transformer, callback_on_step_end returning the latents unchanged).

usage: /work/venv/bin/python tools/make-img2img-golden/make_golden.py [OUT_DIR]
       (default OUT_DIR: tests/data/golden/img2img)
"""
import hashlib
import json
import os
import sys

import numpy as np
import PIL.Image
import torch
import diffusers
from diffusers import (Flux2Pipeline, FluxImg2ImgPipeline, FluxInpaintPipeline, FluxPipeline, StableDiffusion3Img2ImgPipeline,
                       StableDiffusion3InpaintPipeline, StableDiffusion3Pipeline)
from safetensors.torch import load_file, save_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PIPES = os.path.join(ROOT, "tests", "data", "pipelines")
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "data", "golden", "img2img")
torch.set_num_threads(1)


def make_image(w, h, seed):
    """A smooth colour picture (gradients + a disc) so that a resize has something to do."""
    rs = np.random.RandomState(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    img = np.zeros((h, w, 3))
    for c in range(3):
        a, b, ph = rs.uniform(0.05, 0.3), rs.uniform(0.05, 0.3), rs.uniform(0, 6.28)
        img[..., c] = 127.5 + 100 * np.sin(a * x + b * y + ph)
    cy, cx, r = h * rs.uniform(0.3, 0.7), w * rs.uniform(0.3, 0.7), min(h, w) * 0.25
    disc = (y - cy) ** 2 + (x - cx) ** 2 < r * r
    img[disc] = rs.uniform(0, 255, 3)
    img += rs.normal(0, 6, img.shape)
    return PIL.Image.fromarray(np.clip(np.round(img), 0, 255).astype(np.uint8), "RGB")


def make_mask(w, h):
    """White (repaint) rectangle in the middle of a black mask, mode L."""
    m = np.zeros((h, w), np.uint8)
    m[h // 4: (3 * h) // 4, w // 3: (2 * w) // 3] = 255
    return PIL.Image.fromarray(m, "L")


class Recorder:
    """Records what the pipeline computes, without changing it."""

    def __init__(self, pipe):
        self.pipe = pipe
        self.scale_noise_calls = []
        self.transformer_inputs = []
        self.step_latents = []
        sched = pipe.scheduler
        orig = sched.scale_noise

        def scale_noise(sample, timestep, noise=None):
            out = orig(sample, timestep, noise)
            self.scale_noise_calls.append((sample.clone(), timestep.clone() if torch.is_tensor(timestep) else
                                           torch.tensor(timestep), noise.clone(), out.clone()))
            return out

        sched.scale_noise = scale_noise
        self.hook = pipe.transformer.register_forward_pre_hook(self.pre_hook, with_kwargs=True)
        self.preprocessed = {}
        for attr, key in (("image_processor", "init_image"), ("mask_processor", "mask_condition")):
            proc = getattr(pipe, attr, None)
            if proc is not None:
                proc.preprocess = self.wrap_preprocess(proc.preprocess, key)

    def wrap_preprocess(self, orig, key):
        def preprocess(*a, **k):
            out = orig(*a, **k)
            self.preprocessed.setdefault(key, out.clone())
            return out
        return preprocess

    def pre_hook(self, module, args, kwargs):
        if not self.transformer_inputs:
            self.transformer_inputs.append({k: v.clone() for k, v in kwargs.items() if torch.is_tensor(v)})

    def callback(self, pipe, i, t, kw):
        self.step_latents.append(kw["latents"].clone())
        return kw


def load(cls, folder):
    if cls is Flux2Pipeline:
        # the tiny folder's Mistral tokenizer/processor does not load with this transformers; the
        # prompt embedding comes from the folder's own golden case instead (prompt_embeds)
        return cls.from_pretrained(os.path.join(PIPES, folder), dtype=torch.float32, tokenizer=None, text_encoder=None)
    return cls.from_pretrained(os.path.join(PIPES, folder), dtype=torch.float32)


def run_case(name, cls, folder, call, image=None, mask=None, seeds=None, img_size=None):
    """call: pipeline kwargs without image/mask/generator; seeds: one int (one generator) or a list."""
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    pipe = load(cls, folder)
    pipe.set_progress_bar_config(disable=True)
    kw = dict(call)
    if isinstance(image, list):  # FLUX.2 reference images
        kw["image"] = []
        for i, im in enumerate(image):
            im.save(os.path.join(d, "image_in_%d.png" % i))
            kw["image"].append(PIL.Image.open(os.path.join(d, "image_in_%d.png" % i)))
    elif image is not None:
        image.save(os.path.join(d, "image_in.png"))
        kw["image"] = PIL.Image.open(os.path.join(d, "image_in.png"))
    if mask is not None:
        mask.save(os.path.join(d, "mask_in.png"))
        kw["mask_image"] = PIL.Image.open(os.path.join(d, "mask_in.png"))
    gens = ([torch.Generator("cpu").manual_seed(s) for s in seeds] if isinstance(seeds, list)
            else torch.Generator("cpu").manual_seed(seeds))
    rec = Recorder(pipe)
    with torch.no_grad():
        out = pipe(**kw, generator=gens, output_type="np", callback_on_step_end=rec.callback,
                   callback_on_step_end_tensor_inputs=["latents"])
    images = out.images  # (B, H, W, 3) float32
    t = {}
    hs = rec.transformer_inputs[0]["hidden_states"]
    if cls in (StableDiffusion3Img2ImgPipeline, StableDiffusion3InpaintPipeline, StableDiffusion3Pipeline):
        if call.get("guidance_scale", 7.0) > 1:  # CFG: [negative; positive] batch, latents repeated
            hs = hs[: hs.shape[0] // 2]
    if cls is Flux2Pipeline and image is not None:
        # the transformer sees [latents; reference tokens]: keep both parts and their ids
        n = rec.step_latents[-1].shape[1]
        t["image_latents"] = hs[:, n:].contiguous()
        t["image_latent_ids"] = rec.transformer_inputs[0]["img_ids"][:, n:].contiguous()
        hs = hs[:, :n]
    t["latents_initial"] = hs.contiguous()
    t["latents_final"] = rec.step_latents[-1].contiguous()
    t["latents_after_step"] = torch.stack(rec.step_latents).contiguous()
    t["timesteps"] = pipe.scheduler.timesteps.float().contiguous()  # the full schedule
    t["sigmas"] = pipe.scheduler.sigmas.float().contiguous()
    t["image"] = torch.from_numpy(images).contiguous()
    t["image_uint8"] = torch.from_numpy((images * 255).round().astype(np.uint8)).contiguous()
    for k, v in rec.preprocessed.items():
        t[k] = v.float().contiguous()  # init_image in [-1, 1] (1,3,H,W); mask_condition binarised (1,1,H,W)
    if rec.scale_noise_calls:
        sample, ts, noise, res = rec.scale_noise_calls[0]
        t["image_latents"] = sample.contiguous()   # (vae sample - shift) * scale, unpacked, batch-expanded
        t["noise"] = noise.contiguous()             # randn drawn after the VAE's latent sample
        t["scale_noise_timestep"] = ts.float().reshape(-1).contiguous()
    n_steps_run = len(rec.step_latents)
    meta = {
        "pipeline": cls.__name__, "folder": "tests/data/pipelines/" + folder,
        "call": {k: (v if not torch.is_tensor(v) else "tensor %s (the flux2_dev_tiny 64x64 case's prompt_embeds)"
                     % list(v.shape)) for k, v in call.items()}, "seeds": seeds,
        "generator": "one torch.Generator('cpu').manual_seed(seed)" if not isinstance(seeds, list)
        else "a list of torch.Generator('cpu').manual_seed(s)",
        "image_in": (["image_in_%d.png" % i for i in range(len(image))] if isinstance(image, list)
                     else "image_in.png" if image is not None else None),
        "image_in_size": ([list(im.size) for im in image] if isinstance(image, list)
                          else list(image.size) if image is not None else None),
        "mask_in": "mask_in.png" if mask is not None else None,
        "steps_run": n_steps_run,
        "t_start": len(pipe.scheduler.timesteps) - n_steps_run,
        "tensors": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in t.items()},
        "diffusers": diffusers.__version__, "torch": torch.__version__,
    }
    save_file(t, os.path.join(d, "expected.safetensors"))
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(meta, f, indent=1)
    for b in range(images.shape[0]):
        PIL.Image.fromarray(t["image_uint8"][b].numpy()).save(os.path.join(d, "out-%03d.png" % b))
    print(name, {k: tuple(v.shape) for k, v in t.items()}, "steps", n_steps_run, flush=True)


def main():
    os.makedirs(OUT, exist_ok=True)
    img64 = make_image(64, 64, 1)
    img_odd = make_image(70, 50, 2)  # resized (Lanczos) to 80x48 by the pipelines
    fl = dict(prompt="a red house by a lake", num_inference_steps=8, guidance_scale=3.5, max_sequence_length=32)
    sd = dict(prompt="a red house by a lake", negative_prompt="blurry", num_inference_steps=8, guidance_scale=5.0,
              max_sequence_length=32)
    run_case("flux_img2img_s06_64x64", FluxImg2ImgPipeline, "flux1_dev_tiny",
             dict(fl, height=64, width=64, strength=0.6), image=img64, seeds=7)
    run_case("flux_img2img_s09_48x80", FluxImg2ImgPipeline, "flux1_dev_tiny",
             dict(fl, height=48, width=80, strength=0.9), image=img_odd, seeds=8)
    run_case("sd3_img2img_s06_64x64", StableDiffusion3Img2ImgPipeline, "sd35m_tiny",
             dict(sd, height=64, width=64, strength=0.6), image=img64, seeds=7)
    run_case("sd3_img2img_s03_48x80", StableDiffusion3Img2ImgPipeline, "sd35m_tiny",
             dict(sd, height=48, width=80, strength=0.3), image=img_odd, seeds=8)
    run_case("flux_inpaint_s08_64x64", FluxInpaintPipeline, "flux1_dev_tiny",
             dict(fl, height=64, width=64, strength=0.8), image=img64, mask=make_mask(64, 64), seeds=9)
    run_case("flux_inpaint_s10_48x80", FluxInpaintPipeline, "flux1_dev_tiny",
             dict(fl, height=48, width=80, strength=1.0), image=img_odd, mask=make_mask(70, 50), seeds=10)
    run_case("sd3_inpaint_s07_64x64", StableDiffusion3InpaintPipeline, "sd35m_tiny",
             dict(sd, height=64, width=64, strength=0.7), image=img64, mask=make_mask(64, 64), seeds=9)
    run_case("sd3_inpaint_s10_48x80", StableDiffusion3InpaintPipeline, "sd35m_tiny",
             dict(sd, height=48, width=80, strength=1.0), image=img_odd, mask=make_mask(70, 50), seeds=10)
    # batches
    run_case("flux_t2i_n2_64x64", FluxPipeline, "flux1_dev_tiny",
             dict(fl, height=64, width=64, num_images_per_prompt=2), seeds=11)
    run_case("flux_t2i_gens_64x64", FluxPipeline, "flux1_dev_tiny",
             dict(fl, height=64, width=64, num_images_per_prompt=2), seeds=[12, 13])
    run_case("sd3_t2i_n2_64x64", StableDiffusion3Pipeline, "sd35m_tiny",
             dict(sd, height=64, width=64, num_images_per_prompt=2), seeds=11)
    run_case("sd3_t2i_gens_64x64", StableDiffusion3Pipeline, "sd35m_tiny",
             dict(sd, height=64, width=64, num_images_per_prompt=2), seeds=[12, 13])
    run_case("flux_img2img_n2_64x64", FluxImg2ImgPipeline, "flux1_dev_tiny",
             dict(fl, height=64, width=64, strength=0.7, num_images_per_prompt=2), image=img64, seeds=14)
    # FLUX.2 reference images (prompt_embeds of the folder's own 64x64 case)
    f2 = os.path.join(PIPES, "flux2_dev_tiny", "cases", "64x64", "expected.safetensors")
    pe = load_file(f2)["prompt_embeds"]
    f2call = dict(prompt_embeds=pe, num_inference_steps=4, guidance_scale=4.0)
    run_case("flux2_ref1_64x64", Flux2Pipeline, "flux2_dev_tiny", dict(f2call), image=[make_image(64, 64, 3)], seeds=21)
    run_case("flux2_ref2_64x96", Flux2Pipeline, "flux2_dev_tiny", dict(f2call, height=64, width=96),
             image=[make_image(100, 70, 4), make_image(64, 80, 5)], seeds=22)
    # manifest
    man = {}
    for dp, _, fs in os.walk(OUT):
        for f in sorted(fs):
            if f == "manifest.json":
                continue
            p = os.path.join(dp, f)
            man[os.path.relpath(p, OUT)] = {"size": os.path.getsize(p),
                                            "sha256": hashlib.sha256(open(p, "rb").read()).hexdigest()}
    with open(os.path.join(OUT, "manifest.json"), "w") as f:
        json.dump(dict(sorted(man.items())), f, indent=1)


if __name__ == "__main__":
    main()
