"""ggtool.tensor_io: parsing tensor sources, reading .npy/JSON/GGUF/stdin, conversions, laziness."""

from __future__ import annotations

import io

import gguf
import numpy as np
import pytest
from conftest import STORIES, TINY_LLAMA, ok, write_gguf

import ggtool
from ggtool import Context
from ggtool import types as T
from ggtool.errors import InputError
from ggtool.gguf_io import FileStorage
from ggtool.tensor_io import Inputs, SourceSyntaxError, convert_array, parse_json_array, parse_named_source, parse_source


def inputs(*options, gguf_paths=(), stdin=None, read_data=True):
    return Inputs([parse_named_source(o) for o in options], list(gguf_paths), stdin=stdin, read_data=read_data)


# -- parsing ----------------------------------------------------------------------------------
@pytest.mark.parametrize("text, kind, type_", [
    ("[[1,2],[3,4]]", "json", None),
    ("i32:[1,2,3]", "json", T.I32),
    ("3.5", "json", None),
    ("-1e3", "json", None),
    ("NaN", "json", None),
    ("w.npy", "npy", None),
    ("f16:w.npy", "npy", T.F16),
    ("data/w.json", "json", None),
    ("-", "stdin", None),
    ("i32:-", "stdin", T.I32),
    ("f32[4,3]", "shape", T.F32),
    ("q4_0[32]", "shape", T.Q4_0),
    ("model.gguf:blk.0.attn_q.weight", "gguf", None),
    ("q4_0:model.gguf:blk.0.attn_q.weight", "gguf", T.Q4_0),
    ("1.npy", "npy", None),
])
def test_source_kinds(text, kind, type_):
    s = parse_source("x", text)
    assert (s.kind, s.type) == (kind, type_)


def test_gguf_source_splits_file_and_tensor():
    s = parse_source("w", "f16:dir/m.gguf:token_embd.weight")
    assert (s.path, s.tensor, s.type) == ("dir/m.gguf", "token_embd.weight", T.F16)


def test_shape_source_is_ggml_order():
    assert parse_source("x", "f32[4,3]").ne == (4, 3)


@pytest.mark.parametrize("option, message", [
    ("x", "expected NAME=SOURCE"),
    ("1x=[1]", "is not a tensor name"),
    ("x=", "empty source"),
    ("x=q4_K:w.npy", "cannot convert to 'q4_K'"),
    ("x=f32:f16[4]", "names its own type"),
    ("x=f32[4,x]", "bad shape"),
    ("x=f32[1,2,3,4,5]", "1 to 4 non-negative sizes"),
    ("x=m.gguf", "name the tensor: m.gguf:TENSOR"),
    ("x=m.gguf:", "no tensor name"),
])
def test_malformed_options(option, message):
    with pytest.raises(SourceSyntaxError, match=message):
        parse_named_source(option)


# -- JSON -----------------------------------------------------------------------------------------
def test_json_arrays():
    assert parse_json_array("[[1,2],[3,4]]").shape == (2, 2)
    assert parse_json_array("7").shape == ()
    a = parse_json_array("[1, NaN, Infinity, -Infinity]")
    assert np.isnan(a[1]) and a[2] == np.inf and a[3] == -np.inf


@pytest.mark.parametrize("text, message", [
    ("[[1,2],[3,4,5]]", "JSON is not rectangular: row 1 has 3 elements, row 0 has 2"),
    ("[[1,2],3]", "row 1 is a number, row 0 is a list"),
    ("[[[1],[2]],[[1],[2,3]]]", "row [1][1] has 2 elements, row [1][0] has 1"),
    ("[true, 1]", "element [0] is a boolean"),
    ('[1, "a"]', "element [1] is a string"),
    ("[1, null]", "element [1] is null"),
    ('{"a": 1}', "JSON value is an object"),
    ("[[1,2]", "invalid JSON"),
    ("[[[[[1]]]]]", "JSON array has 5 dimensions; GGML tensors have at most 4"),
    ("[" * 10 + "]" * 10, "more than 5 dimensions"),
    ("[" * 100000 + "]" * 100000, "JSON is nested more than 64 levels deep"),
])
def test_bad_json(text, message):
    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_json_array(text)


# -- conversions ---------------------------------------------------------------------------------
def test_convert_to_i32_needs_whole_numbers_in_range():
    assert convert_array(np.array([1.0, -2.0]), T.I32).dtype == np.int32
    with pytest.raises(InputError, match=r"i32 needs whole numbers; element \[1\] is 2.5"):
        convert_array(np.array([1.0, 2.5]), T.I32)
    with pytest.raises(InputError, match="does not fit in i32"):
        convert_array(np.array([2**40]), T.I32)


def test_convert_refuses_overflow():
    with pytest.raises(InputError, match="too large for f16"):
        convert_array(np.array([70000.0]), T.F16)
    with pytest.raises(InputError, match="too large for f32"):
        convert_array(np.array([1e300]), T.F32)
    assert np.isinf(convert_array(np.array([np.inf]), T.F16)[0])  # inf stays inf


# -- .npy --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype, type_", [
    (np.float32, T.F32), (np.float16, T.F16), (np.int32, T.I32),
    (np.float64, T.F32), (np.int64, T.I32), (np.int16, T.I32), (np.int8, T.I32), (np.uint8, T.I32),
])
def test_npy_dtypes(npy, dtype, type_):
    p = npy(np.arange(6, dtype=dtype).reshape(2, 3))
    t = inputs(f"x={p}").tensor("x", Context())
    assert t.type == type_ and t.ne == (3, 2, 1, 1)
    np.testing.assert_array_equal(t.numpy().reshape(2, 3), np.arange(6).reshape(2, 3))


def test_npy_fortran_order(npy):
    a = np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    t = inputs(f"x={npy(a)}").tensor("x", Context())
    np.testing.assert_array_equal(t.numpy().reshape(2, 3), a)


def test_npy_int64_out_of_range(npy):
    p = npy(np.array([1, 2**40]))
    with pytest.raises(InputError, match=r"element \[1\] = 1099511627776 does not fit in i32"):
        inputs(f"x={p}").tensor("x", Context())


@pytest.mark.parametrize("array, message", [
    (np.array([True, False]), "boolean arrays are not supported"),
    (np.zeros((1, 1, 1, 1, 2), np.float32), "5 dimensions"),
    (np.array([1 + 2j]), "dtype complex128 is not supported"),
])
def test_npy_rejected(npy, array, message):
    with pytest.raises(InputError, match=message):
        inputs(f"x={npy(array)}")


def test_pickled_npy_rejected(npy):
    p = npy(np.array([{"a": 1}, None], dtype=object))
    with pytest.raises(InputError, match=r"pickled array.*allow_pickle=False"):
        inputs(f"x={p}")


def test_truncated_npy(npy):
    p = npy(np.arange(100, dtype=np.float32))
    p.write_bytes(p.read_bytes()[:-10])
    with pytest.raises(InputError, match="truncated"):
        inputs(f"x={p}")


def test_not_npy(tmp_path):
    p = tmp_path / "x.npy"
    p.write_text("hello")
    with pytest.raises(InputError, match="is not a .npy file"):
        inputs(f"x={p}")
    with pytest.raises(InputError, match="No such file"):
        inputs(f"x={tmp_path / 'missing.npy'}")


def test_type_prefix_converts(npy):
    p = npy(np.array([[1.5, 2.5]], dtype=np.float64))
    t = inputs(f"x=f16:{p}").tensor("x", Context())
    assert t.type == T.F16 and t.numpy().dtype == np.float16


def test_quantizing_prefix():
    a = np.linspace(-1, 1, 64, dtype=np.float32).tolist()
    t = inputs(f"x=q8_0:{a}").tensor("x", Context())
    assert t.type == T.Q8_0 and t.ne == (64, 1, 1, 1)
    np.testing.assert_allclose(t.numpy().ravel(), a, atol=0.01)


def test_quantized_row_length_checked_up_front():
    with pytest.raises(InputError, match="q4_0 rows hold blocks of 32: ne0=3"):
        inputs("x=q4_0[3]")


# -- stdin ---------------------------------------------------------------------------------------------
def test_stdin_npy_and_json():
    buf = io.BytesIO()
    np.save(buf, np.arange(4, dtype=np.float32))
    t = inputs("x=-", stdin=io.BytesIO(buf.getvalue())).tensor("x", Context())
    assert t.ne == (4, 1, 1, 1) and t.type == T.F32
    t = inputs("x=i32:-", stdin=io.BytesIO(b"[[1,2],[3,4]]")).tensor("x", Context())
    assert t.type == T.I32 and t.ne == (2, 2, 1, 1)


def test_one_stdin_only():
    with pytest.raises(SourceSyntaxError, match="only one input can read stdin"):
        inputs("x=-", "y=-", stdin=io.BytesIO(b"[1]"))


def test_empty_stdin():
    with pytest.raises(InputError, match="stdin is empty"):
        inputs("x=-", stdin=io.BytesIO(b""))


def test_duplicate_names():
    with pytest.raises(SourceSyntaxError, match="given twice"):
        inputs("x=[1]", "x=[2]")


# -- GGUF ----------------------------------------------------------------------------------------------
def test_gguf_tensors_are_memory_mapped_lazily():
    env = inputs(gguf_paths=[STORIES])
    assert "token_embd.weight" in env.names() and len(env.names()) == 48
    ctx = Context()
    t = env.tensor("token_embd.weight", ctx)
    assert isinstance(t.storage, FileStorage) and t.ne == (64, 512, 1, 1)
    assert ctx.external_bytes == 64 * 512 * 4
    assert env.tensor("token_embd.weight", ctx) is t  # cached per context
    assert env.tensor("nope", ctx) is None
    info = env.ggufs[0].tensors["token_embd.weight"]
    np.testing.assert_array_equal(t.data.reshape(512, 64), env.ggufs[0].array("token_embd.weight").reshape(512, 64))
    assert t.data_offset == info.offset
    assert env.metadata("general.architecture") == "llama"
    with pytest.raises(KeyError):
        env.metadata("no.such.key")


def test_gguf_source_with_prefix_converts():
    env = inputs(f"w=f16:{STORIES}:blk.0.attn_q.weight")
    t = env.tensor("w", Context())
    assert t.type == T.F16 and t.name == "w" and t.storage is None


def test_gguf_f16_tensor_keeps_its_type():
    t = inputs(gguf_paths=[TINY_LLAMA]).tensor("token_embd.weight", Context())
    assert t.type == T.F16 and t.ne == (8, 32000, 1, 1)


def test_tensor_option_shadows_gguf_and_unused_is_reported():
    env = inputs("token_embd.weight=[1,2]", "spare=[3]", gguf_paths=[STORIES])
    assert env.tensor("token_embd.weight", Context()).ne == (2, 1, 1, 1)
    assert env.unused() == ["spare"]


def test_name_in_two_gguf_files_is_ambiguous(tmp_path):
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(STORIES.read_bytes())
    env = inputs(gguf_paths=[STORIES, copy])
    with pytest.raises(InputError, match=r"is in .* and .*; pick one by naming its file: output.weight=.*:output.weight"):
        env.tensor("output.weight", Context())


def test_missing_gguf_tensor_suggests():
    with pytest.raises(InputError, match="has no tensor 'token_embd.weights'; did you mean 'token_embd.weight'"):
        inputs(f"w={STORIES}:token_embd.weights")



def test_gguf_types_with_a_kernel_load_as_themselves(tmp_path):
    x = np.linspace(-1, 1, 2 * 256, dtype=np.float32).reshape(2, 256)
    path = tmp_path / "q.gguf"
    write_gguf(path, {"bf": (gguf.quants.quantize(x, T.GGMLType.BF16), T.GGMLType.BF16),
                      "q5": (gguf.quants.quantize(x, T.GGMLType.Q5_0), T.GGMLType.Q5_0),
                      "q41": (gguf.quants.quantize(x, T.GGMLType.Q4_1), T.GGMLType.Q4_1)})
    env = inputs(gguf_paths=[path])
    for name, tol, want in (("bf", 0.01, T.GGMLType.BF16), ("q5", 0.05, T.GGMLType.Q5_0), ("q41", 0.1, T.GGMLType.Q4_1)):
        t = env.tensor(name, Context())
        assert t.type == want and t.ne == (256, 2, 1, 1)
        row = T.row_size(want, 256)                         # memory-mapped: GGML's row size and strides
        assert t.storage is not None and t.nb == (T.type_size(want), row, 2 * row, 2 * row)
        np.testing.assert_allclose(t.numpy().reshape(2, 256), x, atol=tol)


def test_read_data_false_reads_nothing(tmp_path, npy, monkeypatch):
    x = np.ones((2, 64), np.float32)
    path = tmp_path / "q.gguf"
    write_gguf(path, {"q5": (gguf.quants.quantize(x, T.GGMLType.Q5_0), T.GGMLType.Q5_0)})
    p = npy(np.ones((3, 2), np.float32))

    def boom(*a, **k):
        raise AssertionError("data was read")

    monkeypatch.setattr(np, "load", boom)
    monkeypatch.setattr(gguf.quants, "dequantize", boom)
    monkeypatch.setattr(FileStorage, "array", property(boom))
    env = inputs(f"x={p}", f"e={STORIES}:token_embd.weight", gguf_paths=[path], read_data=False)
    ctx = Context()
    for name, ne, type_ in (("x", (2, 3, 1, 1), T.F32), ("e", (64, 512, 1, 1), T.F32), ("q5", (64, 2, 1, 1), T.GGMLType.Q5_0)):
        t = env.tensor(name, ctx)
        assert (t.ne, t.type) == (ne, type_)


def test_a_gguf_type_ggtool_does_not_compute_is_refused_unless_converted_on_request(tmp_path):
    """Never a silent conversion: an nvfp4, f64 or i8 tensor is an error naming the tensor and its
    type (with the prefix that asks for the conversion); with that prefix it loads converted."""
    rng = np.random.default_rng(0)
    iq = rng.integers(0, 256, size=(2, 36), dtype=np.uint8)   # 2 rows of one nvfp4 block (36 bytes, 64 values)
    iq[:, 32:36] = 0x38                                       # its four UE4M3 scales: finite
    path = tmp_path / "other.gguf"
    write_gguf(path, {"iq": (iq, T.GGMLType.NVFP4), "wide": np.arange(4, dtype=np.float64),
                      "small": np.arange(4, dtype=np.int8)})
    env = inputs(gguf_paths=[path])
    for name, type_name, target in (("iq", "nvfp4", "f32"), ("wide", "f64", "f32"), ("small", "i8", "i32")):
        with pytest.raises(InputError) as e:
            env.tensor(name, Context())
        assert str(e.value) == (f"{path}: tensor '{name}' is {type_name}, a type ggtool does not compute "
                                f"with; to use it converted to {target}, say so: {name}={target}:{path}:{name}")
        assert (e.value.input, e.value.file, e.value.tensor, e.value.kind) == (None, str(path), name, "needs-conversion")
        assert e.value.details["spec"] == f"{target}:{path}:{name}"
    with pytest.raises(InputError, match=rf"^input 'x': {path}:iq is nvfp4, a type ggtool does not compute with") as e:
        inputs(f"x={path}:iq")
    assert (e.value.input, e.value.file, e.value.tensor) == ("x", str(path), "iq")
    env = inputs(f"iq=f32:{path}:iq", f"wide=f32:{path}:wide", f"small=i32:{path}:small")
    t = env.tensor("iq", Context())
    assert (t.type, t.ne) == (T.F32, (64, 2, 1, 1))
    want = gguf.quants.dequantize(iq, T.GGMLType.NVFP4)
    np.testing.assert_array_equal(t.numpy().reshape(2, 64), want)
    np.testing.assert_array_equal(env.tensor("wide", Context()).numpy().ravel(), np.arange(4, dtype=np.float32))
    t = env.tensor("small", Context())
    assert t.type == T.I32 and t.numpy().ravel().tolist() == [0, 1, 2, 3]


def test_an_output_is_written_from_its_own_memory():
    """tensor_array gives a packed tensor's memory itself (a large output is not copied to be
    written out); a view that is not packed, and a quantized tensor, come as packed copies."""
    from ggtool.ops.layout import permute
    from ggtool.tensor_io import tensor_array

    ctx = Context()
    t = ctx.new_tensor(T.F32, [4, 3]).set_data(np.arange(12, dtype=np.float32).reshape(3, 4))
    a = tensor_array(t)
    assert np.shares_memory(a, t.data) and a.shape == (3, 4)
    p = permute(ctx, t, 1, 0, 2, 3)
    b = tensor_array(p)
    assert not np.shares_memory(b, t.data) and b.flags.c_contiguous
    assert (b == np.arange(12, dtype=np.float32).reshape(3, 4).T).all()


def _resident_kib(path) -> int:
    """This process's resident KiB of its mappings of file `path` (/proc/self/smaps)."""
    total, ours = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:      # a mapping's header line
                ours = line.rstrip().endswith(str(path))
            elif ours and line.startswith("Rss:"):
                total += int(head[1])
    return total


def test_repacked_gguf_weights_leave_the_process_memory(tmp_path):
    """Once a mapped weight is repacked for mul_mat, its file pages are dropped from this process
    (they stay in the page cache): a model's weights do not count twice. The result is unchanged."""
    from ggtool.ops.matmul import mul_mat

    rng = np.random.default_rng(3)
    w = rng.standard_normal((2048, 1024)).astype(np.float32)            # 2048 rows of Q8_0: ~2.2 MB
    path = tmp_path / "w.gguf"
    write_gguf(path, {"w": (gguf.quants.quantize(w, T.GGMLType.Q8_0), T.GGMLType.Q8_0)})
    env = inputs(gguf_paths=[path])
    ctx = Context()
    wt = env.tensor("w", ctx)
    x = ctx.new_tensor(T.F32, [1024, 4]).set_data(rng.standard_normal((4, 1024)).astype(np.float32))
    before = wt.numpy().sum()                                           # reads every page of the weight
    assert _resident_kib(path) > 2000
    y = mul_mat(ctx, wt, x)
    ggtool.graph_compute(ggtool.Graph(ctx).expand(y), 1)
    assert _resident_kib(path) < 256                                    # pages a tile shares with its neighbour or the header
    assert wt.numpy().sum() == before                                   # read again from the page cache
    wq = gguf.quants.dequantize(gguf.quants.quantize(w, T.GGMLType.Q8_0), T.GGMLType.Q8_0).astype(np.float64)
    xq = gguf.quants.dequantize(gguf.quants.quantize(x.numpy().reshape(4, 1024), T.GGMLType.Q8_0),
                                T.GGMLType.Q8_0).astype(np.float64)
    np.testing.assert_allclose(y.numpy().reshape(4, 2048), xq @ wq.T, rtol=1e-4, atol=1e-3)


# -- .npy inputs memory-mapped, and written-into mapped tensors copied first ------------------------
@pytest.mark.parametrize("array, mapped", [
    (np.arange(12, dtype=np.float32).reshape(3, 4), True),
    (np.arange(12, dtype=np.float16).reshape(3, 4), True),
    (np.arange(12, dtype=np.int32).reshape(3, 4), True),
    (np.arange(12, dtype=np.float64).reshape(3, 4), False),                  # converted to f32
    (np.asfortranarray(np.arange(12, dtype=np.float32).reshape(3, 4)), False),
    (np.arange(12, dtype=">f4").reshape(3, 4), False),                       # big-endian
])
def test_npy_input_is_memory_mapped_when_its_bytes_are_the_tensors(npy, array, mapped):
    """Like a GGUF weight: only the header goes into the pool; the data is read from the file (and
    the pool's worker processes map it themselves). The GGML context size is the same either way."""
    ctx = Context()
    t = Inputs([parse_source("x", str(npy(array)))], []).tensor("x", ctx)
    assert isinstance(t.storage, FileStorage) == mapped
    assert np.array_equal(t.numpy().reshape(array.shape), array)
    ref = Context()
    Inputs([parse_source("x", "[" + ",".join("[" + ",".join(map(str, r)) + "]" for r in array.tolist()) + "]")],
           []).tensor("x", ref)
    if array.dtype == np.float32 and mapped:
        assert ctx.ggml_mem_size == ref.ggml_mem_size


def test_a_prefix_conversion_is_read_into_the_pool(npy):
    t = Inputs([parse_source("x", "f16:" + str(npy(np.ones((2, 4), np.float32))))], []).tensor("x", Context())
    assert t.storage is None and t.type == T.F16


@pytest.mark.parametrize("threads", ["1", "2"])
@pytest.mark.parametrize("source", ["npy", "gguf"])
def test_ops_that_write_into_a_mapped_input_write_into_a_copy(run, npy, tmp_path, source, threads):
    """clamp and cpy compute into their source's memory: a memory-mapped input (a .npy, a GGUF
    weight) is copied into the context first, and the file is never written."""
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    if source == "npy":
        path = npy(w, "w.npy")
        args = ["--tensor", f"w={path}"]
    else:
        path = write_gguf(tmp_path / "w.gguf", {"w": w})
        args = ["--gguf", str(path)]
    before = path.read_bytes()
    out = ok(run("compute", "clamp(w, 1, 4)", *args, "--threads", threads))
    assert out.strip() == "[[1,1,2],[3,4,4]]"
    out = ok(run("compute", "add(cpy(x, w), w)", "--tensor", "x=[[1,1,1],[2,2,2]]", *args, "--threads", threads))
    assert out.strip() == "[[2,2,2],[4,4,4]]"
    assert path.read_bytes() == before


def test_set_data_on_a_mapped_tensor_copies_it_into_the_context_with_its_views(npy):
    from ggtool.ops import FUNCTIONS as F

    path = npy(np.arange(8, dtype=np.float32).reshape(2, 4))
    ctx = Context()
    t = Inputs([parse_source("x", str(path))], []).tensor("x", ctx)
    v = F["view_1d"](ctx, t, 4, 16)                      # the second row
    before, external = path.read_bytes(), ctx.external_bytes
    t.set_data(np.full((2, 4), 7, np.float32))
    assert t.storage is None and v.storage is None and ctx.external_bytes == external - 32
    assert v.numpy().reshape(-1).tolist() == [7, 7, 7, 7] and path.read_bytes() == before


# -- the engine's public readers, and its one FILE.gguf:TENSOR and "did you mean" rules ------------------
def test_read_npy_refuses_pickles_and_maps_the_rest(npy):
    from ggtool.tensor_io import read_npy

    a = read_npy(str(npy(np.arange(6, dtype=np.float32).reshape(2, 3))))
    assert isinstance(a, np.memmap) and a.shape == (2, 3) and not a.flags.writeable
    p = npy(np.array([{"a": 1}], dtype=object), "o.npy")
    with pytest.raises(InputError, match=r"^.*o\.npy: the \.npy holds Python objects") as e:
        read_npy(str(p))
    assert e.value.input is None and e.value.kind == "npy"


def test_gguf_array_dequantizes_and_converts(tmp_path):
    from ggtool.gguf_io import open_gguf
    from ggtool.tensor_io import gguf_array

    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    path = write_gguf(tmp_path / "q.gguf", {"q": (gguf.quants.quantize(x, T.GGMLType.Q8_0), T.GGMLType.Q8_0)})
    g = open_gguf(path)
    a = gguf_array(g, "q")
    assert a.shape == (2, 32) and a.dtype == np.float32
    np.testing.assert_allclose(a, x, atol=0.01)
    assert gguf_array(g, "q", T.F16).dtype == np.float16
    with pytest.raises(InputError, match="has no tensor 'nope'"):
        gguf_array(g, "nope")


def test_readers_say_what_and_the_caller_says_where():
    """Errors of the readers have no location; InputError.at adds the input (once) and a file."""
    with pytest.raises(InputError) as e:
        convert_array(np.array([70000.0]), T.F16)
    assert str(e.value) == "element [0] = 70000.0 is too large for f16" and e.value.input is None
    located = e.value.at("w", within="w.npy")
    assert (str(located), located.input, located.kind) == ("input 'w': w.npy: element [0] = 70000.0 is too large for f16",
                                                           "w", "conversion")
    assert located.at("other") is located
    assert located.worded(lambda n: f"<{n}>", str, hint=" (!)") == "<w>: w.npy: element [0] = 70000.0 is too large for f16 (!)"


def test_split_gguf_tensor_takes_the_first_split_whose_file_exists(tmp_path):
    from ggtool.gguf_io.spec import split_gguf_tensor

    assert split_gguf_tensor("m.gguf:blk.0.w") == ("m.gguf", "blk.0.w")
    assert split_gguf_tensor("m.gguf:") == ("m.gguf", "")
    assert split_gguf_tensor("w.npy") is None and split_gguf_tensor("m.gguf") is None
    odd = tmp_path / "a.gguf:b.gguf"            # a path that contains '.gguf:' itself
    odd.write_bytes(b"")
    assert split_gguf_tensor(f"{odd}:t") == (str(odd), "t")
    assert split_gguf_tensor(f"{tmp_path}/x.gguf:y.gguf:t") == (f"{tmp_path}/x.gguf:y.gguf", "t")  # none exists: the last
    assert split_gguf_tensor(str(odd)) is None  # an existing file is itself
    assert split_gguf_tensor("m.gguf:a:b") == ("m.gguf", "a:b")   # ':' in a tensor name (compare split at the last)


def test_did_you_mean_is_one_rule():
    from ggtool.dsl.errors import suggest
    from ggtool.errors import did_you_mean

    assert did_you_mean("wieght", ["weight", "bias", "weight"]) == "did you mean 'weight'?"
    assert did_you_mean("zzz", ["weight"]) == ""
    assert suggest("wieght", ["weight"]) == " (did you mean 'weight'?)"


# -- text sources -------------------------------------------------------------------------------
def test_text_source_parses_verbatim():
    s = parse_source("tokens", "text:Once upon a time, i32:[1]")
    assert (s.kind, s.type, s.text) == ("text", T.I32, "Once upon a time, i32:[1]")


def test_text_source_tokenizes_with_the_models_vocabulary():
    t = inputs("tokens=text:Once upon a time", gguf_paths=[STORIES]).tensor("tokens", Context())
    assert (t.type, t.ne[0]) == (T.I32, 5)
    assert t.numpy().ravel().tolist() == [1, 403, 407, 261, 378]


def test_text_source_needs_a_model():
    with pytest.raises(InputError) as e:
        inputs("tokens=text:hello")
    assert (e.value.kind, e.value.input) == ("text-needs-vocab", "tokens")
    assert "no model is given" in str(e.value)


def test_text_source_needs_a_vocabulary(tmp_path):
    path = str(write_gguf(tmp_path / "w.gguf", {"w": np.ones(4, np.float32)}))
    with pytest.raises(InputError) as e:
        inputs("tokens=text:hello", gguf_paths=[path])
    assert e.value.details["models"] == [path]
    assert "has one (tokenizer.ggml.tokens)" in str(e.value)
