"""prompt_embeds (and pooled / negative) and lists of prompts, as diffusers' pipelines take them.
Expected numbers are diffusers' golden runs (tests/data/pipelines), at tests/test_pipeline.c's
tolerance for the final latents (5e-4). The golden runs have one prompt each: a batch of several
prompts is checked image by image against the single-prompt call with that image's generator,
which diffusers guarantees with a list of generators (each image's noise comes from its own
generator), and its first image against the golden run."""
import os

import pytest

np = pytest.importorskip("numpy", reason="numpy is not installed (apt install python3-numpy)")
cdiffusers = pytest.importorskip("cdiffusers", reason="the cdiffusers extension module is not built")
import golden  # noqa: E402
from cdiffusers import FluxPipeline, Generator, StableDiffusion3Pipeline  # noqa: E402

TOL = 5e-4
EMBEDS = ("prompt_embeds", "pooled_prompt_embeds", "negative_prompt_embeds", "negative_pooled_prompt_embeds")


def _case(pipeline, name):
    folder, js, g = golden.case(pipeline, name)
    c = js["call"]
    kw = {k: c[k] for k in ("prompt", "negative_prompt", "height", "width", "num_inference_steps", "guidance_scale",
                            "true_cfg_scale", "max_sequence_length") if k in c}
    return folder, kw, c["seed"], g


def _pipe(cls, folder):
    pipe = cls.from_pretrained(folder, dtype="float32")
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def schnell():
    folder, kw, seed, g = _case("flux1_schnell_tiny", "64x64")
    return _pipe(FluxPipeline, folder), kw, seed, g


def _latents(pipe, seed, **kw):
    gen = [Generator().manual_seed(s) for s in seed] if isinstance(seed, list) else Generator().manual_seed(seed)
    return pipe(**kw, generator=gen, output_type="latent").images


@pytest.mark.parametrize("pipeline,name,cls", [("flux1_dev_tiny", "64x64_true_cfg", FluxPipeline),
                                               ("sd35m_tiny", "64x64_neg", StableDiffusion3Pipeline)])
def test_prompt_embeds_give_diffusers_latents(pipeline, name, cls):
    """The case's captured embeddings (negative ones included: Flux true CFG, SD3 CFG) and no
    prompt: the case's latents."""
    folder, kw, seed, g = _case(pipeline, name)
    kw.pop("prompt"), kw.pop("negative_prompt")
    embeds = {k: g[k] for k in EMBEDS}
    lat = _latents(_pipe(cls, folder), seed, **kw, **embeds)
    assert np.abs(lat - g["latents_final"]).max() <= TOL


def test_prompt_embeds_flux_without_negative(schnell):
    pipe, kw, seed, g = schnell
    kw = dict(kw)
    kw.pop("prompt")
    lat = _latents(pipe, seed, **kw, prompt_embeds=g["prompt_embeds"], pooled_prompt_embeds=g["pooled_prompt_embeds"])
    assert np.abs(lat - g["latents_final"]).max() <= TOL


def test_prompt_embeds_errors(schnell):
    pipe, kw, seed, g = schnell
    e, pe = g["prompt_embeds"], g["pooled_prompt_embeds"]
    rest = {k: v for k, v in kw.items() if k != "prompt"}
    with pytest.raises(ValueError, match="Cannot forward both `prompt`"):
        pipe(**kw, prompt_embeds=e, pooled_prompt_embeds=pe)
    with pytest.raises(ValueError, match="`pooled_prompt_embeds` also have to be passed"):
        pipe(**rest, prompt_embeds=e)
    with pytest.raises(ValueError, match="Provide either `prompt` or `prompt_embeds`"):
        pipe(**rest)
    with pytest.raises(ValueError, match=r"`prompt_embeds` must have shape \(batch_size, sequence_length, channels\)"):
        pipe(**rest, prompt_embeds=e[0], pooled_prompt_embeds=pe)
    with pytest.raises(ValueError, match="joint_attention_dim"):
        pipe(**rest, prompt_embeds=e[..., :5], pooled_prompt_embeds=pe)
    with pytest.raises(ValueError, match="pooled_projection_dim"):
        pipe(**rest, prompt_embeds=e, pooled_prompt_embeds=pe[:, :3])
    with pytest.raises(ValueError, match="batch of 2"):
        pipe(**rest, prompt_embeds=e, pooled_prompt_embeds=np.concatenate([pe, pe]))
    with pytest.raises(TypeError, match="prompt_embeds must be an array of floats"):
        pipe(**rest, prompt_embeds="abc", pooled_prompt_embeds=pe)


def test_a_list_of_prompts(schnell):
    """prompt=[a, b] x num_images_per_prompt=2 with four generators: images prompt-major, each the
    single-prompt call with its generator; the first one diffusers' golden run."""
    pipe, kw, seed, g = schnell
    other = "a small blue circle on a white background"
    rest = {k: v for k, v in kw.items() if k != "prompt"}
    seeds = [seed, seed + 1, seed + 2, seed + 3]
    four = _latents(pipe, seeds, prompt=[kw["prompt"], other], num_images_per_prompt=2, **rest)
    assert four.shape[0] == 4
    assert np.abs(four[:1] - g["latents_final"]).max() <= TOL
    for k in (1, 2, 3):
        one = _latents(pipe, seeds[k], prompt=[kw["prompt"], other][k // 2], **rest)
        assert np.abs(four[k:k + 1] - one).max() <= 1e-6, k
    # one generator: the batch's noise is one draw (row 0 = the golden run's noise), prompt-major
    two = _latents(pipe, seed, prompt=[kw["prompt"], other], **rest)
    assert two.shape[0] == 2 and np.abs(two[:1] - g["latents_final"]).max() <= TOL
    images = pipe(prompt=[kw["prompt"], other], **rest, generator=[Generator().manual_seed(s) for s in seeds[:2]]).images
    assert len(images) == 2


def test_prompt_list_errors(schnell):
    pipe, kw, seed, g = schnell
    rest = {k: v for k, v in kw.items() if k != "prompt"}
    with pytest.raises(ValueError, match="effective batch size of 4"):
        pipe(prompt=["a", "b"], num_images_per_prompt=2, generator=[Generator().manual_seed(1)] * 3, **rest)
    with pytest.raises(ValueError, match="matches the batch size of `prompt`"):
        pipe(prompt=["a", "b"], negative_prompt=["x"], **rest)
    with pytest.raises(TypeError, match="should be the same type"):
        pipe(prompt="a", negative_prompt=["x", "y"], **rest)
    with pytest.raises(TypeError, match="list of str"):
        pipe(prompt=["a", 3], **rest)
    with pytest.raises(ValueError, match="empty"):
        pipe(prompt=[], **rest)
