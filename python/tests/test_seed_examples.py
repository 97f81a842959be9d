"""The seed's three Python examples (shared/seed: diffusers' TPU page), run on cdiffusers.

Each example is read from the seed document itself and rewritten only where the issue allows:
the imports (diffusers / torch / torch.distributed / transformers -> cdiffusers and its
stand-ins), the model id (-> a tiny golden pipeline folder), "tpu" (-> the device under test),
the sizes and steps (-> the golden case's), and, because the golden runs were made that way, the
dtype (float32), the prompt, the seed (a generator where the example has none) and the arguments
the golden call passed besides (max_sequence_length, text_encoder_out_layers for the 3-layer
tiny Mistral). The results are compared with diffusers' own runs (tests/data/pipelines) at the
C tests' tolerances (tests/test_pipeline.c): final latents and the float image 5e-4, the 8-bit
image at most one level."""
import os
import re
import shutil
import subprocess
import sys

import pytest

np = pytest.importorskip("numpy", reason="numpy is not installed (apt install python3-numpy)")
cdiffusers = pytest.importorskip("cdiffusers", reason="the cdiffusers extension module is not built")
import golden  # noqa: E402

SEED = os.environ.get("CDF_SEED_DOC") or os.path.join(os.path.dirname(__file__), "seed_tpu_page.md")
DEVICE = os.environ.get("CDF_PYTEST_DEVICE", "cpu")
TOL_LATENTS = 5e-4  # tests/test_pipeline.c: latents_final, vae_decode_output, image
TOL_IMAGE = 5e-4


def seed_examples():
    with open(SEED, encoding="utf-8") as f:
        text = f.read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 3, f"the seed document should hold three Python examples, found {len(blocks)}"
    return blocks


IMPORTS = [
    ("import torch.distributed as dist\n", "import cdiffusers.distributed as dist\n"),
    ("from torch.distributed.device_mesh import DeviceMesh\n", "from cdiffusers.distributed import DeviceMesh\n"),
    ("from transformers import ", "from cdiffusers import "),
    ("from diffusers import ", "from cdiffusers import "),
    ("import torch\n", "import cdiffusers.torch as torch\n"),
]


def rewrite(code, subs):
    """The import lines wherever they occur, then (old, new) replacements, each of which must match
    (so an edit of the seed fails loudly)."""
    for old, new in IMPORTS:
        code = code.replace(old, new)
    for old, new in subs:
        assert old in code, f"{old!r} not in the example"
        code = code.replace(old, new)
    assert "diffusers import" not in code.replace("cdiffusers import", "")
    return code


def compare(tensors, images_np, latents, png_path, latents_key="latents_final", tol_latents=TOL_LATENTS,
            ref_png=None):
    """max |diff| of the final latents, the float image and the 8-bit PNG the example saved
    against diffusers' (image_uint8, or the case's image.png where the golden has no such key)."""
    d_lat = float(np.abs(latents - tensors[latents_key]).max())
    d_img = float(np.abs(images_np - tensors["image"]).max())
    assert d_lat <= tol_latents, f"{latents_key} differ by {d_lat}"
    assert d_img <= TOL_IMAGE, f"image differs by {d_img}"
    from PIL import Image
    got = np.asarray(Image.open(png_path).convert("RGB")).astype(int)
    want = tensors["image_uint8"][0] if ref_png is None else np.asarray(Image.open(ref_png).convert("RGB"))
    d8 = int(np.abs(got - want.astype(int)).max())
    assert d8 <= 1, f"8-bit image differs by {d8} levels"
    return d_lat, d_img, d8


@pytest.fixture
def compile_log(monkeypatch):
    """Records the library's compile counter across every pipeline call."""
    log = []
    orig = cdiffusers.pipelines.DiffusionPipeline.__call__

    def wrapped(self, *a, **k):
        before = cdiffusers.exec_stats()["compiles"]
        out = orig(self, *a, **k)
        log.append(cdiffusers.exec_stats()["compiles"] - before)
        return out

    monkeypatch.setattr(cdiffusers.pipelines.DiffusionPipeline, "__call__", wrapped)
    return log


def test_eager_with_model_offload(tmp_path):
    """Example 1: FluxPipeline (FLUX.1-schnell), enable_model_cpu_offload(), eager."""
    pytest.importorskip("PIL", reason="Pillow is not installed (the example saves a PNG)")
    folder, js, g = golden.case("flux1_schnell_tiny", "64x64")
    call = js["call"]
    out_png = str(tmp_path / "output.png")
    code = rewrite(seed_examples()[0], [
        ('"black-forest-labs/FLUX.1-schnell"', repr(folder)),
        ("dtype=torch.bfloat16", "dtype=torch.float32"),
        ('prompt="a golden retriever surfing a wave, photorealistic"', f"prompt={call['prompt']!r}"),
        ("height=1024", f"height={call['height']}"), ("width=1024", f"width={call['width']}"),
        ("num_inference_steps=4", f"num_inference_steps={call['num_inference_steps']}"),
        ("guidance_scale=0.0,", f"guidance_scale=0.0, max_sequence_length={call['max_sequence_length']}, "
                                f"generator=torch.Generator('cpu').manual_seed({call['seed']}),"),
        ('image.save("output.png")', f"image.save({out_png!r})"),
    ])
    ns = {}
    exec(compile(code, "seed_example_1", "exec"), ns)
    pipe = ns["pipe"]
    assert pipe._offload == "model" and pipe._handle is not None
    kw = dict(prompt=call["prompt"], height=call["height"], width=call["width"],
              num_inference_steps=call["num_inference_steps"], guidance_scale=0.0,
              max_sequence_length=call["max_sequence_length"])
    gen = lambda: cdiffusers.Generator("cpu").manual_seed(call["seed"])  # noqa: E731
    images = pipe(**kw, generator=gen(), output_type="np").images
    latents = pipe(**kw, generator=gen(), output_type="latent").images
    print("example 1:", compare(g, images, latents, out_png))


def test_compiled_mode_with_warmup(tmp_path, compile_log):
    """Example 2: StableDiffusion3Pipeline, pipe.to(device), transformer.compile(fullgraph,
    dynamic=False), a warm-up call, then the same shapes again: nothing is compiled the second time."""
    pytest.importorskip("PIL", reason="Pillow is not installed (the example saves a PNG)")
    folder, js, g = golden.case("sd35m_tiny", "64x96_bang_default_seq")
    call = js["call"]
    out_png = str(tmp_path / "output.png")
    h, w, n = call["height"], call["width"], call["num_inference_steps"]
    code = rewrite(seed_examples()[1], [
        ('"stabilityai/stable-diffusion-3.5-medium"', repr(folder)),
        ("dtype=torch.bfloat16", "dtype=torch.float32"),
        ('pipe.to("tpu")', f"pipe.to({DEVICE!r})"), ('backend="tpu"', f"backend={DEVICE!r}"),
        ("height=1024, width=1024, num_inference_steps=40", f"height={h}, width={w}, num_inference_steps={n}"),
        ('prompt="a golden retriever surfing a wave, photorealistic"', f"prompt={call['prompt']!r}"),
        ("height=1024", f"height={h}"), ("width=1024", f"width={w}"), ("num_inference_steps=40", f"num_inference_steps={n}"),
        ("guidance_scale=4.5,\n", f"guidance_scale=4.5, generator=torch.Generator('cpu').manual_seed({call['seed']}),\n"),
        ('image.save("output.png")', f"image.save({out_png!r})"),
    ])
    ns = {}
    exec(compile(code, "seed_example_2", "exec"), ns)
    pipe = ns["pipe"]
    assert compile_log[0] > 0, "the warm-up call compiled nothing"
    assert compile_log[1] == 0, f"the second call with the same shapes compiled {compile_log[1]} graphs"
    kw = dict(prompt=call["prompt"], height=h, width=w, num_inference_steps=n, guidance_scale=4.5)
    gen = lambda: cdiffusers.Generator("cpu").manual_seed(call["seed"])  # noqa: E731
    images = pipe(**kw, generator=gen(), output_type="np").images
    latents = pipe(**kw, generator=gen(), output_type="latent").images
    assert compile_log[2:] == [0, 0], "the output types recompiled"
    print("example 2:", compare(g, images, latents, out_png))


def tp_script(out_dir):
    folder, js, g = golden.case("flux2_dev_tiny", "64x64")
    c = js["case"]
    code = rewrite(seed_examples()[2], [
        ('DeviceMesh("tpu"', f"DeviceMesh({DEVICE!r}"), ('pipe.vae.to("tpu")', f"pipe.vae.to({DEVICE!r})"),
        ('repo_id = "black-forest-labs/FLUX.2-dev"', f"repo_id = {folder!r}"),
        ("dtype=torch.bfloat16", "dtype=torch.float32"),
        ('prompt="a golden retriever surfing a wave, photorealistic"', f"prompt={c['prompt']!r}"),
        ("num_inference_steps=28,", f"num_inference_steps={c['steps']}, height={c['height']}, width={c['width']}, "
                                    "text_encoder_out_layers=[1, 2, 3],"),
        ("manual_seed(0)", f"manual_seed({c['seed']})"),
        ('image.save("output.png")', f"image.save({os.path.join(out_dir, 'output.png')!r})"),
    ])
    # after the example: the float image and the latents of the same call, for the comparison
    code += f"""
import numpy
kw = dict(prompt={c['prompt']!r}, num_inference_steps={c['steps']}, height={c['height']}, width={c['width']},
          text_encoder_out_layers=[1, 2, 3])
im = pipe(**kw, generator=torch.Generator("cpu").manual_seed({c['seed']}), output_type="np").images
lat = pipe(**kw, generator=torch.Generator("cpu").manual_seed({c['seed']}), output_type="latent").images
numpy.save({os.path.join(out_dir, 'image_')!r} + str(dist.get_rank()) + ".npy", im)
numpy.save({os.path.join(out_dir, 'latents_')!r} + str(dist.get_rank()) + ".npy", lat)
# the sharded forwards sum their partial results across the ranks
import cdiffusers
open({os.path.join(out_dir, 'collectives_')!r} + str(dist.get_rank()), "w").write(str(cdiffusers._cdiffusers.dist_collectives()))
"""
    return code, g


# tests/test_pipeline_flux2.c: FLUX.2's per-step and final latents 3e-4, the image 5e-4
FLUX2 = dict(latents_key="final_latents", tol_latents=3e-4,
             ref_png=os.path.join(golden.PIPELINES, "flux2_dev_tiny", "cases", "64x64", "image.png"))


def test_tensor_parallel_one_process(tmp_path):
    """Example 3 in this process: a group of one (no launcher), the models loaded through the
    tensor-parallel path with a mesh of one."""
    pytest.importorskip("PIL", reason="Pillow is not installed (the example saves a PNG)")
    code, g = tp_script(str(tmp_path))
    ns = {}
    try:
        exec(compile(code, "seed_example_3", "exec"), ns)
    finally:
        cdiffusers.distributed.destroy_process_group()
    print("example 3 (1 process):", compare(g, np.load(tmp_path / "image_0.npy"), np.load(tmp_path / "latents_0.npy"),
                                            str(tmp_path / "output.png"), **FLUX2))


@pytest.mark.skipif(not shutil.which("mpirun"), reason="mpirun is not installed (openmpi-bin)")
def test_tensor_parallel_two_ranks(tmp_path):
    """Example 3 as the seed runs it: one process per rank, two ranks under mpirun; every rank's
    result matches diffusers' single-process run."""
    pytest.importorskip("PIL", reason="Pillow is not installed (the example saves a PNG)")
    if not cdiffusers._cdiffusers.dist_backend_available("mpi"):
        pytest.skip("this cdiffusers was built without MPI")
    code, g = tp_script(str(tmp_path))
    script = tmp_path / "flux2_tp.py"
    script.write_text(code)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(sys.path))
    cmd = ["mpirun", "--oversubscribe", "-np", "2", sys.executable, str(script)]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in (0, 1):
        n = int((tmp_path / f"collectives_{rank}").read_text())
        assert n > 0, f"rank {rank} ran no collective: the models were not sharded"
        png = str(tmp_path / "output.png")
        print(f"example 3 (rank {rank} of 2):", compare(g, np.load(tmp_path / f"image_{rank}.npy"),
                                                     np.load(tmp_path / f"latents_{rank}.npy"), png, **FLUX2))
