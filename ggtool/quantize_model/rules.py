"""Which type each tensor gets when a whole model is quantized, and the resulting output layout.

Exists so the decisions (llama.cpp's rules, the plan, the GGUF header) can be read and tested apart
from running them (`ggtool.quantize_model`).  The rules are llama.cpp's (`llama_model_quantize`,
Q4_0/Q8_0 file types) so the file behaves like one `llama-quantize` writes:

* only tensors whose name ends in ``weight`` with 2 or more dims (ggml_n_dims: trailing 1s do not
  count) are quantized, never ``*_norm.weight`` nor the small/special tensors llama.cpp skips
  (``ffn_gate_inp``, positional embeddings, RWKV/Mamba small weights, ...); the rest is copied;
* default mode: ``output.weight`` (or ``token_embd.weight`` when no output.weight exists, i.e. tied)
  would be Q6_K, or Q8_0 when its row is not a multiple of 256 (k-quant fallback) or the model is
  Falcon; ggtool does not write Q6_K into these file types yet (its K-quant mixes are not built),
  so where llama.cpp writes Q6_K it writes Q8_0 and warns.
  MoE models with 8 experts get Q8_0 attn_v/attn_k as in llama.cpp.  ``pure`` skips all of this;
* an output tensor type / token embedding type (options) override output.weight / token_embd.weight;
* pure Q4_K / Q5_K / Q6_K files (llama-quantize's pure mode with its Q4_K, Q5_K aliases or Q6_K): every
  eligible tensor gets the type (general.file_type 15, 17, 18); the K file types' own mixes
  (Q4_K_M, ...) are not built yet (MixNotBuiltError);
* a row length that is not a multiple of the chosen type's block size falls back as llama.cpp's
  tensor_type_fallback does (q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0), else to F16;
* a tensor whose chosen type equals its source type is copied byte for byte.

All metadata is copied verbatim (raw key/value bytes), except that ``general.quantization_version``
(2) and ``general.file_type`` are removed and appended last, as llama.cpp's gguf_set_val does, and
split keys are dropped.  Tensors are written in llama.cpp's order (non-block tensors by name, then
``blk.N.*`` by layer and name).  A split input (its first shard; the reader opens the rest) gives
one file, or with keep_split as many files as it has shards, each with its shard's tensors in file
order and the split keys set again, as llama-quantize writes them when asked to keep the split.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import numpy as np

from .. import quant as Q
from .. import types as T
from ..quant.kquants import K_QUANTIZE
from ..errors import GGToolError, InputError, QuantizationError
from ..gguf_io import write as W
from ..gguf_io.format import (
    DEFAULT_ALIGNMENT,
    SPLIT_COUNT,
    SPLIT_KEYS,
    SPLIT_NO,
    SPLIT_TENSORS,
    check_tensor_name,
    check_write_alignment,
    output_prefix,
    shard_path,
)

GGML_QNT_VERSION = 2
GGUF_DEFAULT_ALIGNMENT = DEFAULT_ALIGNMENT
_G = T.GGMLType
# llama_ftype of each target: LLAMA_FTYPE_MOSTLY_Q4_0 / _Q8_0, and the file types llama-quantize's
# aliases Q4_K / Q5_K name (Q4_K_M / Q5_K_M), Q6_K
FILE_TYPES = {T.Q4_0: 2, T.Q8_0: 7, _G.Q4_K: 15, _G.Q5_K: 17, _G.Q6_K: 18}
TARGET_TYPES = (T.Q4_0, T.Q8_0, _G.Q4_K, _G.Q5_K, _G.Q6_K)
# targets written only pure (every eligible tensor the one type, llama-quantize's pure mode): their
# per-tensor mixes (llama_tensor_get_type's rules for the K file types) are not built yet
PURE_ONLY = (_G.Q4_K, _G.Q5_K, _G.Q6_K)
_FILE_TYPE_NAMES = {_G.Q4_K: "Q4_K_M", _G.Q5_K: "Q5_K_M", _G.Q6_K: "Q6_K"}
# llama.cpp's tensor_type_fallback (llama-quant.cpp): a type whose block does not divide the row
# gets a type of 32-element blocks; if that does not divide it either (or the type has no entry
# here: q4_0, q8_0, ...), F16. The check is the type's block size (ggml_blck_size), so no list of
# "k-quants" is needed: older llama.cpp tested a hand-written list against QK_K (256), which is the
# block size of every type it held. Of this table q4_K -> q5_0, q5_K -> q5_1 and q6_K -> q8_0 are
# reachable from ggtool's targets.
_FALLBACK = {_G.Q4_K: _G.Q5_0, _G.Q5_K: _G.Q5_1, _G.Q6_K: T.Q8_0,
             _G.Q2_K: T.Q4_0, _G.Q3_K: T.Q4_0, _G.TQ1_0: T.Q4_0, _G.TQ2_0: T.Q4_0,
             **{t: _G.IQ4_NL for t in (_G.IQ1_S, _G.IQ1_M, _G.IQ2_XXS, _G.IQ2_XS, _G.IQ2_S, _G.IQ3_XXS,
                                       _G.IQ3_S, _G.IQ4_XS)}}
# llama.cpp's llama_model_quantize: substrings / names never quantized
_SKIP_SUBSTR = ("_norm.weight", "ffn_gate_inp.weight", "altup", "laurel", "per_layer_model_proj",
                "ssm_conv1d.weight", "shortconv.conv.weight", "time_mix_first.weight",
                "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight", "time_mix_v0.weight",
                "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight", "time_mix_a1.weight",
                "time_mix_a2.weight", "time_mix_g1.weight", "time_mix_g2.weight",
                "time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight",
                "attn_rel_b.weight", ".position_embd.")
_SKIP_NAMES = ("position_embd.weight", "token_types.weight")


@dataclass
class QuantizeOptions:
    type: T.GGMLType = T.Q4_0
    pure: bool = False
    leave_output_tensor: bool = False
    output_tensor_type: T.GGMLType | None = None
    token_embedding_type: T.GGMLType | None = None
    threads: int = 1
    name: str | None = None        # tensor name for a .npy input
    allow_requantize: bool = False  # quantize tensors that are already quantized (llama.cpp's flag)
    keep_split: bool = False       # a split input gives as many output files, the same tensors in each


class RequantizeError(QuantizationError):
    """A tensor that is already quantized would be quantized again, which was not allowed:
    `tensor` (the first), its `src_type`, the `dst_type` it would get, `count` such tensors."""

    kind = "requantize"

    def __init__(self, tensor: str, src_type: T.GGMLType, dst_type: T.GGMLType, count: int):
        self.tensor, self.src_type, self.dst_type, self.count = tensor, src_type, dst_type, count
        super().__init__(f"tensor '{tensor}' is already quantized ({T.type_name(src_type)}): requantizing it to "
                         f"{T.type_name(dst_type)} adds a second rounding error to the first ({count} tensor"
                         f"{'s' if count != 1 else ''} of this model would be requantized)")


def _writes(t: T.GGMLType) -> bool:
    """Whether a whole-model quantization writes tensors of type t: what ggtool.quant quantizes,
    less the K types until llama.cpp's K-quant file types (their per-tensor mixes) are built here."""
    return t in (T.F32, T.F16) or (Q.can_quantize(t) and t not in K_QUANTIZE)


class MixNotBuiltError(QuantizationError):
    """A K-quant file type asked for with its per-tensor mix, which is not built yet: `type`."""

    kind = "mix-not-built"

    def __init__(self, type: T.GGMLType):
        self.type = type
        name = T.type_name(type)
        super().__init__(f"the per-tensor mix of llama.cpp's {_FILE_TYPE_NAMES[type]} file type is not built yet; "
                         f"only a pure {name} file (every eligible tensor {name}) can be written")


class TargetTypeError(GGToolError):
    """A tensor type ggtool cannot write: `name` as given, `type` if it names one, `choices`."""

    CHOICES = ("f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0")

    def __init__(self, name: str, type: T.GGMLType | None, choices: tuple[str, ...] = CHOICES):
        self.name, self.type, self.choices = name, type, choices
        extra = " (ggtool writes q6_K only in pure q6_K files yet)" if type == T.GGMLType.Q6_K else ""
        super().__init__(f"cannot write tensor type {name!r}{extra}; use one of {', '.join(choices)}")


@dataclass
class TensorPlan:
    """What happens to one tensor. `ne` in ggml order; `src_offset` absolute in `src_path` (the
    input, or the shard of a split input, holding its data)."""

    index: int
    name: str
    ne: tuple[int, ...]
    src_type: T.GGMLType
    dst_type: T.GGMLType
    src_offset: int
    src_bytes: int
    dst_bytes: int
    warning: str | None = None
    dst_offset: int = 0            # relative to its output file's data section
    src_path: str = ""

    @property
    def copy(self) -> bool:
        return self.src_type == self.dst_type

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.ne, dtype=np.int64))


@dataclass
class OutputFile:
    """One file a plan writes: metadata as (key, raw key/value bytes) in order, tensors in order."""

    kv: list[tuple[str, bytes]]
    tensors: list[TensorPlan]
    alignment: int

    def size(self) -> int:
        end = T.pad(self.tensors[-1].dst_offset + self.tensors[-1].dst_bytes, self.alignment) if self.tensors else 0
        return len(header_bytes(self)) + end


@dataclass
class QuantizePlan:
    """One output file, or (keep_split with a split input) one per input shard."""

    input: str
    options: QuantizeOptions
    files: list[OutputFile]
    warnings: list[str] = field(default_factory=list)
    npy: np.ndarray | None = None        # the array of a .npy input
    sources: list[str] = field(default_factory=list)   # every input file (the shards of a split model)

    @property
    def tensors(self) -> list[TensorPlan]:
        return [t for f in self.files for t in f.tensors]

    @property
    def kv(self) -> list[tuple[str, bytes]]:
        return self.files[0].kv

    @property
    def alignment(self) -> int:
        return self.files[0].alignment

    def output_paths(self, output: str) -> list[str]:
        """OUTPUT itself, or the shards named after it (llama-quantize's names for kept splits)."""
        n = len(self.files)
        if n == 1:
            return [output]
        prefix = output_prefix(output, n)
        return [shard_path(prefix, k, n) for k in range(n)]

    @property
    def src_bytes(self) -> int:
        return sum(t.src_bytes for t in self.tensors)

    @property
    def dst_bytes(self) -> int:
        return sum(t.dst_bytes for t in self.tensors)

    @property
    def n_elements(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    def file_bytes(self) -> int:
        """Size of the output (all its files)."""
        return sum(f.size() for f in self.files)


# --------------------------------------------------------------------------------------------- GGUF bits

def _split_kv(no: int, count: int, n_tensors: int) -> list[tuple[str, bytes]]:
    """llama-quantize's split keys: split.no and split.count as UINT16, split.tensors.count INT32."""
    return [(SPLIT_NO, W.kv_scalar(SPLIT_NO, W.UINT16, no)),
            (SPLIT_COUNT, W.kv_scalar(SPLIT_COUNT, W.UINT16, count)),
            (SPLIT_TENSORS, W.kv_scalar(SPLIT_TENSORS, W.INT32, n_tensors))]


def _llama_order(name: str) -> tuple[int, str]:
    """llama.cpp's weight_name_comparer: layer number of 'blk.N.' (-1 if none), then name."""
    m = re.match(r"blk\.(-?\d+)\.", name)
    return (int(m.group(1)) if m else -1, name)


def tensor_bytes(t: T.GGMLType, ne) -> int:
    """Bytes of a packed tensor of type t and shape ne (ggml_nbytes of a contiguous tensor)."""
    return T.row_size(t, int(np.prod(ne, dtype=np.int64)))


# ------------------------------------------------------------------------------------------- the rules

def _fallback(t: T.GGMLType, ne0: int) -> T.GGMLType:
    """llama.cpp's tensor_type_fallback: a type whose blocks divide rows of ne0."""
    if ne0 % T.block_size(t):
        t = _FALLBACK.get(t, t)
        if ne0 % T.block_size(t):
            t = T.F16
    return t


def choose_type(name: str, ne, src_type: T.GGMLType, opts: QuantizeOptions, *, has_output: bool,
                arch: str = "", n_expert: int = 0) -> tuple[T.GGMLType, str | None]:
    """(type to write, warning or None) for one tensor, following llama.cpp's Q4_0/Q8_0 rules (and
    its pure mode for the K types)."""
    quantize = name.endswith("weight") and T.n_dims(ne) >= 2
    quantize &= not any(s in name for s in _SKIP_SUBSTR) and name not in _SKIP_NAMES
    quantize &= not (opts.leave_output_tensor and name == "output.weight")
    if not quantize:
        return src_type, None
    new = opts.type
    warning = None
    ne0 = int(ne[0])
    if not opts.pure:
        is_output = name == "output.weight" or (not has_output and name == "token_embd.weight")
        if is_output:
            if opts.output_tensor_type is not None:
                new = opts.output_tensor_type
            elif arch == "falcon" or ne0 % T.block_size(new):
                new = T.Q8_0
            elif new != T.Q8_0:
                new = T.GGMLType.Q6_K
        elif name == "token_embd.weight" and opts.token_embedding_type is not None:
            new = opts.token_embedding_type
        elif n_expert == 8 and ("attn_v.weight" in name or "attn_k.weight" in name):
            new = T.Q8_0
        new = _fallback(new, ne0)
    if opts.token_embedding_type is not None and name == "token_embd.weight":
        new = opts.token_embedding_type
    if opts.output_tensor_type is not None and name == "output.weight":
        new = opts.output_tensor_type
    new = _fallback(new, ne0)
    if not (new == opts.type or _writes(new)):
        if new == T.GGMLType.Q6_K:
            warning = (f"{name}: llama.cpp would write q6_K here; ggtool writes q6_K only in pure q6_K files yet, "
                       f"writing q8_0 instead")
            new = _fallback(T.Q8_0, ne0)
        else:
            raise QuantizationError(f"tensor '{name}': cannot quantize to {T.type_name(new)} "
                                    f"(not implemented)")
    return new, warning


def parse_target_type(name: str) -> T.GGMLType:
    """A type for output.weight or token_embd.weight: one ggtool can write (TargetTypeError if not)."""
    try:
        t = T.parse_type(name)
    except GGToolError:
        t = None
    if t is None or not _writes(t):
        raise TargetTypeError(name, t)
    return t


# ------------------------------------------------------------------------------------------ the plan

def _file_type_kv(opts: QuantizeOptions) -> list[tuple[str, bytes]]:
    """general.quantization_version and general.file_type, set last as llama.cpp's gguf_set_val_u32 does."""
    return [("general.quantization_version", W.kv_u32("general.quantization_version", GGML_QNT_VERSION)),
            ("general.file_type", W.kv_u32("general.file_type", FILE_TYPES[opts.type]))]


def _is_npy(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(6) == b"\x93NUMPY"


def plan_quantization(input_path: str | os.PathLike, opts: QuantizeOptions) -> QuantizePlan:
    """Decide every tensor's type and the output layout (nothing is read but headers)."""
    path = os.fspath(input_path)
    if opts.type not in TARGET_TYPES:
        raise TargetTypeError(T.type_name(opts.type), opts.type, tuple(map(T.type_name, TARGET_TYPES)))
    if opts.type in PURE_ONLY and not opts.pure:
        raise MixNotBuiltError(opts.type)
    try:
        npy = _is_npy(path)
    except OSError as e:
        raise InputError(f"{path}: {e.strerror}") from None
    if npy:
        return _plan_npy(path, opts)
    from ..gguf_io import GGUFFile  # gguf-py loads only for a GGUF input

    g = GGUFFile(path)                 # the first shard of a split model opens them all
    infos = list(g.tensors.values())
    has_output = "output.weight" in g.tensors
    arch = str(g.metadata("general.architecture", ""))
    n_expert = g.metadata(f"{arch}.expert_count", 0) if arch else 0
    n_expert = int(n_expert) if isinstance(n_expert, (int, np.integer)) else 0
    alignment = g.alignment
    check_write_alignment(alignment, path)
    drop = {"general.quantization_version", "general.file_type", *SPLIT_KEYS}
    raw = g.reader.data
    kv = [(k, bytes(raw[s:e])) for k, (s, e) in g.reader.kv_spans.items() if k not in drop]
    kv += _file_type_kv(opts)
    plans, warnings = {}, []
    for info in sorted(infos, key=lambda t: _llama_order(t.name)):
        dst, warn = choose_type(info.name, info.ne, info.type, opts, has_output=has_output, arch=arch,
                                n_expert=n_expert)
        if warn:
            warnings.append(warn)
        if dst != info.type and T.is_quantized(info.type) and not opts.allow_requantize:
            _refuse_requantize(info, dst, infos, opts, has_output, arch, n_expert)
        if dst != info.type and not Q.can_dequantize(info.type):
            raise QuantizationError(f"tensor '{info.name}': cannot dequantize {T.type_name(info.type)}")
        plans[info.name] = TensorPlan(0, info.name, info.ne, info.type, dst, info.offset, info.n_bytes,
                                      tensor_bytes(dst, info.ne), warn, src_path=info.path)
    if opts.keep_split and len(g.shards) > 1:
        # llama-quantize keeping the split: shard k gets shard k's tensors in file order; the first
        # carries the metadata, every one the split keys (later shards: the default alignment)
        n = len(g.shards)
        files = [OutputFile((kv if k == 0 else []) + _split_kv(k, n, len(plans)),
                            [plans[name] for name in s.own_tensors], alignment if k == 0 else GGUF_DEFAULT_ALIGNMENT)
                 for k, s in enumerate(g.shards)]
    else:
        files = [OutputFile(kv, list(plans.values()), alignment)]
    return _layout(QuantizePlan(path, opts, files, warnings, sources=g.paths))


def _refuse_requantize(info, dst: T.GGMLType, infos, opts: QuantizeOptions, has_output: bool, arch: str,
                       n_expert: int) -> None:
    """llama.cpp's llama_model_quantize refuses to quantize a tensor that is already quantized
    unless allow_requantize is set: the second rounding adds to the first, silently."""
    n = sum(1 for t in infos if T.is_quantized(t.type) and choose_type(
        t.name, t.ne, t.type, opts, has_output=has_output, arch=arch, n_expert=n_expert)[0] != t.type)
    raise RequantizeError(info.name, info.type, dst, n)


def _plan_npy(path: str, opts: QuantizeOptions) -> QuantizePlan:
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise InputError(f"{path}: not a readable .npy file ({e})") from None
    if arr.dtype.kind != "f" or arr.dtype.itemsize not in (2, 4, 8):
        raise InputError(f"{path}: cannot quantize a {arr.dtype} array (float16/32/64 expected)")
    if arr.ndim == 0 or arr.ndim > 4 or arr.size == 0:
        raise InputError(f"{path}: expected a non-empty array of 1 to 4 dimensions, got shape {arr.shape}")
    name = opts.name or os.path.splitext(os.path.basename(path))[0] or "tensor"
    check_tensor_name(name)
    src = T.F16 if arr.dtype == np.float16 else T.F32
    ne = tuple(int(d) for d in arr.shape[::-1])
    dst = opts.type
    warn = None
    if ne[0] % T.block_size(dst):
        dst = T.F16
        warn = f"{name}: row length {ne[0]} is not a multiple of {T.block_size(opts.type)}, writing f16"
    src_bytes = int(arr.size) * (2 if src == T.F16 else 4)
    tp = TensorPlan(0, name, ne, src, dst, 0, src_bytes, tensor_bytes(dst, ne), warn, src_path=path)
    kv = _file_type_kv(opts)
    plan = QuantizePlan(path, opts, [OutputFile(kv, [tp], GGUF_DEFAULT_ALIGNMENT)], [warn] if warn else [], npy=arr,
                        sources=[path])
    return _layout(plan)


def _layout(plan: QuantizePlan) -> QuantizePlan:
    """Tensor indices in write order, data offsets within each file."""
    for i, t in enumerate(plan.tensors):
        t.index = i
    for f in plan.files:
        off = 0
        for t in f.tensors:
            t.dst_offset = off
            off = T.pad(off + t.dst_bytes, f.alignment)
    return plan


def header_bytes(out: OutputFile | QuantizePlan) -> bytes:
    """GGUF v3 header, metadata and tensor infos of one output file (a plan's first), padded."""
    f = out.files[0] if isinstance(out, QuantizePlan) else out
    return W.header_bytes((raw for _, raw in f.kv), [(t.name, t.ne, t.dst_type, t.dst_offset) for t in f.tensors],
                          f.alignment)
