"""Names shared by the pipelines, the models and the torch stand-in: dtypes, devices, generators."""
import os

from . import _cdiffusers as _C


class dtype:
    """A weight dtype, as ``torch.bfloat16`` / ``torch.float32`` (cdiffusers.bfloat16, cdiffusers.float32).

    Maps to ``cdf_pipeline_load_params.weight_dtype`` (CDF_BF16 / CDF_F32)."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return "cdiffusers." + self.name

    def __eq__(self, other):
        try:
            return dtype_name(other) == self.name
        except (TypeError, ValueError):
            return False

    def __hash__(self):
        return hash(self.name)


bfloat16 = dtype("bfloat16")
float32 = dtype("float32")

_DTYPE_NAMES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float32": "float32", "float": "float32",
                "fp32": "float32", "f32": "float32"}


def dtype_name(d):
    """'bfloat16' or 'float32' for a cdiffusers dtype, a torch.dtype or one of those strings."""
    if isinstance(d, dtype):
        return d.name
    if isinstance(d, str):
        name = d
    elif type(d).__name__ == "dtype" and str(d).startswith("torch."):  # torch.bfloat16, without importing torch
        name = str(d)[len("torch."):]
    else:
        raise TypeError(f"dtype must be cdiffusers.bfloat16 / float32, a torch.dtype or a string, got {d!r}")
    if name not in _DTYPE_NAMES:
        raise ValueError(f"dtype {d!r} is not supported: cdiffusers runs bfloat16 or float32 weights")
    return _DTYPE_NAMES[name]


_DEVICE_TYPES = {"cpu": "cpu", "cuda": "cuda", "pjrt": "pjrt", "tpu": "pjrt"}


def device_name(device):
    """The library's device name for a diffusers/torch device: "tpu" is the pjrt device (a TPU
    plugin), "cuda:1" stays "cuda:1"; a torch.device is read by its str()."""
    if device is None:
        return None
    if not isinstance(device, (str, int)) and type(device).__name__ != "device":
        raise TypeError(f"device must be a string such as 'cpu', 'cuda', 'pjrt' or 'tpu', got {device!r}")
    if isinstance(device, int):  # torch: an int is a cuda ordinal
        return f"cuda:{device}"
    base, sep, index = str(device).partition(":")
    if base not in _DEVICE_TYPES:
        raise ValueError(f"unknown device {device!r}: cdiffusers runs on 'cpu', 'cuda', 'pjrt' and 'tpu' (= pjrt)")
    return _DEVICE_TYPES[base] + (sep + index if sep else "")


def default_device():
    """The device a pipeline without .to() runs on ($CDIFFUSERS_DEVICE, else the best one)."""
    env = os.environ.get("CDIFFUSERS_DEVICE")
    if env:
        return env
    devs = _C.devices()
    return devs[0].partition(":")[0] if devs else "cpu"


class Generator:
    """``torch.Generator("cpu").manual_seed(s)``: cdiffusers draws the same numbers as torch's CPU
    generator (the mt19937 + Box-Muller recipe in include/cdiffusers/rng.h), from the seed.

    Only the seed is used: a pipeline call draws from a fresh generator with this seed, as a
    freshly seeded torch generator would (numbers drawn from it before the call are not replayed)."""

    def __init__(self, device="cpu"):
        self.device = device
        self._seed = 67280421310721  # torch's default seed

    def manual_seed(self, seed):
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"manual_seed expects an int, got {type(seed).__name__}")
        self._seed = seed & 0xFFFFFFFFFFFFFFFF
        return self

    def initial_seed(self):
        return self._seed

    def seed(self):
        self._seed = int.from_bytes(os.urandom(8), "little") >> 1
        return self._seed

    def __repr__(self):
        return f"cdiffusers.Generator(device={self.device!r}, seed={self._seed})"


def seed_of(g):
    """The seed of a cdiffusers.Generator or of a torch.Generator (duck-typed: initial_seed())."""
    if isinstance(g, Generator):
        return g.initial_seed()
    init = getattr(g, "initial_seed", None)
    if callable(init):
        return int(init()) & 0xFFFFFFFFFFFFFFFF
    raise TypeError(f"generator must be a cdiffusers.Generator or a torch.Generator, got {type(g).__name__}")
