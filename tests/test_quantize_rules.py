"""quantize_model's rules use the core's type traits (block sizes, ggml_n_dims, row sizes) and
speak no CLI: the fallback follows each type's block size, as llama.cpp's tensor_type_fallback."""

from __future__ import annotations

from pathlib import Path

import pytest

from ggtool import quantize_model as QM
from ggtool import types as T

ROOT = Path(__file__).resolve().parent.parent
G = T.GGMLType


@pytest.mark.parametrize("ne0, want", [(4096, T.Q8_0), (4096 + 32, T.Q8_0), (4096 + 16, T.F16)])
def test_fallback_follows_the_block_size(ne0, want):
    # q8_0 needs rows of 32k: a row of 4096+16 falls back to f16 (no block type has an entry for it)
    o = QM.QuantizeOptions(type=T.Q8_0)
    assert QM.choose_type("blk.0.attn_q.weight", (ne0, 8), T.F32, o, has_output=True)[0] == want


def test_output_q6_k_falls_back_by_its_256_block():
    o = QM.QuantizeOptions()
    # a row of 256k: llama.cpp writes q6_K (ggtool: q8_0 and a warning); of 32k but not 256k: q8_0
    t, warn = QM.choose_type("output.weight", (512, 8), T.F32, o, has_output=True)
    assert t == T.Q8_0 and warn and "q6_K" in warn
    t, warn = QM.choose_type("output.weight", (288, 8), T.F32, o, has_output=True)
    assert t == T.Q8_0 and warn is None
    # a row that no 32-block divides: f16
    assert QM.choose_type("output.weight", (300, 8), T.F32, o, has_output=True)[0] == T.F16


def test_n_dims_is_ggml_n_dims():
    o = QM.QuantizeOptions(pure=True)
    assert QM.choose_type("blk.0.w.weight", (64, 1, 1, 1), T.F32, o, has_output=True)[0] == T.F32
    assert QM.choose_type("blk.0.w.weight", (64, 1, 2), T.F32, o, has_output=True)[0] == T.Q4_0
    # ggml_n_dims counts dimensions above 1: an empty [64, 0] tensor is 1-D to llama.cpp, so copied
    assert QM.choose_type("blk.0.w.weight", (64, 0), T.F32, o, has_output=True)[0] == T.F32
    assert T.n_dims((5,)) == 1 and T.n_dims((5, 1, 3, 1)) == 3 and T.n_dims((1, 1, 1, 1)) == 1


def test_tensor_bytes_is_row_size():
    assert QM.tensor_bytes(T.Q4_0, (64, 3)) == T.row_size(T.Q4_0, 64) * 3 == 108
    assert QM.tensor_bytes(T.F16, (5, 2)) == 20


def test_k_file_types_without_pure_are_refused_with_fields():
    with pytest.raises(QM.MixNotBuiltError) as e:
        QM.plan_quantization(ROOT / "fixtures" / "stories260K.gguf", QM.QuantizeOptions(type=G.Q5_K))
    assert e.value.type == G.Q5_K and "Q5_K_M" in str(e.value)
    plan = QM.plan_quantization(ROOT / "fixtures" / "stories260K.gguf", QM.QuantizeOptions(type=G.Q6_K, pure=True))
    # stories260K's rows (64, 172) are no multiple of 256: q6_K falls back to q8_0, then to f16
    assert {t.dst_type for t in plan.tensors if not t.copy} == {T.Q8_0, T.F16}


def test_target_type_error_has_fields_and_no_flag():
    with pytest.raises(QM.TargetTypeError) as e:
        QM.parse_target_type("q6_K")
    assert e.value.type == G.Q6_K and e.value.name == "q6_K" and "q6_K only in pure q6_K files" in str(e.value)
    with pytest.raises(QM.TargetTypeError) as e:
        QM.parse_target_type("nope")
    assert e.value.type is None and "q8_0" in e.value.choices
    with pytest.raises(QM.TargetTypeError):
        QM.plan_quantization(ROOT / "fixtures" / "stories260K.gguf", QM.QuantizeOptions(type=T.F16))
