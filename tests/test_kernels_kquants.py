"""The compiled Q5_0 / Q4_K / Q6_K dequantizers equal gguf-py's float32 arithmetic bit for bit."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from ggtool import quant as Q
from ggtool import types as T
from ggtool.errors import QuantizationError

CASES = {"q5_0": (22, 32), "q4_K": (144, 256), "q6_K": (210, 256)}


def _blocks(t: str, n: int, seed: int, finite: bool) -> np.ndarray:
    """n random blocks; with `finite`, every fp16 scale is a small normal number."""
    nbytes, _ = CASES[t]
    b = np.random.default_rng(seed).integers(0, 256, (n, nbytes), dtype=np.uint8)
    if finite:
        scale_at = {"q5_0": [0], "q4_K": [0, 2], "q6_K": [208]}[t]
        for o in scale_at:
            b[:, o + 1] = b[:, o + 1] % 0x20 + 0x08            # exponent 2..9, either sign: normal
    return b


@pytest.mark.parametrize("t", CASES)
@pytest.mark.parametrize("finite", [True, False], ids=["scales", "any-bits"])
def test_dequantize_is_gguf_py_bit_for_bit(t, finite):
    blocks = _blocks(t, 3000, len(t), finite)
    got = Q.dequantize(blocks.reshape(3, -1), t)
    with np.errstate(all="ignore"):
        want = gguf.quants.dequantize(blocks.reshape(3, -1), T.parse_type(t))
    assert got.shape == want.shape == (3, 1000 * CASES[t][1])
    assert got.view(np.uint32).tobytes() == np.asarray(want, np.float32).view(np.uint32).tobytes()


@pytest.mark.parametrize("t", CASES)
def test_dequantize_bad_row_length_is_one_clear_error(t):
    with pytest.raises(QuantizationError, match=f"{CASES[t][0]}-byte block"):
        Q.dequantize(np.zeros((2, CASES[t][0] + 1), np.uint8), t)
