"""diffusers' pipeline and model classes over the library (the C extension cdiffusers._cdiffusers).

A pipeline object records what diffusers' calls ask for (device, dtype, offload, compile, LoRA,
tensor parallelism) and loads the library's pipeline the first time it is needed: the weights are
read once, on the device .to() named, instead of on the CPU and then again on the device.
from_pretrained checks the folder at once (configs and checkpoint headers), so a missing or
broken folder fails there, with the library's message."""
import json
import os
import random
import sys
import warnings

from . import _cdiffusers as _C
from ._common import default_device, device_name, dtype_name, seed_of

__all__ = []

_TP_COMPONENTS = ("transformer", "text_encoder", "text_encoder_2", "text_encoder_3")


def _np():
    try:
        import numpy
    except ImportError as e:  # pragma: no cover - numpy is a test dependency
        raise ImportError("output_type 'np' / 'latent' and numpy inputs need numpy (apt install python3-numpy)") from e
    return numpy


def _pil():
    try:
        from PIL import Image
    except ImportError:
        return None
    return Image


def _check_int(name, v, minimum=None):
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if minimum is not None and v < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {v}")


def _check_float(name, v):
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(v).__name__}")


def _prompt_list(name, p):
    """diffusers takes a string or a list of them: None, a str, or a list of str."""
    if p is None or isinstance(p, str):
        return p
    if isinstance(p, (list, tuple)) and all(isinstance(x, str) for x in p):
        if not p:
            raise ValueError(f"{name} is an empty list")
        return list(p)
    raise TypeError(f"{name} must be a str or a list of str, got {type(p).__name__}")


def _embeds_arg(name, x, ndim, width=None, width_what=""):
    """prompt_embeds and co.: a numpy array (or anything numpy reads: a CPU torch tensor) of
    diffusers' encode_prompt shape -> (float32 bytes, shape) for the library."""
    if x is None:
        return None
    np = _np()
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor
        x = x.detach().cpu().float().numpy()
    try:
        a = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must be an array of floats, got {type(x).__name__}") from e
    dims = "(batch_size, sequence_length, channels)" if ndim == 3 else "(batch_size, channels)"
    if a.ndim != ndim or 0 in a.shape:
        raise ValueError(f"`{name}` must have shape {dims}, got {tuple(a.shape)}")
    if width is not None and a.shape[-1] != width:
        raise ValueError(f"`{name}` has {a.shape[-1]} channels but the pipeline takes {width} ({width_what}); "
                         f"shape {tuple(a.shape)}")
    if not np.isfinite(a).all():
        raise ValueError(f"`{name}` holds NaN or infinite values")
    return a


def _image_arg(name, img, mask=False):
    """(bytes, width, height, channels) for the C layer from a PIL image or a numpy array
    (HWC or HW, uint8 0..255 or float 0..1; a batch of one is accepted)."""
    if img is None:
        return None
    if isinstance(img, (list, tuple)):
        if len(img) != 1:
            raise NotImplementedError(f"{name}: one image per call (got {len(img)})")
        img = img[0]
    Image = _pil()
    if Image is not None and isinstance(img, Image.Image):
        if mask:
            img = img.convert("L")
            return (img.tobytes(), img.width, img.height, 1)
        img = img.convert("RGB")
        return (img.tobytes(), img.width, img.height, 3)
    if type(img).__module__ == "numpy" or hasattr(img, "__array_interface__"):
        np = _np()
        a = np.asarray(img)
        if a.ndim == 4 and a.shape[0] == 1:
            a = a[0]
        if a.ndim == 3 and a.shape[-1] == 1:
            a = a[..., 0]
        if a.ndim not in (2, 3) or (a.ndim == 3 and a.shape[-1] != 3):
            raise ValueError(f"{name}: expected an array of shape (H, W, 3) or (H, W), got {a.shape}")
        if a.dtype != np.uint8:
            # diffusers' numpy convention: floats in [0, 1]; the library takes 8-bit samples
            a = np.clip(np.rint(a.astype(np.float64) * 255.0), 0, 255).astype(np.uint8)
        a = np.ascontiguousarray(a)
        ch = 1 if a.ndim == 2 else 3
        return (a.tobytes(), int(a.shape[1]), int(a.shape[0]), ch)
    raise TypeError(f"{name} must be a PIL.Image.Image or a numpy array, got {type(img).__name__}")


class BaseOutput:
    """The pipeline's output: ``.images`` (PIL images, or numpy arrays for output_type "np" /
    "latent" or without Pillow); indexable like diffusers' output tuple."""

    def __init__(self, images):
        self.images = images

    def __getitem__(self, i):
        return (self.images,)[i]

    def __iter__(self):
        return iter((self.images,))

    def __repr__(self):
        return f"{type(self).__name__}(images=<{len(self.images)} image(s)>)"


class FluxPipelineOutput(BaseOutput):
    """diffusers' FluxPipelineOutput."""


class StableDiffusion3PipelineOutput(BaseOutput):
    """diffusers' StableDiffusion3PipelineOutput."""


class Flux2PipelineOutput(BaseOutput):
    """diffusers' Flux2PipelineOutput."""


# ---- models (components) -------------------------------------------------------------------------
class ModelMixin:
    """A model loaded on its own, to hand to a pipeline's from_pretrained (``transformer=``,
    ``text_encoder=``, ...): diffusers' ModelMixin / transformers' PreTrainedModel.

    The weights are read when the pipeline loads (the library loads whole pipelines); what this
    object holds is where they are (a sub-folder, or a single file / GGUF from from_single_file)
    and how to load them (tensor parallelism)."""

    _component = None  # the model_index.json name it usually has

    def __init__(self, source, subfolder=None, single_file=False, dtype=None, parallel=False, mesh=None):
        self.source = source
        self.subfolder = subfolder
        self.single_file = single_file
        self.dtype = dtype
        self.parallel = parallel
        self.mesh = mesh
        self._pipe = None

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, subfolder=None, dtype=None, torch_dtype=None,
                        parallel_config=None, distributed_config=None, device_mesh=None, **kwargs):
        """Where a model's folder is (``<path>/<subfolder>``); ``parallel_config=TensorParallelConfig``
        (diffusers) or ``distributed_config=DistributedConfig`` with ``device_mesh=`` (transformers)
        loads it sharded over the mesh."""
        _warn_unused(cls.__name__ + ".from_pretrained", kwargs)
        path = os.fspath(pretrained_model_name_or_path)
        folder = os.path.join(path, subfolder) if subfolder else path
        if not os.path.isfile(os.path.join(folder, "config.json")):
            raise FileNotFoundError(f"{cls.__name__}.from_pretrained: no config.json in '{folder}'"
                                    + ("" if os.path.isdir(folder) else " (the folder does not exist)"))
        mesh = None
        if parallel_config is not None:
            mesh = parallel_config.mesh
        elif distributed_config is not None or device_mesh is not None:
            if device_mesh is None:
                raise ValueError(f"{cls.__name__}.from_pretrained: distributed_config needs device_mesh=")
            mesh = device_mesh
        d = dtype if dtype is not None else torch_dtype
        return cls(path, subfolder=subfolder, dtype=dtype_name(d) if d is not None else None, parallel=mesh is not None,
                   mesh=mesh)

    @classmethod
    def from_single_file(cls, path, config=None, dtype=None, torch_dtype=None, **kwargs):
        """One component's weights from a .safetensors (diffusers, BFL or ComfyUI names; fp8) or
        .gguf file; the pipeline's sub-folder still gives its config."""
        _warn_unused(cls.__name__ + ".from_single_file", kwargs)
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{cls.__name__}.from_single_file: '{path}' does not exist")
        d = dtype if dtype is not None else torch_dtype
        return cls(path, single_file=True, dtype=dtype_name(d) if d is not None else None)

    def to(self, device=None, dtype=None):
        """Moves the pipeline this model belongs to (one device per pipeline in cdiffusers)."""
        if self._pipe is not None:
            self._pipe.to(device, dtype)
        return self

    def compile(self, backend=None, fullgraph=False, dynamic=False, mode=None, options=None):
        """torch.compile of the transformer -> cdf_pipeline_compile (the transformer and the VAE are
        captured once per input shape and replayed). ``backend``: the device the model is on (the
        seed's "tpu" after pipe.to("tpu")) or None; ``dynamic=True`` is refused (static shapes:
        a new height/width compiles once, the step count never)."""
        self._owner("compile")._set_compile("whole", backend, fullgraph, dynamic)

    def compile_repeated_blocks(self, backend=None, fullgraph=False, dynamic=False, mode=None, options=None):
        """diffusers' compile_repeated_blocks -> cdf_pipeline_compile_repeated_blocks: one graph per
        block class and shape, shared by all blocks (short warm-up; works with offload)."""
        self._owner("compile_repeated_blocks")._set_compile("blocks", backend, fullgraph, dynamic)

    def enable_tiling(self, tile_sample_min_size=None):
        """AutoencoderKL.enable_tiling -> cdf_generate_params.vae_tiling = ON."""
        self._owner("enable_tiling")._vae_tiling = (1, tile_sample_min_size or 0)

    def disable_tiling(self):
        self._owner("disable_tiling")._vae_tiling = (0, 0)

    def _owner(self, what):
        if self._pipe is None:
            raise NotImplementedError(f"{type(self).__name__}.{what}: call it on the pipeline's model "
                                      f"(pipe.{self._component or 'transformer'}.{what}(...)): the library "
                                      "compiles and runs models as parts of a pipeline")
        return self._pipe

    @property
    def device(self):
        return self._pipe.device if self._pipe is not None else "cpu"

    def __repr__(self):
        where = self.source if not self.subfolder else os.path.join(self.source, self.subfolder)
        return f"{type(self).__name__}({where!r}{', tensor parallel' if self.parallel else ''})"


def _model_class(name, component, doc):
    return type(name, (ModelMixin,), {"_component": component, "__doc__": doc, "__module__": "cdiffusers"})


FluxTransformer2DModel = _model_class("FluxTransformer2DModel", "transformer",
                                      "diffusers.FluxTransformer2DModel (FLUX.1's denoiser), run by the library.")
SD3Transformer2DModel = _model_class("SD3Transformer2DModel", "transformer",
                                     "diffusers.SD3Transformer2DModel (SD3 / SD3.5's MMDiT), run by the library.")
Flux2Transformer2DModel = _model_class("Flux2Transformer2DModel", "transformer",
                                       "diffusers.Flux2Transformer2DModel (FLUX.2's denoiser), run by the library.")
AutoencoderKL = _model_class("AutoencoderKL", "vae", "diffusers.AutoencoderKL (FLUX.1 / SD3's VAE).")
AutoencoderKLFlux2 = _model_class("AutoencoderKLFlux2", "vae", "diffusers.AutoencoderKLFlux2 (FLUX.2's VAE).")
CLIPTextModel = _model_class("CLIPTextModel", "text_encoder", "transformers.CLIPTextModel, run by the library.")
CLIPTextModelWithProjection = _model_class("CLIPTextModelWithProjection", "text_encoder",
                                           "transformers.CLIPTextModelWithProjection, run by the library.")
T5EncoderModel = _model_class("T5EncoderModel", "text_encoder_2", "transformers.T5EncoderModel, run by the library.")
Mistral3ForConditionalGeneration = _model_class(
    "Mistral3ForConditionalGeneration", "text_encoder",
    "transformers.Mistral3ForConditionalGeneration (FLUX.2's text encoder; its language model), run by the library.")


class _Component(ModelMixin):
    """A model of a loaded pipeline: pipe.transformer, pipe.vae, pipe.text_encoder, ..."""

    def __init__(self, pipe, name, class_name):
        super().__init__(pipe._path, subfolder=name)
        self._pipe = pipe
        self._component = name
        self.class_name = class_name

    def __repr__(self):
        return f"<{self.class_name} {self._component!r} of {type(self._pipe).__name__}>"


def _warn_unused(where, kwargs):
    # diffusers' loaders warn about (and ignore) keyword arguments they do not use
    ignored = {k: v for k, v in kwargs.items() if v is not None}
    if ignored:
        warnings.warn(f"{where}: keyword arguments {sorted(ignored)} are not used by cdiffusers and are ignored",
                      stacklevel=3)


# ---- pipelines ----------------------------------------------------------------------------------
_CALL_DEFAULTS = dict(prompt=None, negative_prompt=None, true_cfg_scale=None, height=None, width=None,
                      num_inference_steps=None, guidance_scale=None, num_images_per_prompt=1, generator=None,
                      output_type="pil", return_dict=True, joint_attention_kwargs=None,
                      callback_on_step_end=None, callback_on_step_end_tensor_inputs=("latents",),
                      max_sequence_length=None, image=None, mask_image=None, strength=None,
                      text_encoder_out_layers=None, prompt_embeds=None, pooled_prompt_embeds=None,
                      negative_prompt_embeds=None, negative_pooled_prompt_embeds=None)


class DiffusionPipeline:
    """diffusers.DiffusionPipeline: ``DiffusionPipeline.from_pretrained(folder)`` reads the class
    from the folder's model_index.json (FluxPipeline, StableDiffusion3Pipeline, Flux2Pipeline) and
    returns that pipeline. Maps to the C API's cdf_pipeline (cdf_pipeline_load,
    cdf_pipeline_generate_images); docs/python.md lists every call and argument."""

    _family = None  # model_index.json _class_name this class runs
    _output = BaseOutput
    _call_params = ()  # the __call__ keywords this class takes besides the common ones
    _needs_image = False
    _needs_mask = False

    # -- construction -----------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, dtype=None, torch_dtype=None, transformer=None,
                        text_encoder=None, text_encoder_2=None, text_encoder_3=None, vae=None, **kwargs):
        """Loads a diffusers pipeline folder (model_index.json + sub-folders): the checkpoint is
        checked now (configs and headers), its weights read at the first use, on the device
        .to() names. ``dtype`` (or ``torch_dtype``): torch.bfloat16 / "bfloat16" (the default) or
        torch.float32 / "float32". Models from from_pretrained / from_single_file replace the
        folder's (a single file, or the same sub-folder loaded with tensor parallelism)."""
        _warn_unused(cls.__name__ + ".from_pretrained", {k: v for k, v in kwargs.items()
                                                         if k not in ("local_files_only", "use_safetensors",
                                                                      "low_cpu_mem_usage", "variant")})
        path = os.fspath(pretrained_model_name_or_path)
        class_name = _C.inspect(path)  # the library's message for a missing or broken folder
        target = cls._resolve_class(class_name)
        d = dtype if dtype is not None else torch_dtype
        models = {"transformer": transformer, "text_encoder": text_encoder, "text_encoder_2": text_encoder_2,
                  "text_encoder_3": text_encoder_3, "vae": vae}
        return target(path, dtype_name(d) if d is not None else "bfloat16",
                      {k: v for k, v in models.items() if v is not None})

    @classmethod
    def from_single_file(cls, pretrained_model_link_or_path, config=None, dtype=None, torch_dtype=None, **kwargs):
        """One all-in-one checkpoint (ComfyUI / Stability layout); ``config``: a diffusers folder
        for the configs and tokenizers (default: the configs shipped for the model recognised)."""
        _warn_unused(cls.__name__ + ".from_single_file", kwargs)
        path = os.fspath(pretrained_model_link_or_path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{cls.__name__}.from_single_file: '{path}' does not exist")
        class_name = _C.inspect(path, os.fspath(config) if config is not None else None)
        target = cls._resolve_class(class_name)
        d = dtype if dtype is not None else torch_dtype
        pipe = target(path, dtype_name(d) if d is not None else "bfloat16", {})
        pipe._config = os.fspath(config) if config is not None else None
        return pipe

    @classmethod
    def _resolve_class(cls, class_name):
        if cls._family is None:  # DiffusionPipeline itself: the folder decides
            if class_name not in _PIPELINES:
                raise NotImplementedError(f"pipeline class {class_name!r} is not supported by cdiffusers")
            return _PIPELINES[class_name]
        if class_name != cls._family:
            raise ValueError(f"{cls.__name__} cannot load a {class_name} checkpoint (use DiffusionPipeline, or "
                             f"the {class_name} classes)")
        return cls

    def __init__(self, path, dtype, models):
        self._path = path
        self._config = None
        self._dtype = dtype
        self._device = None  # None: the library's default device
        self._offload = "none"
        self._compile = None  # ("whole" | "blocks", backend, fullgraph)
        self._vae_tiling = (0, 0)
        self._progress = {}
        self._loras = []  # {"path", "name", "weight", "fused", "id"}
        self._handle = None
        self._models = models
        self._rng = random.Random()
        with open(os.path.join(path, "model_index.json")) if os.path.isdir(path) else _nullctx() as f:
            index = json.load(f) if f else {}
        for name, spec in index.items():
            if name.startswith("_") or not isinstance(spec, list) or spec[0] is None:
                continue
            if name in ("transformer", "vae") or name.startswith("text_encoder"):
                comp = _Component(self, name, spec[1])
                setattr(self, name, comp)
        if not index:  # a single file: the usual three
            for name in ("transformer", "vae", "text_encoder"):
                setattr(self, name, _Component(self, name, name))
        for name, m in models.items():
            if not isinstance(m, ModelMixin):
                raise TypeError(f"{name} must be a model from from_pretrained / from_single_file, got {type(m).__name__}")
            if not m.single_file and os.path.realpath(os.path.join(m.source, m.subfolder or "")) != \
                    os.path.realpath(os.path.join(path, name)):
                raise NotImplementedError(f"{name}: a model from another folder ({m!r}) is not supported; give a "
                                          f"single file (from_single_file) or the pipeline's own '{name}' sub-folder")
            m._pipe = self

    # -- diffusers' settings ----------------------------------------------------------------------
    def to(self, device=None, dtype=None):
        """``pipe.to("cpu" | "cuda" | "pjrt" | "tpu")``: the device every model runs on ("tpu" is
        the pjrt device on a TPU plugin); a dtype changes the weight dtype. After the first call
        the pipeline is loaded again on the new device."""
        if device is not None and not isinstance(device, str) and type(device).__name__ == "dtype":
            device, dtype = None, device
        if device is not None:
            dev = device_name(device)
            if dev != self._device:
                self._device = dev
                self._unload()
        if dtype is not None:
            d = dtype_name(dtype)
            if d != self._dtype:
                self._dtype = d
                self._unload()
        return self

    @property
    def device(self):
        return self._device or default_device()

    @property
    def dtype(self):
        from ._common import bfloat16, float32
        return bfloat16 if self._dtype == "bfloat16" else float32

    def enable_model_cpu_offload(self, gpu_id=None, device=None):
        """One model on the device at a time (cdf_pipeline_enable_model_cpu_offload); the device is
        the one .to() named, else the best one found (the seed's TPU on a TPU host)."""
        if device is not None:
            self.to(device)
        self._set_offload("model")

    def enable_sequential_cpu_offload(self, gpu_id=None, device=None):
        """The transformer's blocks stay host-side and are brought over one at a time
        (cdf_pipeline_enable_sequential_cpu_offload)."""
        if device is not None:
            self.to(device)
        self._set_offload("sequential")

    def _set_offload(self, mode):
        self._offload = mode
        if self._handle is not None:
            self._handle.set_offload(mode)

    def enable_vae_tiling(self):
        """VAE decode (and encode) in overlapping tiles (cdf_generate_params.vae_tiling = ON)."""
        self._vae_tiling = (1, 0)

    def disable_vae_tiling(self):
        self._vae_tiling = (0, 0)

    def set_progress_bar_config(self, **kwargs):
        """Options for the tqdm progress bar (``disable=True`` hides it), as diffusers."""
        self._progress = dict(kwargs)

    def _set_compile(self, kind, backend, fullgraph, dynamic):
        if dynamic:
            raise ValueError("dynamic=True is not supported: cdiffusers compiles static shapes (pass dynamic=False); "
                             "a new height/width compiles once, the step count never recompiles")
        if backend is not None:
            if not isinstance(backend, str):
                raise TypeError(f"backend must be a string, got {type(backend).__name__}")
            want = self.device.partition(":")[0]
            if backend != "inductor" and device_name(backend).partition(":")[0] != want:
                raise ValueError(f"backend={backend!r}: the model is on {self.device!r}; compile with the device the "
                                 f"model is on (backend={want!r}, or omit it)")
        self._compile = (kind, self.device.partition(":")[0], bool(fullgraph))
        if self._handle is not None:
            self._apply_compile()

    def _apply_compile(self):
        kind, backend, fullgraph = self._compile
        if kind == "whole":
            self._handle.compile(backend=backend, fullgraph=fullgraph, dynamic=False)
        else:
            self._handle.compile_repeated_blocks(backend=backend, fullgraph=fullgraph, dynamic=False)

    # -- LoRA -------------------------------------------------------------------------------------
    def load_lora_weights(self, pretrained_model_name_or_path_or_dict, weight_name=None, adapter_name=None, **kwargs):
        """A LoRA file (diffusers/PEFT or kohya keys), or a folder + ``weight_name``
        (cdf_pipeline_load_lora, run-time mode: scales change without reloading)."""
        _warn_unused("load_lora_weights", kwargs)
        src = pretrained_model_name_or_path_or_dict
        if isinstance(src, dict):
            raise NotImplementedError("load_lora_weights: a state dict is not supported; give the file")
        src = os.fspath(src)
        path = os.path.join(src, weight_name or "pytorch_lora_weights.safetensors") if os.path.isdir(src) else src
        name = adapter_name or f"default_{len(self._loras)}"
        if any(l["name"] == name for l in self._loras):
            raise ValueError(f"Adapter name {name} already in use in the model")
        entry = {"path": path, "name": name, "weight": 1.0, "fused": None, "id": None}
        if self._handle is not None:
            entry["id"] = self._handle.load_lora(path, scale=1.0)[0]
        elif not os.path.isfile(path):
            raise FileNotFoundError(f"load_lora_weights: '{path}' does not exist")
        self._loras.append(entry)

    def set_adapters(self, adapter_names, adapter_weights=None):
        """The named adapters at the given weights; the others at 0."""
        names = [adapter_names] if isinstance(adapter_names, str) else list(adapter_names)
        if adapter_weights is None:
            weights = [1.0] * len(names)
        elif isinstance(adapter_weights, (int, float)):
            weights = [float(adapter_weights)] * len(names)
        else:
            weights = [float(w) for w in adapter_weights]
        if len(weights) != len(names):
            raise ValueError(f"Length of adapter names {len(names)} is not equal to the length of the weights {len(weights)}")
        known = {l["name"] for l in self._loras}
        for n in names:
            if n not in known:
                raise ValueError(f"Adapter name(s) {{'{n}'}} not in the list of present adapters: {sorted(known)}")
        for l in self._loras:
            l["weight"] = weights[names.index(l["name"])] if l["name"] in names else 0.0
        self._apply_lora_scales(1.0)

    def get_active_adapters(self):
        return [l["name"] for l in self._loras if l["weight"] != 0]

    def fuse_lora(self, lora_scale=1.0, components=None, adapter_names=None, **kwargs):
        """Adds scale * the adapters into the weights (cdf_lora_params.mode = FUSE)."""
        for l in self._loras:
            if adapter_names is None or l["name"] in adapter_names:
                l["fused"] = float(lora_scale) * l["weight"]
        self._reload_loras()

    def unfuse_lora(self, components=None):
        for l in self._loras:
            l["fused"] = None
        self._reload_loras()

    def unload_lora_weights(self):
        self._loras = []
        if self._handle is not None:
            self._handle.unload_lora()

    def _reload_loras(self):
        if self._handle is None:
            return
        self._handle.unload_lora()
        for l in self._loras:
            fused = l["fused"] is not None
            l["id"] = self._handle.load_lora(l["path"], scale=l["fused"] if fused else l["weight"], fuse=fused)[0]

    def _apply_lora_scales(self, scale):
        if self._handle is None:
            return
        for l in self._loras:
            if l["fused"] is None:
                self._handle.set_lora_scale(l["id"], l["weight"] * scale)

    # -- loading ----------------------------------------------------------------------------------
    def _unload(self):
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def _load(self):
        if self._handle is not None:
            return self._handle
        _apply_env_exec_mode()
        parallel = {n for n, m in self._models.items() if m.parallel}
        if parallel:
            mesh = next(self._models[n].mesh for n in parallel)
            replicate = [n for n in _TP_COMPONENTS if n not in parallel and hasattr(self, n)]
            _C.tp_enable(self._device or mesh.device, ",".join(replicate) or None)
        files = [(n, m.source) for n, m in self._models.items() if m.single_file]
        try:
            self._handle = _C.Pipeline(self._path, device=self._device, dtype=self._dtype, offload=self._offload,
                                       component_files=files or None, config=self._config)
        finally:
            if parallel:
                _C.tp_disable()
        if self._compile is not None:
            self._apply_compile()
        for l in self._loras:
            l["id"] = None
        self._reload_loras()
        return self._handle

    # -- the call ---------------------------------------------------------------------------------
    def __call__(self, prompt=None, negative_prompt=None, height=None, width=None, num_inference_steps=None,
                 guidance_scale=None, num_images_per_prompt=1, generator=None, output_type="pil", return_dict=True,
                 joint_attention_kwargs=None, callback_on_step_end=None,
                 callback_on_step_end_tensor_inputs=("latents",), max_sequence_length=None, prompt_embeds=None,
                 **class_kwargs):
        """Draws images: cdf_pipeline_generate_images. Arguments as diffusers' __call__ of this
        class (docs/python.md); returns the output with ``.images``."""
        for k in class_kwargs:
            if k not in self._call_params:
                raise TypeError(f"{type(self).__name__}.__call__() got an unexpected keyword argument '{k}'")
        kw = {}
        _check_int("num_images_per_prompt", num_images_per_prompt, 1)
        batch_size = self._prompt_args(kw, prompt, negative_prompt, prompt_embeds, class_kwargs)
        for name, v in (("height", height), ("width", width), ("num_inference_steps", num_inference_steps),
                        ("max_sequence_length", max_sequence_length)):
            _check_int(name, v, 1)
            if v is not None:
                kw[name] = v
        _check_float("guidance_scale", guidance_scale)
        if guidance_scale is not None:
            kw["guidance_scale"] = float(guidance_scale)
        tcfg = class_kwargs.get("true_cfg_scale")
        _check_float("true_cfg_scale", tcfg)
        if tcfg is not None:
            kw["true_cfg_scale"] = float(tcfg)
        strength = class_kwargs.get("strength")
        _check_float("strength", strength)
        if strength is not None:
            kw["strength"] = float(strength)
        layers = class_kwargs.get("text_encoder_out_layers")
        if layers is not None:
            layers = list(layers)
            for x in layers:
                _check_int("text_encoder_out_layers", x, 0)
            kw["text_encoder_out_layers"] = layers
        image = _image_arg("image", class_kwargs.get("image"))
        mask = _image_arg("mask_image", class_kwargs.get("mask_image"), mask=True)
        if self._needs_image and image is None:
            raise ValueError(f"{type(self).__name__} needs image=")
        if self._needs_mask and mask is None:
            raise ValueError(f"{type(self).__name__} needs mask_image=")
        if image is not None:
            kw["image"] = image
        if mask is not None:
            kw["mask_image"] = mask
        # generators: one (its seed; the batch's noise drawn from it as one tensor) or one per image,
        # images prompt-major (batch_size prompts x num_images_per_prompt), as diffusers
        count = batch_size * num_images_per_prompt
        if isinstance(generator, (list, tuple)):
            if len(generator) != count:
                raise ValueError(f"You have passed a list of generators of length {len(generator)}, but requested an "
                                 f"effective batch size of {count}. Make sure the batch size matches "
                                 "the length of the generators.")
            kw["seeds"] = [seed_of(g) for g in generator]
        else:
            kw["seed"] = seed_of(generator) if generator is not None else self._rng.getrandbits(63)
            kw["num_images"] = num_images_per_prompt
        if output_type not in ("pil", "np", "latent"):
            raise ValueError(f"output_type must be 'pil', 'np' or 'latent', got {output_type!r} (no 'pt': no torch)")
        pil = _pil() if output_type == "pil" else None
        capture = output_type != "pil" or pil is None or callback_on_step_end is not None
        if self._vae_tiling[0]:
            kw["vae_tiling"], kw["vae_tile_size"] = self._vae_tiling
        lora_scale = None
        if joint_attention_kwargs:
            if not isinstance(joint_attention_kwargs, dict):
                raise TypeError("joint_attention_kwargs must be a dict")
            unknown = set(joint_attention_kwargs) - {"scale"}
            if unknown:
                raise NotImplementedError(f"joint_attention_kwargs: only 'scale' is supported, got {sorted(unknown)}")
            lora_scale = joint_attention_kwargs.get("scale")
            _check_float("joint_attention_kwargs['scale']", lora_scale)
        if callback_on_step_end is not None and not callable(callback_on_step_end):
            raise TypeError("callback_on_step_end must be callable")
        if callback_on_step_end is not None and count > 1:
            # the library draws a batch image by image: there is no batch of latents per step
            raise NotImplementedError("callback_on_step_end with more than one image per call is not supported")
        bad = set(callback_on_step_end_tensor_inputs or ()) - {"latents"}
        if bad:
            raise ValueError(f"`callback_on_step_end_tensor_inputs` has to be in ['latents'], but found {sorted(bad)}")

        handle = self._load()
        _apply_env_exec_mode()
        bar = _ProgressBar(self._progress)
        step_fn = _StepCallback(self, handle, bar, callback_on_step_end, callback_on_step_end_tensor_inputs, count)
        if lora_scale is not None:
            self._apply_lora_scales(float(lora_scale))
        try:
            out = handle.generate(callback=step_fn, capture=capture, **kw)
        finally:
            bar.close()
            if lora_scale is not None:
                self._apply_lora_scales(1.0)
        images = self._images(handle, out, output_type, pil, count)
        return self._output(images) if return_dict else (images,)

    def _prompt_args(self, kw, prompt, negative_prompt, prompt_embeds, class_kwargs):
        """prompt / negative_prompt (str or lists) and the embedding arguments, checked as diffusers'
        check_inputs does, into the library's fields; returns the number of prompts (batch_size)."""
        prompts = _prompt_list("prompt", prompt)
        negs = _prompt_list("negative_prompt", negative_prompt)
        pooled = class_kwargs.get("pooled_prompt_embeds")
        neg_embeds = class_kwargs.get("negative_prompt_embeds")
        neg_pooled = class_kwargs.get("negative_pooled_prompt_embeds")
        if prompts is not None and prompt_embeds is not None:
            raise ValueError(f"Cannot forward both `prompt`: {prompt} and `prompt_embeds`. Please make sure to only "
                             "forward one of the two.")
        if prompts is None and prompt_embeds is None:
            raise ValueError("Provide either `prompt` or `prompt_embeds`. Cannot leave both `prompt` and "
                             "`prompt_embeds` undefined.")
        if prompt_embeds is not None and pooled is None:
            raise ValueError("If `prompt_embeds` are provided, `pooled_prompt_embeds` also have to be passed. Make "
                             "sure to generate `pooled_prompt_embeds` from the same text encoder that was used to "
                             "generate `prompt_embeds`.")
        if neg_embeds is not None and neg_pooled is None:
            raise ValueError("If `negative_prompt_embeds` are provided, `negative_pooled_prompt_embeds` also have to "
                             "be passed. Make sure to generate `negative_pooled_prompt_embeds` from the same text "
                             "encoder that was used to generate `negative_prompt_embeds`.")
        if negs is not None and neg_embeds is not None:
            raise ValueError(f"Cannot forward both `negative_prompt`: {negative_prompt} and `negative_prompt_embeds`. "
                             "Please make sure to only forward one of the two.")
        if prompt_embeds is not None or neg_embeds is not None or pooled is not None:
            joint, pooled_dim = self._embeds_widths()
            e = _embeds_arg("prompt_embeds", prompt_embeds, 3, joint, "the transformer's joint_attention_dim")
            pe = _embeds_arg("pooled_prompt_embeds", pooled, 2, pooled_dim, "the transformer's pooled_projection_dim")
            ne = _embeds_arg("negative_prompt_embeds", neg_embeds, 3, joint, "the transformer's joint_attention_dim")
            npe = _embeds_arg("negative_pooled_prompt_embeds", neg_pooled, 2, pooled_dim,
                              "the transformer's pooled_projection_dim")
            batch = e.shape[0] if e is not None else len(prompts) if isinstance(prompts, list) else 1
            for name, a in (("pooled_prompt_embeds", pe), ("negative_prompt_embeds", ne),
                            ("negative_pooled_prompt_embeds", npe)):
                if a is not None and a.shape[0] not in (1, batch):
                    raise ValueError(f"`{name}` has a batch of {a.shape[0]} but there are {batch} prompts")
            if e is not None and ne is not None and e.shape != ne.shape:
                raise ValueError("`prompt_embeds` and `negative_prompt_embeds` must have the same shape when passed "
                                 f"directly, but got: `prompt_embeds` {tuple(e.shape)} != `negative_prompt_embeds` "
                                 f"{tuple(ne.shape)}.")
            for name, a in (("prompt_embeds", e), ("pooled_prompt_embeds", pe), ("negative_prompt_embeds", ne),
                            ("negative_pooled_prompt_embeds", npe)):
                if a is not None:
                    kw[name] = (a.tobytes(), list(a.shape))
        if isinstance(prompts, list):
            batch = len(prompts)
            kw["prompts"] = prompts
        elif prompts is not None:
            batch = 1
            kw["prompt"] = prompts
        else:
            batch = kw["prompt_embeds"][1][0]
        if isinstance(negs, list):
            if isinstance(prompts, str):
                raise TypeError("`negative_prompt` should be the same type to `prompt`, but got <class 'list'> != "
                                "<class 'str'>.")
            if len(negs) != batch:
                raise ValueError(f"`negative_prompt`: {negative_prompt} has batch size {len(negs)}, but `prompt`: "
                                 f"{prompt} has batch size {batch}. Please make sure that passed `negative_prompt` "
                                 "matches the batch size of `prompt`.")
            if batch == 1:
                kw["negative_prompt"] = negs[0]
            elif prompts is None:
                raise NotImplementedError("a list of negative prompts with prompt_embeds is not supported (pass "
                                          "negative_prompt_embeds)")
            else:
                kw["negative_prompts"] = negs
        elif negs is not None:
            kw["negative_prompt"] = negs
        if "prompts" in kw and len(kw["prompts"]) == 1 and "negative_prompts" not in kw:
            kw["prompt"] = kw.pop("prompts")[0]
        return batch

    def _embeds_widths(self):
        """The transformer's joint_attention_dim and pooled_projection_dim (its config.json)."""
        if self._family == "Flux2Pipeline":
            raise NotImplementedError("prompt_embeds: Flux2Pipeline encodes the prompt itself in cdiffusers "
                                      "(FluxPipeline and StableDiffusion3Pipeline take embeddings)")
        try:
            with open(os.path.join(self._path, "transformer", "config.json")) as f:
                cfg = json.load(f)
            return cfg.get("joint_attention_dim"), cfg.get("pooled_projection_dim")
        except (OSError, ValueError, TypeError):
            return None, None  # the library checks what it can

    def _images(self, handle, out, output_type, pil, count):
        if output_type == "pil" and pil is not None:
            return [pil.frombytes("RGB", (w, h), px) for px, w, h in out]
        np = _np()
        key = "latents_final" if output_type == "latent" else "image"
        return _stack_captured(np, handle, key, count)


def _stack_captured(np, handle, key, count):
    parts = []
    for k in range(count):
        got = handle.captured(f"{k}.{key}") if count > 1 else None
        got = got or handle.captured(key)
        if got is None:
            raise RuntimeError(f"the library did not report '{key}'")
        data, shape = got
        parts.append(np.frombuffer(data, dtype=np.float32).reshape(shape))
    return parts[0].copy() if count == 1 else np.concatenate(parts, axis=0)


class _nullctx:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def _apply_env_exec_mode():
    """The seed's TORCH_TPU_DEFER_AND_FUSE=1 selects defer-and-fuse (=0 eager); unset leaves the
    library's own setting (CDIFFUSERS_DEFER_AND_FUSE)."""
    v = os.environ.get("TORCH_TPU_DEFER_AND_FUSE")
    if v is None:
        return
    want = "defer_and_fuse" if v.strip().lower() in ("1", "true", "yes", "on") else "eager"
    if _C.get_exec_mode() != want:
        _C.set_exec_mode(want)


class _ProgressBar:
    """tqdm when it is installed and not disabled (set_progress_bar_config), as diffusers shows."""

    def __init__(self, config):
        self.config = dict(config)
        self.bar = None
        self.disabled = self.config.pop("disable", False)

    def update(self, step, num_steps):
        if self.disabled:
            return
        if self.bar is None:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                self.disabled = True
                return
            self.bar = tqdm(total=num_steps, **self.config)
        self.bar.update(1)

    def close(self):
        if self.bar is not None:
            self.bar.close()


class _StepCallback:
    """The library's per-step callback: the progress bar and diffusers' callback_on_step_end
    (pipe, step index, timestep, {"latents": latents after the step}); it must return the latents
    unchanged (changing them is not supported). Ctrl-C is checked by the C layer around it."""

    def __init__(self, pipe, handle, bar, user_cb, tensor_inputs, count):
        self.pipe, self.handle, self.bar, self.user_cb = pipe, handle, bar, user_cb
        self.tensor_inputs = tuple(tensor_inputs or ())
        self.count = count

    def __call__(self, step, num_steps, seconds):
        self.bar.update(step, num_steps)
        if self.user_cb is None:
            return True
        np = _np()
        i = step - 1
        kwargs = {}
        if "latents" in self.tensor_inputs:  # FLUX.2's pipeline names its steps "stepNN.latents"
            key = f"latents_after_step.{i}" if self.handle.captured(f"latents_after_step.{i}") else f"step{i:02d}.latents"
            kwargs["latents"] = _stack_captured(np, self.handle, key, 1)
        t = None
        ts = self.handle.captured("timesteps")
        if ts is not None:
            vals = np.frombuffer(ts[0], dtype=np.float32)
            t = float(vals[len(vals) - num_steps + i]) if len(vals) >= num_steps else None
        result = self.user_cb(self.pipe, i, t, kwargs)
        if isinstance(result, dict) and "latents" in result and result["latents"] is not kwargs.get("latents"):
            raise NotImplementedError("callback_on_step_end: changing the latents is not supported (return them "
                                      "unchanged)")
        return not getattr(self.pipe, "_interrupt", False)


def _pipeline_class(name, family, output, call_params=(), needs_image=False, needs_mask=False, doc=""):
    cls = type(name, (DiffusionPipeline,), {
        "_family": family, "_output": output, "_call_params": tuple(call_params), "_needs_image": needs_image,
        "_needs_mask": needs_mask, "__module__": "cdiffusers",
        "__doc__": doc + "\n\nMaps to the C API's cdf_pipeline (cdf_pipeline_load of a " + family + " folder, "
                   "cdf_pipeline_generate_images); arguments: docs/python.md."})
    return cls


FluxPipeline = _pipeline_class(
    "FluxPipeline", "FluxPipeline", FluxPipelineOutput, ("true_cfg_scale", "pooled_prompt_embeds", "negative_prompt_embeds", "negative_pooled_prompt_embeds"),
    doc="diffusers.FluxPipeline: FLUX.1 [schnell] / [dev] text-to-image, run by the library.")
FluxImg2ImgPipeline = _pipeline_class(
    "FluxImg2ImgPipeline", "FluxPipeline", FluxPipelineOutput, ("true_cfg_scale", "image", "strength", "pooled_prompt_embeds", "negative_prompt_embeds", "negative_pooled_prompt_embeds"),
    True,
    doc="diffusers.FluxImg2ImgPipeline: FLUX.1 image-to-image (image=, strength=), run by the library.")
FluxInpaintPipeline = _pipeline_class(
    "FluxInpaintPipeline", "FluxPipeline", FluxPipelineOutput, ("true_cfg_scale", "image", "mask_image", "strength",
                                              "pooled_prompt_embeds", "negative_prompt_embeds", "negative_pooled_prompt_embeds"),
    True, True, doc="diffusers.FluxInpaintPipeline: FLUX.1 inpainting (image=, mask_image=: white repaints).")
StableDiffusion3Pipeline = _pipeline_class(
    "StableDiffusion3Pipeline", "StableDiffusion3Pipeline", StableDiffusion3PipelineOutput, ("pooled_prompt_embeds", "negative_prompt_embeds", "negative_pooled_prompt_embeds"),
    doc="diffusers.StableDiffusion3Pipeline: SD3 / SD3.5 text-to-image, run by the library.")
StableDiffusion3Img2ImgPipeline = _pipeline_class(
    "StableDiffusion3Img2ImgPipeline", "StableDiffusion3Pipeline", StableDiffusion3PipelineOutput,
    ("image", "strength", "pooled_prompt_embeds", "negative_prompt_embeds", "negative_pooled_prompt_embeds"), True, doc="diffusers.StableDiffusion3Img2ImgPipeline: SD3 / SD3.5 image-to-image.")
StableDiffusion3InpaintPipeline = _pipeline_class(
    "StableDiffusion3InpaintPipeline", "StableDiffusion3Pipeline", StableDiffusion3PipelineOutput,
    ("image", "mask_image", "strength", "pooled_prompt_embeds", "negative_prompt_embeds", "negative_pooled_prompt_embeds"), True, True,
    doc="diffusers.StableDiffusion3InpaintPipeline: SD3 / SD3.5 inpainting.")
Flux2Pipeline = _pipeline_class(
    "Flux2Pipeline", "Flux2Pipeline", Flux2PipelineOutput, ("image", "text_encoder_out_layers"),
    doc="diffusers.Flux2Pipeline: FLUX.2 text-to-image, and reference images (image=), run by the library.")

_PIPELINES = {"FluxPipeline": FluxPipeline, "StableDiffusion3Pipeline": StableDiffusion3Pipeline,
              "Flux2Pipeline": Flux2Pipeline}
