"""The numerics a compute asks for, and which of llama.cpp's x86 builds "llama.cpp" means on this host.

"ggml" sums as GGML's scalar reference code. The others sum as a llama.cpp CPU build sums on x86-64
(``ggtool.kernels.x86``): "llama.cpp-avx512" (AVX-512 lanes: tinyBLAS<16, __m512>, 4 x 16 lanes in
``ggml_vec_dot_f32``, the AVX-512 ``ggml_v_expf``) or "llama.cpp-avx2" (8-wide: tinyBLAS<8, __m256>,
4 x 8 lanes, the AVX2 ``ggml_v_expf``). The quantized kernels (tinyBLAS_Q0, the repacked Q4_0/Q4_K
gemm and gemv, the Q6_K dot and the tiled K-quant kernel) sum alike in both. "llama.cpp" is the
one llama.cpp's CPU backend compiles for this CPU (GGML_NATIVE), picked from its flags; "x86" is
the name "llama.cpp-avx512" had first, kept as its alias.

Light on purpose (no numba): the ops and the plan read these names on every compute.
"""

from __future__ import annotations

from functools import cache

from .. import environment
from ..errors import GGToolError

GGML = "ggml"
AUTO = "llama.cpp"
AVX512 = "llama.cpp-avx512"
AVX2 = "llama.cpp-avx2"
ALIASES = {"x86": AVX512}
NAMES = (GGML, AUTO, AVX2, AVX512, *ALIASES)     # what a caller may ask for
LLAMA_CPP = (AVX512, AVX2)                       # what kernels see (resolved)
LLAMA_CPP_KV_PAD = 256    # llama.cpp's KV cache attends over a multiple of 256 cells (llama_kv_cache::get_n_kv)

# the flags a -march=native build needs for each variant's code paths: __AVX512F__ (tinyBLAS's
# __m512, ggml_vec_dot_f32's 16 lanes) and __AVX512DQ__ (the soft_max loop), or __AVX2__, __FMA__ and
# __F16C__. AVX512F without DQ compiles the F32 products of the first and the soft_max of the second:
# neither build (_MIXED). AMX (__AMX_INT8__ and __AVX512VNNI__) puts the quantized weights in its own
# buffer type and tile kernels (ggml-cpu.cpp's extra buffer types): neither build either.
_NEEDS = {AVX512: frozenset(("avx512f", "avx512dq")), AVX2: frozenset(("avx2", "fma", "f16c"))}
_MIXED = "avx512f"
_AMX = frozenset(("amx_int8", "avx512_vnni"))


class NumericsError(GGToolError):
    """An unknown numerics name, or "llama.cpp" on a CPU whose build ggtool does not model."""

    def __init__(self, name: str, flags: frozenset | None = None):
        self.name, self.kind = name, "unknown-numerics" if flags is None else "no-llama-cpp-build"
        self.flags = flags
        cpu = f"the CPU {CPU_FLAGS_VAR} describes" if cpu_flags_override() is not None else "this CPU"
        if flags is None:
            msg = f"numerics must be one of {', '.join(NAMES)}, not {name!r}"
        elif _AMX <= flags:
            msg = (f"numerics {name!r}: {cpu} has AMX (amx_int8), where llama.cpp's build multiplies quantized "
                   f"weights with its AMX kernels, neither of the two x86 builds ggtool follows")
        elif _MIXED in flags:
            msg = (f"numerics {name!r}: {cpu} has avx512f without avx512dq, where llama.cpp's build sums F32 "
                   f"products in AVX-512's lanes and soft_max in AVX2's, a mix of the two x86 builds ggtool follows")
        else:
            msg = (f"numerics {name!r}: {cpu} has neither AVX-512 (avx512f, avx512dq) nor AVX2 (avx2, fma, f16c), "
                   f"the two llama.cpp x86 builds ggtool follows")
        super().__init__(msg)


def llama_cpp_variant(flags) -> str | None:
    """The llama.cpp build a native compile makes for a CPU with these /proc/cpuinfo flags: AVX512,
    AVX2, or None (neither, AVX512F without DQ, or AMX: other kernels, not modelled)."""
    flags = frozenset(flags)
    if _AMX <= flags or (_MIXED in flags and not _NEEDS[AVX512] <= flags):
        return None
    for variant in LLAMA_CPP:
        if _NEEDS[variant] <= flags:
            return variant
    return None


def resolve(name: str, flags=None) -> str:
    """The numerics the kernels run for `name`: GGML, AVX512 or AVX2. `flags` (the CPU's, see
    `host_flags`, read only when needed where not given) decide only what AUTO means."""
    if name not in NAMES:
        raise NumericsError(name)
    name = ALIASES.get(name, name)
    if name != AUTO:
        return name
    flags = frozenset(host_flags() if flags is None else flags)
    variant = llama_cpp_variant(flags)
    if variant is None:
        raise NumericsError(name, flags)
    return variant


CPU_FLAGS_VAR = environment.CPU_FLAGS.name


def cpu_flags_override() -> frozenset | None:
    """GGTOOL_CPU_FLAGS (``ggtool.environment``), where set and not blank: the CPU flags ggtool reads
    instead of this CPU's (space- or comma-separated, /proc/cpuinfo's names), so that a run acts as
    another host would, e.g. an AVX2 one (numerics "llama.cpp" then means llama.cpp-avx2; .ci/avx2-host)."""
    return environment.cpu_flags()


def host_flags(path: str = "/proc/cpuinfo") -> frozenset:
    """The CPU feature flags ggtool goes by: GGTOOL_CPU_FLAGS's where it is set, else this CPU's
    (the first "flags" line of /proc/cpuinfo; empty where there is none)."""
    override = cpu_flags_override()
    if override is not None:
        return override
    return _cpuinfo_flags(path)


@cache
def _cpuinfo_flags(path: str) -> frozenset:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "flags":
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def is_llama_cpp(numerics: str) -> bool:
    """Whether `numerics` (resolved, an alias, or AUTO) is one of llama.cpp's x86 builds (the kernels
    of ggtool.kernels.x86)."""
    return numerics == AUTO or ALIASES.get(numerics, numerics) in LLAMA_CPP


def wide(numerics: str) -> bool:
    """Whether `numerics` (resolved, or an alias) sums in AVX-512's 16-float lanes (else AVX2's 8)."""
    return ALIASES.get(numerics, numerics) == AVX512
