"""GGML's ggml_validate_row_data (ggml-quants.c): whether data of a type holds a NaN or an
infinity where GGML refuses one, and where the first is.

llama.cpp refuses a model whose tensors fail it (the loader with check_tensors, llama-quantize
after each quantized chunk: "quantized data validation failed"). What is checked is the type's
layout: every value of f32, f64, f16 and bf16; every block's f16 scales (d, and m or dmin where the
block has one; the f16 scale IQ1_M assembles from the top bits of its 3-bit scales); Q8_K's f32 d;
MXFP4's E8M0 exponent (0xff is invalid). NVFP4's UE4M3 scales and the integer types have nothing
to check; a type ggml_validate_row_data does not know (Q8_1) is invalid, as there.

The check is numpy over byte columns (the high byte of each f16 field decides whether it is inf
or NaN), in chunks of CHUNK_BYTES, so a large tensor costs no large temporary: about 15 ms per
16 MB of f16 or f32 on one core, and far less per block of a quantized type.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import types as T

_G = T.GGMLType
CHUNK_BYTES = 16 << 20

# per block type: (byte offset, field name) of each f16 field checked (ggml-common.h's layouts)
F16_FIELDS: dict[T.GGMLType, tuple[tuple[int, str], ...]] = {
    _G.Q1_0: ((0, "d"),), _G.Q4_0: ((0, "d"),), _G.Q4_1: ((0, "d"), (2, "m")), _G.Q5_0: ((0, "d"),),
    _G.Q5_1: ((0, "d"), (2, "m")), _G.Q8_0: ((0, "d"),),
    _G.Q2_K: ((80, "d"), (82, "dmin")), _G.Q3_K: ((108, "d"),), _G.Q4_K: ((0, "d"), (2, "dmin")),
    _G.Q5_K: ((0, "d"), (2, "dmin")), _G.Q6_K: ((208, "d"),),
    _G.TQ1_0: ((52, "d"),), _G.TQ2_0: ((64, "d"),),
    _G.IQ1_S: ((0, "d"),), _G.IQ2_XXS: ((0, "d"),), _G.IQ2_XS: ((0, "d"),), _G.IQ2_S: ((0, "d"),),
    _G.IQ3_XXS: ((0, "d"),), _G.IQ3_S: ((0, "d"),), _G.IQ4_XS: ((0, "d"),), _G.IQ4_NL: ((0, "d"),),
}
_ELEMENTS = (_G.F32, _G.F64, _G.F16, _G.BF16)                   # every value checked
_UNCHECKED = (_G.I8, _G.I16, _G.I32, _G.I64, _G.NVFP4)          # nothing to check
_IQ1_M_SCALES = 48                                              # offset of block_iq1_m's scales[8]


@dataclass(frozen=True)
class InvalidData:
    """The first value GGML refuses: `index` of the block (of the element, for f32/f16/bf16/f64)
    in the data, `field` ("value", "d", "m", "dmin", "e"), `problem` ("NaN", "inf", "0xff", or
    "unknown type")."""

    index: int
    field: str
    problem: str


def validates(t: T.GGMLType) -> bool:
    """Whether ggml_validate_row_data knows type t (else it refuses any data of it)."""
    return t in F16_FIELDS or t in _ELEMENTS or t in _UNCHECKED or t in (_G.Q8_K, _G.IQ1_M, _G.MXFP4)


def validate_row_data(t: T.GGMLType, data) -> InvalidData | None:
    """None if GGML accepts `data` (bytes, or an array viewed as bytes) as values of type t, else
    where and what the first refused value is. `data` holds whole blocks."""
    raw = np.frombuffer(data, np.uint8) if isinstance(data, (bytes, bytearray, memoryview)) else \
        np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    if t in _UNCHECKED:
        return None
    if not validates(t):
        return InvalidData(0, "type", "unknown type")
    size = T.type_size(t)
    if raw.size % size:
        raise ValueError(f"{raw.size} bytes are not whole {T.type_name(t)} blocks of {size}")
    step = max(1, CHUNK_BYTES // size)
    n = raw.size // size
    for b0 in range(0, n, step):
        chunk = raw[b0 * size: min(n, b0 + step) * size].reshape(-1, size)
        found = _first_invalid(t, chunk)
        if found is not None:
            return InvalidData(b0 + found.index, found.field, found.problem)
    return None


def _f16_problem(bits: int) -> str:
    return "inf" if bits & 0x03FF == 0 else "NaN"


def _first_invalid(t: T.GGMLType, blocks: np.ndarray) -> InvalidData | None:
    """The first invalid value among `blocks` (uint8, one row per block or element). Each check is
    first a max over the magnitude bits (one vectorised pass, no boolean temporary: an f16 is inf
    or NaN exactly when its exponent bits are all ones, i.e. its high byte & 0x7F >= 0x7C); the
    position is looked for only in data that fails."""
    if t in F16_FIELDS:
        if all(int((blocks[:, off + 1] & 0x7F).max(initial=0)) < 0x7C for off, _ in F16_FIELDS[t]):
            return None
        bad = np.zeros(len(blocks), bool)
        for off, _ in F16_FIELDS[t]:
            bad |= (blocks[:, off + 1] & 0x7C) == 0x7C
        i = int(np.argmax(bad))
        for off, name in F16_FIELDS[t]:
            bits = int(blocks[i, off]) | int(blocks[i, off + 1]) << 8
            if bits & 0x7C00 == 0x7C00:
                return InvalidData(i, name, _f16_problem(bits))
    if t in (_G.F16, _G.BF16):
        bits = blocks.view(np.uint16).reshape(-1)
        top = 0x7C00 if t == _G.F16 else 0x7F80            # the exponent, all ones
        if int((bits & 0x7FFF).max(initial=0)) < top:
            return None
        i = int(np.argmax((bits & top) == top))
        inf = bits[i] & (0x03FF if t == _G.F16 else 0x007F) == 0
        return InvalidData(i, "value", "inf" if inf else "NaN")
    if t == _G.F32:
        return _first_nonfinite(blocks.view(np.float32).reshape(-1), "value")
    if t == _G.F64:
        return _first_nonfinite(blocks.view(np.float64).reshape(-1), "value")
    if t == _G.Q8_K:
        return _first_nonfinite(np.ascontiguousarray(blocks[:, :4]).view(np.float32).reshape(-1), "d")
    if t == _G.MXFP4:
        bad = blocks[:, 0] == 0xFF
        return InvalidData(int(np.argmax(bad)), "e", "0xff") if bad.any() else None
    if t == _G.IQ1_M:
        sc = np.ascontiguousarray(blocks[:, _IQ1_M_SCALES:_IQ1_M_SCALES + 8]).view(np.uint16)
        scale = (sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0x00F0) | ((sc[:, 2] >> 4) & 0x0F00) | (sc[:, 3] & 0xF000)
        bad = (scale & 0x7C00) == 0x7C00
        if not bad.any():
            return None
        i = int(np.argmax(bad))
        return InvalidData(i, "d", _f16_problem(int(scale[i])))
    return None


def _first_nonfinite(values: np.ndarray, field: str) -> InvalidData | None:
    with np.errstate(invalid="ignore", over="ignore"):
        if np.isfinite(values.sum(dtype=values.dtype)):     # inf and NaN propagate; a finite sum: none
            return None
    fin = np.isfinite(values)
    if fin.all():                                          # the sum overflowed: all finite
        return None
    i = int(np.argmin(fin))
    return InvalidData(i, field, "NaN" if np.isnan(values[i]) else "inf")
