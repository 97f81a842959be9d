#!/usr/bin/env python3
"""Reference data for cdiffusers' GGUF reader and dequantization kernels.

Ground truth is the `gguf` Python package (llama.cpp's gguf-py): its GGUFWriter writes the files
and its `gguf.quants.dequantize` (numpy, float32) gives the expected values. Nothing here comes
from cdiffusers. Writes into tests/data/formats/:

  dequant_refs.safetensors  for every type T: "T.raw" (U8, the blocks' bytes) and "T.out" (F32,
                            gguf.quants.dequantize of those bytes), random blocks
  tiny_v3.gguf              a GGUF v3 file (general.alignment 32 default) holding one tensor of
                            every type plus metadata of every value kind; tiny_v3.expect.safetensors
                            has each tensor dequantized by gguf's own GGUFReader + dequantize, in
                            torch order (GGUF dims reversed)
  tiny_v2.gguf              the same bytes with version 2 (v2 and v3 differ only in the version
                            field for little-endian files)
  tiny_align64.gguf         the same tensors with general.alignment = 64
  quant_refs.safetensors    "Q8_0.in" (F32 values: random rows of several magnitudes, an all-zero
                            block, halfway products, subnormal scales) and "Q8_0.blocks" (U8,
                            gguf.quants.quantize of them): the quantize-at-load reference

Usage: /work/venv/bin/python tools/make-format-refs/make_gguf_refs.py [--only-quant] [OUT_DIR]
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf.constants import GGML_QUANT_SIZES
from safetensors.numpy import save_file

TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]

# Byte offsets of the f16 scale fields inside one block: random bytes there would be mostly
# fine, but NaN/inf scales make NaN results whose payload depends on the operand order of the
# multiply, which is not part of the format. They get random finite values instead.
F16_FIELDS = {
    "Q8_0": [0], "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
}


def random_blocks(rng, name, n_blocks):
    qt = Q[name]
    bs, ts = GGML_QUANT_SIZES[qt]
    raw = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint8)
    if name in F16_FIELDS:
        for off in F16_FIELDS[name]:
            # finite scales over a wide range, including subnormals and negative values
            mag = np.exp(rng.uniform(np.log(1e-7), np.log(60000.0), size=n_blocks))
            sign = np.where(rng.random(n_blocks) < 0.3, -1.0, 1.0)
            h = (mag * sign).astype(np.float16)
            h[0] = np.float16(0.0)  # a zero scale
            raw[:, off:off + 2] = h.view(np.uint8).reshape(n_blocks, 2)
    elif name == "F16":
        # plain values plus every special: +-0, +-inf, NaNs with payloads, subnormals
        raw = raw.reshape(-1)
        specials = np.array([0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0x7d01, 0xfe55, 0x0001, 0x83ff, 0x7bff],
                            dtype=np.uint16)
        raw[: specials.size * 2] = specials.view(np.uint8)
        raw = raw.reshape(n_blocks, ts)
    elif name == "BF16":
        raw = raw.reshape(-1)
        specials = np.array([0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0x7f81, 0x0001, 0x807f], dtype=np.uint16)
        raw[: specials.size * 2] = specials.view(np.uint8)
        raw = raw.reshape(n_blocks, ts)
    # F32 stays random bits (NaNs included): dequantization is a plain copy
    return raw, bs, ts


def dequant(raw, name):
    return np.ascontiguousarray(gguf.quants.dequantize(raw.reshape(-1), Q[name]).astype(np.float32).reshape(-1))


def write_dequant_refs(out, rng):
    tensors = {}
    for name in TYPES:
        bs, _ = GGML_QUANT_SIZES[Q[name]]
        n_blocks = 4 if bs == 256 else (8 if bs == 32 else 96)
        raw, _, _ = random_blocks(rng, name, n_blocks)
        tensors[f"{name}.raw"] = np.ascontiguousarray(raw.reshape(-1))
        tensors[f"{name}.out"] = dequant(raw, name)
    save_file(tensors, os.path.join(out, "dequant_refs.safetensors"))


def write_gguf(path, rng, alignment=None):
    w = gguf.GGUFWriter(path, arch="flux")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_string("general.name", "cdiffusers tiny reference")
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -5)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", 1.5)
    w.add_bool("test.bool", True)
    w.add_uint64("test.u64", 2**63 + 5)
    w.add_int64("test.i64", -(2**62))
    w.add_float64("test.f64", -2.25)
    w.add_array("test.arr_str", ["a", "bc", ""])
    w.add_array("test.arr_i32", [1, -2, 3])
    w.add_array("test.arr_nested", [[1, 2], [3]])
    shapes = {}
    for i, name in enumerate(TYPES):
        qt = Q[name]
        bs, ts = GGML_QUANT_SIZES[qt]
        # torch order [rows, cols]; cols a multiple of the block size; 3-D for one to test dims
        cols = bs * 2 if bs > 1 else 48
        rows = 3
        raw, _, _ = random_blocks(rng, name, rows * cols // bs)
        tname = f"blocks.{i}.{name.lower()}.weight"
        if name == "Q8_0":
            shape = (2, 3, cols)
        else:
            shape = (rows, cols)
        if name == "Q8_0":
            raw, _, _ = random_blocks(rng, name, 2 * 3 * cols // bs)
        byte_shape = (*shape[:-1], shape[-1] // bs * ts)
        w.add_tensor(tname, raw.reshape(byte_shape), raw_dtype=qt)
        shapes[tname] = shape
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return shapes


def expect_from_reader(path, shapes):
    r = gguf.GGUFReader(path)
    out = {}
    for t in r.tensors:
        v = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        v = np.ascontiguousarray(v.reshape(shapes[t.name]))
        out[t.name] = v
    return out


def write_quant_refs(out, rng):
    rows = [rng.standard_normal(32 * 8) * s for s in (1e-3, 0.05, 1.0, 30.0)]
    zero = np.zeros(32)
    # 127 * k / 2 steps: x * (1 / d) lands on .5 exactly for many of them (round half away from 0)
    half = np.array([127.0] + [(k + 0.5) for k in range(-15, 16)])
    tiny = rng.standard_normal(32) * 1e-7  # d below f16's normal range
    x = np.concatenate(rows + [zero, half, -half, tiny]).astype(np.float32)
    blocks = gguf.quants.quantize(x.reshape(1, -1), Q.Q8_0).reshape(-1)
    save_file({"Q8_0.in": x, "Q8_0.blocks": np.ascontiguousarray(blocks)}, os.path.join(out, "quant_refs.safetensors"))


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    out = args[0] if args else os.path.join(os.path.dirname(__file__), "../../tests/data/formats")
    os.makedirs(out, exist_ok=True)
    write_quant_refs(out, np.random.default_rng(21))
    if "--only-quant" in sys.argv:
        return
    rng = np.random.default_rng(19)
    write_dequant_refs(out, rng)
    p3 = os.path.join(out, "tiny_v3.gguf")
    shapes = write_gguf(p3, np.random.default_rng(20))
    save_file(expect_from_reader(p3, shapes), os.path.join(out, "tiny_v3.expect.safetensors"))
    data = bytearray(open(p3, "rb").read())
    assert data[4:8] == (3).to_bytes(4, "little")
    data[4:8] = (2).to_bytes(4, "little")
    open(os.path.join(out, "tiny_v2.gguf"), "wb").write(bytes(data))
    p64 = os.path.join(out, "tiny_align64.gguf")
    shapes64 = write_gguf(p64, np.random.default_rng(20), alignment=64)
    e64 = expect_from_reader(p64, shapes64)
    e3 = expect_from_reader(p3, shapes)
    for k in e3:  # same seed, same tensors: one expect file serves both
        assert np.array_equal(e3[k].view(np.uint32), e64[k].view(np.uint32)), k
    print("wrote", out)


if __name__ == "__main__":
    main()
