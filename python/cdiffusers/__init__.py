"""cdiffusers: diffusers' text-to-image pipelines (FLUX.1, SD3 / SD3.5, FLUX.2) on the cdiffusers C
library, without PyTorch. A diffusers script runs with its imports changed:

    from cdiffusers import FluxPipeline          # was: from diffusers import FluxPipeline
    import cdiffusers.torch as torch             # was: import torch (dtypes, Generator)

    pipe = FluxPipeline.from_pretrained("/models/FLUX.1-schnell", dtype=torch.bfloat16)
    pipe.enable_model_cpu_offload()
    image = pipe(prompt="a red fox", num_inference_steps=4, guidance_scale=0.0,
                 generator=torch.Generator("cpu").manual_seed(0)).images[0]

Every public class says in its help() what it maps to; docs/python.md has the whole list."""
from . import _cdiffusers
from ._cdiffusers import (CdiffusersError, InvalidArgumentError, ModelFileError, NotFoundError, OutOfMemoryError,
                          RuntimeFailure, UnsupportedError)
from ._common import Generator, bfloat16, dtype, float32
from .distributed import DeviceMesh, DistributedConfig, TensorParallelConfig
from .pipelines import (AutoencoderKL, AutoencoderKLFlux2, CLIPTextModel, CLIPTextModelWithProjection,
                        DiffusionPipeline, Flux2Pipeline, Flux2PipelineOutput, Flux2Transformer2DModel,
                        FluxImg2ImgPipeline, FluxInpaintPipeline, FluxPipeline, FluxPipelineOutput,
                        FluxTransformer2DModel, Mistral3ForConditionalGeneration, ModelMixin, SD3Transformer2DModel,
                        StableDiffusion3Img2ImgPipeline, StableDiffusion3InpaintPipeline, StableDiffusion3Pipeline,
                        StableDiffusion3PipelineOutput, T5EncoderModel)

__version__ = _cdiffusers.version


def devices():
    """The devices the library registered, the default first (e.g. ['cpu:0'])."""
    return _cdiffusers.devices()


def exec_stats():
    """The library's execution counters (cdf_exec_get_stats): ops, kernels launched, fused kernels,
    compiles, compiled-graph cache hits, graph breaks."""
    return _cdiffusers.exec_stats()


__all__ = [
    "DiffusionPipeline", "FluxPipeline", "FluxImg2ImgPipeline", "FluxInpaintPipeline", "StableDiffusion3Pipeline",
    "StableDiffusion3Img2ImgPipeline", "StableDiffusion3InpaintPipeline", "Flux2Pipeline", "FluxPipelineOutput",
    "StableDiffusion3PipelineOutput", "Flux2PipelineOutput", "ModelMixin", "FluxTransformer2DModel",
    "SD3Transformer2DModel", "Flux2Transformer2DModel", "AutoencoderKL", "AutoencoderKLFlux2", "CLIPTextModel",
    "CLIPTextModelWithProjection", "T5EncoderModel", "Mistral3ForConditionalGeneration", "TensorParallelConfig",
    "DistributedConfig", "DeviceMesh", "Generator", "bfloat16", "float32", "dtype", "devices", "exec_stats",
    "CdiffusersError", "NotFoundError", "ModelFileError", "InvalidArgumentError", "OutOfMemoryError",
    "UnsupportedError", "RuntimeFailure",
]
