"""Reference data for the step caches, computed by diffusers' own cache hooks.

Runs FluxPipeline / FluxImg2ImgPipeline, unmodified, on the tiny golden pipeline folders of
tests/data/pipelines/ (CPU, float32, 1 thread) with
`pipe.transformer.enable_cache(FirstBlockCacheConfig(threshold=T))`. Nothing of cdiffusers is used.
What the pipeline computes is recorded without changing it: the latents after every step
(callback_on_step_end returning them unchanged) and every decision of the cache's head-block hook
(a wrapper around FBCHeadBlockHook._should_compute_remaining_blocks that calls the original and
records its result, the cache context ("cond" / "uncond") and the relative change
mean|r - r_prev| / mean|r_prev| it compared with the threshold, recomputed from the hook's state).

The tiny folders' weights are random: the first block's residual changes by 0.4-1.1 (relative)
from step to step, so a useful threshold like 0.05-0.2 never skips. The thresholds here are taken
from those measured changes so that some steps skip and some do not, and each recorded change is
at least MARGIN away from its threshold (checked; a float rounding cannot flip a decision).

usage: /work/venv39/bin/python tools/make-step-cache-golden/make_golden.py [OUT_DIR]
       (default OUT_DIR: tests/data/golden/step_cache)
"""
import ast
import contextlib
import importlib.util
import io
import json
import os
import sys

import numpy as np
import PIL.Image
import torch
import diffusers
from diffusers import Flux2Pipeline, FluxImg2ImgPipeline, FluxInpaintPipeline, FluxPipeline
from diffusers.hooks import FirstBlockCacheConfig, HookRegistry
from diffusers.hooks.first_block_cache import _FBC_LEADER_BLOCK_HOOK
from diffusers.hooks.mag_cache import FLUX_MAG_RATIOS, MagCacheConfig, MagCacheHeadHook
from diffusers.hooks.taylorseer_cache import _TAYLORSEER_CACHE_HOOK, TaylorSeerCacheConfig
from safetensors.torch import load_file, save_file

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PIPES = os.path.join(ROOT, "tests", "data", "pipelines")
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "data", "golden", "step_cache")
MARGIN = 0.01
torch.set_num_threads(1)

_spec = importlib.util.spec_from_file_location("img2img_golden", os.path.join(ROOT, "tools", "make-img2img-golden", "make_golden.py"))
_img2img = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_img2img)
make_image = _img2img.make_image
make_mask = _img2img.make_mask


def run_case(name, cls, folder, call, threshold, seed, image=None, set_context=False, mag=None, taylor=None, mask=None):
    """mag: None for FirstBlockCacheConfig(threshold), else MagCacheConfig's fields (the mag_ratios
    are FLUX_MAG_RATIOS unless given; the decisions come from a wrapper around MagCacheHeadHook.new_forward)."""
    if ONLY and name not in ONLY:
        return
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    decisions = []
    if mag is not None:
        orig_forward = MagCacheHeadHook.new_forward

        def new_forward(self, module, *args, **kwargs):
            out = orig_forward(self, module, *args, **kwargs)
            st = self.state_manager.get_state()
            decisions.append({"context": self.state_manager.context.name, "change": None, "computed": bool(st.should_compute)})
            return out

        MagCacheHeadHook.new_forward = new_forward
    if cls is Flux2Pipeline:
        # the tiny folder's Mistral tokenizer/processor does not load with this transformers: the
        # prompt embedding is the folder's own golden case's (as tools/make-img2img-golden does)
        pipe = cls.from_pretrained(os.path.join(PIPES, folder), dtype=torch.float32, tokenizer=None, text_encoder=None)
    else:
        pipe = cls.from_pretrained(os.path.join(PIPES, folder), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    if taylor is not None:
        kw_t = dict(taylor)
        if "taylor_factors_dtype" in kw_t:
            kw_t["taylor_factors_dtype"] = getattr(torch, kw_t["taylor_factors_dtype"])
        config = TaylorSeerCacheConfig(**kw_t)
        pipe.transformer.enable_cache(config)
        # every hooked module decides alike: record the first attention module's decisions (lite
        # mode hooks the blocks (inactive) and proj_out (active) instead: record proj_out's)
        first = pipe.transformer.proj_out if kw_t.get("use_lite_mode") else pipe.transformer.transformer_blocks[0].attn
        hook = HookRegistry.check_if_exists_or_initialize(first).get_hook(_TAYLORSEER_CACHE_HOOK)
        orig_measure = hook._measure_should_compute

        def measure():
            res, state = orig_measure()
            decisions.append({"context": hook.state_manager.context.name, "change": None, "computed": bool(res)})
            return res, state

        hook._measure_should_compute = measure
    elif mag is not None:
        kw_m = dict(mag)
        if "mag_ratios" not in kw_m and not kw_m.get("calibrate"):
            kw_m["mag_ratios"] = FLUX_MAG_RATIOS  # cdiffusers' default (diffusers has none)
        config = MagCacheConfig(**kw_m)
        pipe.transformer.enable_cache(config)
    else:
        config = FirstBlockCacheConfig(threshold=threshold)
        pipe.transformer.enable_cache(config)
        head = pipe.transformer.transformer_blocks[0]
        hook = HookRegistry.check_if_exists_or_initialize(head).get_hook(_FBC_LEADER_BLOCK_HOOK)
        orig = hook._should_compute_remaining_blocks

        def should_compute(residual):
            prev = hook.state_manager.get_state().head_block_residual
            res = orig(residual)
            change = None if prev is None else ((residual - prev).abs().mean() / prev.abs().mean()).item()
            decisions.append({"context": hook.state_manager.context.name, "change": change, "computed": bool(res)})
            return res

        hook._should_compute_remaining_blocks = should_compute
    if set_context:
        # FluxImg2ImgPipeline (0.42.1) calls the transformer without `cache_context`, and the hook then
        # raises "No cache context is set": give every call the context FluxPipeline gives it ("cond")
        from diffusers.hooks.hooks import CacheContext, _set_cache_context
        pipe.transformer.register_forward_pre_hook(lambda m, a: _set_cache_context(m, CacheContext("cond")))
        pipe.transformer.register_forward_hook(lambda m, a, o: _set_cache_context(m, None))
    steps = []

    def callback(p, i, t, kw):
        steps.append(kw["latents"].clone())
        return kw

    kw = dict(call)
    if cls is Flux2Pipeline:
        kw["prompt_embeds"] = load_file(os.path.join(PIPES, "flux2_dev_tiny", "cases", "64x64", "expected.safetensors"))["prompt_embeds"]
    if image is not None:
        image.save(os.path.join(d, "image_in.png"))
        kw["image"] = PIL.Image.open(os.path.join(d, "image_in.png"))
        if cls is Flux2Pipeline:
            kw["image"] = [kw["image"]]
    if mask is not None:
        mask.save(os.path.join(d, "mask_in.png"))
        kw["mask_image"] = PIL.Image.open(os.path.join(d, "mask_in.png"))
    printed = io.StringIO()  # MagCache's calibration prints its ratios (print(), stdout)
    try:
        with torch.no_grad(), contextlib.redirect_stdout(printed):
            out = pipe(**kw, generator=torch.Generator("cpu").manual_seed(seed), output_type="np", callback_on_step_end=callback,
                       callback_on_step_end_tensor_inputs=["latents"])
    finally:
        if mag is not None:
            MagCacheHeadHook.new_forward = orig_forward
    for dd in decisions:
        if dd["change"] is not None:
            assert abs(dd["change"] - threshold) >= MARGIN, (name, dd, threshold)
    contexts = sorted({dd["context"] for dd in decisions})
    per_ctx = {c: [dd for dd in decisions if dd["context"] == c] for c in contexts}
    for c, ds in per_ctx.items():
        n_full = sum(dd["computed"] for dd in ds)
        if mag is not None and mag.get("calibrate"):
            assert n_full == len(ds), (name, c, "calibration never skips", ds)
        else:
            assert 1 < n_full < len(ds), (name, c, "want some steps skipped and some computed", ds)
    # calibration: the printed text, and each printed list (one per context, in the order printed)
    calib_text = printed.getvalue()
    calib = [ast.literal_eval(line) for line in calib_text.splitlines() if line.startswith("[") and not line.startswith("[MagCache]")]
    if mag is not None and mag.get("calibrate"):
        assert len(calib) == len(contexts), (name, calib_text)
    images = out.images
    t = {
        "latents_after_step": torch.stack(steps).contiguous(),
        "latents_final": steps[-1].contiguous(),
        "image": torch.from_numpy(images).contiguous(),
    }
    meta = {
        "pipeline": cls.__name__, "folder": "tests/data/pipelines/" + folder, "call": call, "seeds": seed,
        "prompt_embeds": "the flux2_dev_tiny 64x64 case's" if cls is Flux2Pipeline else None,
        "cache": ("TaylorSeerCacheConfig(%s)" % ", ".join("%s=%s" % kv for kv in taylor.items()) if taylor is not None
                  else "MagCacheConfig(%s%s)" % ("" if "mag_ratios" in mag or mag.get("calibrate") else "mag_ratios=FLUX_MAG_RATIOS, ",
                                                  ", ".join("%s=%r" % kv for kv in mag.items())) if mag is not None
                  else "FirstBlockCacheConfig(threshold=%r)" % threshold),
        "threshold": threshold, "mag": mag, "taylorseer": taylor,
        "mag_ratios_used": config.mag_ratios.tolist() if mag is not None and not mag.get("calibrate") else None,
        # calibrate=True: what diffusers printed (stdout), and its lists in the order printed
        "calibration_stdout": calib_text if mag is not None and mag.get("calibrate") else None,
        "calibration_ratios": calib if mag is not None and mag.get("calibrate") else None,
        "cache_context": "set around every transformer call by this script (the pipeline sets none)" if set_context
        else "the pipeline's own",
        "image_in": "image_in.png" if image is not None else None,
        "mask_in": "mask_in.png" if mask is not None else None,
        "steps_run": len(steps),
        # one entry per transformer call, in call order (per step: "cond", then "uncond" with true CFG)
        "decisions": decisions,
        "computed_steps": {c: [i for i, dd in enumerate(ds) if dd["computed"]] for c, ds in per_ctx.items()},
        "tensors": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in t.items()},
        "diffusers": diffusers.__version__, "torch": torch.__version__,
    }
    save_file(t, os.path.join(d, "expected.safetensors"))
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(name, "computed", meta["computed_steps"],
          "changes", [None if dd["change"] is None else round(dd["change"], 4) for dd in decisions], flush=True)


ONLY = set(filter(None, os.environ.get("ONLY", "").split(",")))  # ONLY=case1,case2: make just those


def main():
    os.makedirs(OUT, exist_ok=True)
    fl = dict(prompt="a red house by a lake", guidance_scale=3.5, max_sequence_length=32)
    CASES(fl)



def CASES(fl):
    T = [float(x) for x in os.environ.get("FBC_T", "0.8,0.75,0.85,0.65").split(",")]
    run_case("fbc_dev_64x64", FluxPipeline, "flux1_dev_tiny", dict(fl, height=64, width=64, num_inference_steps=10), T[0], 7)
    run_case("fbc_dev_truecfg_64x64", FluxPipeline, "flux1_dev_tiny",
             dict(fl, height=64, width=64, num_inference_steps=10, negative_prompt="blurry", true_cfg_scale=2.0), T[1], 8)
    run_case("fbc_schnell_48x80", FluxPipeline, "flux1_schnell_tiny",
             dict(prompt="a red house by a lake", max_sequence_length=32, height=48, width=80, num_inference_steps=8), T[2], 9)
    run_case("fbc_img2img_s08_64x64", FluxImg2ImgPipeline, "flux1_dev_tiny",
             dict(fl, height=64, width=64, num_inference_steps=12, strength=0.8), T[3], 10, image=make_image(64, 64, 1),
             set_context=True)
    # MagCache: its decisions follow FLUX_MAG_RATIOS alone, so diffusers' defaults skip on the
    # random models too (num_inference_steps = the call's, as cdiffusers' default)
    run_case("mag_dev_64x64", FluxPipeline, "flux1_dev_tiny", dict(fl, height=64, width=64, num_inference_steps=10), None, 7,
             mag=dict(num_inference_steps=10))
    run_case("mag_dev_truecfg_fields_64x64", FluxPipeline, "flux1_dev_tiny",
             dict(fl, height=64, width=64, num_inference_steps=12, negative_prompt="blurry", true_cfg_scale=2.0), None, 8,
             mag=dict(threshold=0.1, max_skip_steps=2, retention_ratio=0.1, num_inference_steps=12))
    run_case("mag_schnell_28steps_48x80", FluxPipeline, "flux1_schnell_tiny",
             dict(prompt="a red house by a lake", max_sequence_length=32, height=48, width=80, num_inference_steps=28), None, 9,
             mag=dict(num_inference_steps=28))
    # img2img: MagCache sets its own context ("inference"); 12 steps of which 10 run
    run_case("mag_img2img_s08_64x64", FluxImg2ImgPipeline, "flux1_dev_tiny",
             dict(fl, height=64, width=64, num_inference_steps=12, strength=0.8), None, 10, image=make_image(64, 64, 1),
             mag=dict(num_inference_steps=12))
    run_case("mag_inpaint_s09_64x64", FluxInpaintPipeline, "flux1_dev_tiny",
             dict(fl, height=64, width=64, num_inference_steps=12, strength=0.9), None, 11, image=make_image(64, 64, 1),
             mask=make_mask(64, 64), mag=dict(num_inference_steps=12))
    # FLUX.2 (Flux2Pipeline sets no context: MagCache's own "inference"; First Block Cache fails
    # there, see docs/step-caches.md): text to image, and with a reference image
    run_case("mag_flux2_64x64", Flux2Pipeline, "flux2_dev_tiny", dict(height=64, width=64, num_inference_steps=10, guidance_scale=4.0),
             None, 21, mag=dict(num_inference_steps=10))
    run_case("mag_flux2_ref1_64x64", Flux2Pipeline, "flux2_dev_tiny",
             dict(height=64, width=64, num_inference_steps=8, guidance_scale=4.0), None, 22, image=make_image(64, 64, 3),
             mag=dict(threshold=0.1, num_inference_steps=8))
    # TaylorSeer: its schedule alone decides; the defaults keep bf16 Taylor factors
    run_case("ts_dev_64x64", FluxPipeline, "flux1_dev_tiny", dict(fl, height=64, width=64, num_inference_steps=12), None, 7,
             taylor=dict())
    run_case("ts_dev_truecfg_f32_order2_64x64", FluxPipeline, "flux1_dev_tiny",
             dict(fl, height=64, width=64, num_inference_steps=12, negative_prompt="blurry", true_cfg_scale=2.0), None, 8,
             taylor=dict(cache_interval=3, disable_cache_before_step=2, max_order=2, taylor_factors_dtype="float32"))
    run_case("ts_schnell_after8_48x80", FluxPipeline, "flux1_schnell_tiny",
             dict(prompt="a red house by a lake", max_sequence_length=32, height=48, width=80, num_inference_steps=10), None, 9,
             taylor=dict(cache_interval=2, disable_cache_after_step=8))


    # TaylorSeer's lite mode (use_lite_mode=True: the blocks "inactive", returning zeros on a
    # predicted step, proj_out "active": its output predicted from Taylor factors)
    run_case("ts_dev_lite_64x64", FluxPipeline, "flux1_dev_tiny", dict(fl, height=64, width=64, num_inference_steps=12), None, 7,
             taylor=dict(use_lite_mode=True))
    run_case("ts_dev_lite_truecfg_f32_order2_64x64", FluxPipeline, "flux1_dev_tiny",
             dict(fl, height=64, width=64, num_inference_steps=12, negative_prompt="blurry", true_cfg_scale=2.0), None, 8,
             taylor=dict(use_lite_mode=True, cache_interval=3, disable_cache_before_step=2, max_order=2, taylor_factors_dtype="float32"))
    # MagCache with its own mag_ratios (8 values, interpolated to 12 steps), and calibrate=True
    # (no mag_ratios: diffusers prints the measured ratios at the last step, per context)
    run_case("mag_dev_ratios_64x64", FluxPipeline, "flux1_dev_tiny", dict(fl, height=64, width=64, num_inference_steps=12), None, 7,
             mag=dict(num_inference_steps=12, mag_ratios=[1.0, 1.25, 1.1, 1.03, 1.01, 0.99, 0.97, 0.9]))
    run_case("mag_dev_calibrate_truecfg_64x64", FluxPipeline, "flux1_dev_tiny",
             dict(fl, height=64, width=64, num_inference_steps=10, negative_prompt="blurry", true_cfg_scale=2.0), None, 8,
             mag=dict(calibrate=True, num_inference_steps=10))
    run_case("mag_flux2_calibrate_64x64", Flux2Pipeline, "flux2_dev_tiny", dict(height=64, width=64, num_inference_steps=6, guidance_scale=4.0),
             None, 21, mag=dict(calibrate=True, num_inference_steps=6))
    check_flux2_taylorseer_fails()


def check_flux2_taylorseer_fails():
    """TaylorSeer on Flux2Pipeline: the pipeline sets no cache context and TaylorSeer's hook sets
    none of its own (MagCache's does), so diffusers raises at the first attention module."""
    if ONLY and "flux2_taylorseer" not in ONLY:
        return
    pipe = Flux2Pipeline.from_pretrained(os.path.join(PIPES, "flux2_dev_tiny"), dtype=torch.float32, tokenizer=None, text_encoder=None)
    pipe.set_progress_bar_config(disable=True)
    pe = load_file(os.path.join(PIPES, "flux2_dev_tiny", "cases", "64x64", "expected.safetensors"))["prompt_embeds"]
    for lite in (False, True):
        pipe.transformer.enable_cache(TaylorSeerCacheConfig(use_lite_mode=lite))
        try:
            pipe(prompt_embeds=pe, height=64, width=64, num_inference_steps=4, guidance_scale=4.0, output_type="np")
            raise AssertionError("Flux2Pipeline ran with TaylorSeer (use_lite_mode=%s): cdiffusers should run it too" % lite)
        except ValueError as e:
            assert "No cache context is set" in str(e), e
            print("Flux2Pipeline + TaylorSeerCacheConfig(use_lite_mode=%s) raises ValueError: %s" % (lite, e), flush=True)
        pipe.transformer.disable_cache()


if __name__ == "__main__":
    main()
