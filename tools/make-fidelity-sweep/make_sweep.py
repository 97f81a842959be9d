"""The integer and branch decisions diffusers makes in Python floats, swept with diffusers' own code.

Two tables (tests/data/fidelity/), read by tests/test_fidelity_sweep.c:

strength_sweep.txt -- for every img2img / inpainting pipeline class (FluxImg2ImgPipeline,
  FluxInpaintPipeline on flux1_dev_tiny and flux1_schnell_tiny; StableDiffusion3Img2ImgPipeline,
  StableDiffusion3InpaintPipeline on sd35m_tiny), at 1024x1024, strengths i / 100 (i = 1..100, the
  Python float) x num_inference_steps 1..60: the start index the pipeline picks (the scheduler's
  begin index after get_timesteps) and the first sigma (what scheduler.scale_noise uses for the
  start latents), or '-' where diffusers makes no picture: no step left (FLUX.1 and SD3 inpainting
  raise "the number of pipeline steps is 0 which is < 1"; SD3 img2img does not check, its start
  latents are an empty batch and it fails later with a RuntimeError). No strength i / 100 leaves
  no step (int(N - N * s) < N whenever N * s > 0), so the table has no '-'; the header records
  what each pipeline does at strength 1e-30. The pipelines are called unmodified, with random
  prompt embeddings and an image tensor, and stopped by an exception from a wrapper around their
  get_timesteps once it has returned (nothing after it can change the start index).
  The first sigma is stored compactly: each step count's line of schedule sigmas (float32 bits)
  from set_timesteps, and this script asserts for every cell that scale_noise's sigma is the
  schedule's sigma at the start index.

mu_sweep.txt -- the dynamic-shifting mu over widths and heights 256..2048 in steps of 16 (all
  113 x 113 pairs): the image_seq_len each of FluxPipeline, Flux2Pipeline (every cell) and
  FluxImg2ImgPipeline (the cells with both sides 256 + 64 k: its image preprocessing is slow)
  passes to calculate_shift / compute_empirical_mu (recorded from the running pipeline, which is
  stopped when it calls scheduler.set_timesteps, with the mu that call gets); FLUX.1's mu by
  sequence length (flux1_dev_tiny's scheduler config); and for FLUX.2, for every step count
  1..60, an FNV-1a 64 hash of the mu bits of all cells (row-major, heights outer) from diffusers'
  compute_empirical_mu on the recorded lengths (at 50 steps each equals the mu the running
  Flux2Pipeline passed).

reference_sizes.txt -- FLUX.2's reference image sizing (check_image_input, the 1024x1024 area
  limit with Flux2ImageProcessor._resize_to_target_area, the crop to multiples of 16) over widths
  and heights 64..6136 in steps of 24, hashed, with the cells nearest an int() boundary in full.

usage: /work/venv39/bin/python tools/make-fidelity-sweep/make_sweep.py [OUT_DIR [strength|mu|reference]]
       (default OUT_DIR: tests/data/fidelity; both tables). diffusers 0.42.1, torch 2.15 CPU;
       a venv outside the repository: pip install torch diffusers transformers safetensors
       numpy sentencepiece protobuf pillow accelerate. About 5 minutes per table on one core.
"""
import functools
import math
import os
import struct
import sys

import numpy as np
import PIL.Image
import torch
import diffusers
from diffusers import (Flux2Pipeline, FluxImg2ImgPipeline, FluxInpaintPipeline, FluxPipeline,
                       StableDiffusion3Img2ImgPipeline, StableDiffusion3InpaintPipeline)
from diffusers.pipelines.flux import pipeline_flux as m_flux, pipeline_flux_img2img as m_flux_i2i
from diffusers.pipelines.flux2 import pipeline_flux2 as m_flux2
from diffusers.pipelines.flux2.image_processor import Flux2ImageProcessor
from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PIPES = os.path.join(ROOT, "tests", "data", "pipelines")
OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "data", "fidelity")
SIZE = 1024
STEPS = range(1, 61)
STRENGTHS = [i / 100 for i in range(1, 101)]
SIDES = range(256, 2049, 16)
torch.set_num_threads(1)


class Stop(Exception):
    pass


def load(cls, folder):
    extra = dict(tokenizer=None, text_encoder=None) if cls is Flux2Pipeline else {}
    pipe = cls.from_pretrained(os.path.join(PIPES, folder), dtype=torch.float32, **extra)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def embeds(pipe):
    c = pipe.transformer.config
    g = torch.Generator("cpu").manual_seed(0)
    kw = dict(prompt_embeds=torch.randn(1, 8, c.joint_attention_dim, generator=g))
    if getattr(c, "pooled_projection_dim", None):
        kw["pooled_prompt_embeds"] = torch.randn(1, c.pooled_projection_dim, generator=g)
    return kw


def memoize_preprocess(pipe):
    """The image / mask processors get the same tensor in every call of a sweep: compute their
    preprocess once and hand out copies of that result (what the call would compute again)."""
    for attr in ("image_processor", "mask_processor"):
        proc = getattr(pipe, attr, None)
        if proc is None:
            continue
        orig, cache = proc.preprocess, {}

        def preprocess(image, *a, _orig=orig, _cache=cache, **k):
            key = (id(image), a, tuple(sorted(k.items())))
            if key not in _cache:
                _cache[key] = (image, _orig(image, *a, **k))
            return _cache[key][1].clone()

        proc.preprocess = preprocess


def f32hex(x):
    return "%08x" % struct.unpack("<I", struct.pack("<f", float(x)))[0]


def f64hex(x):
    return "%016x" % struct.unpack("<Q", struct.pack("<d", float(x)))[0]


def start_cells(cls, folder):
    """{N: (sigma row, [t_start or None for each strength])}, and the mu set_timesteps got."""
    pipe = load(cls, folder)
    kw = embeds(pipe)
    if cls in (StableDiffusion3Img2ImgPipeline, StableDiffusion3InpaintPipeline):
        kw["guidance_scale"] = 1.0  # no CFG: no negative embeddings needed (the schedule does not depend on it)
    image = torch.zeros(1, 3, SIZE, SIZE)
    if cls in (FluxInpaintPipeline, StableDiffusion3InpaintPipeline):
        kw["mask_image"] = torch.ones(1, 1, SIZE, SIZE)
    sched = pipe.scheduler
    got = {}
    orig_get = pipe.get_timesteps
    orig_set = sched.set_timesteps

    @functools.wraps(orig_set)  # retrieve_timesteps inspects its signature
    def set_timesteps(*a, **k):
        got["mu"] = k.get("mu")
        return orig_set(*a, **k)

    def get_timesteps(num_inference_steps, strength, device):
        timesteps, n = orig_get(num_inference_steps, strength, device)
        got["begin"] = sched.begin_index
        got["n"] = n
        # the sigma prepare_latents' scale_noise(image_latents, timesteps[:1], noise) uses:
        # sigma * 1 + (1 - sigma) * 0
        one = torch.ones(1, 1, 1, 1)
        got["sigma"] = sched.scale_noise(torch.zeros(1, 1, 1, 1), timesteps[:1], one).flatten().tolist()
        raise Stop

    pipe.get_timesteps = get_timesteps
    sched.set_timesteps = set_timesteps
    memoize_preprocess(pipe)
    rows, mus = {}, set()
    for n_steps in STEPS:
        starts = []
        sig_row = None
        for s in STRENGTHS:
            got.clear()
            try:
                pipe(image=image, strength=s, num_inference_steps=n_steps, height=SIZE, width=SIZE,
                     generator=torch.Generator("cpu").manual_seed(0), output_type="latent", **kw)
                raise AssertionError("the pipeline ran past get_timesteps")
            except Stop:
                pass
            sigmas = sched.sigmas.tolist()
            if sig_row is None:
                sig_row = sigmas
            assert sigmas == sig_row
            mus.add(got["mu"])
            if got["n"] < 1:
                # FLUX.1 / SD3 inpaint raise here; SD3 img2img's start latents are an empty batch
                assert got["sigma"] == [], got
                starts.append(None)
                continue
            t = got["begin"]
            assert got["n"] == n_steps - t
            assert got["sigma"] == [sig_row[t]], (cls.__name__, n_steps, s, got, sig_row)
            starts.append(t)
        rows[n_steps] = (sig_row, starts)
    assert len(mus) == 1
    return rows, mus.pop()


def check_refusal(cls, folder):
    """What diffusers does past get_timesteps when no step is left: strength 1e-30 (every strength
    i / 100 leaves a step: int(N - N * s) < N whenever N * s > 0 is not absorbed)."""
    pipe = load(cls, folder)
    kw = embeds(pipe)
    if cls in (StableDiffusion3Img2ImgPipeline, StableDiffusion3InpaintPipeline):
        kw["guidance_scale"] = 1.0
    if cls in (FluxInpaintPipeline, StableDiffusion3InpaintPipeline):
        kw["mask_image"] = torch.ones(1, 1, 64, 64)
    try:
        out = pipe(image=torch.zeros(1, 3, 64, 64), strength=1e-30, num_inference_steps=5, height=64, width=64,
                   generator=torch.Generator("cpu").manual_seed(0), output_type="np", **kw)
        return "returns %s images" % len(out.images)
    except Exception as e:  # noqa: BLE001 -- recording what diffusers does
        return "raises %s: %s" % (type(e).__name__, " ".join(str(e).split())[:110])


def write_strength(path):
    sections = [
        ("FluxImg2ImgPipeline", FluxImg2ImgPipeline, "flux1_dev_tiny"),
        ("FluxInpaintPipeline", FluxInpaintPipeline, "flux1_dev_tiny"),
        ("FluxImg2ImgPipeline", FluxImg2ImgPipeline, "flux1_schnell_tiny"),
        ("FluxInpaintPipeline", FluxInpaintPipeline, "flux1_schnell_tiny"),
        ("StableDiffusion3Img2ImgPipeline", StableDiffusion3Img2ImgPipeline, "sd35m_tiny"),
        ("StableDiffusion3InpaintPipeline", StableDiffusion3InpaintPipeline, "sd35m_tiny"),
    ]
    lines = ["# strength x steps sweep of img2img / inpainting, made by tools/make-fidelity-sweep/make_sweep.py",
             "# diffusers %s, torch %s; %dx%d; strengths i/100 (i = 1..100, Python floats); steps 1..60"
             % (diffusers.__version__, torch.__version__, SIZE, SIZE),
             "# 'pipeline CLASS FOLDER [same CLASS2]' (same: every cell equals CLASS2's section on FOLDER),",
             "# 'mu HEX64|none' (the mu given to set_timesteps), then per step count N:",
             "# 'sigmas N HEX32 x (N+1)' (the schedule) and 'start N S1 .. S100' (the start index per strength,",
             "# '-' = diffusers makes no image: none of these cells); the first sigma of a cell is sigmas[start]"]
    done = {}
    for name, cls, folder in sections:
        rows, mu = start_cells(cls, folder)
        refusal = check_refusal(cls, folder)
        print(name, folder, "no step left:", refusal, flush=True)
        lines.append("# %s on %s with no step left (strength 1e-30, 5 steps): %s" % (name, folder, refusal))
        same = next((n for (n, f), r in done.items() if f == folder and r == rows), None)
        if same:
            lines.append("pipeline %s %s same %s" % (name, folder, same))
            continue
        done[(name, folder)] = rows
        lines.append("pipeline %s %s" % (name, folder))
        lines.append("mu %s" % ("none" if mu is None else f64hex(mu)))
        for n_steps in STEPS:
            sig, starts = rows[n_steps]
            lines.append("sigmas %d %s" % (n_steps, " ".join(f32hex(x) for x in sig)))
            lines.append("start %d %s" % (n_steps, " ".join("-" if t is None else str(t) for t in starts)))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def record_mu(pipe, call, module, fn_name):
    """(image_seq_len, mu) of the running pipeline for call(...): the length it passes to its
    module's calculate_shift / compute_empirical_mu, the mu it gives set_timesteps."""
    sched = pipe.scheduler
    got = {}
    orig_set, orig_fn = sched.set_timesteps, getattr(module, fn_name)

    def fn(*a, **k):
        got["seq"] = k["image_seq_len"] if "image_seq_len" in k else a[0]
        return orig_fn(*a, **k)

    @functools.wraps(orig_set)  # retrieve_timesteps inspects its signature
    def set_timesteps(*a, **k):
        got["mu"] = k.get("mu")
        raise Stop

    sched.set_timesteps = set_timesteps
    setattr(module, fn_name, fn)
    try:
        call()
    except Stop:
        pass
    finally:
        sched.set_timesteps = orig_set
        setattr(module, fn_name, orig_fn)
    return got["seq"], got["mu"]


def write_mu(path):
    f1 = load(FluxPipeline, "flux1_dev_tiny")
    f1i = load(FluxImg2ImgPipeline, "flux1_dev_tiny")
    f2 = load(Flux2Pipeline, "flux2_dev_tiny")
    k1, k2 = embeds(f1), embeds(f2)
    gen = lambda: torch.Generator("cpu").manual_seed(0)  # noqa: E731
    seq_rows, mu1 = [], {}
    for h in SIDES:
        row = []
        for w in SIDES:
            s, mu_t2i = record_mu(f1, lambda: f1(height=h, width=w, num_inference_steps=4, generator=gen(), **k1),
                                  m_flux, "calculate_shift")
            if (h - SIDES.start) % 64 == 0 and (w - SIDES.start) % 64 == 0:  # its image preprocessing is slow
                s_i, mu_i2i = record_mu(f1i, lambda: f1i(image=torch.zeros(1, 3, h, w), height=h, width=w,
                                                         strength=0.6, num_inference_steps=4, generator=gen(), **k1),
                                        m_flux_i2i, "calculate_shift")
                assert (s, mu_t2i) == (s_i, mu_i2i), (h, w, s, mu_t2i, s_i, mu_i2i)
            s2, mu2 = record_mu(f2, lambda: f2(height=h, width=w, num_inference_steps=50, generator=gen(), **k2),
                                m_flux2, "compute_empirical_mu")
            assert s2 == s, (h, w, s, s2)  # one table of lengths serves both
            assert mu2 == compute_empirical_mu(image_seq_len=s, num_steps=50)  # what the hash at 50 is made of
            row.append(s)
            mu1[s] = mu_t2i
        seq_rows.append(row)
        print("mu rows: height", h, flush=True)
    lines = ["# mu sweep, made by tools/make-fidelity-sweep/make_sweep.py (diffusers %s, torch %s)"
             % (diffusers.__version__, torch.__version__),
             "# 'sides 256 2048 16': widths and heights; 'seq H S..': image_seq_len for each width at height H",
             "# (FluxPipeline and Flux2Pipeline agree on every cell, FluxImg2ImgPipeline on sides 256 + 64 k);",
             "# 'flux1 SEQ HEX64': FluxPipeline's mu (flux1_dev_tiny scheduler config); 'flux2hash N HEX64':",
             "# FNV-1a 64 of the little-endian mu doubles of all cells (heights outer, widths inner) that",
             "# Flux2Pipeline's compute_empirical_mu gives at N steps (at 50 steps: the mu Flux2Pipeline passed)",
             "sides %d %d %d" % (SIDES.start, SIDES.stop - 1, SIDES.step)]
    for h, row in zip(SIDES, seq_rows):
        lines.append("seq %d %s" % (h, " ".join(str(s) for s in row)))
    for s in sorted(mu1):
        lines.append("flux1 %d %s" % (s, f64hex(mu1[s])))
    for n_steps in STEPS:
        hsh = 0xCBF29CE484222325
        for row in seq_rows:
            for s in row:
                for byte in struct.pack("<d", compute_empirical_mu(image_seq_len=s, num_steps=n_steps)):
                    hsh = ((hsh ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
        lines.append("flux2hash %d %016x" % (n_steps, hsh))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


REF_SIDES = range(64, 6145, 24)


class FakeImage:
    """What Flux2ImageProcessor._resize_to_target_area reads (size) and calls (resize): the sizes
    alone, without pixels."""

    def __init__(self, size):
        self.size = size

    def resize(self, size, resample=None):
        return FakeImage(size)


def flux2_reference_size(w, h):
    """Flux2Pipeline.__call__'s sizing of one reference image (pipeline_flux2.py, diffusers 0.42.1):
    check_image_input, then `if image_width * image_height > 1024 * 1024:
    _resize_to_target_area(img, 1024 * 1024)`, then `(image_width // multiple_of) * multiple_of`
    with multiple_of = vae_scale_factor * 2 = 16. None where check_image_input raises."""
    im = PIL.Image.new("RGB", (1, 1))
    im._size = (w, h)  # check_image_input reads only .size
    try:
        Flux2ImageProcessor.check_image_input(im)
    except ValueError:
        return None
    img = FakeImage((w, h))
    image_width, image_height = img.size
    if image_width * image_height > 1024 * 1024:
        img = Flux2ImageProcessor._resize_to_target_area(img, 1024 * 1024)
        image_width, image_height = img.size
    multiple_of = 16
    return (image_width // multiple_of) * multiple_of, (image_height // multiple_of) * multiple_of


def write_reference(path):
    """FLUX.2 reference image sizes over widths and heights 64..6136 in steps of 24: an FNV-1a 64
    hash of every cell's (width, height) (0, 0 for a refused image), and the cells whose scaled
    side lies within 1e-9 relative of an integer (where a float computation would truncate
    differently) in full."""
    hsh, close, refused = 0xCBF29CE484222325, [], 0
    for h in REF_SIDES:
        for w in REF_SIDES:
            r = flux2_reference_size(w, h)
            refused += r is None
            for v in (r or (0, 0)):
                for byte in struct.pack("<i", v):
                    hsh = ((hsh ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
            if r is not None and w * h > 1024 * 1024:
                scale = math.sqrt(1024 * 1024 / (w * h))
                if any(abs(x * scale - round(x * scale)) < 1e-9 * x * scale for x in (w, h)):
                    close.append((w, h) + r)
    lines = ["# FLUX.2 reference image sizes, made by tools/make-fidelity-sweep/make_sweep.py (diffusers %s)"
             % diffusers.__version__,
             "# 'sides LO HI STEP': widths and heights; 'hash HEX64': FNV-1a 64 of the little-endian int32",
             "# (width, height) of every cell (heights outer), (0, 0) where check_image_input refuses it;",
             "# 'refused N'; 'cell W H W2 H2': cells whose scaled side is within 1e-9 of an integer",
             "sides %d %d %d" % (REF_SIDES.start, REF_SIDES.stop - 1, REF_SIDES.step),
             "hash %016x" % hsh, "refused %d" % refused] + ["cell %d %d %d %d" % c for c in close]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    os.makedirs(OUT, exist_ok=True)
    what = sys.argv[2] if len(sys.argv) > 2 else "all"
    if what in ("all", "strength"):
        write_strength(os.path.join(OUT, "strength_sweep.txt"))
    if what in ("all", "mu"):
        write_mu(os.path.join(OUT, "mu_sweep.txt"))
    if what in ("all", "reference"):
        write_reference(os.path.join(OUT, "reference_sizes.txt"))


if __name__ == "__main__":
    main()
