#!/usr/bin/env python3
"""Writes tests/data/quant-vectors.safetensors: for every GGUF tensor type the runtime supports,
random blocks (8 rows x 512 columns, with scales kept in a sane range) and their dequantization
by gguf-py (llama.cpp's own Python reference, `pip install gguf numpy safetensors`). The Rust
tests check the host dequantizer and the GPU kernels (matvec, matmul, embedding) against it.
Run once; the output is committed (about 200 KB)."""
import numpy as np
from gguf import quants, GGMLQuantizationType as T
from safetensors.numpy import save_file

rng = np.random.default_rng(7)
ROWS, COLS = 8, 512
out = {}
for name, ty, block_elems, block_bytes, f16_at in [
    ("F32", T.F32, 1, 4, []), ("F16", T.F16, 1, 2, []), ("BF16", T.BF16, 1, 2, []),
    ("Q4_0", T.Q4_0, 32, 18, [0]), ("Q4_1", T.Q4_1, 32, 20, [0, 2]), ("Q5_0", T.Q5_0, 32, 22, [0]),
    ("Q8_0", T.Q8_0, 32, 34, [0]), ("Q4_K", T.Q4_K, 256, 144, [0, 2]), ("Q5_K", T.Q5_K, 256, 176, [0, 2]),
    ("Q6_K", T.Q6_K, 256, 210, [208]),
]:
    if block_elems == 1:
        vals = rng.standard_normal((ROWS, COLS)).astype(np.float32)
        if name == "F32":
            raw = vals.view(np.uint8).reshape(ROWS, -1)
        elif name == "F16":
            raw = vals.astype(np.float16).view(np.uint8).reshape(ROWS, -1)
        else:
            raw = (vals.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(ROWS, -1)
    else:
        nb = ROWS * COLS // block_elems
        raw = rng.integers(0, 256, size=(nb, block_bytes), dtype=np.uint8)
        for off in f16_at:  # scales: small positive/negative f16 values instead of random bits
            sc = (rng.standard_normal(nb) * 0.01).astype(np.float16)
            raw[:, off:off + 2] = sc.view(np.uint8).reshape(nb, 2)
        raw = raw.reshape(ROWS, -1)
    deq = quants.dequantize(raw, ty).astype(np.float32).reshape(ROWS, COLS)
    out[f"{name}.raw"] = np.ascontiguousarray(raw)
    out[f"{name}.f32"] = np.ascontiguousarray(deq)
out["x"] = rng.standard_normal((70, COLS)).astype(np.float32)  # 70 input rows (tokens)
save_file(out, "tests/data/quant-vectors.safetensors")
print("wrote tests/data/quant-vectors.safetensors")
