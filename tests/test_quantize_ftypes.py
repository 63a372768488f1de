"""llama-quantize's IQ, TQ and MXFP4 file types and the options of issue 22 (--tensor-type-file, COPY,
--include-weights/--exclude-weights, --prune-layers), apart from the whole files (those are
tests/test_quantize_imatrix.py's, stories260K against llama-quantize's, and
tests/test_quantize_smollm2.py's where SmolLM2 is at hand): the ids, the rules' branches a small
model's metadata cannot reach in type-tables.json (8 experts, MXFP4_MOE's experts), the refusal
without an importance matrix, the tensor type file's reader, layer pruning's renumbering."""

from __future__ import annotations

import os

import gguf
import numpy as np
import pytest
from conftest import fails, write_gguf

from ggtool import quantize_model as QM
from ggtool import types as T
from ggtool.imatrix import Imatrix

G = T.GGMLType

# enum llama_ftype (llama.h) and llama_ftype_get_default_type, for the file types added with the registry
IDS = {"IQ2_XXS": (19, "iq2_xxs"), "IQ2_XS": (20, "iq2_xs"), "IQ3_XS": (22, "iq3_s"), "IQ3_XXS": (23, "iq3_xxs"),
       "IQ1_S": (24, "iq1_s"), "IQ3_S": (26, "iq3_s"), "IQ3_M": (27, "iq3_s"), "IQ2_S": (28, "iq2_xs"),
       "IQ2_M": (29, "iq2_s"), "IQ4_XS": (30, "iq4_xs"), "IQ1_M": (31, "iq1_m"), "TQ1_0": (36, "tq1_0"),
       "TQ2_0": (37, "tq2_0"), "MXFP4_MOE": (38, "mxfp4")}


def test_ids_and_default_types_are_llama_cpps():
    got = {f.name: (f.id, T.type_name(f.default)) for f in QM.FILE_TYPES if f.name in IDS}
    assert got == IDS
    assert QM.file_type("iq2_xxs").name == "IQ2_XXS" and QM.file_type("mxfp4_moe").id == 38
    assert QM.file_type("copy").copy and not QM.file_type("copy").quantized
    for t in (G.IQ1_S, G.IQ2_XXS, G.IQ3_S, G.IQ4_XS, G.TQ1_0, G.TQ2_0, G.MXFP4):
        assert t in QM.WRITABLE


def _choices(ftype: str, info: QM.ModelInfo, names: list[str], ne=(256, 256), has_imatrix=False) -> dict[str, str]:
    mix = QM.new_mix(QM.QuantizeOptions(type=ftype), info, names, has_imatrix=has_imatrix)
    return {n: T.type_name(mix.choose(n, ne if not isinstance(ne, dict) else ne[n], T.F16).type) for n in names}


LAYERS = [f"blk.{i}.{w}.weight" for i in range(8) for w in ("attn_k", "attn_output", "attn_q", "attn_v", "ffn_down",
                                                           "ffn_gate", "ffn_up")]
NAMES = ["output.weight", "token_embd.weight"] + LAYERS


def test_the_very_low_bit_chain():
    """IQ1_S ... IQ2_M: their own chain (before the 70B and 8-expert rules of the others)."""
    plain = QM.ModelInfo("llama", 8, 8, 8)                  # n_gqa 1, no experts
    c = _choices("IQ2_XXS", plain, NAMES)
    assert c["output.weight"] == "q5_K" and c["token_embd.weight"] == "q2_K"
    assert c["blk.0.attn_v.weight"] == "q2_K" and c["blk.0.ffn_down.weight"] == "q2_K"   # 0 < 8/8
    assert c["blk.1.ffn_down.weight"] == "iq2_xxs" and c["blk.0.attn_output.weight"] == "iq2_xxs"
    c = _choices("IQ2_M", plain, NAMES)
    assert c["blk.0.attn_v.weight"] == "iq3_s" and c["blk.3.attn_output.weight"] == "iq3_s"
    assert c["token_embd.weight"] == "iq3_s" and c["blk.5.ffn_up.weight"] == "iq2_s"
    assert _choices("IQ1_M", plain, NAMES)["blk.2.attn_output.weight"] == "iq2_xxs"
    gqa8 = QM.ModelInfo("llama", 8, 32, 4, n_expert=8)      # n_gqa 8 and 8 experts
    c = _choices("IQ1_S", gqa8, NAMES)
    assert c["blk.0.attn_v.weight"] == "q4_K" and c["blk.0.attn_k.weight"] == "q4_K"
    assert c["blk.0.attn_output.weight"] == "q5_K"          # not the others' q8_0 for 8 experts


def test_iq3_and_iq4_rules_with_experts_and_importances():
    e8 = QM.ModelInfo("llama", 8, 8, 8, n_expert=8)
    c = _choices("IQ3_XXS", e8, NAMES)
    assert c["blk.0.attn_v.weight"] == "q8_0" and c["blk.0.attn_k.weight"] == "q8_0"
    assert c["blk.0.attn_output.weight"] == "q5_K" and c["blk.0.attn_q.weight"] == "iq2_s"
    plain = QM.ModelInfo("llama", 8, 8, 8)
    no_im, im = _choices("IQ3_XXS", plain, NAMES), _choices("IQ3_XXS", plain, NAMES, has_imatrix=True)
    assert (no_im["blk.0.attn_v.weight"], im["blk.0.attn_v.weight"]) == ("iq3_s", "iq3_xxs")
    assert (no_im["blk.0.ffn_down.weight"], no_im["blk.4.ffn_down.weight"]) == ("q4_K", "q3_K")
    assert im["blk.4.ffn_down.weight"] == "iq3_xxs"
    c = _choices("IQ3_XS", plain, NAMES)
    assert [c[f"blk.{i}.ffn_up.weight"] for i in range(8)] == ["iq3_s"] + ["iq3_xxs"] * 6 + ["iq3_s"]
    assert c["blk.0.attn_k.weight"] == "iq3_xxs" and c["blk.0.attn_q.weight"] == "iq3_xxs"
    c = _choices("IQ3_M", e8, NAMES)
    assert [c[f"blk.{i}.ffn_down.weight"] for i in range(8)] == ["q4_K", "iq3_s", "iq3_s", "q4_K", "iq3_s", "iq3_s",
                                                                    "q4_K", "q4_K"]   # use_more_bits, 8 experts
    assert _choices("IQ4_XS", plain, NAMES)["blk.0.ffn_down.weight"] == "q5_K"
    assert _choices("IQ4_XS", plain, NAMES, has_imatrix=True)["blk.0.ffn_down.weight"] == "iq4_xs"
    assert _choices("TQ2_0", plain, NAMES)["token_embd.weight"] == "q4_K"


def test_mxfp4_moe_gives_the_experts_mxfp4_and_the_rest_q8_0():
    moe = QM.ModelInfo("gpt-oss", 2, 8, 8, n_expert=4)
    names = ["output.weight", "token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_up_exps.weight",
             "blk.0.ffn_down_exps.weight"]
    ne = {n: (256, 256, 4) if "exps" in n else (256, 256) for n in names}
    c = _choices("MXFP4_MOE", moe, names, ne)
    assert c == {"output.weight": "q8_0", "token_embd.weight": "q8_0", "blk.0.attn_q.weight": "q8_0",
                 "blk.0.ffn_up_exps.weight": "mxfp4", "blk.0.ffn_down_exps.weight": "mxfp4"}
    # bailingmoe3: a 3-d tensor that is not an expert's ffn is q8_0
    c = _choices("MXFP4_MOE", QM.ModelInfo("bailingmoe3", 2, 8, 8, n_expert=4), ["blk.0.attn_kv_b.weight"],
                 {"blk.0.attn_kv_b.weight": (256, 256, 4)})
    assert c == {"blk.0.attn_kv_b.weight": "q8_0"}


def _model(tmp_path, cols=256, layers=8, kv=None):
    rng = np.random.default_rng(1)
    ts = {"token_embd.weight": rng.standard_normal((32, cols)).astype(np.float32)}
    for i in range(layers):
        ts[f"blk.{i}.ffn_down.weight"] = rng.standard_normal((8, cols)).astype(np.float32)
        ts[f"blk.{i}.attn_q.weight"] = rng.standard_normal((8, cols)).astype(np.float32)
    return write_gguf(tmp_path / "m.gguf", ts, arch="llama", kv={"llama.block_count": layers, **(kv or {})}), ts


@pytest.mark.parametrize("ftype, first, t", [
    ("IQ1_S", "blk.0.attn_q.weight", "iq1_s"), ("IQ1_M", "blk.0.attn_q.weight", "iq1_m"),
    ("IQ2_XXS", "blk.0.attn_q.weight", "iq2_xxs"), ("IQ2_XS", "blk.0.attn_q.weight", "iq2_xs"),
    ("IQ2_S", "blk.0.attn_q.weight", "iq2_xs"), ("IQ2_M", "blk.0.attn_q.weight", "iq2_s"),
    ("IQ3_XXS", "blk.0.attn_q.weight", "iq2_s"), ("Q2_K_S", "blk.0.attn_q.weight", "q2_K")])
def test_refused_without_an_importance_matrix(run, tmp_path, ftype, first, t):
    """llama.cpp's tensor_requires_imatrix: one line naming the file type, the tensor and --imatrix;
    exit 1; no output file."""
    src, _ = _model(tmp_path)
    out = tmp_path / "q.gguf"
    r = run("quantize", src, out, "--type", ftype.lower())
    assert r.exit_code == 1 and not out.exists()
    assert r.stderr.splitlines() == [f"Error: file type {ftype} needs an importance matrix: tensor '{first}' ({t}) "
                                     "would be garbage without one (llama.cpp refuses it); give one with --imatrix "
                                     "FILE (made by ggtool imatrix or llama-imatrix)"]
    assert not list(tmp_path.glob("*.tmp*"))


def test_iq_file_types_that_need_no_importance_matrix(run, tmp_path):
    src, _ = _model(tmp_path, layers=2)
    for ftype in ("IQ3_S", "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4_MOE"):
        out = tmp_path / f"{ftype}.gguf"
        r = run("quantize", src, out, "--type", ftype, "-q")
        assert r.exit_code == 0, r.output
        f = gguf.GGUFReader(str(out))
        assert int(f.fields["general.file_type"].contents()) == QM.file_type(ftype).id


# ------------------------------------------------------------------------------ --tensor-type-file

def test_tensor_type_file_is_read_as_llama_quantize_reads_it(run, tmp_path):
    p = tmp_path / "types.txt"
    p.write_text("FFN_DOWN=q8_0   attn_q=IQ4_XS\n\n  blk\\.1\\.=q2_K\n")
    rules = QM.read_tensor_type_file(p)
    assert [(r.pattern, T.type_name(r.type)) for r in rules] == [("ffn_down", "q8_0"), ("attn_q", "iq4_xs"),
                                                                 ("blk\\.1\\.", "q2_K")]
    assert QM.read_tensor_type_file(_empty(tmp_path)) == []
    src, _ = _model(tmp_path, layers=2)
    r = run("quantize", src, tmp_path / "q.gguf", "--type", "q4_k_m", "--tensor-type", "attn_q=q5_0",
            "--tensor-type-file", p, "--dry-run", "--json")
    import json
    types = {t["name"]: t["type"] for t in json.loads(r.stdout)["tensors"]}
    # --tensor-type's rules first, then the file's, the first match winning
    assert types["blk.0.ffn_down.weight"] == "q8_0" and types["blk.1.attn_q.weight"] == "q5_0"


def _empty(tmp_path):
    p = tmp_path / "empty.txt"
    p.write_text("")
    return p


@pytest.mark.parametrize("content, where, reason", [
    ("ffn_down=q8_0\nattn_q\n", ":2: 'attn_q'", "expected PATTERN=TYPE"),
    ("ffn_down=q8_0 attn_q=q9_9\n", ":1: 'attn_q=q9_9'", "cannot write tensor type 'q9_9'"),
    ("=q8_0\n", ":1:", "expected PATTERN=TYPE"),
    ("(=q8_0\n", ":1: '(=q8_0'", ""),
])
def test_tensor_type_file_bad_words(run, tmp_path, content, where, reason):
    p = tmp_path / "types.txt"
    p.write_text(content)
    with pytest.raises(QM.TensorTypeFileError) as e:
        QM.read_tensor_type_file(p)
    assert e.value.path == str(p) and e.value.line is not None
    src, _ = _model(tmp_path, layers=1)
    fails(run("quantize", src, tmp_path / "q.gguf", "--tensor-type-file", p), f"--tensor-type-file': {p}{where}",
          reason, code=2)
    assert not (tmp_path / "q.gguf").exists()


def test_tensor_type_file_missing_special_huge_or_not_text(run, tmp_path):
    src, _ = _model(tmp_path, layers=1)
    missing = tmp_path / "nope.txt"
    fails(run("quantize", src, tmp_path / "q.gguf", "--tensor-type-file", missing),
          f"{missing}: No such file or directory", code=2)
    huge = tmp_path / "huge.txt"
    with open(huge, "wb") as f:                 # sparse: 2 MiB of zeros, nothing written
        f.truncate(2 << 20)
    fails(run("quantize", src, tmp_path / "q.gguf", "--tensor-type-file", huge), "2,097,152 bytes, over the 1,048,576",
          code=2)
    fails(run("quantize", src, tmp_path / "q.gguf", "--tensor-type-file", tmp_path), "not a regular file", code=2)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)                             # would block a reader: refused before it is opened
    fails(run("quantize", src, tmp_path / "q.gguf", "--tensor-type-file", fifo), "not a regular file", code=2)
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"ffn_down=q8_0\nattn_q=q4_0 \xe9\n")
    fails(run("quantize", src, tmp_path / "q.gguf", "--tensor-type-file", bad), f"{bad}:2: not UTF-8 text", code=2)
    assert not (tmp_path / "q.gguf").exists()


def test_tensor_type_file_through_a_symlink(run, tmp_path):
    real = tmp_path / "real.txt"
    real.write_text("ffn_down=q8_0\n")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    assert [r.pattern for r in QM.read_tensor_type_file(link)] == ["ffn_down"]
    dangling = tmp_path / "dangling.txt"
    dangling.symlink_to(tmp_path / "gone.txt")
    src, _ = _model(tmp_path, layers=1)
    fails(run("quantize", src, tmp_path / "q.gguf", "--tensor-type-file", dangling), "No such file or directory", code=2)


# ------------------------------------------------------------------------------------------ COPY

def test_copy_copies_every_tensor_and_keeps_the_file_type(run, tmp_path):
    rng = np.random.default_rng(2)
    q = QM.convert_rows(rng.standard_normal((4, 64)).astype(np.float32), T.F32, T.Q8_0, "w", (4, 64), 0)
    ts = {"blk.0.attn_q.weight": (np.frombuffer(q, np.uint8).reshape(4, -1), gguf.GGMLQuantizationType.Q8_0),
          "blk.0.ffn_down.weight": (np.frombuffer(q, np.uint8).reshape(4, -1), gguf.GGMLQuantizationType.Q8_0),
          "blk.0.attn_norm.weight": rng.standard_normal(64).astype(np.float32)}
    src = write_gguf(tmp_path / "m.gguf", ts, arch="llama", kv={"llama.block_count": 1, "general.file_type": 7})
    out = tmp_path / "c.gguf"
    r = run("quantize", src, out, "--type", "COPY", "-q")       # quantized tensors: no --allow-requantize needed
    assert r.exit_code == 0, r.output
    f = gguf.GGUFReader(str(out))
    assert int(f.fields["general.file_type"].contents()) == 7
    assert {t.name: bytes(t.data.tobytes()) for t in f.tensors} == \
        {t.name: bytes(t.data.tobytes()) for t in gguf.GGUFReader(str(src)).tensors}
    # without general.file_type: llama.cpp's guess (the most common tensor type) | LLAMA_FTYPE_GUESSED
    src2 = write_gguf(tmp_path / "m2.gguf", ts, arch="llama", kv={"llama.block_count": 1})
    plan = QM.plan_quantization(src2, QM.QuantizeOptions(type="COPY"))
    assert plan.file_type_id == 7 | 1024 and all(t.copy for t in plan.tensors)
    assert QM.guessed_file_type([T.F32, T.F16, T.F32, T.F16]) == 0 | 1024      # the first to reach the most
    assert QM.guessed_file_type([G.IQ2_XXS]) == 19 | 1024 and QM.guessed_file_type([G.I32]) == 1024


# ------------------------------------------------------------------ --include/--exclude-weights

def test_include_and_exclude_weights_select_entries_by_substring(run, tmp_path):
    w = Imatrix("w", {"blk.0.attn_q.weight": np.ones(4, np.float32), "blk.1.ffn_down.weight": np.ones(4, np.float32),
                      "blk.10.attn_q.weight": np.ones(4, np.float32)})
    assert set(w.select(include=("attn",)).values) == {"blk.0.attn_q.weight", "blk.10.attn_q.weight"}
    assert set(w.select(exclude=("blk.1",)).values) == {"blk.0.attn_q.weight"}      # a substring: blk.10 too
    assert w.select(exclude=("blk",)) is None and w.select(include=("nothing",)) is None
    assert w.select(include=("blk.0.", "ffn")).metadata()["quantize.imatrix.entries_count"] == 2
    src, _ = _model(tmp_path, layers=1)
    fails(run("quantize", src, tmp_path / "q.gguf", "--include-weights", "a", "--exclude-weights", "b"),
          "cannot be given together", code=2)
    fails(run("quantize", src, tmp_path / "q.gguf", "--exclude-weights", "b"), "give one with --imatrix FILE", code=2)


# ------------------------------------------------------------------------------- --prune-layers

def test_prune_layers_renumbers_as_llama_cpp():
    names = ["output.weight"] + [f"blk.{i}.{w}.weight" for i in range(5) for w in ("attn_q", "ffn_up")]
    renamed, n = QM.prune_layers(names, (1, 3))
    assert n == 3 and renamed["output.weight"] == "output.weight"
    assert [renamed[f"blk.{i}.attn_q.weight"] for i in range(5)] == ["blk.0.attn_q.weight", None,
                                                                     "blk.1.attn_q.weight", None, "blk.2.attn_q.weight"]
    assert QM.prune_layers(names, (0,))[0]["blk.1.ffn_up.weight"] == "blk.0.ffn_up.weight"
    assert QM.prune_layers(names, (9,))[1] == 5         # no such layer: every one kept
    assert QM.parse_prune_layers("3,1,3") == (1, 3)
    for bad in ("", "1,,2", "-1", "1.5", "x"):
        with pytest.raises(QM.PruneLayersError):
            QM.parse_prune_layers(bad)


def test_prune_layers_writes_fewer_layers(run, tmp_path):
    src, ts = _model(tmp_path, cols=64, layers=4)
    out = tmp_path / "p.gguf"
    r = run("quantize", src, out, "--type", "q8_0", "--prune-layers", "1,2", "-q")
    assert r.exit_code == 0, r.output
    f = gguf.GGUFReader(str(out))
    assert sorted(t.name for t in f.tensors) == ["blk.0.attn_q.weight", "blk.0.ffn_down.weight", "blk.1.attn_q.weight",
                                                 "blk.1.ffn_down.weight", "token_embd.weight"]
    assert int(f.fields["llama.block_count"].contents()) == 2
    assert [k for k in f.fields if not k.startswith("GGUF.")][-1] == "llama.block_count"     # set last
    # blk.1 of the output is blk.3 of the input
    want = QM.convert_rows(ts["blk.3.attn_q.weight"], T.F32, T.Q8_0, "w", (8, 64), 0)
    assert bytes({t.name: t for t in f.tensors}["blk.1.attn_q.weight"].data.tobytes()) == want
    fails(run("quantize", src, out, "--prune-layers", "1,a"), "invalid layer number 'a'", code=2)
