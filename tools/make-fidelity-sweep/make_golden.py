"""Golden runs where a float strength would change the start step, and seed lists with an input image.

The same recorder and file layout as tools/make-img2img-golden/make_golden.py (its run_case is
reused unchanged), written to tests/data/golden/fidelity/:
  - img2img / inpainting at (strength, steps) pairs where N * strength is an integer in Python
    doubles but not with the strength rounded to float32 (0.6 x 5, 0.3 x 10, 0.55 x 20, 0.6 x 25,
    0.2 x 5, 0.14 x 50):
    there int(N - N * float32(strength)) is one step lower, a different picture;
  - FluxImg2ImgPipeline / FluxInpaintPipeline / StableDiffusion3InpaintPipeline with a list of two
    generators (cdiffusers' --batch-seeds): the one input image is encoded with generator[0]
    only, each noise row comes from its own generator. StableDiffusion3Img2ImgPipeline fails with
    a generator list (refusals.json records its error).

usage: /work/venv39/bin/python tools/make-fidelity-sweep/make_golden.py [OUT_DIR]
       (default OUT_DIR: tests/data/golden/fidelity)
"""
import hashlib
import importlib.util
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
spec = importlib.util.spec_from_file_location("img2img_golden", os.path.join(ROOT, "tools", "make-img2img-golden",
                                                                              "make_golden.py"))
G = importlib.util.module_from_spec(spec)
spec.loader.exec_module(G)
G.OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "data", "golden", "fidelity")


def float32_start(n, s):
    f = float(np.float32(s))
    return int(max(n - min(n * f, n), 0))


def main():
    os.makedirs(G.OUT, exist_ok=True)
    img64 = G.make_image(64, 64, 1)
    fl = dict(prompt="a red house by a lake", guidance_scale=3.5, max_sequence_length=32, height=64, width=64)
    sd = dict(prompt="a red house by a lake", negative_prompt="blurry", guidance_scale=5.0, max_sequence_length=32,
              height=64, width=64)
    cases = [
        ("flux_img2img_s06_n5", G.FluxImg2ImgPipeline, fl, 0.6, 5, False, 31),
        ("sd3_img2img_s06_n5", G.StableDiffusion3Img2ImgPipeline, sd, 0.6, 5, False, 32),
        ("flux_inpaint_s03_n10", G.FluxInpaintPipeline, fl, 0.3, 10, True, 33),
        ("sd3_inpaint_s055_n20", G.StableDiffusion3InpaintPipeline, sd, 0.55, 20, True, 34),
        ("flux_img2img_s06_n25", G.FluxImg2ImgPipeline, fl, 0.6, 25, False, 35),
        ("sd3_img2img_s03_n10", G.StableDiffusion3Img2ImgPipeline, sd, 0.3, 10, False, 36),
        # two more of the 92 cells the sweep finds
        ("flux_inpaint_s02_n5", G.FluxInpaintPipeline, fl, 0.2, 5, True, 37),
        ("sd3_img2img_s014_n50", G.StableDiffusion3Img2ImgPipeline, sd, 0.14, 50, False, 38),
    ]
    for name, cls, base, s, n, inpaint, seed in cases:
        t_py = int(max(n - min(n * s, n), 0))
        assert float32_start(n, s) != t_py, name  # the case must be one a float strength gets wrong
        folder = "flux1_dev_tiny" if cls.__name__.startswith("Flux") else "sd35m_tiny"
        G.run_case(name, cls, folder, dict(base, strength=s, num_inference_steps=n), image=img64,
                   mask=G.make_mask(64, 64) if inpaint else None, seeds=seed)
    # seed lists with an input image
    G.run_case("flux_img2img_gens", G.FluxImg2ImgPipeline, "flux1_dev_tiny",
               dict(fl, strength=0.6, num_inference_steps=5, num_images_per_prompt=2), image=img64, seeds=[12, 13])
    G.run_case("sd3_inpaint_gens", G.StableDiffusion3InpaintPipeline, "sd35m_tiny",
               dict(sd, strength=0.6, num_inference_steps=5, num_images_per_prompt=2), image=img64,
               mask=G.make_mask(64, 64), seeds=[12, 13])
    # StableDiffusion3Img2ImgPipeline.prepare_latents encodes image[i : i + 1] for i in range(batch_size)
    # with generator[i]: the one image's slices past the first are empty and the VAE fails on them
    refusals = {}
    pipe = G.load(G.StableDiffusion3Img2ImgPipeline, "sd35m_tiny")
    pipe.set_progress_bar_config(disable=True)
    try:
        pipe(**dict(sd, strength=0.6, num_inference_steps=5, num_images_per_prompt=2), image=img64,
             generator=[G.torch.Generator("cpu").manual_seed(s) for s in (12, 13)], output_type="np")
        refusals["sd3_img2img_gens"] = "made an image"
    except Exception as e:  # noqa: BLE001 -- recording what diffusers does
        refusals["sd3_img2img_gens"] = "%s: %s" % (type(e).__name__, " ".join(str(e).split()))
    assert refusals["sd3_img2img_gens"] != "made an image"
    with open(os.path.join(G.OUT, "refusals.json"), "w") as f:
        json.dump({"what": "StableDiffusion3Img2ImgPipeline, sd35m_tiny, 64x64, strength 0.6, 5 steps, "
                           "num_images_per_prompt=2, generator=[seed 12, seed 13]",
                   "diffusers": G.diffusers.__version__, "torch": G.torch.__version__, "result": refusals}, f, indent=1)
    G.run_case("flux_inpaint_gens", G.FluxInpaintPipeline, "flux1_dev_tiny",
               dict(fl, strength=0.8, num_inference_steps=5, num_images_per_prompt=2), image=img64,
               mask=G.make_mask(64, 64), seeds=[14, 15])
    man = {}
    for dp, _, fs in os.walk(G.OUT):
        for f in sorted(fs):
            if f == "manifest.json":
                continue
            p = os.path.join(dp, f)
            man[os.path.relpath(p, G.OUT)] = {"size": os.path.getsize(p),
                                              "sha256": hashlib.sha256(open(p, "rb").read()).hexdigest()}
    with open(os.path.join(G.OUT, "manifest.json"), "w") as f:
        json.dump(dict(sorted(man.items())), f, indent=1)


if __name__ == "__main__":
    main()
