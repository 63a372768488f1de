"""quantize_model's rules, apart from running them: the file types, llama.cpp's per-tensor type choice
(`Mix`, against the types llama-quantize itself chose for gemma-3-270m and SmolLM2-135M in every file
type: tests/golden/quantize/type-tables.json), the fallbacks by block size, the option parsers.
They use the core's type traits (block sizes, ggml_n_dims, row sizes) and speak no CLI."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from ggtool import quantize_model as QM
from ggtool import types as T
from ggtool.errors import QuantizationError
from ggtool.gguf_io import edit as E

ROOT = Path(__file__).resolve().parent.parent
TABLES = json.loads((ROOT / "tests" / "golden" / "quantize" / "type-tables.json").read_text())
G = T.GGMLType


def _options(case: str) -> tuple[QM.QuantizeOptions, bool]:
    """A case of type-tables.json ("Q4_K_M --tensor-type ffn_down=q8_0 ...") as options, and
    whether it was made with an importance matrix ("IQ3_XXS --imatrix")."""
    words = shlex.split(case.replace("\\", "\\\\"))
    kw, tensor_types, kv, imatrix = {"type": words[0]}, [], [], False
    it = iter(words[1:])
    for w in it:
        if w == "--imatrix":
            imatrix = True
        elif w in ("--pure", "--leave-output-tensor"):
            kw[w[2:].replace("-", "_")] = True
        elif w in ("--output-tensor-type", "--token-embedding-type"):
            kw[w[2:].replace("-", "_")] = QM.parse_target_type(next(it))
        elif w == "--tensor-type":
            tensor_types.append(QM.parse_tensor_type_override(next(it)))
        elif w == "--override-kv":
            kv.append(QM.parse_kv_override(next(it)))
        else:  # pragma: no cover - a case this reader does not know
            raise AssertionError(w)
    return QM.QuantizeOptions(**kw, tensor_types=tensor_types, kv_overrides=kv), imatrix


CASES = [(model, case) for model, m in TABLES.items() for case in m["tables"]]


@pytest.mark.parametrize("model, case", CASES, ids=[f"{m}-{c}" for m, c in CASES])
def test_types_are_llama_quantizes(model, case):
    """Every tensor's type, in llama.cpp's order, as llama-quantize --dry-run chose it: the mixes'
    counters (attn_v, ffn_down layers, use_more_bits), the tied embedding, gemma's 640-wide and
    SmolLM2's 576-wide rows falling back, and the options."""
    m = TABLES[model]
    opts, imatrix = _options(case)
    over = {o.key: o.value for o in opts.kv_overrides}
    info = QM.ModelInfo.from_metadata(lambda k, default: over.get(k, m["metadata"].get(k, default)))
    mix = QM.new_mix(opts, info, m["names"], has_imatrix=imatrix)
    got = [T.type_name(mix.choose(n, ne, T.parse_type(s)).type)
           for n, ne, s in zip(m["names"], m["ne"], m["src_types"].split())]
    want = m["tables"][case].split()
    assert [(n, g) for n, g, w in zip(m["names"], got, want) if g != w] == []
    assert len(got) == len(want)


def test_the_tables_cover_every_file_type():
    for m in TABLES.values():
        assert {f.name for f in QM.FILE_TYPES} <= set(m["tables"])


def test_file_types_names_ids_and_aliases():
    # llama.cpp's llama_ftype ids (general.file_type) and llama_ftype_get_default_type
    ids = {f.name: (f.id, T.type_name(f.default)) for f in QM.FILE_TYPES}
    assert ids["Q4_K_M"] == (15, "q4_K") and ids["Q3_K_S"] == (11, "q3_K") and ids["Q8_0"] == (7, "q8_0")
    assert ids["Q5_0"] == (8, "q5_0") and ids["BF16"] == (32, "bf16") and ids["F32"] == (0, "f32")
    assert QM.file_type("q4_k").name == "Q4_K_M" and QM.file_type("Q3_K").name == "Q3_K_M"
    assert QM.file_type(G.Q5_K).name == "Q5_K_M" and QM.file_type(T.F16).name == "F16"
    assert QM.QuantizeOptions(type="q5_k_s").type.id == 16
    with pytest.raises(QM.FileTypeError) as e:
        QM.file_type("Q4_K_X")
    assert e.value.name == "Q4_K_X" and "Q4_K_M" in e.value.choices and "--" not in str(e.value)


@pytest.mark.parametrize("t, ncols, want", [
    (G.Q4_K, 4096, G.Q4_K), (G.Q4_K, 640, G.Q5_0), (G.Q5_K, 576, G.Q5_1), (G.Q6_K, 576, T.Q8_0),
    (G.Q2_K, 576, T.Q4_0), (G.Q3_K, 640, T.Q4_0), (G.Q4_K, 100, T.F16), (T.Q8_0, 4096 + 16, T.F16),
    (T.Q4_0, 64, T.Q4_0)])
def test_fallback_follows_the_block_size(t, ncols, want):
    new, warn = QM.fallback("blk.0.attn_q.weight", t, ncols)
    assert new == want
    assert (warn is None) == (t == want)
    if warn:
        assert f"ncols {ncols:6d} not divisible by" in warn and warn.endswith(f"-> falling back to {T.type_name(want):>7s}")
        assert ("must use F16" in warn) == (want == T.F16)


def _one(name, ne, ftype="Q4_0", model=None, names=None, **kw):
    mix = QM.new_mix(QM.QuantizeOptions(type=ftype, **kw), model or QM.ModelInfo(), names or [name, "output.weight"])
    return mix.choose(name, ne, T.F32)


def test_which_tensors_are_quantized():
    assert _one("blk.0.w.weight", (64, 1, 1, 1), pure=True).type == T.F32     # ggml_n_dims 1
    assert _one("blk.0.w.weight", (64, 1, 2), pure=True).type == T.Q4_0
    assert _one("blk.0.w.weight", (64, 0), pure=True).type == T.F32            # empty: 1-D to llama.cpp
    for name in ("blk.0.ffn_norm.weight", "blk.0.ffn_gate_inp.weight", "blk.0.attn_q.bias", "position_embd.weight",
                 "v.blk.0.patch_embd.weight", "blk.0.ssm_conv1d.weight"):
        assert _one(name, (64, 64)).type == T.F32, name
    assert _one("output.weight", (64, 64), leave_output_tensor=True).type == T.F32
    assert T.n_dims((5,)) == 1 and T.n_dims((5, 1, 3, 1)) == 3 and T.n_dims((1, 1, 1, 1)) == 1


def test_output_rules_and_reasons():
    c = _one("output.weight", (512, 8))
    assert c.type == G.Q6_K and c.reasons == ("output",) and c.fallback is None
    assert _one("output.weight", (288, 8)).type == T.Q8_0          # rows of 32k, not of 256: q8_0
    assert _one("output.weight", (300, 8)).type == T.F16           # no 32-block divides it
    assert _one("output.weight", (512, 8), model=QM.ModelInfo(arch="falcon")).type == T.Q8_0
    assert _one("output.weight", (512, 8), ftype="Q8_0").type == T.Q8_0
    # tied: no output.weight, the embedding is the output
    assert _one("token_embd.weight", (512, 8), names=["token_embd.weight"]).type == G.Q6_K
    assert _one("token_embd.weight", (512, 8)).type == T.Q4_0
    assert _one("token_embd.weight", (512, 8), token_embedding_type=G.Q5_1).type == G.Q5_1


def test_eight_experts_and_70b():
    moe = QM.ModelInfo(arch="llama", n_layer=32, n_head=32, n_head_kv=8, n_expert=8)
    assert _one("blk.0.attn_v.weight", (4096, 1024), model=moe).type == T.Q8_0
    assert _one("blk.0.attn_k.weight", (4096, 1024), model=moe).type == T.Q8_0
    assert _one("blk.0.attn_output.weight", (4096, 4096), ftype="Q4_K_M", model=moe).type == G.Q5_K
    with pytest.raises(QuantizationError, match="failed to determine its layer"):
        _one("ffn_down.weight", (4096, 4096), ftype="Q4_K_M", model=moe)
    big = QM.ModelInfo(arch="llama", n_layer=80, n_head=64, n_head_kv=8)
    assert big.is_70b and big.n_gqa == 8
    assert _one("blk.2.attn_v.weight", (8192, 1024), ftype="Q4_K_S", model=big,
                names=[f"blk.{i}.attn_v.weight" for i in range(80)]).type == G.Q5_K


def test_glm5_next_keeps_its_attn_q_a_q8_0():
    glm = QM.ModelInfo(arch="glm5-next", n_layer=4)
    assert _one("blk.0.attn_q_a.weight", (512, 64), ftype="Q4_K_M", model=glm).type == T.Q8_0
    assert _one("blk.0.attn_q_a.weight", (512, 64), ftype="Q4_K_M").type == G.Q4_K
    assert _one("blk.0.indexer.proj.weight", (512, 64), ftype="Q4_K_M", model=glm).type == T.F32   # never quantized


def test_tensor_type_overrides_first_match_wins_and_fall_back():
    tt = [QM.parse_tensor_type_override("FFN_(UP|DOWN)=q8_0"), QM.parse_tensor_type_override("ffn=q4_K")]
    assert tt[0].pattern == "ffn_(up|down)"          # lower-cased, as llama-quantize does
    c = _one("blk.0.ffn_up.weight", (64, 64), tensor_types=tt)
    assert c.type == T.Q8_0 and c.reasons == ("tensor type override 'ffn_(up|down)'",)
    c = _one("blk.0.ffn_gate.weight", (640, 64), tensor_types=tt)
    assert c.type == G.Q5_0 and c.fallback                       # q4_K, then its fallback
    for bad in ("ffn_up", "=q8_0", "x=", "x=nope", "(=q8_0"):
        with pytest.raises((QM.OverrideSyntaxError, QM.TargetTypeError)):
            QM.parse_tensor_type_override(bad)


def test_kv_overrides_parse_and_write_as_llama_cpp():
    o = QM.parse_kv_override("general.name=str:tiny")
    assert (o.key, o.tag, o.value) == ("general.name", "str", "tiny")
    assert QM.parse_kv_override("a.b=int:-7").raw()[-8:] == (4).to_bytes(4, "little") + (7).to_bytes(4, "little")
    assert QM.parse_kv_override("a.b=bool:true").value is True
    assert QM.parse_kv_override("a.b=float:0.5").value == 0.5
    for bad in ("a.b", "a.b=int", "a.b=i32:3", "a.b=bool:yes", "a.b=int:x", "k=str:" + "x" * 128):
        with pytest.raises(QM.OverrideSyntaxError) as e:
            QM.parse_kv_override(bad)
        assert e.value.text == bad and e.value.what == "kv"
    with pytest.raises(E.MetadataEditError) as e:      # a value its type cannot hold: set-metadata's words
        QM.parse_kv_override("a.b=float:inf")
    assert (e.value.key, e.value.reason) == ("a.b", "value")


def test_tensor_bytes_is_row_size():
    assert QM.tensor_bytes(T.Q4_0, (64, 3)) == T.row_size(T.Q4_0, 64) * 3 == 108
    assert QM.tensor_bytes(T.F16, (5, 2)) == 20


def test_plan_of_a_k_mix_says_why():
    plan = QM.plan_quantization(ROOT / "fixtures" / "stories260K.gguf", QM.QuantizeOptions(type="Q4_K_M"))
    by = {t.name: t for t in plan.tensors}
    # stories260K's rows (64, 172) are no multiple of 256: q4_K falls back to q5_0, ffn_down to f16
    assert by["blk.0.attn_q.weight"].dst_type == G.Q5_0 and "q5_0" in by["blk.0.attn_q.weight"].fallback
    assert by["blk.0.ffn_down.weight"].dst_type == T.F16
    assert by["blk.0.attn_v.weight"].reasons == () and by["blk.0.attn_v.weight"].dst_type == G.Q5_0
    assert by["blk.4.attn_v.weight"].reasons == ("attn_v: use_more_bits(4, 5)",)    # q6_K, then q8_0
    assert by["blk.4.attn_v.weight"].dst_type == T.Q8_0
    assert plan.n_fallback == sum(t.fallback is not None for t in plan.tensors) > 0
    assert plan.kv[-1][0] == "general.file_type"


def test_target_type_error_has_fields_and_no_flag():
    assert QM.parse_target_type("q6_K") == G.Q6_K and QM.parse_target_type("Q5_1") == G.Q5_1
    assert QM.parse_target_type("iq2_xxs") == G.IQ2_XXS and QM.parse_target_type("MXFP4") == G.MXFP4
    with pytest.raises(QM.TargetTypeError) as e:
        QM.parse_target_type("q8_1")
    assert e.value.type == G.Q8_1 and "q8_0" in e.value.choices and "--" not in str(e.value)
    with pytest.raises(QM.TargetTypeError) as e:
        QM.parse_target_type("nope")
    assert e.value.type is None
