"""The compiled Q4_0 / Q8_0 / fp16 kernels (ggtool.kernels.quantize) against the numpy oracles
(tests/numpy_oracle.py), byte for byte; GGML's own bytes are checked in test_quant.py."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import numpy_oracle as O
import pytest

from ggtool import quant as Q
from ggtool.errors import QuantizationError

F32 = np.float32
QUANTIZERS = [(Q.quantize_q4_0, O.quantize_q4_0), (Q.quantize_q8_0, O.quantize_q8_0),
              (Q.quantize_q8_0_cpu, O.quantize_q8_0_cpu)]
QIDS = ["q4_0", "q8_0", "q8_0_cpu"]


def _bits(*v):
    return np.array(v, np.uint32).view(F32)


def _random_blocks(seed: int, n: int = 6000) -> np.ndarray:
    """Blocks of several distributions, each block at its own scale (tiny to near float32 max)."""
    rng = np.random.default_rng(seed)
    parts = [rng.standard_normal((n, 32)), rng.uniform(-1, 1, (n, 32)), rng.standard_cauchy((n, 32)),
             rng.integers(-9, 10, (n, 32)).astype(float),
             rng.standard_normal((n, 32)) * (rng.random((n, 32)) < 0.1)]             # sparse
    x = np.concatenate(parts)
    scale = 10.0 ** rng.uniform(-44, 37, (len(x), 1))
    scale[::3] = 1
    with np.errstate(over="ignore"):
        x = (x * scale).astype(F32)
    x[~np.isfinite(x)] = F32(3e38)
    return x


def _edge_blocks() -> np.ndarray:
    rng = np.random.default_rng(99)
    blocks = [np.zeros(32), -np.zeros(32), np.where(np.arange(32) % 2, 0.0, -0.0), np.full(32, 7.0),
              np.full(32, -7.0), np.full(32, 3e38), np.full(32, -3.4028235e38)]
    for a in (1.0, 0.37, 1e-20, 3e38, 65504.0 * 8, 65504.0 * 127):     # ties of +a / -a, both orders
        for first in (1, -1):
            b = rng.uniform(-a, a, 32) * 0.5
            i, j = sorted(rng.choice(32, 2, replace=False))
            b[i], b[j] = first * a, -first * a
            blocks.append(b)
    for m in (65504.0, 65519.0, 65520.0, 65536.0):                      # d around fp16's overflow
        for k in (8, 127):
            for s in (1, -1):
                b = rng.uniform(-1, 1, 32) * m * k * 0.9
                b[5] = s * m * k
                blocks.append(b)
    for amax in _bits(1, 2, 3, 8, 9, 100, 0x7FFFFF, 0x800000, 0x01000000, 0x02000000, 0x03800000, 0x03FFFFFF,
                      0x04000000, 0x04100000):      # subnormal-scale blocks: 1/d or 127/amax overflows
        for s in (1, -1):
            b = rng.uniform(-1, 1, 32) * float(amax)
            b[rng.integers(32)] = s * float(amax)
            b[rng.integers(32)] = 0
            blocks.append(b)
    halves = np.zeros(32)                       # Q8_0 round halves (x * id lands on k + 0.5)
    halves[0] = 127.0
    halves[1:12] = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -126.5, 0.49999997, -0.49999997, 3.5]
    blocks.append(halves)
    return np.array(blocks).astype(F32)


@pytest.mark.parametrize("fn,oracle", QUANTIZERS, ids=QIDS)
def test_quantize_matches_oracle(fn, oracle):
    x = np.concatenate([_random_blocks(1), _edge_blocks()])
    assert np.array_equal(fn(x), oracle(x))
    x4 = x[:len(x) // 4 * 4].reshape(-1, 128)                     # rows of 4 blocks
    assert np.array_equal(fn(x4), oracle(x4))


@pytest.mark.parametrize("fn,oracle", QUANTIZERS, ids=QIDS)
def test_quantize_chunks_threads_and_input_kinds(fn, oracle):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((Q.CHUNK_BLOCKS * 2 + 7, 32)).astype(F32)
    want = oracle(x)
    Q.set_threads(2)
    try:
        assert np.array_equal(fn(x), want)
    finally:
        Q.set_threads(None)
    ro = x.copy()
    ro.flags.writeable = False
    assert np.array_equal(fn(ro), want)                                       # read-only input
    assert np.array_equal(fn(x.astype(">f4")), want)                          # byte-swapped
    assert np.array_equal(fn(x.astype(np.float64)), want)
    buf = np.empty(x.nbytes + 1, np.uint8)[1:].view(F32).reshape(x.shape)     # unaligned
    buf[...] = x
    assert np.array_equal(fn(buf), want)
    assert np.array_equal(fn(np.asfortranarray(x[:64].reshape(16, 128))), oracle(x[:64].reshape(16, 128)))
    assert np.array_equal(fn(np.arange(-16, 48, dtype=np.int32)), oracle(np.arange(-16, 48)))


@pytest.mark.parametrize("fn", [q for q, _ in QUANTIZERS], ids=QIDS)
def test_nonfinite_index(fn):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((Q.CHUNK_BLOCKS + 40, 64)).astype(F32)
    for flat, bad in [(0, np.nan), (31, np.inf), (32, -np.inf), (x.size - 1, np.nan),
                      (Q.CHUNK_BLOCKS * 32 + 77, -np.inf), (12345, _bits(0x7F800001)[0]),
                      (777, _bits(0xFFC00000)[0])]:
        y = x.copy()
        y.reshape(-1)[flat] = bad
        y.reshape(-1)[flat + 1:][::1000] = np.inf          # later ones, in the same block and after
        with pytest.raises(QuantizationError) as e:
            fn(y, name="w")
        r, c = divmod(flat, 64)
        word = "NaN" if np.isnan(bad) else ("inf" if bad > 0 else "-inf")
        assert str(e.value) == f"tensor 'w': cannot quantize {word} at index ({r}, {c})"


def test_kernel_return_values():
    from ggtool.kernels import quantize as kq
    x = np.zeros((5, 32), F32)
    x[3, 7], x[3, 9], x[4, 0] = np.nan, np.inf, np.nan
    for k, nb in ((kq.q4_0_quantize, 18), (kq.q8_0_quantize, 34), (kq.q8_0_quantize_cpu, 34), (kq.q4_1_quantize, 20),
                  (kq.q5_0_quantize, 22), (kq.q5_1_quantize, 24)):
        assert k(x, np.empty((5, nb), np.uint8)) == 3 * 32 + 7
        assert k(x[:3], np.empty((3, nb), np.uint8)) == -1
        with pytest.raises(TypeError):                      # one specialization: no silent recompiles
            k(x.astype(np.float64), np.empty((5, nb), np.uint8))


def _fp16_cases() -> np.ndarray:
    """Every fp32 exponent and sign, with mantissas at and around each rounding boundary (ties
    to even/odd for every shift an fp16 subnormal or normal result needs), plus random patterns."""
    mant = {0, 1, 2, 0x7FFFFF, 0x400000, 0x7FE000, 0x7FF000, 0x7FEFFF, 0x7FF001}
    for s in range(1, 25):
        half = 1 << (s - 1)
        for base in (0, 1 << s, 2 << s, 3 << s, 0x7FFFFF & ~((1 << s) - 1)):
            mant.update(((base + half + o) & 0x7FFFFF) for o in (-1, 0, 1))
    m = np.array(sorted(mant), np.uint32)
    e = np.arange(256, dtype=np.uint32)
    w = ((e[:, None] << 23) | m[None, :]).reshape(-1)
    rng = np.random.default_rng(4)
    w = np.concatenate([w, w | np.uint32(0x80000000), rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32),
                        np.array([0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FF001, 0x477FFFFF, 0x47800000,
                                  0x33000000, 0x33000001, 0x337FFFFF, 0x33800000, 0x387FC000, 0x387FE000,
                                  0x387FF000, 0x38800000, 0x7FC00000, 0xFFFFFFFF, 0x7F800001, 0xFF800000],
                                 np.uint32)])
    return w.view(F32)


def test_fp32_to_fp16_matches_numpy():
    x = _fp16_cases()
    got = Q.fp32_to_fp16(x)
    assert got.dtype == np.float16 and got.shape == x.shape
    bad = np.flatnonzero(got.view(np.uint16) != O.fp32_to_fp16(x).view(np.uint16))
    assert bad.size == 0, [hex(v) for v in x[bad[:10]].view(np.uint32)]


def test_fp32_to_fp16_shapes():
    x = np.random.default_rng(5).standard_normal((3, 4, 6)).astype(F32) * 1e4
    want = O.fp32_to_fp16(x)
    for y in (x, x.astype(np.float64), x.transpose(2, 0, 1), x[:, ::2]):
        w = O.fp32_to_fp16(y)
        assert Q.fp32_to_fp16(y).tobytes() == w.tobytes() and Q.fp32_to_fp16(y).shape == w.shape
    assert Q.fp32_to_fp16(np.float32(65520.0)).shape == ()
    assert Q.fp32_to_fp16(np.zeros((0, 3), F32)).shape == (0, 3)
    assert Q.fp32_to_fp16(x.reshape(-1)).tobytes() == want.tobytes()
    big = np.random.default_rng(6).standard_normal(Q.CHUNK_BLOCKS * 32 * 2 + 5).astype(F32)
    Q.set_threads(2)
    try:
        assert Q.fp32_to_fp16(big).tobytes() == O.fp32_to_fp16(big).tobytes()
    finally:
        Q.set_threads(None)


def _random_block_bytes(n: int, nbytes: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n, nbytes), dtype=np.uint8)
    d = np.concatenate([np.arange(1 << 16, dtype=np.uint32).astype(np.uint16),   # every fp16 scale
                        rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)])[:n]
    raw[:, :2] = d.view(np.uint8).reshape(n, 2)
    return raw


@pytest.mark.parametrize("fn,oracle,nbytes", [(Q.dequantize_q4_0, O.dequantize_q4_0, 18),
                                              (Q.dequantize_q8_0, O.dequantize_q8_0, 34)], ids=["q4_0", "q8_0"])
def test_dequantize_matches_oracle(fn, oracle, nbytes):
    raw = _random_block_bytes(70000, nbytes, 7)
    with np.errstate(invalid="ignore"):
        got, want = fn(raw), oracle(raw)
    assert got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))    # NaN payloads too (same x86 mul)
    rows = raw[:64].reshape(8, 8 * nbytes)
    assert fn(rows).shape == (8, 256) and np.array_equal(fn(rows).reshape(-1, 32), got[:64])


@pytest.mark.parametrize("name,oracle,nbytes", [("q4_0_dequantize", O.dequantize_q4_0, 18),
                                                ("q8_0_dequantize", O.dequantize_q8_0, 34)], ids=["q4_0", "q8_0"])
def test_a_dequantizer_and_its_numpy_twin_give_the_same_bits(name, oracle, nbytes):
    """Up to SMALL_BLOCKS blocks a dequantizer runs its numpy twin (no compile for a few rows), past
    it the compiled kernel: the oracle's bits on both sides, NaN/inf/subnormal scales included."""
    from ggtool.kernels import quantize as kq

    kernel = getattr(kq, name)
    raw = _random_block_bytes(kq.SMALL_BLOCKS + 1, nbytes, 11).reshape(-1, nbytes)
    raw[:6, :2] = [[0x00, 0x7C], [0x01, 0x7E], [0x01, 0x7C], [0x01, 0xFC], [0x01, 0x00], [0x00, 0x80]]
    with np.errstate(invalid="ignore"):
        want = oracle(raw).reshape(-1, 32)
    for blocks in (raw[:kq.SMALL_BLOCKS], raw):          # the twin, then the kernel
        got = np.full((len(blocks), 32), np.nan, F32)
        kernel(np.ascontiguousarray(blocks), got)
        assert np.array_equal(got.view(np.uint32), want[:len(blocks)].view(np.uint32))
    assert len(kernel.signatures) == 1


@pytest.mark.parametrize("fn,dq", [(Q.quantize_q4_0, Q.dequantize_q4_0), (Q.quantize_q8_0, Q.dequantize_q8_0),
                                   (Q.quantize_q8_0_cpu, Q.dequantize_q8_0)], ids=QIDS)
def test_round_trip_is_stable(fn, dq):
    """Dequantized values quantize back to the same bytes (codes and scale are reproduced)."""
    x = np.random.default_rng(8).standard_normal((500, 64)).astype(F32)
    q = fn(x)
    assert np.array_equal(fn(dq(q)), q)


def test_one_specialization_each():
    """Writable and read-only arrays alike run the one pinned specialization of each kernel (the
    dequantizers' past their numpy twins' SMALL_BLOCKS)."""
    from ggtool.kernels import quantize as kq
    n = (kq.SMALL_BLOCKS + 1) * 32
    writable, readonly = np.ones(n, F32), np.ones(n, F32)
    readonly.flags.writeable = False
    for x in (writable, readonly):
        for fn, dq in ((Q.quantize_q4_0, Q.dequantize_q4_0), (Q.quantize_q8_0, Q.dequantize_q8_0)):
            dq(fn(x))
        Q.quantize_q8_0_cpu(x)
        Q.fp32_to_fp16(x)
    for name in ("q4_0_quantize", "q8_0_quantize", "q8_0_quantize_cpu", "q4_0_dequantize", "q8_0_dequantize",
                 "fp32_to_fp16"):
        assert len(getattr(kq, name).signatures) == 1, name


@pytest.mark.parametrize("bad, what", [
    (lambda x, out: (x.astype(np.float64), out), "argument 0 .* not float64"),
    (lambda x, out: (x[:, ::2], out[:, :18]), "argument 0 .* C-contiguous"),
    (lambda x, out: (x, np.frombuffer(out.tobytes(), np.uint8).reshape(out.shape)), "argument 1 .*writable"),
    (lambda x, out: (np.frombuffer(b"\0" + x.tobytes(), np.float32, offset=1).reshape(x.shape), out), "aligned"),
])
def test_a_pinned_kernel_refuses_what_its_one_specialization_cannot_take(bad, what):
    """Called through its compiled entry point, a kernel checks its arrays itself: another dtype,
    layout, a misaligned input or a read-only output is a TypeError, never a crash."""
    from ggtool.kernels import quantize as kq

    x, out = np.ones((2, 64), F32), np.zeros((2, 36), np.uint8)
    with pytest.raises(TypeError, match=what):
        kq.q4_0_quantize(*bad(x, out))


def test_quantizing_a_read_only_memory_map_does_not_import_numpy_ma(tmp_path):
    """numba's dispatch types a read-only array in Python and imports numpy.ma for it; the entry
    point does not (a memory-mapped .npy is read-only)."""
    alone = subprocess.run([sys.executable, "-c", "import sys, numpy; print('numpy.ma' in sys.modules)"],
                           capture_output=True, text=True, check=True)
    if alone.stdout.strip() == "True":
        pytest.skip(f"numpy {np.__version__} imports numpy.ma itself (numpy 1.x)")
    np.save(tmp_path / "x.npy", np.ones((4, 64), F32))
    code = ("import sys, numpy as np; from ggtool import quant as Q; "
            f"x = np.load({str(tmp_path / 'x.npy')!r}, mmap_mode='r'); q = Q.quantize_q4_0(x); "
            "assert not x.flags.writeable and q.shape == (4, 36); assert 'numpy.ma' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_import_does_not_load_numba():
    code = "import sys, ggtool, ggtool.quant; assert 'numba' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


OPTIONAL_LEFT_OUT = """
import sys, ggtool.role
ggtool.role.COMMAND_LINE = {command_line}
from ggtool.kernels import quantize as kq
import numpy as np
from numba.core import entrypoints
kq.q4_0_quantize(np.ones((1, 32), np.float32), np.zeros((1, 18), np.uint8))
print('numba' in sys.modules, sorted({{'scipy', 'yaml', 'pycparser', 'importlib.metadata'}} & set(sys.modules)),
      hasattr(entrypoints, 'importlib_metadata'), any(type(f).__name__ == '_NoExtensions' for f in sys.meta_path))
import yaml, importlib.metadata
"""


@pytest.mark.parametrize("command_line", [True, False])
def test_in_ggtools_own_process_numba_loads_without_its_optional_packages(command_line):
    """The command line sets ggtool.role.COMMAND_LINE: numba then loads without scipy, yaml,
    cffi's parser (jit.OPTIONAL) and its extensions' entry points (jit._NoExtensions: not even
    importlib.metadata is imported), which ggtool's kernels never use; they stay importable after.
    A library user's process keeps numba's own (importlib.metadata imported)."""
    r = subprocess.run([sys.executable, "-c", OPTIONAL_LEFT_OUT.format(command_line=command_line)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    if command_line:     # numba.core.entrypoints is the stand-in, and the finder is gone
        assert r.stdout == "True [] False False\n"
    else:
        assert r.stdout.startswith("True ['importlib.metadata'") and r.stdout.endswith(" True False\n"), r.stdout


PLANTED_CONFIG = """
import sys, ggtool.role
ggtool.role.COMMAND_LINE = {command_line}
from ggtool.gguf_io import reader          # gguf-py, with yaml (or the command line's stand-in)
from ggtool.kernels import jit
from numba.core import config
@jit.numba.njit(cache=False)
def f(x):
    return x + 1
f(1)                                        # a compile: numba reads its config again
config.reload_config()
print(config.DEBUG_CACHE, config.BOUNDSCHECK)
"""


@pytest.mark.parametrize("command_line", [True, False])
def test_the_command_lines_numba_reads_no_config_file_from_the_working_directory(tmp_path, command_line):
    """numba takes a .numba_config.yaml in the current directory as NUMBA_* settings: one planted
    where a user runs ggtool could print numba's debug output into the data on stdout (it did, with
    `debug_cache: 1`, once gguf-py had loaded yaml) or change the kernels. The command line's numba
    reads none, at import or at a compile, and says nothing of it (jit._no_config_file); a
    library user's numba keeps numba's behaviour."""
    (tmp_path / ".numba_config.yaml").write_text("debug_cache: 1\nboundscheck: 1\n")
    r = subprocess.run([sys.executable, "-c", PLANTED_CONFIG.format(command_line=command_line)], capture_output=True,
                       text=True, cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout == ("0 None\n" if command_line else "1 1\n"), r.stdout
