"""The package's diffusers-facing behaviour beyond the seed examples: the errors diffusers would
raise (with the library's message), generators and dtypes, output types, execution modes,
Ctrl-C, the GIL, help() texts. Numbers are checked against diffusers' golden runs only (tests/data
/pipelines), at tests/test_pipeline.c's tolerances."""
import os
import signal
import threading
import time

import pytest

np = pytest.importorskip("numpy", reason="numpy is not installed (apt install python3-numpy)")
cdiffusers = pytest.importorskip("cdiffusers", reason="the cdiffusers extension module is not built")
import golden  # noqa: E402
from cdiffusers import DiffusionPipeline, FluxPipeline, StableDiffusion3Pipeline  # noqa: E402

SCHNELL = os.path.join(golden.PIPELINES, "flux1_schnell_tiny")


@pytest.fixture(scope="module")
def schnell_case():
    folder, js, g = golden.case("flux1_schnell_tiny", "64x64")
    c = js["call"]
    kw = dict(prompt=c["prompt"], height=c["height"], width=c["width"], num_inference_steps=c["num_inference_steps"],
              guidance_scale=c["guidance_scale"], max_sequence_length=c["max_sequence_length"])
    return kw, c["seed"], g


@pytest.fixture(scope="module")
def schnell():
    pipe = FluxPipeline.from_pretrained(SCHNELL, dtype="float32")
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_diffusion_pipeline_picks_the_class_from_model_index():
    assert type(DiffusionPipeline.from_pretrained(SCHNELL)) is FluxPipeline
    sd3 = DiffusionPipeline.from_pretrained(os.path.join(golden.PIPELINES, "sd35m_tiny"), dtype="bfloat16")
    assert type(sd3) is StableDiffusion3Pipeline
    with pytest.raises(ValueError, match="cannot load a FluxPipeline"):
        StableDiffusion3Pipeline.from_pretrained(SCHNELL)


def test_missing_folder_names_it():
    missing = "/nonexistent/cdiffusers-model"
    with pytest.raises(FileNotFoundError, match=missing) as e:
        FluxPipeline.from_pretrained(missing)
    assert isinstance(e.value, cdiffusers.CdiffusersError)  # the library's error, its message kept


def test_bad_call_arguments(schnell, schnell_case):
    kw, seed, _ = schnell_case
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_steps'"):
        schnell(prompt="x", num_steps=2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'mask_image'"):
        schnell(prompt="x", mask_image=np.zeros((64, 64), np.uint8))  # not an inpainting pipeline
    with pytest.raises(TypeError, match="height must be an int"):
        schnell(**dict(kw, height="64"))
    with pytest.raises(TypeError, match="prompt must be a str"):
        schnell(**dict(kw, prompt=3))
    with pytest.raises(TypeError, match="generator"):
        schnell(**kw, generator=7)
    with pytest.raises(ValueError, match="output_type"):
        schnell(**kw, output_type="pt")
    # the library's own checks arrive with its message: FLUX needs sizes divisible by 16
    with pytest.raises(ValueError, match="16"):
        schnell(**dict(kw, height=72))
    with pytest.raises(ValueError, match="list of generators of length 1"):
        schnell(**kw, num_images_per_prompt=2, generator=[cdiffusers.Generator().manual_seed(1)])
    with pytest.raises(ValueError):
        FluxPipeline.from_pretrained(SCHNELL, dtype="float16")


def test_compile_arguments(schnell):
    with pytest.raises(ValueError, match="dynamic=True is not supported"):
        schnell.transformer.compile(backend="cpu", fullgraph=True, dynamic=True)
    with pytest.raises(ValueError, match="the model is on 'cpu'"):
        schnell.to("cpu").transformer.compile(backend="tpu", fullgraph=True, dynamic=False)


def test_generators_and_output_types(schnell, schnell_case):
    kw, seed, g = schnell_case
    lat = schnell(**kw, generator=cdiffusers.Generator("cpu").manual_seed(seed), output_type="latent").images
    assert np.abs(lat - g["latents_final"]).max() <= 5e-4
    out = schnell(**kw, generator=cdiffusers.Generator("cpu").manual_seed(seed), output_type="np", return_dict=False)
    assert isinstance(out, tuple) and np.abs(out[0] - g["image"]).max() <= 5e-4
    # a list of generators: one image per generator, each its own seed's image
    two = schnell(**kw, num_images_per_prompt=2, output_type="latent",
                  generator=[cdiffusers.Generator().manual_seed(seed), cdiffusers.Generator().manual_seed(seed + 1)]).images
    assert two.shape[0] == 2 and np.abs(two[0] - g["latents_final"][0]).max() <= 5e-4
    assert np.abs(two[1] - two[0]).max() > 1e-2
    torch = pytest.importorskip("torch", reason="torch is not installed: the torch.Generator case is skipped")
    lat_t = schnell(**kw, generator=torch.Generator("cpu").manual_seed(seed), output_type="latent").images
    assert np.abs(lat_t - g["latents_final"]).max() <= 5e-4


def test_defer_and_fuse_from_the_seed_variable(monkeypatch, schnell_case):
    kw, seed, g = schnell_case
    pipe = FluxPipeline.from_pretrained(SCHNELL, dtype="float32")
    pipe.set_progress_bar_config(disable=True)
    monkeypatch.setenv("TORCH_TPU_DEFER_AND_FUSE", "1")
    before = cdiffusers.exec_stats()["fused_kernels"]
    try:
        lat = pipe(**kw, generator=cdiffusers.Generator().manual_seed(seed), output_type="latent").images
        assert cdiffusers._cdiffusers.get_exec_mode() == "defer_and_fuse"
        assert cdiffusers.exec_stats()["fused_kernels"] > before
    finally:
        cdiffusers._cdiffusers.set_exec_mode("eager")
    assert np.abs(lat - g["latents_final"]).max() <= 5e-4


def test_repeated_blocks(schnell_case):
    """compile_repeated_blocks: the golden numbers, with and without model offload; a second call
    with the same shapes compiles nothing (with model offload too: the block graphs outlive the
    weights' release and re-materialisation) and gives the same golden numbers."""
    kw, seed, g = schnell_case
    for offload in (False, True):
        pipe = FluxPipeline.from_pretrained(SCHNELL, dtype="float32")
        pipe.set_progress_bar_config(disable=True)
        if offload:
            pipe.enable_model_cpu_offload()
        pipe.transformer.compile_repeated_blocks(fullgraph=True, dynamic=False)
        before = cdiffusers.exec_stats()["compiles"]
        lat = pipe(**kw, generator=cdiffusers.Generator().manual_seed(seed), output_type="latent").images
        assert np.abs(lat - g["latents_final"]).max() <= 5e-4
        assert cdiffusers.exec_stats()["compiles"] > before
        before = cdiffusers.exec_stats()["compiles"]
        lat = pipe(**kw, generator=cdiffusers.Generator().manual_seed(seed), output_type="latent").images
        assert cdiffusers.exec_stats()["compiles"] == before
        assert np.abs(lat - g["latents_final"]).max() <= 5e-4


def test_ctrl_c_cancels_between_steps_and_the_gil_is_released(schnell, schnell_case):
    kw, seed, _ = schnell_case
    steps, ticks, in_callback, sent, per_step = [], [0], [False], [False], []
    stop = threading.Event()

    def other_thread():  # counts only while generate runs the library (not in a callback)
        while not stop.is_set():
            if not in_callback[0]:
                ticks[0] += 1
            time.sleep(0.001)

    def on_step(pipe, i, t, kwargs):
        in_callback[0] = True
        per_step.append(ticks[0])
        steps.append(i)
        # Ctrl-C arrives in the middle of the run, once the other thread has run during one step
        # (or at step 30 at the latest: a loaded machine may not schedule it soon)
        ran = max((b - a for a, b in zip(per_step, per_step[1:])), default=0)
        if i >= 1 and not sent[0] and (ran >= 3 or i >= 30):
            sent[0] = True
            threading.Timer(0.0, os.kill, (os.getpid(), signal.SIGINT)).start()
            time.sleep(0.2)
        in_callback[0] = False
        return kwargs

    th = threading.Thread(target=other_thread)
    th.start()
    try:
        with pytest.raises(KeyboardInterrupt):  # 128x128: each step long enough to count in
            schnell(**dict(kw, num_inference_steps=40, height=128, width=128),
                    generator=cdiffusers.Generator().manual_seed(seed), callback_on_step_end=on_step)
    finally:
        stop.set()
        th.join()
    assert len(steps) < 40, "the run was not cancelled"
    # with the GIL held through a step, the other thread could run at most once per step (when
    # the interpreter hands the GIL over between callbacks); released, it runs every millisecond
    ran = max((b - a for a, b in zip(per_step, per_step[1:])), default=0)
    assert ran >= 3, f"another thread never ran during a step (at most {ran} times)"
    # the pipeline is still usable
    assert schnell(**kw, generator=cdiffusers.Generator().manual_seed(seed), output_type="latent").images.shape[0] == 1


def test_help_says_what_each_class_maps_to():
    for name in ("DiffusionPipeline", "FluxPipeline", "FluxImg2ImgPipeline", "FluxInpaintPipeline",
                 "StableDiffusion3Pipeline", "StableDiffusion3Img2ImgPipeline", "StableDiffusion3InpaintPipeline",
                 "Flux2Pipeline"):
        doc = getattr(cdiffusers, name).__doc__
        assert "cdf_pipeline" in doc, name
    for name in ("FluxTransformer2DModel", "Flux2Transformer2DModel", "Mistral3ForConditionalGeneration",
                 "TensorParallelConfig", "DeviceMesh", "Generator"):
        assert getattr(cdiffusers, name).__doc__, name
    assert "cdf_pipeline_compile" in cdiffusers.FluxTransformer2DModel.compile.__doc__


def test_img2img_and_inpaint_run():
    from cdiffusers import FluxImg2ImgPipeline, FluxInpaintPipeline
    img = (np.arange(64 * 64 * 3) % 251).astype(np.uint8).reshape(64, 64, 3)
    mask = np.zeros((64, 64), np.uint8)
    mask[16:48, 16:48] = 255
    pipe = FluxImg2ImgPipeline.from_pretrained(SCHNELL, dtype="float32")
    pipe.set_progress_bar_config(disable=True)
    a = pipe(prompt="x", image=img, strength=0.5, num_inference_steps=4, guidance_scale=0.0,
             generator=cdiffusers.Generator().manual_seed(0), output_type="np").images
    assert a.shape == (1, 64, 64, 3)
    with pytest.raises(ValueError, match="needs image"):
        pipe(prompt="x")
    inp = FluxInpaintPipeline.from_pretrained(SCHNELL, dtype="float32")
    inp.set_progress_bar_config(disable=True)
    b = inp(prompt="x", image=img, mask_image=mask, strength=1.0, num_inference_steps=4, guidance_scale=0.0,
            generator=cdiffusers.Generator().manual_seed(0), output_type="np").images
    # black = keep: far from the mask the picture stays close to the input
    assert np.abs(b[0, :8, :8] * 255 - img[:8, :8]).mean() < np.abs(b[0, 24:40, 24:40] * 255 - img[24:40, 24:40]).mean()


def test_lora_against_diffusers_peft():
    """load_lora_weights / set_adapters / fuse_lora / unload_lora_weights against diffusers + PEFT
    (tests/data/lora/pipe_flux_te.safetensors, reference.json "text_encoder_pipelines"; the
    latents tolerance of tests/test_lora_pipeline.c, 5e-4; the adapter moves them by ~3)."""
    import json
    with open(os.path.join(golden.DATA, "lora", "reference.json")) as f:
        ref = json.load(f)["text_encoder_pipelines"]["flux"]
    ref_t = golden.read_safetensors(os.path.join(golden.DATA, "lora", "pipe_flux_te.safetensors"))
    c = ref["call"]
    kw = dict(prompt=c["prompt"], height=c["height"], width=c["width"], num_inference_steps=c["num_inference_steps"],
              guidance_scale=c["guidance_scale"], max_sequence_length=c["max_sequence_length"], output_type="latent")
    pipe = FluxPipeline.from_pretrained(os.path.join(golden.PIPELINES, "flux1_dev_tiny"), dtype="float32")
    pipe.set_progress_bar_config(disable=True)

    def check(key):
        lat = pipe(**kw, generator=cdiffusers.Generator().manual_seed(c["seed"])).images
        d = np.abs(lat - ref_t[key + ".latents_final"]).max()
        assert d <= 5e-4, f"{key}: {d}"

    pipe.load_lora_weights(os.path.join(golden.DATA, "lora", "pipe_flux_te_peft.safetensors"), adapter_name="te")
    check("pipe_flux_te_peft.runtime_s1")
    pipe.set_adapters(["te"], [0.7])
    check("pipe_flux_te_peft.runtime_s07")
    pipe.set_adapters(["te"], [1.0])
    kw["joint_attention_kwargs"] = {"scale": 0.7}  # the call's scale, for that call only
    check("pipe_flux_te_peft.runtime_s07")
    del kw["joint_attention_kwargs"]
    check("pipe_flux_te_peft.runtime_s1")
    pipe.fuse_lora(lora_scale=0.7)
    check("pipe_flux_te_peft.fused_s07")
    pipe.unload_lora_weights()
    check("pipe_flux_te_peft.unloaded")
    with pytest.raises(ValueError, match="not in the list of present adapters"):
        pipe.set_adapters(["nope"])
