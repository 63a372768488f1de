"""The plan of a whole-model quantization: options, each tensor's type, the output layout and header.

Exists so the decisions can be read and tested apart from running them (`ggtool.quantize_model`).
Which type each tensor gets is llama.cpp's llama_tensor_get_type, ported in `.mix` (the file
types are `.ftypes`); here the pass runs over the tensors in llama.cpp's order, the requantize
refusal is applied, and the file is laid out as `llama_model_quantize` writes it:

* all metadata is copied verbatim (raw key/value bytes), except that ``general.quantization_version``
  (2) and ``general.file_type`` (the file type's id; COPY's: the input's, or llama.cpp's guess)
  are removed and appended last, as llama.cpp's gguf_set_val does, then each metadata override
  (KEY=TYPE:VALUE) likewise, then with prune_layers ``{arch}.block_count``; split keys are dropped;
* tensors are written in llama.cpp's order (non-block tensors by name, then ``blk.N.*`` by layer and
  name; prune_layers drops the pruned layers' tensors and renumbers the rest as llama.cpp's
  remap_layer); a tensor whose chosen type equals its source type is copied byte for byte;
* a split input (its first shard; the reader opens the rest) gives one file, or with keep_split as
  many files as it has shards, each with its shard's tensors in file order and the split keys set
  again, as llama-quantize writes them when asked to keep the split.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import numpy as np

from .. import quant as Q
from .. import types as T
from ..errors import GGToolError, ImatrixError, InputError, QuantizationError
from ..gguf_io import edit as E
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
from ..imatrix import Imatrix
from ..qtypes import REGISTRY
from ..user_regex import RegexError, shown
from .ftypes import FileType, file_type, guessed_file_type
from .mix import C, Choice, Mix, ModelInfo, TensorTypeOverride, category, fallback, requires_imatrix

GGML_QNT_VERSION = 2
RECORD_KEY = "quantize.tensor_types"   # the rules a size target chose (a string array), not llama.cpp's
GGUF_DEFAULT_ALIGNMENT = DEFAULT_ALIGNMENT
_G = T.GGMLType
# the tensor types ggtool writes with GGML's bytes (what a rule, a fallback or an option may choose):
# the float types and every block type of the registry (the legacy types, the K-quants, IQ*, TQ*, MXFP4)
WRITABLE = (T.F32, T.F16, T.BF16) + tuple(sorted(REGISTRY, key=int))


# llama_model_kv_override's tags and the GGUF types llama-quantize writes them as
KV_TYPES = {"int": W.UINT32, "float": W.FLOAT32, "bool": W.BOOL, "str": W.STRING}


@dataclass(frozen=True)
class KVOverride:
    """One metadata value set in the output (llama.cpp's llama_model_kv_override): `tag` is int,
    float, bool or str; written as UINT32 (of |value|), FLOAT32, BOOL or STRING, as llama.cpp does.
    Checked when made by set-metadata's own check (`gguf_io.edit.check_metadata`): what it refuses
    (a split key, gguf-py's header names, general.architecture other than a string, a bad
    general.alignment, an empty or non-UTF-8 key, a value its type cannot hold) is refused here in
    the same words. A general.alignment set so is honoured: the tensors are laid out for it."""

    key: str
    tag: str
    value: object

    def __post_init__(self):
        E.check_metadata(self.key, self.vtype, self.stored)

    @property
    def vtype(self) -> int:
        return KV_TYPES[self.tag]

    @property
    def stored(self):
        """The value as written: |value| for an int (llama.cpp's (uint32_t)std::abs)."""
        return abs(int(self.value)) if self.tag == "int" else self.value

    def raw(self) -> bytes:
        return W.kv_scalar(self.key, self.vtype, self.stored)


class OverrideSyntaxError(GGToolError):
    """A PATTERN=TYPE or KEY=TYPE:VALUE that does not parse: `text`, `what` ('tensor-type' or
    'kv'), `reason`."""

    kind = "override-syntax"

    def __init__(self, text: str, what: str, reason: str):
        self.text, self.what, self.reason = text, what, reason
        super().__init__(f"{text!r}: {reason}")


def parse_kv_override(text: str) -> KVOverride:
    """KEY=TYPE:VALUE as llama.cpp's string_parse_kv_override reads it (TYPE int, float, bool, str;
    a key under 128 bytes, a string of at most 127); the key and value then pass set-metadata's
    checks (MetadataEditError, in its words)."""
    key, sep, rest = text.partition("=")
    if sep:
        E.check_key(key)
    if not sep or len(key.encode()) >= 128:
        raise OverrideSyntaxError(text, "kv", "expected KEY=TYPE:VALUE with a key under 128 bytes")
    tag, colon, value = rest.partition(":")
    if not colon or tag not in KV_TYPES:
        raise OverrideSyntaxError(text, "kv", "TYPE must be int, float, bool or str (KEY=TYPE:VALUE)")
    if tag == "int":
        try:
            return KVOverride(key, tag, int(value))
        except ValueError:
            raise OverrideSyntaxError(text, "kv", f"{value!r} is not an integer") from None
    if tag == "float":
        return KVOverride(key, tag, E.parse_value(key, W.FLOAT32, value))
    if tag == "bool":
        if value not in ("true", "false"):
            raise OverrideSyntaxError(text, "kv", "a bool is true or false")
        return KVOverride(key, tag, value == "true")
    E.check_text(key, value)
    if len(value.encode()) > 127:
        raise OverrideSyntaxError(text, "kv", "a string value cannot exceed 127 bytes")
    return KVOverride(key, tag, value)


def parse_tensor_type_override(text: str) -> TensorTypeOverride:
    """PATTERN=TYPE as llama-quantize reads it: the pattern lower-cased, a regular expression
    searched in each tensor name; TYPE a tensor type ggtool writes."""
    pattern, sep, tname = text.partition("=")
    if not sep or not pattern or not tname:
        raise OverrideSyntaxError(text, "tensor-type", "expected PATTERN=TYPE")
    try:
        return TensorTypeOverride(pattern.lower(), parse_target_type(tname))
    except RegexError as e:
        raise OverrideSyntaxError(text, "tensor-type", str(e)) from None


# a tensor type file holds PATTERN=TYPE words; one this large is no such list (a mistaken path)
TENSOR_TYPE_FILE_MAX = 1 << 20


class TensorTypeFileError(GGToolError):
    """A tensor type file (llama-quantize's tensor-type-file option) that cannot be used: `path`,
    `reason`, and for a bad word its `line` (1-based) and `word`."""

    kind = "tensor-type-file"

    def __init__(self, path: str, reason: str, line: int | None = None, word: str | None = None):
        self.path, self.reason, self.line, self.word = path, reason, line, word
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {reason}")


def read_tensor_type_file(path: str | os.PathLike) -> list[TensorTypeOverride]:
    """The PATTERN=TYPE rules of a tensor type file, as llama-quantize's parse_tensor_type_file
    reads it: words separated by spaces or newlines (``file >> word``), each PATTERN=TYPE as
    a tensor-type rule takes it, in order; none is no rule. The file is read whole, so it must be a
    regular file (a symlink to one is followed) of at most 1 MiB of UTF-8 text."""
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except OSError as e:
        raise TensorTypeFileError(p, e.strerror or str(e)) from None
    import stat as S
    if not S.S_ISREG(st.st_mode):
        raise TensorTypeFileError(p, "not a regular file (a list of PATTERN=TYPE words is expected)")
    if st.st_size > TENSOR_TYPE_FILE_MAX:
        raise TensorTypeFileError(p, f"{st.st_size:,} bytes, over the {TENSOR_TYPE_FILE_MAX:,} a list of PATTERN=TYPE "
                                     "words may have")
    try:
        with open(p, "rb") as f:
            data = f.read(TENSOR_TYPE_FILE_MAX + 1)
    except OSError as e:
        raise TensorTypeFileError(p, e.strerror or str(e)) from None
    if len(data) > TENSOR_TYPE_FILE_MAX:
        raise TensorTypeFileError(p, f"over the {TENSOR_TYPE_FILE_MAX:,} bytes a list of PATTERN=TYPE words may have")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise TensorTypeFileError(p, "not UTF-8 text", line) from None
    rules = []
    for n, line in enumerate(text.splitlines(), 1):
        for word in line.split():
            try:
                rules.append(parse_tensor_type_override(word))
            except (OverrideSyntaxError, TargetTypeError) as e:
                raise TensorTypeFileError(p, f"{word!r}: {e.reason if isinstance(e, OverrideSyntaxError) else e}",
                                          n, word) from None
    return rules


class PruneLayersError(GGToolError):
    """A prune-layers list that does not parse: `text`, `reason`."""

    kind = "prune-layers"

    def __init__(self, text: str, reason: str):
        self.text, self.reason = text, reason
        super().__init__(f"{text!r}: {reason}")


def parse_prune_layers(text: str) -> tuple[int, ...]:
    """L0,L1,... as llama-quantize's parse_layer_prune takes it: layer numbers 0 or more, sorted,
    each once (a word that is not a whole number is refused, where std::stoi would read its digits)."""
    out = []
    for word in text.split(","):
        w = word.strip()
        if not w.isdigit():
            raise PruneLayersError(text, f"invalid layer number {word!r} (expected L0,L1,... of numbers 0 or more)")
        out.append(int(w))
    return tuple(sorted(set(out)))


_BLK = re.compile(r"blk\.(\d+)\.")


def prune_layers(names: list[str], prune: tuple[int, ...]) -> tuple[dict[str, str | None], int]:
    """llama.cpp's remap_layer over the tensor names in its order: ({old name: new name, or None
    for a pruned layer's tensor}, the new block count). A layer below the first pruned keeps its
    number; every later one that is kept takes the next number. Without `prune`: every name kept."""
    if not prune:
        return {n: n for n in names}, 0
    mapped: dict[int, str | None] = {}
    next_id = 0
    out: dict[str, str | None] = {}
    for name in names:
        m = _BLK.search(name)
        if not m:
            out[name] = name
            continue
        blk = int(m.group(1))
        if blk not in mapped:
            if blk in prune:
                mapped[blk] = None
            elif blk < prune[0]:
                mapped[blk], next_id = str(blk), blk + 1
            else:
                mapped[blk], next_id = str(next_id), next_id + 1
        new = mapped[blk]
        out[name] = None if new is None else name[:m.start(1)] + new + name[m.end(1):]
    return out, next_id


@dataclass
class QuantizeOptions:
    """llama_model_quantize_params, as ggtool takes them: `type` is a file type (a FileType, its
    name or alias, or a tensor type naming one: q4_K is Q4_K_M); the rest as llama-quantize's."""

    type: FileType | str | T.GGMLType = "Q4_0"
    pure: bool = False
    leave_output_tensor: bool = False
    output_tensor_type: T.GGMLType | None = None
    token_embedding_type: T.GGMLType | None = None
    tensor_types: list[TensorTypeOverride] = field(default_factory=list)   # PATTERN=TYPE, first match wins
    kv_overrides: list[KVOverride] = field(default_factory=list)
    threads: int = 1
    name: str | None = None        # tensor name for a .npy input
    allow_requantize: bool = False  # quantize tensors that are already quantized (llama.cpp's flag)
    keep_split: bool = False       # a split input gives as many output files, the same tensors in each
    imatrix: Imatrix | None = None  # importance matrix (ggtool.imatrix): the weighted quantizers
    dry_run: bool = False          # plan only: a missing required importance matrix is a refusal kept in the plan
    # PATTERN=TYPE lines written under quantize.tensor_types (a size target's chosen rules); none: no key
    recorded_tensor_types: tuple[str, ...] = ()
    prune_layers: tuple[int, ...] = ()   # layers (blk.N) removed, the others renumbered (llama-quantize's)

    def __post_init__(self):
        self.type = file_type(self.type)
        self.prune_layers = tuple(sorted(set(int(n) for n in self.prune_layers)))
        if any(n < 0 for n in self.prune_layers):
            raise PruneLayersError(",".join(map(str, self.prune_layers)), "a layer number is 0 or more")


class RequantizeError(QuantizationError):
    """A tensor that is already quantized would be quantized again, which was not allowed:
    `tensor` (the first), its `src_type`, the `dst_type` it would get, `count` such tensors."""

    kind = "requantize"

    def __init__(self, tensor: str, src_type: T.GGMLType, dst_type: T.GGMLType, count: int):
        self.tensor, self.src_type, self.dst_type, self.count = tensor, src_type, dst_type, count
        super().__init__(f"tensor '{tensor}' is already quantized ({T.type_name(src_type)}): requantizing it to "
                         f"{T.type_name(dst_type)} adds a second rounding error to the first ({count} tensor"
                         f"{'s' if count != 1 else ''} of this model would be requantized)")


class ImatrixRequiredError(QuantizationError):
    """A tensor of this file type cannot be quantized without an importance matrix (llama.cpp's
    tensor_requires_imatrix): `tensor` (the first), `type` (its target), `file_type` (the file
    type's name: IQ2_XXS, Q2_K_S, ...), `missing_entry` (an importance matrix was given but has no
    entry for it)."""

    kind = "imatrix-required"

    def __init__(self, tensor: str, type: T.GGMLType, missing_entry: bool = False, file_type: str = ""):
        self.tensor, self.type, self.missing_entry, self.file_type = tensor, type, missing_entry, file_type
        ft = f"file type {file_type}" if file_type else "this quantization"
        if missing_entry:
            msg = (f"{ft}: the importance matrix has no entry for tensor '{tensor}' ({T.type_name(type)}), "
                   "which would be garbage without one (llama.cpp refuses it)")
        else:
            msg = (f"{ft} needs an importance matrix: tensor '{tensor}' ({T.type_name(type)}) would be garbage "
                   "without one (llama.cpp refuses it)")
        super().__init__(msg)


class TargetTypeError(GGToolError):
    """A tensor type ggtool cannot write: `name` as given, `type` if it names one, `choices`."""

    CHOICES = tuple(T.type_name(t) for t in WRITABLE)

    def __init__(self, name: str, type: T.GGMLType | None, choices: tuple[str, ...] = CHOICES):
        self.name, self.type, self.choices = name, type, choices
        super().__init__(f"cannot write tensor type {name!r}; use one of {', '.join(choices)}")


@dataclass
class TensorPlan:
    """What happens to one tensor. `ne` in ggml order; `src_offset` absolute in `src_path` (the
    input, or the shard of a split input, holding its data). `reasons` say what moved its type
    from the file type's default; `fallback` is llama.cpp's warning when its rows took a fallback."""

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
    reasons: tuple[str, ...] = ()
    fallback: str | None = None
    imatrix: np.ndarray | None = field(default=None, repr=False)   # importances (per column; per expert)

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
    kept_split: bool = False             # keep_split of a GGUF: shards named PREFIX-0000k-of-0000n.gguf, even one
    refusals: list[GGToolError] = field(default_factory=list)   # a dry run's: what the real run raises at once

    @property
    def tensors(self) -> list[TensorPlan]:
        return [t for f in self.files for t in f.tensors]

    @property
    def kv(self) -> list[tuple[str, bytes]]:
        return self.files[0].kv

    @property
    def alignment(self) -> int:
        return self.files[0].alignment

    @property
    def file_type_id(self) -> int | None:
        """general.file_type as written (COPY's is the input's; a metadata override's wins), None if
        an override made it other than a UINT32."""
        raw = dict(self.kv).get("general.file_type")
        if raw is None or int.from_bytes(raw[-8:-4], "little") != W.UINT32:
            return None
        return int.from_bytes(raw[-4:], "little")

    def output_paths(self, output: str) -> list[str]:
        """OUTPUT itself, or the shards named after it (llama-quantize's names for kept splits)."""
        n = len(self.files)
        if n == 1 and not self.kept_split:
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

    @property
    def n_fallback(self) -> int:
        return sum(t.fallback is not None for t in self.tensors)

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


# ------------------------------------------------------------------------------------------- the types

def parse_target_type(name: str) -> T.GGMLType:
    """A tensor type given by name (for the output, the token embedding, a pattern): one ggtool
    writes with GGML's bytes (TargetTypeError if not)."""
    try:
        t = T.parse_type(name)
    except GGToolError:
        t = None
    if t not in WRITABLE:
        raise TargetTypeError(name, t)
    return t


def new_mix(opts: QuantizeOptions, model: ModelInfo, names: list[str], *, has_imatrix: bool = False) -> Mix:
    """The type pass of llama_model_quantize for these options over a model's tensor names."""
    return Mix(opts.type, model, names, pure=opts.pure, leave_output=opts.leave_output_tensor,
               output_type=opts.output_tensor_type, token_embd_type=opts.token_embedding_type,
               overrides=list(opts.tensor_types), has_imatrix=has_imatrix)


def _checked(name: str, choice: Choice) -> Choice:
    if choice.type not in WRITABLE:
        raise QuantizationError(f"tensor '{name}': cannot quantize to {T.type_name(choice.type)} (not implemented)")
    return choice


# ------------------------------------------------------------------------------------------ the plan

def _file_type_kv(opts: QuantizeOptions, file_type_id: int | None = None) -> list[tuple[str, bytes]]:
    """general.quantization_version and general.file_type (the file type's id, or `file_type_id`:
    COPY's), set last as llama.cpp's gguf_set_val_u32 does, then the overrides, each removed where
    it was and set last."""
    fid = opts.type.id if file_type_id is None else file_type_id
    kv = [("general.quantization_version", W.kv_u32("general.quantization_version", GGML_QNT_VERSION)),
          ("general.file_type", W.kv_u32("general.file_type", fid))]
    for o in _overrides(opts):
        kv = [(k, raw) for k, raw in kv if k != o.key] + [(o.key, o.raw())]
    if opts.recorded_tensor_types:
        kv.append((RECORD_KEY, W.kv_string_array(RECORD_KEY, opts.recorded_tensor_types)))
    return kv


def _overrides(opts: QuantizeOptions) -> list[KVOverride]:
    """The metadata set last: the options' overrides, then (as llama-quantize adds them after) the
    keys that record the importance matrix."""
    extra = [] if opts.imatrix is None else [KVOverride(k, "str" if isinstance(v, str) else "int", v)
                                             for k, v in opts.imatrix.metadata().items()]
    return list(opts.kv_overrides) + extra


def _alignment(opts: QuantizeOptions, default: int) -> int:
    """The output's alignment: an override of general.alignment (checked when made), else `default`."""
    return next((int(o.stored) for o in reversed(opts.kv_overrides) if o.key == E.ALIGNMENT_KEY), default)


def _is_npy(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(6) == b"\x93NUMPY"


def _model_info(g, opts: QuantizeOptions) -> ModelInfo:
    """The model's shape from its metadata, the overrides applied (llama.cpp's loader sees them)."""
    over = {o.key: o.value for o in opts.kv_overrides}
    return ModelInfo.from_metadata(lambda key, default: over[key] if key in over else g.metadata(key, default))


def plan_quantization(input_path: str | os.PathLike, opts: QuantizeOptions) -> QuantizePlan:
    """Decide every tensor's type and the output layout (nothing is read but headers)."""
    path = os.fspath(input_path)
    try:
        npy = _is_npy(path)
    except OSError as e:
        raise InputError(f"{path}: {e.strerror}") from None
    if npy:
        return _plan_npy(path, opts)
    from ..gguf_io import GGUFFile  # gguf-py loads only for a GGUF input

    g = GGUFFile(path)                 # the first shard of a split model opens them all
    alignment = _alignment(opts, g.alignment)
    if alignment == g.alignment:
        check_write_alignment(alignment, path)
    drop = {"general.quantization_version", "general.file_type", *SPLIT_KEYS}
    raw = g.reader.data
    kv = [(k, bytes(raw[s:e])) for k, (s, e) in g.reader.kv_spans.items() if k not in drop]
    replaced = {o.key for o in _overrides(opts)} | ({RECORD_KEY} if opts.recorded_tensor_types else set())
    split = opts.keep_split
    # llama.cpp's order: by layer and name, or (keeping a split, even of one file) shard by shard in
    # file order
    by_name = sorted(g.tensors.values(), key=lambda t: _llama_order(t.name))
    order = [g.tensors[n] for s in g.shards for n in s.own_tensors] if split else by_name
    file_type_id = None
    if opts.type.copy:
        # COPY writes the file type llama.cpp's loader sees: the input's general.file_type (an
        # --override-kv of it applied), else its guess from the tensor types
        over = {o.key: o.value for o in opts.kv_overrides}
        given = over.get("general.file_type", g.metadata("general.file_type", None))
        try:
            file_type_id = int(given) & 0xFFFFFFFF
        except (TypeError, ValueError):
            file_type_id = guessed_file_type(t.type for t in by_name)
    kv = [(k, b) for k, b in kv if k not in replaced] + _file_type_kv(opts, file_type_id)
    # --prune-layers: the pruned layers' tensors dropped, the others renumbered (names below are
    # the new ones; the importance matrix is looked up by the old), block_count set last
    renamed, n_blocks = prune_layers([t.name for t in by_name], opts.prune_layers)
    if opts.prune_layers:
        bc = f"{g.metadata('general.architecture', '')}.block_count"
        kv = [(k, b) for k, b in kv if k != bc] + [(bc, W.kv_u32(bc, n_blocks))]
    order = [t for t in order if renamed[t.name] is not None]
    mix = new_mix(opts, _model_info(g, opts), [renamed[t.name] for t in order], has_imatrix=opts.imatrix is not None)
    plans, warnings, requant, refusals = {}, [], [], []
    for info in order:
        name = renamed[info.name]
        c = _checked(name, mix.choose(name, info.ne, info.type))
        if c.type != info.type and T.is_quantized(info.type):
            requant.append((name, info.type, c.type))
        if c.type != info.type and not Q.can_dequantize(info.type):
            raise QuantizationError(f"tensor '{name}': cannot dequantize {T.type_name(info.type)}")
        w, warn = (_importances(opts, name, info.ne, c.type, refusals, lookup=info.name) if c.type != info.type
                   else (None, None))
        if warn:
            warnings.append(warn)
        plans[info.name] = TensorPlan(0, name, info.ne, info.type, c.type, info.offset, info.n_bytes,
                                      tensor_bytes(c.type, info.ne), warn, src_path=info.path, reasons=c.reasons,
                                      fallback=c.fallback, imatrix=w)
    warnings += [f"tensor-type pattern {shown(o.pattern)} gives no tensor its type (it matches none of the tensors "
                 "quantized, or an earlier pattern matched them first)" for o in mix.unused_overrides()]
    if requant and not opts.allow_requantize:
        # llama.cpp's llama_model_quantize refuses to quantize a tensor that is already quantized
        # unless allow_requantize is set: the second rounding adds to the first, silently
        raise RequantizeError(*requant[0], len(requant))
    if split:
        # llama-quantize keeping the split: shard k gets shard k's tensors in file order; the first
        # carries the metadata, every one the split keys (later shards: the default alignment). Of
        # a single file it writes PREFIX-00001-of-00001.gguf without split keys (llama_model_quantize
        # sets them only for 2 or more)
        n = len(g.shards)
        files = [OutputFile((kv if k == 0 else []) + (_split_kv(k, n, len(plans)) if n > 1 else []),
                            [plans[name] for name in s.own_tensors if name in plans],
                            alignment if k == 0 else GGUF_DEFAULT_ALIGNMENT)
                 for k, s in enumerate(g.shards)]
    else:
        files = [OutputFile(kv, list(plans.values()), alignment)]
    return _layout(QuantizePlan(path, opts, files, warnings, sources=g.paths, kept_split=split, refusals=refusals))


def _importances(opts: QuantizeOptions, name: str, ne, t: T.GGMLType, refusals: list[GGToolError],
                 lookup: str | None = None) -> tuple[np.ndarray | None, str | None]:
    """(the tensor's importances or None, a warning or None), as llama_model_quantize looks them up
    for a tensor it converts: no entry is a warning (quantized without), an entry of another size
    an error (the token embeddings excepted: a warning), a type that needs one and has none an
    error (in a dry run, which completes as llama-quantize's does, it joins `refusals`). `lookup`:
    the entry's name where it is not the tensor's (a layer renumbered by prune_layers)."""
    w, warn = None, None
    if opts.imatrix is not None:
        try:
            w = opts.imatrix.weights_for(lookup or name, tuple(ne))
        except ImatrixError:
            if category(name) is not C.TOKEN_EMBD:
                raise
            warn = f"{name}: the importance matrix's entry has another size than the tensor's rows; quantized without it"
        if w is None and warn is None:
            warn = f"did not find importance weights for {name}; quantized without"
    if w is None and requires_imatrix(name, t, opts.type):
        refusal = ImatrixRequiredError(name, t, missing_entry=opts.imatrix is not None, file_type=opts.type.name)
        if not opts.dry_run:
            raise refusal
        refusals.append(refusal)
    return w, warn


def _plan_npy(path: str, opts: QuantizeOptions) -> QuantizePlan:
    """One array: the file type's default tensor type (its fallback where the rows need one)."""
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
    dst, warn = (src, None) if opts.type.copy else fallback(name, opts.type.default, ne[0])
    src_bytes = int(arr.size) * (2 if src == T.F16 else 4)
    tp = TensorPlan(0, name, ne, src, dst, 0, src_bytes, tensor_bytes(dst, ne), src_path=path, fallback=warn)
    kv = _file_type_kv(opts, guessed_file_type([src]) if opts.type.copy else None)
    plan = QuantizePlan(path, opts, [OutputFile(kv, [tp], _alignment(opts, GGUF_DEFAULT_ALIGNMENT))], [], npy=arr,
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
