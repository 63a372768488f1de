"""llama.cpp's file types (enum llama_ftype) that ggtool writes: their names, ids and default tensor types.

A file type is what llama-quantize's TYPE argument names: Q4_K_M is not a tensor type but a mix of
them (``.mix`` says which tensor gets which), written with ``general.file_type`` = its id. Kept
apart from the mix so that the names a user may give, their aliases and the ids written are one
table, checked against llama.cpp's (tools/quantize/quantize.cpp's QUANT_OPTIONS,
llama_ftype_get_default_type) by tests.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import types as T
from ..errors import GGToolError

_G = T.GGMLType


@dataclass(frozen=True)
class FileType:
    """One llama_ftype: `name` as llama-quantize spells it, `id` (general.file_type), `default`
    the tensor type its weights get before the mix's rules (llama_ftype_get_default_type)."""

    name: str
    id: int
    default: T.GGMLType
    copy: bool = False      # COPY: every tensor copied unchanged (general.file_type: the input's)

    def __str__(self) -> str:
        return self.name

    @property
    def quantized(self) -> bool:
        """A block-type file (the mix's rules and fallbacks apply), not F32/F16/BF16 nor COPY."""
        return T.is_quantized(self.default) and not self.copy


# llama-quantize's order (QUANT_OPTIONS), limited to the file types whose tensor types ggtool writes
# (all but Q1_0 and Q2_0); ids are enum llama_ftype's, defaults llama_ftype_get_default_type's (IQ2_S
# is mostly iq2_xs, IQ2_M iq2_s, IQ3_XS and IQ3_M iq3_s: their rules move tensors up from there)
FILE_TYPES = (
    FileType("Q4_0", 2, T.Q4_0), FileType("Q4_1", 3, _G.Q4_1),
    FileType("MXFP4_MOE", 38, _G.MXFP4),
    FileType("Q5_0", 8, _G.Q5_0), FileType("Q5_1", 9, _G.Q5_1),
    FileType("IQ2_XXS", 19, _G.IQ2_XXS), FileType("IQ2_XS", 20, _G.IQ2_XS),
    FileType("IQ2_S", 28, _G.IQ2_XS), FileType("IQ2_M", 29, _G.IQ2_S),
    FileType("IQ1_S", 24, _G.IQ1_S), FileType("IQ1_M", 31, _G.IQ1_M),
    FileType("TQ1_0", 36, _G.TQ1_0), FileType("TQ2_0", 37, _G.TQ2_0),
    FileType("Q2_K", 10, _G.Q2_K), FileType("Q2_K_S", 21, _G.Q2_K),
    FileType("IQ3_XXS", 23, _G.IQ3_XXS), FileType("IQ3_S", 26, _G.IQ3_S), FileType("IQ3_M", 27, _G.IQ3_S),
    FileType("IQ3_XS", 22, _G.IQ3_S),
    FileType("Q3_K_S", 11, _G.Q3_K), FileType("Q3_K_M", 12, _G.Q3_K), FileType("Q3_K_L", 13, _G.Q3_K),
    FileType("IQ4_NL", 25, _G.IQ4_NL), FileType("IQ4_XS", 30, _G.IQ4_XS),
    FileType("Q4_K_S", 14, _G.Q4_K), FileType("Q4_K_M", 15, _G.Q4_K),
    FileType("Q5_K_S", 16, _G.Q5_K), FileType("Q5_K_M", 17, _G.Q5_K),
    FileType("Q6_K", 18, _G.Q6_K), FileType("Q8_0", 7, T.Q8_0),
    FileType("F16", 1, T.F16), FileType("BF16", 32, T.BF16), FileType("F32", 0, T.F32),
    # llama-quantize's COPY (only_copy): no tensor converted; its id is none of its own (the
    # written general.file_type is the input's, `guessed_file_type` where it has none)
    FileType("COPY", 0, T.F32, copy=True),
)
BY_NAME = {f.name: f for f in FILE_TYPES}
# llama-quantize's aliases: the K tensor types name their _M file types
ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}


class FileTypeError(GGToolError):
    """A file type ggtool does not write: `name` as given, `choices` (llama-quantize's names)."""

    kind = "file-type"

    def __init__(self, name: str):
        self.name = name
        self.choices = tuple(f.name for f in FILE_TYPES)
        super().__init__(f"unknown file type {name!r}; use one of {', '.join(self.choices)} "
                         f"(or the aliases {', '.join(f'{a} = {b}' for a, b in ALIASES.items())})")


# llama_model_loader's guess of a file's type from its most common tensor type (ORed with
# LLAMA_FTYPE_GUESSED, 1024): what COPY writes for an input without general.file_type
_GUESS = {T.F32: 0, T.F16: 1, T.BF16: 32, T.Q4_0: 2, _G.Q4_1: 3, _G.Q5_0: 8, _G.Q5_1: 9, T.Q8_0: 7, _G.Q2_K: 10,
          _G.Q3_K: 12, _G.Q4_K: 15, _G.Q5_K: 17, _G.Q6_K: 18, _G.TQ1_0: 36, _G.TQ2_0: 37, _G.IQ2_XXS: 19,
          _G.IQ2_XS: 20, _G.IQ2_S: 28, _G.IQ3_XXS: 23, _G.IQ1_S: 24, _G.IQ1_M: 31, _G.IQ4_NL: 25, _G.IQ4_XS: 30,
          _G.IQ3_S: 26, _G.NVFP4: 39, _G.Q1_0: 40}
GUESSED = 1024


def guessed_file_type(types) -> int:
    """llama.cpp's guess of general.file_type from the tensor types in its order (the type that
    first reaches the largest count; an unknown one is ALL_F32), | LLAMA_FTYPE_GUESSED."""
    counts: dict = {}
    best, n_best = T.F32, 0
    for t in types:
        counts[t] = counts.get(t, 0) + 1
        if counts[t] > n_best:
            best, n_best = t, counts[t]
    return _GUESS.get(best, 0) | GUESSED


def file_type(spec: FileType | str | T.GGMLType) -> FileType:
    """The file type `spec` names: a FileType, a name or alias (any case), or a tensor type (the file
    type of that name: q4_K is Q4_K_M, as llama-quantize's alias)."""
    if isinstance(spec, FileType):
        return spec
    name = T.type_name(spec) if isinstance(spec, T.GGMLType) else str(spec)
    key = name.upper()
    key = ALIASES.get(key, key)
    if key not in BY_NAME:
        raise FileTypeError(name)
    return BY_NAME[key]
