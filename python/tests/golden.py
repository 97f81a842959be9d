"""Reading the golden pipeline runs (tests/data/pipelines, made by diffusers; README there) without
the safetensors package: the format is an 8-byte header length, a JSON header, raw data."""
import json
import os
import struct

import numpy as np

DATA = os.environ.get("CDF_TEST_DATA") or os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data")
PIPELINES = os.path.join(DATA, "pipelines")

_DT = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "U8": np.uint8, "I32": np.int32}


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for key, info in header.items():
        if key == "__metadata__" or info["dtype"] not in _DT:
            continue
        b, e = info["data_offsets"]
        out[key] = np.frombuffer(raw[8 + n + b:8 + n + e], dtype=_DT[info["dtype"]]).reshape(info["shape"])
    return out


def case(pipeline, name):
    """(folder, call, tensors) of a golden case."""
    folder = os.path.join(PIPELINES, pipeline)
    d = os.path.join(folder, "cases", name)
    with open(os.path.join(d, "expected.json")) as f:
        js = json.load(f)
    return folder, js, read_safetensors(os.path.join(d, "expected.safetensors"))
