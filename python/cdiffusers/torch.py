"""A stand-in for the few ``torch`` names diffusers scripts use, so a script runs without PyTorch
after ``import torch`` becomes ``import cdiffusers.torch as torch``:
``torch.bfloat16``, ``torch.float32``, ``torch.Generator("cpu").manual_seed(s)``, ``torch.device``,
``torch.no_grad()`` / ``torch.inference_mode()`` (no-ops: nothing here records gradients) and
``torch.distributed`` (= cdiffusers.distributed)."""
import contextlib

from . import distributed
from ._common import Generator, bfloat16, dtype, float32

__all__ = ["Generator", "bfloat16", "float32", "dtype", "device", "no_grad", "inference_mode", "distributed"]


def device(name):
    """A device is its name here: cdiffusers' .to() takes the string."""
    return str(name)


@contextlib.contextmanager
def no_grad():
    yield


inference_mode = no_grad
