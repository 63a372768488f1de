"""`quantize --target-bpw/--target-size`: a mix of tensor types chosen by measured error for a size
(ggtool.quantize_model.target): the size kept, the error minimised, the rules recorded and
reproducing the file, and every bad target one line."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import fails, write_gguf

from ggtool import quantize_model as QM
from ggtool import types as T
from ggtool.imatrix import Imatrix, read_imatrix
from ggtool.quantize_model import target as TG
from ggtool.qtypes import REGISTRY

ROOT = Path(__file__).resolve().parent.parent
STORIES = ROOT / "fixtures" / "stories260K.gguf"
IMATRIX = ROOT / "tests" / "golden" / "imatrix" / "stories260K-imatrix.gguf"
_G = T.GGMLType


@pytest.mark.parametrize("bpw, size, fragment", [
    ("nan", None, "finite number above 0"), ("inf", None, "finite number above 0"), ("-1", None, "above 0"),
    ("0", None, "above 0"), ("abc", None, "not a number"), (None, "10x", "expected bytes"),
    (None, "0", "above 0 bytes"), (None, "-5M", "expected bytes"), ("4", "1M", "exactly one"), (None, None, "exactly one")])
def test_bad_targets_are_refused(bpw, size, fragment):
    with pytest.raises(QM.TargetSizeError, match=fragment):
        QM.parse_target(bpw, size)


def test_sizes_read_with_their_suffixes():
    assert QM.parse_target(size="1.5MiB").size == 1572864
    assert QM.parse_target(size="2M").size == 2_000_000
    assert QM.parse_target(size="123").size == 123
    t = QM.parse_target(bpw="4.5")
    assert t.max_bytes(1000) == 562          # floor(4.5 * 1000 / 8)


def _sens(name, pts):
    return QM.TensorSensitivity(name, (256, 1), [TG.Option(_G.Q4_K, b, e) for b, e in pts], True)


def test_allocation_keeps_the_budget_and_is_the_best_on_a_small_case():
    rng = np.random.default_rng(3)
    sens = []
    for k in range(4):
        sizes = np.sort(rng.integers(10, 100, 4))
        errs = np.sort(rng.random(4))[::-1]
        sens.append(_sens(f"t{k}", list(zip(sizes.tolist(), errs.tolist()))))
    for budget in range(40, 400, 7):
        got = QM.allocate(sens, budget)
        best = min((sum(o.error for o in c) for c in itertools.product(*(s.options for s in sens))
                    if sum(o.bytes for o in c) <= budget), default=None)
        if best is None:
            assert got is None
            continue
        assert sum(o.bytes for o in got.values()) <= budget
        # the greedy on convex hulls is within the error of one step of the optimum; here exact or close
        assert sum(o.error for o in got.values()) <= best * 1.5 + 1e-12
    assert QM.allocate(sens, 10 ** 6) == {s.name: min(s.options, key=lambda o: o.error) for s in sens}


def test_the_largest_error_removed_per_byte_is_taken_first():
    a = _sens("a", [(10, 1.0), (20, 0.5)])      # 0.05 per byte
    b = _sens("b", [(10, 1.0), (20, 0.1)])      # 0.09 per byte
    got = QM.allocate([a, b], 30)
    assert (got["a"].bytes, got["b"].bytes) == (10, 20)


def test_weighted_error_weights_the_columns():
    x = np.array([[1.0, 1.0]], np.float32)
    q = np.array([[0.0, 1.0]], np.float32)
    assert TG.weighted_error(x, q, None) == 0.5
    assert TG.weighted_error(x, q, np.array([3.0, 1.0], np.float32)) == 0.75
    assert TG.weighted_error(np.zeros((1, 2), np.float32), q, None) == 0.0


def _model(tmp_path, layers=4):
    rng = np.random.default_rng(7)
    ts = {"token_embd.weight": rng.standard_normal((64, 256)).astype(np.float32),
          "output.weight": rng.standard_normal((64, 256)).astype(np.float32)}
    for i in range(layers):
        ts[f"blk.{i}.attn_q.weight"] = rng.standard_normal((64, 256)).astype(np.float32)
        ts[f"blk.{i}.ffn_down.weight"] = (rng.standard_normal((64, 256)) * (10.0 if i == 0 else 1.0)).astype(np.float32)
    return write_gguf(tmp_path / "m.gguf", ts, arch="llama", kv={"llama.block_count": layers}), ts


def test_the_mix_is_no_worse_than_any_single_type_of_its_size(tmp_path):
    src, ts = _model(tmp_path)
    w = Imatrix("w", {n: np.linspace(0.1, 4.0, 256, dtype=np.float32) for n in ts})
    opts = QM.QuantizeOptions(imatrix=w)
    mix = QM.plan_for_target(src, opts, QM.parse_target(bpw=4.0))
    n = mix.plan.n_elements
    assert mix.file_bytes <= math.floor(4.0 * n / 8)
    assert len(set(mix.types.values())) > 1                     # a mix, not one type
    for t in QM.CANDIDATES:                                      # every uniform choice that fits is no better
        if sum(next(o.bytes for o in s.options if o.type == t) for s in mix.sensitivities) <= \
                sum(mix.plan.tensors[i].dst_bytes for i in range(len(mix.plan.tensors))):
            uniform = sum(next(o.error for o in s.options if o.type == t) for s in mix.sensitivities)
            assert mix.predicted_error <= uniform + 1e-12, t
    # more room, less error; the error measured is the error the file has
    big = QM.plan_for_target(src, opts, QM.parse_target(bpw=6.0))
    assert big.predicted_error < mix.predicted_error and big.file_bytes > mix.file_bytes


def test_the_file_keeps_the_size_and_records_rules_that_reproduce_it(run, tmp_path):
    out, again = tmp_path / "mix.gguf", tmp_path / "again.gguf"
    r = run("quantize", STORIES, out, "--target-bpw", "8.5", "--imatrix", IMATRIX, "-q")
    assert r.exit_code == 0, r.output
    reader = gguf.GGUFReader(str(out))
    n = sum(int(t.n_elements) for t in reader.tensors)
    assert out.stat().st_size <= math.floor(8.5 * n / 8)
    field = reader.fields[QM.RECORD_KEY]
    rules = [bytes(field.parts[i]).decode() for i in field.data]
    assert rules and all("=" in x for x in rules)
    ftype = reader.fields["general.file_type"].contents()
    name = next(f.name for f in QM.FILE_TYPES if f.id == ftype)
    args = [a for x in rules for a in ("--tensor-type", x)]
    r = run("quantize", STORIES, again, "--type", name, "--imatrix", IMATRIX, *args, "-q")
    assert r.exit_code == 0, r.output
    b = gguf.GGUFReader(str(again))
    assert {t.name: (t.tensor_type, t.data.tobytes()) for t in reader.tensors} == \
        {t.name: (t.tensor_type, t.data.tobytes()) for t in b.tensors}
    assert QM.RECORD_KEY not in b.fields          # only a size target records its rules
    dry = run("quantize", STORIES, tmp_path / "d.gguf", "--target-bpw", "8.5", "--imatrix", IMATRIX, "--dry-run", "-q")
    assert [x.removeprefix("tensor-type ") for x in dry.stdout.splitlines() if x.startswith("tensor-type ")] == rules


def test_a_target_below_the_smallest_mix_is_one_line_and_no_file(run, tmp_path):
    out = tmp_path / "o.gguf"
    err = fails(run("quantize", STORIES, out, "--target-bpw", "2"), "--target-bpw 2: the smallest mix of",
                "bits per weight), above the target of")
    assert not out.exists() and len(err.splitlines()) == 1
    fails(run("quantize", STORIES, out, "--target-size", "100K"), "--target-size 100K: the smallest mix")
    assert not out.exists()


@pytest.mark.parametrize("args, fragment", [
    (["--target-bpw", "nan"], "--target-bpw nan: bits per weight must be a finite number above 0"),
    (["--target-bpw", "inf"], "--target-bpw inf: bits per weight must be"),
    (["--target-bpw", "1e400"], "--target-bpw 1e400: bits per weight must be"),
    (["--target-bpw", "-1"], "--target-bpw -1: bits per weight must be"),
    (["--target-bpw", ""], "--target-bpw : not a number"),
    (["--target-bpw", "4.5bits"], "--target-bpw 4.5bits: not a number"),
    (["--target-size", "1e3"], "--target-size 1e3: expected bytes"),
    (["--target-size", "-5M"], "--target-size -5M: expected bytes"),
    (["--target-size", "0K"], "--target-size 0K: the size must be above 0 bytes"),
    (["--target-bpw", "4", "--target-size", "1M"], "--target-bpw and --target-size: give one of them, not both")])
def test_a_target_no_model_could_meet_is_a_usage_error(run, tmp_path, args, fragment):
    out = tmp_path / "o.gguf"
    err = fails(run("quantize", STORIES, out, *args), fragment, code=2)
    assert "Traceback" not in err and not out.exists()


def test_the_engine_names_no_flag_and_the_command_line_does():
    """TargetSizeError's str() is the engine's words; wording.py gives the flag and the value as typed."""
    from ggtool.commands.wording import cli_message

    for bpw, size, flag in (("nan", None, "--target-bpw nan: "), (None, "12Q", "--target-size 12Q: ")):
        with pytest.raises(QM.TargetSizeError) as e:
            QM.parse_target(bpw, size)
        assert "--" not in str(e.value)
        assert cli_message(e.value).startswith(flag)


def test_a_huge_target_gives_each_tensor_its_least_error_type(tmp_path):
    src, _ = _model(tmp_path, layers=1)
    mix = QM.plan_for_target(src, QM.QuantizeOptions(), QM.parse_target(bpw="1e30"))
    for s in mix.sensitivities:
        assert mix.types[s.name] == min(s.options, key=lambda o: (o.error, o.bytes)).type
    assert QM.parse_target(size="999999G").max_bytes(1) == 999999 * 1000 ** 3


def test_an_existing_output_is_refused_before_anything_is_measured(run, tmp_path):
    src, _ = _model(tmp_path, layers=1)
    out = tmp_path / "o.gguf"
    out.write_bytes(b"keep me")
    with pytest.raises(QM.OutputPathError):
        QM.plan_for_target(src, QM.QuantizeOptions(), QM.parse_target(bpw=8), output_path=str(out),
                           on_tensor=lambda *a: pytest.fail("measured"))
    fails(run("quantize", src, out, "--target-bpw", "8"), "exists", "--force")
    assert out.read_bytes() == b"keep me"
    assert QM.plan_for_target(src, QM.QuantizeOptions(), QM.parse_target(bpw=8), output_path=str(out),
                              force=True).file_bytes > 0


def test_a_quantized_input_is_one_line_naming_allow_requantize(run, tmp_path):
    src, _ = _model(tmp_path, layers=1)
    q, out = tmp_path / "q.gguf", tmp_path / "o.gguf"
    QM.quantize_file(src, q, QM.QuantizeOptions(type="Q8_0"))
    fails(run("quantize", q, out, "--target-bpw", "6"), "is already quantized (q8_0)", "--allow-requantize")
    assert not out.exists()
    r = run("quantize", q, out, "--target-bpw", "6", "--allow-requantize", "-q")
    assert r.exit_code == 0, r.output
    assert out.stat().st_size <= math.floor(6 * QM.plan_for_target(
        q, QM.QuantizeOptions(allow_requantize=True), QM.parse_target(bpw=6)).plan.n_elements / 8)


def test_a_plan_whose_offsets_are_wrong_writes_no_file(tmp_path):
    """The writer checks each tensor starts where the header says and the file's size is the plan's,
    before the temporary file is renamed: nothing is left behind."""
    src, _ = _model(tmp_path, layers=1)
    mix = QM.plan_for_target(src, QM.QuantizeOptions(), QM.parse_target(bpw=8))
    mix.plan.files[0].tensors[1].dst_offset += 32
    out = tmp_path / "o.gguf"
    before = set(tmp_path.iterdir())
    with pytest.raises(Exception, match="internal error"):
        QM.run_quantization(mix.plan, str(out))
    assert set(tmp_path.iterdir()) == before


def test_the_help_teaches_the_target_and_names_docs_that_exist(run):
    text = " ".join(run("quantize", "--help").stdout.split())
    for needed in ("--target-bpw B", "--target-size", "whole file", "docs/quantize.md", "--allow-requantize",
                   "smallest", "q8_0"):
        assert needed in text, needed
    names = ", ".join(T.type_name(t) for t in QM.CANDIDATES[:-1]) + f" and {T.type_name(QM.CANDIDATES[-1])}"
    assert names in text
    for doc in set(__import__("re").findall(r"docs/[\w-]+\.md", text)):
        assert (ROOT / doc).exists(), doc


@pytest.mark.parametrize("flag", [["--pure"], ["--type", "q4_0"], ["--tensor-type", "attn=q8_0"],
                                  ["--output-tensor-type", "q8_0"]])
def test_options_that_choose_types_conflict_with_a_target(run, tmp_path, flag):
    fails(run("quantize", STORIES, tmp_path / "o.gguf", "--target-bpw", "8", *flag), flag[0], code=2)


def test_an_npy_array_has_no_mix(run, tmp_path):
    p = tmp_path / "w.npy"
    np.save(p, np.ones((4, 256), np.float32))
    fails(run("quantize", p, tmp_path / "o.gguf", "--target-bpw", "8"), "needs a GGUF model")


def test_requantizing_is_refused_before_anything_is_measured(tmp_path):
    src, _ = _model(tmp_path, layers=1)
    q = tmp_path / "q.gguf"
    QM.quantize_file(src, q, QM.QuantizeOptions(type="Q8_0"))
    with pytest.raises(QM.RequantizeError):
        QM.plan_for_target(q, QM.QuantizeOptions(), QM.parse_target(bpw=6), on_tensor=lambda *a: pytest.fail("measured"))
    assert read_imatrix(IMATRIX).values            # the fixture the CLI tests use is there


def test_a_mix_is_named_by_the_file_type_of_its_main_type():
    """general.file_type names the type holding most weights, for every candidate (a mostly-IQ4_NL
    mix is IQ4_NL, not a default); F16/F32 tensors do not count."""
    for t in TG.CANDIDATES:
        name = TG._file_type_name({"a": t, "b": T.Q8_0, "c": T.F16}, {"a": 100, "b": 10, "c": 1000})
        assert next(f.default for f in QM.FILE_TYPES if f.name == name) == t, t
    assert TG._file_type_name({"a": T.GGMLType.IQ4_NL}, {"a": 1}) == "IQ4_NL"


def test_rules_keep_a_top_level_tensor_apart_from_layers_of_its_name():
    """A top-level tensor named as a layer's tail (`attn_q.weight` beside `blk.N.attn_q.weight`)
    gets its own anchored rule; the layers theirs."""
    rules = TG.rules_for({"attn_q.weight": T.Q8_0, "blk.0.attn_q.weight": T.Q8_0, "blk.1.attn_q.weight": T.Q4_0})
    assert sorted(rules) == sorted([r"^attn_q\.weight$=q8_0", r"^blk\.0\.attn_q\.weight$=q8_0",
                                    r"^blk\.1\.attn_q\.weight$=q4_0"])


# ------------------------------------------------------------------ the registry's types (issue 34)

_OLD = (_G.Q2_K, _G.Q3_K, T.Q4_0, _G.IQ4_NL, _G.Q4_1, _G.Q4_K, _G.Q5_0, _G.Q5_1, _G.Q5_K, _G.Q6_K, T.Q8_0)


def _needs(t):
    return t in REGISTRY and (REGISTRY[t].needs_imatrix or REGISTRY[t].ggml_requires_imatrix)


def test_the_candidates_are_the_registry_s_types_but_those_left_out():
    assert set(QM.CANDIDATES) == set(REGISTRY) - set(QM.LEFT_OUT)
    assert {T.Q4_0, T.Q8_0, T.GGMLType.Q4_K, T.GGMLType.Q6_K} <= set(QM.CANDIDATES)
    assert set(QM.LEFT_OUT) == {_G.TQ1_0, _G.TQ2_0, _G.MXFP4}          # ternary; MoE experts only
    assert all(t in QM.WRITABLE for t in QM.CANDIDATES)                 # llama-quantize's --tensor-type names
    bits = [T.row_size(t, T.block_size(t)) * 8 / T.block_size(t) for t in QM.CANDIDATES]
    assert bits == sorted(bits)
    plain = QM.candidate_types(imatrix=False)
    assert set(QM.CANDIDATES) - set(plain) == {t for t in QM.CANDIDATES if _needs(t)} == \
        {_G.IQ1_S, _G.IQ1_M, _G.IQ2_XXS, _G.IQ2_XS, _G.IQ2_S, _G.IQ3_XXS}
    assert {_G.IQ3_S, _G.IQ4_XS, _G.IQ4_NL} <= set(plain)


def test_a_type_needing_an_imatrix_is_not_offered_without_one(run, tmp_path):
    src, ts = _model(tmp_path, layers=1)
    plain = QM.plan_for_target(src, QM.QuantizeOptions(), QM.parse_target(bpw=8))
    offered = {o.type for s in plain.sensitivities for o in s.options}
    assert not any(_needs(t) for t in offered) and {_G.IQ3_S, _G.IQ4_XS} <= offered
    # with an importance matrix they are, but only for the tensors it has an entry of
    w = Imatrix("w", {n: np.linspace(0.1, 4.0, 256, dtype=np.float32) for n in ts if n != "token_embd.weight"})
    mix = QM.plan_for_target(src, QM.QuantizeOptions(imatrix=w), QM.parse_target(bpw=8))
    for s in mix.sensitivities:
        got = {o.type for o in s.options}
        assert any(_needs(t) for t in got) == (s.name != "token_embd.weight"), s.name
    # a target only they reach is refused without one, naming the types offered
    err = fails(run("quantize", src, tmp_path / "o.gguf", "--target-bpw", "2.4"), "the smallest mix of q2_K, q3_K, iq3_s")
    assert "iq2" not in err and "iq1" not in err and "tq" not in err and "mxfp4" not in err


def _weighted_model(tmp_path, layers=4):
    src, ts = _model(tmp_path, layers)
    return src, ts, Imatrix("w", {n: np.linspace(0.1, 4.0, 256, dtype=np.float32) for n in ts})


def test_an_iq_type_is_chosen_where_it_wins_and_the_file_loads_and_computes(tmp_path):
    """At 2.5 bits per weight (below q2_K, the smallest classic type) the mix is of IQ types; the old
    candidates cannot reach it; at 3.5 an IQ type holds some tensor, chosen over the K-quants it
    beats. The file written reads back with the chosen types, its tensors near the source's, and
    GGML's quantized mat-mul of each agrees with the float product of its dequantized rows."""
    src, ts, w = _weighted_model(tmp_path)
    opts = QM.QuantizeOptions(imatrix=w)
    with pytest.raises(QM.TargetSizeError, match="the smallest mix of q2_K"):
        QM.plan_for_target(src, opts, QM.parse_target(bpw=2.5), candidates=_OLD)
    low = QM.plan_for_target(src, opts, QM.parse_target(bpw=2.5))
    assert low.file_bytes <= math.floor(2.5 * low.plan.n_elements / 8)
    assert any(t in (_G.IQ1_S, _G.IQ1_M, _G.IQ2_XXS, _G.IQ2_XS, _G.IQ2_S) for t in low.types.values())
    mid = QM.plan_for_target(src, opts, QM.parse_target(bpw=3.5))
    old = QM.plan_for_target(src, opts, QM.parse_target(bpw=3.5), candidates=_OLD)
    assert any(t.name.lower().startswith("iq") and t != _G.IQ4_NL for t in map(T.GGMLType, mid.types.values()))
    assert mid.predicted_error < old.predicted_error          # the same budget, less error
    out = tmp_path / "mix.gguf"
    QM.run_quantization(mid.plan, str(out))
    from ggtool import quant as Q
    reader = gguf.GGUFReader(str(out))
    seen = set()
    for t in reader.tensors:
        typ = T.GGMLType(int(t.tensor_type))
        assert typ == mid.types.get(t.name, typ), t.name
        if not T.is_quantized(typ):
            continue
        raw = np.asarray(t.data).view(np.uint8).reshape(64, -1)
        x = ts[t.name]
        deq = np.asarray(Q.dequantize(raw, typ), np.float32).reshape(x.shape)
        assert TG.weighted_error(x, deq, None) < 0.2, (t.name, typ)
        if typ not in REGISTRY:
            continue
        # the registry's mat-mul (GGML's vec_dot) against 3 activation rows in its vec_dot_type
        a = np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32)
        if REGISTRY[typ].vec_dot_type == _G.Q8_K:
            act = Q.quantize_q8_k(a)
            b = act.reshape(-1, 292)
            vals = np.ascontiguousarray(b[:, :4]).view(np.float32).astype(np.float64) * b[:, 4:260].view(np.int8)
        else:
            act = Q.quantize_q8_0_cpu(a)
            b = act.reshape(-1, 34)
            vals = np.ascontiguousarray(b[:, :2]).view(np.float16).astype(np.float64) * b[:, 2:].view(np.int8)
        got = REGISTRY[typ].mul_mat(raw, act.reshape(3, -1))
        want = vals.reshape(a.shape) @ deq.astype(np.float64).T
        assert np.allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max()), (t.name, typ)
        seen.add(typ)
    assert any(t.name.lower().startswith("iq") for t in seen)


def test_rules_of_a_mix_with_iq_types_reproduce_it(tmp_path):
    """The recorded rules (ggml type names, as llama-quantize's --tensor-type takes them), the file
    type and the importance matrix given to an ordinary run write the same tensors."""
    src, ts, w = _weighted_model(tmp_path, layers=2)
    mix = QM.plan_for_target(src, QM.QuantizeOptions(imatrix=w), QM.parse_target(bpw=3.0))
    assert any(r.split("=")[1].startswith("iq") for r in mix.rules)
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    QM.run_quantization(mix.plan, str(a))
    again = QM.QuantizeOptions(type=mix.plan.options.type.name, imatrix=w,
                               tensor_types=[QM.parse_tensor_type_override(r) for r in mix.rules])
    QM.quantize_file(src, b, again)
    ra, rb = gguf.GGUFReader(str(a)), gguf.GGUFReader(str(b))
    assert {t.name: (t.tensor_type, t.data.tobytes()) for t in ra.tensors} == \
        {t.name: (t.tensor_type, t.data.tobytes()) for t in rb.tensors}
