"""Which tensor type each tensor of a model gets in a file type: llama.cpp's llama_tensor_get_type
(llama-quant.cpp), for the file types of ``.ftypes``.

One pass over the tensors in the order they are written (`Mix.choose` per tensor), because the
rules count: the n-th attn_v (``i_attention_wv`` of ``n_attention_wv``) and the layer of each
ffn_down decide the K mixes' bumps (``use_more_bits``).  In that order, per tensor:

1. ``allows_quantization``: only ``*weight`` tensors of 2+ dims (ggml_n_dims), never norms, expert
   gates, positional embeddings and the other small or special tensors llama.cpp names; the rest
   keeps its type (COPY: every tensor keeps it);
2. a token embedding / output type given in the options wins outright;
3. a quantized file type: the first tensor-type pattern (``re.search``, llama.cpp's regex_search)
   that matches gives the type; else, unless pure, the file type's rules (the tables below:
   output and tied embedding, the token embedding, attn_v and kin, attn_k, attn_q, ffn_down,
   attn_output, ffn_gate/ffn_up); then the fallback
   for rows its blocks do not divide (``FALLBACK``).  F16/BF16/F32 files have no rules.

Every choice says why (`Choice.reasons`), and a fallback carries llama.cpp's warning.  The model's
shape (`ModelInfo`: architecture, layers, heads, experts) comes from its metadata, as llama.cpp's
hparams do.  Every file type of ``.ftypes`` has its branches here, the IQ and TQ file types' too:
the very-low-bit group (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ2_M, `IQ_LOW`) has a chain of its
own that comes before the others (its attn_v, ffn_down and attn_output bumps; no 70B or 8-expert
q8_0 bump), IQ3_XXS and IQ4_NL/IQ4_XS look at whether an importance matrix is given, MXFP4_MOE
gives the experts' 3-d tensors mxfp4 and everything else q8_0.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from .. import types as T
from ..errors import QuantizationError
from ..user_regex import UserRegex
from .ftypes import FileType

_G = T.GGMLType
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 = T.Q4_0, _G.Q4_1, _G.Q5_0, _G.Q5_1, T.Q8_0
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K = _G.Q2_K, _G.Q3_K, _G.Q4_K, _G.Q5_K, _G.Q6_K
IQ2_XXS, IQ2_S, IQ3_XXS, IQ3_S = _G.IQ2_XXS, _G.IQ2_S, _G.IQ3_XXS, _G.IQ3_S

# the very-low-bit file types: a chain of rules of their own (llama_tensor_get_type_impl's
# "ftype == IQ2_XXS || IQ2_XS || IQ1_S || IQ2_S || IQ2_M || IQ1_M" branch)
IQ_LOW = ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ2_S", "IQ2_M", "IQ1_M")
# ... and those whose output (or tied embedding) gets q5_K instead of q6_K: IQ3_XXS too
IQ_LOW_OUTPUT = IQ_LOW + ("IQ3_XXS",)


# ----------------------------------------------------------------------------------- which tensors

# substrings (and exact names) of tensors never quantized (tensor_allows_quantization)
SKIP_SUBSTR = ("_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel",
               "per_layer_model_proj", "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight",
               "indexer.q_proj.weight", "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight",
               "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight",
               "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight",
               "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
               "time_mix_lerp_fused.weight", "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.",
               "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger", "a.rvq.codebook", "mm.a.code_embd")
SKIP_NAMES = ("position_embd.weight", "token_types.weight")
SKIP_SUBSTR_BY_ARCH = {"glm5-next": ("hc_", "indexer.attn_q_b", "indexer.attn_k", "indexer.proj",
                                     "indexer_compressor_gate", "indexer_compressor_ape", "ssm_f_a.weight",
                                     "ssm_f_b.weight", "ssm_g_a.weight", "ssm_g_b.weight", "ssm_beta.weight",
                                     "attn_kv_a_mqa.weight", "attn_k_b.weight", "attn_v_b.weight")}


def allows_quantization(name: str, ne, arch: str = "", *, leave_output: bool = False) -> bool:
    """llama.cpp's tensor_allows_quantization: whether a tensor may get another type at all."""
    if T.n_dims(ne) < 2 or not name.endswith("weight"):
        return False
    if leave_output and name == "output.weight":
        return False
    skip = SKIP_SUBSTR + SKIP_SUBSTR_BY_ARCH.get(arch, ())
    return not any(s in name for s in skip) and name not in SKIP_NAMES


class Category(Enum):
    """tensor_category: broad roles by name, the keys of the rules."""

    TOKEN_EMBD = "token_embd"
    ATTN_Q = "attn_q"
    ATTN_V = "attn_v"
    ATTN_K = "attn_k"
    ATTN_QKV = "attn_qkv"
    ATTN_KV_B = "attn_kv_b"
    ATTN_OUTPUT = "attn_output"
    FFN_UP = "ffn_up"
    FFN_GATE = "ffn_gate"
    FFN_DOWN = "ffn_down"
    OUTPUT = "output"
    OTHER = "other"


C = Category
# tensor_get_category after the exact names: the first substring found decides
_CATEGORY_SUBSTR = (("attn_qkv.weight", C.ATTN_QKV), ("attn_kv_b.weight", C.ATTN_KV_B), ("attn_v.weight", C.ATTN_V),
                    ("attn_k.weight", C.ATTN_K), ("attn_q.weight", C.ATTN_Q), ("attn_output.weight", C.ATTN_OUTPUT),
                    ("ffn_up", C.FFN_UP), ("ffn_gate", C.FFN_GATE), ("ffn_down", C.FFN_DOWN))
# category_is_attn_v: the tensors the attn_v rules and counter cover
ATTN_V_LIKE = (C.ATTN_V, C.ATTN_QKV, C.ATTN_KV_B)


def category(name: str) -> Category:
    if name == "output.weight":
        return C.OUTPUT
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return C.TOKEN_EMBD
    return next((c for s, c in _CATEGORY_SUBSTR if s in name), C.OTHER)


# --------------------------------------------------------------------------------------- the model

# architectures llama.cpp calls LLM_TYPE_70B (its one size the rules use): layers -> condition
_70B = {"llama": (80, lambda m: m.n_head != m.n_head_kv and m.n_expert != 8), "qwen2": (80, None),
        "deci": (80, None), "olmo": (80, None), "jais2": (68, None)}


@dataclass(frozen=True)
class ModelInfo:
    """What the rules know of the model (llama.cpp's hparams): `n_layer` is `{arch}.block_count`
    (n_layer_all, what the ffn layer counters count to), heads of layer 0, `n_expert`."""

    arch: str = ""
    n_layer: int = 0
    n_head: int = 0
    n_head_kv: int = 0
    n_expert: int = 0
    n_layer_nextn: int = 0

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv if self.n_head_kv else 0

    @property
    def is_70b(self) -> bool:
        layers, cond = _70B.get(self.arch, (None, None))
        return self.n_layer - self.n_layer_nextn == layers and (cond is None or cond(self))

    @classmethod
    def from_metadata(cls, get: Callable[[str, object], object]) -> ModelInfo:
        """From GGUF metadata, `get(key, default)` (head counts may be per-layer arrays: layer 0's)."""
        arch = str(get("general.architecture", "") or "")

        def num(key: str, default: int = 0) -> int:
            v = get(f"{arch}.{key}", default)
            if isinstance(v, (list, tuple)) or getattr(v, "ndim", 0):
                v = list(v)[0] if len(v) else default
            try:
                return int(v)
            except (TypeError, ValueError):
                return default

        n_head = num("attention.head_count")
        return cls(arch, num("block_count"), n_head, num("attention.head_count_kv", n_head), num("expert_count"),
                   num("nextn_predict_layers"))


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers, and every third between."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


# ------------------------------------------------------------------------------ the rules, as tables
# Each entry: file type name -> rule(ctx) giving (type, why) or None (keep the default). llama.cpp's
# if/else-if chains test each of these file types once per category, so a table keyed by it is the
# same chain.  `Ctx` carries the counter, the layer and the model.


@dataclass(frozen=True)
class Ctx:
    i: int            # i_attention_wv (attn_v rules) or the tensor's layer (ffn rules)
    n: int            # n_attention_wv or n_layer
    model: ModelInfo
    has_imatrix: bool = False


def _more_bits(to: T.GGMLType):
    return lambda c: (to, f"use_more_bits({c.i}, {c.n})") if use_more_bits(c.i, c.n) else None


ATTN_V_RULES: dict[str, Callable[[Ctx], tuple[T.GGMLType, str] | None]] = {
    "Q2_K": lambda c: (Q4_K, "n_gqa >= 4") if c.model.n_gqa >= 4 else (Q3_K, "Q2_K's attn_v"),
    "Q2_K_S": lambda c: (Q4_K, "n_gqa >= 4") if c.model.n_gqa >= 4 else None,
    "IQ3_XXS": lambda c: ((Q4_K, "n_gqa >= 4") if c.model.n_gqa >= 4 else
                          (IQ3_S, "no importance matrix") if not c.has_imatrix else (IQ3_XXS, "IQ3_XXS's attn_v")),
    "IQ3_XS": lambda c: (Q4_K, "n_gqa >= 4") if c.model.n_gqa >= 4 else None,
    "IQ3_S": lambda c: (Q4_K, "n_gqa >= 4") if c.model.n_gqa >= 4 else None,
    "IQ3_M": lambda c: (Q4_K, "IQ3_M's attn_v"),
    "Q3_K_M": lambda c: (Q5_K, f"one of the first 2 ({c.i})") if c.i < 2 else (Q4_K, "Q3_K_M's attn_v"),
    "Q3_K_L": lambda c: (Q5_K, "Q3_K_L's attn_v"),
    "IQ4_NL": lambda c: (Q5_K, "n_gqa >= 4") if c.model.n_gqa >= 4 else None,
    "IQ4_XS": lambda c: (Q5_K, "n_gqa >= 4") if c.model.n_gqa >= 4 else None,
    "Q4_K_M": _more_bits(Q6_K),
    "Q5_K_M": _more_bits(Q6_K),
    "Q4_K_S": lambda c: (Q5_K, f"one of the first 4 ({c.i})") if c.i < 4 else None,
}

# attn_k and attn_q (no 8-expert model: its attn_k is q8_0 before these)
ATTN_K_RULES = {"IQ3_XS": (IQ3_XXS, "IQ3_XS's attn_k"), "IQ3_XXS": (IQ2_S, "IQ3_XXS's attn_k")}
ATTN_Q_RULES = {"IQ3_XS": (IQ3_XXS, "IQ3_XS's attn_q"), "IQ3_XXS": (IQ2_S, "IQ3_XXS's attn_q")}
# the token embedding when it is not the output (tied embeddings take the output rule)
TOKEN_EMBD_RULES = {**{f: Q2_K for f in ("IQ2_XXS", "IQ2_XS", "IQ1_S", "IQ1_M")},
                    **{f: IQ3_S for f in ("IQ2_S", "IQ2_M", "IQ3_XXS")}, "TQ1_0": Q4_K, "TQ2_0": Q4_K}


def _ffn_down_q3_k_m(c: Ctx):
    if c.i < c.n // 16:
        return Q5_K, f"layer {c.i} < {c.n}/16"
    if c.model.arch != "falcon" or use_more_bits(c.i, c.n):
        return Q4_K, "Q3_K_M's ffn_down"
    return Q3_K, "falcon"


def _ffn_down_q4_k_m(c: Ctx):
    if c.model.arch == "falcon":
        if c.i < c.n // 16:
            return Q6_K, f"falcon, layer {c.i} < {c.n}/16"
        return (Q5_K, f"falcon, use_more_bits({c.i}, {c.n})") if use_more_bits(c.i, c.n) else None
    return _more_bits(Q6_K)(c)


def _ffn_down_iq3_m(c: Ctx):
    if c.i < c.n // 8:
        return Q4_K, f"layer {c.i} < {c.n}/8"
    if c.model.n_expert == 8 and use_more_bits(c.i, c.n):
        return Q4_K, f"8 experts, use_more_bits({c.i}, {c.n})"
    return None


def _ffn_down_iq4(c: Ctx):
    return (Q5_K, f"no importance matrix, layer {c.i} < {c.n}/8") if c.i < c.n // 8 and not c.has_imatrix else None


FFN_DOWN_RULES: dict[str, Callable[[Ctx], tuple[T.GGMLType, str] | None]] = {
    "Q2_K": lambda c: (Q3_K, "Q2_K's ffn_down"),
    "Q2_K_S": lambda c: (Q4_K, f"layer {c.i} < {c.n}/8") if c.i < c.n // 8 else None,
    "IQ3_XXS": lambda c: None if c.has_imatrix else (
        (Q4_K, f"no importance matrix, layer {c.i} < {c.n}/8") if c.i < c.n // 8 else (Q3_K, "no importance matrix")),
    "Q3_K_M": _ffn_down_q3_k_m,
    "IQ3_M": _ffn_down_iq3_m,
    "Q3_K_L": lambda c: (Q4_K, "falcon") if c.model.arch == "falcon" else (Q5_K, "Q3_K_L's ffn_down"),
    "Q4_K_M": _ffn_down_q4_k_m,
    "IQ4_NL": _ffn_down_iq4,
    "IQ4_XS": _ffn_down_iq4,
    "Q5_K_M": _more_bits(Q6_K),
    "Q4_K_S": lambda c: (Q5_K, f"layer {c.i} < {c.n}/8") if c.model.arch != "falcon" and c.i < c.n // 8 else None,
    # with an importance matrix only: the first layers' ffn_down get the _1 type
    "Q4_0": lambda c: (Q4_1, f"imatrix, layer {c.i} < {c.n}/8") if c.has_imatrix and c.i < c.n // 8 else None,
    "Q5_0": lambda c: (Q5_1, f"imatrix, layer {c.i} < {c.n}/8") if c.has_imatrix and c.i < c.n // 8 else None,
}

ATTN_OUTPUT_RULES: dict[str, Callable[[Ctx], tuple[T.GGMLType, str] | None]] = {
    "Q2_K": lambda c: (Q3_K, "Q2_K's attn_output"),
    "IQ3_XXS": lambda c: (IQ3_S, "IQ3_XXS's attn_output"),
    "Q3_K_M": lambda c: (Q4_K, "Q3_K_M's attn_output"),
    "Q3_K_L": lambda c: (Q5_K, "Q3_K_L's attn_output"),
    "IQ3_M": lambda c: (Q4_K, "IQ3_M's attn_output"),
}
# glm5-next's tensors llama.cpp never quantizes below q8_0 (in a block-type file)
GLM5_NEXT_Q8_0 = ("attn_q_a", "attn_q_b", "nextn.eh_proj")
# with 8 experts (not falcon) these file types give attn_output q5_K instead; falcon's own: Q3_K_L -> q4_K
ATTN_OUTPUT_8_EXPERTS = ("Q2_K", "IQ3_XS", "IQ3_XXS", "Q3_K_S", "Q3_K_M", "IQ4_NL", "Q4_K_S", "Q4_K_M", "IQ3_S",
                         "IQ3_M", "IQ4_XS")

# IQ_LOW's own chain: attn_v-like, ffn_down of the first eighth (by its counter), attn_output; the
# IQ2_S/IQ2_M file types get iq3_s where the others get q2_K
def _iq_low_up(ft: str) -> T.GGMLType:
    return IQ3_S if ft in ("IQ2_S", "IQ2_M") else Q2_K


# llama.cpp's tensor_type_fallback: a type whose blocks do not divide the row gets a type of
# 32-value blocks (a 32-block type keeps itself); if that does not divide it either, F16
FALLBACK = {Q4_K: Q5_0, Q5_K: Q5_1, Q6_K: Q8_0, Q2_K: Q4_0, Q3_K: Q4_0, _G.TQ1_0: Q4_0, _G.TQ2_0: Q4_0,
            **{t: _G.IQ4_NL for t in (_G.IQ1_S, _G.IQ1_M, _G.IQ2_XXS, _G.IQ2_XS, _G.IQ2_S, _G.IQ3_XXS,
                                      _G.IQ3_S, _G.IQ4_XS)}}


def fallback(name: str, t: T.GGMLType, ncols: int) -> tuple[T.GGMLType, str | None]:
    """(type, llama.cpp's warning after the tensor's name, or None): `t` if its blocks divide rows of
    `ncols`, else its fallback."""
    qk = T.block_size(t)
    if ncols % qk == 0:
        return t, None
    if t in FALLBACK:
        new = FALLBACK[t]
    elif qk <= 32:
        new = t
    else:
        raise QuantizationError(f"tensor '{name}': no fallback type for {T.type_name(t)} (rows of {ncols})")
    msg = f"ncols {ncols:6d} not divisible by {qk:3d} (required for type {T.type_name(t):>7s}) "
    if ncols % T.block_size(new):
        msg += "(WARNING: must use F16 due to unusual shape) "
        new = T.F16
    return new, msg + f"-> falling back to {T.type_name(new):>7s}"



def requires_imatrix(name: str, t: T.GGMLType, ftype: FileType) -> bool:
    """llama.cpp's tensor_requires_imatrix: a tensor (not the token embedding nor the output) of
    type iq1_s, iq1_m, iq2_xxs, iq2_xs, iq2_s or iq3_xxs (the registry's `needs_imatrix`), or q2_K
    in a Q2_K_S file, cannot be quantized without an importance matrix (its result would be
    garbage, llama.cpp says)."""
    if category(name) in (C.TOKEN_EMBD, C.OUTPUT):
        return False
    from ..qtypes import REGISTRY
    return (t in REGISTRY and REGISTRY[t].needs_imatrix) or (t == Q2_K and ftype.name == "Q2_K_S")


# --------------------------------------------------------------------------------------- the pass

@dataclass(frozen=True)
class Choice:
    """A tensor's type and why: `reasons` (rules and overrides that moved it, in order),
    `fallback` (llama.cpp's warning when its rows took a fallback type)."""

    type: T.GGMLType
    reasons: tuple[str, ...] = ()
    fallback: str | None = None


@dataclass
class TensorTypeOverride:
    """One PATTERN=TYPE: tensors whose name `pattern` matches (a search, as re.search; run with a
    time bound, `ggtool.user_regex`) get `type`."""

    pattern: str
    type: T.GGMLType
    regex: UserRegex = field(init=False, repr=False)

    def __post_init__(self):
        self.regex = UserRegex(self.pattern, "tensor-type")


@dataclass
class Mix:
    """The state of one pass (quantize_state_impl): the file type, the options that steer the
    rules, the model, and the counters.  `names` is every tensor of the model (the counters' totals
    and whether the output is tied to the embedding come from them)."""

    ftype: FileType
    model: ModelInfo
    names: list[str]
    pure: bool = False
    leave_output: bool = False
    output_type: T.GGMLType | None = None
    token_embd_type: T.GGMLType | None = None
    overrides: list[TensorTypeOverride] = field(default_factory=list)
    has_imatrix: bool = False
    i_attention_wv: int = 0
    i_ffn_down: int = 0
    i_ffn_gate: int = 0
    i_ffn_up: int = 0
    n_fallback: int = 0
    override_hits: dict[int, int] = field(default_factory=dict)   # id(override) -> tensors it gave their type
    n_attention_wv: int = field(init=False, default=0)   # attn_v-like tensors in the model
    tied: bool = field(init=False, default=True)         # no output.weight: the embedding is the output

    def __post_init__(self):
        cats = [category(n) for n in self.names]
        self.n_attention_wv = sum(c in ATTN_V_LIKE for c in cats)
        self.tied = C.OUTPUT not in cats

    def choose(self, name: str, ne, src_type: T.GGMLType) -> Choice:
        """The type of one tensor (call in write order: the counters advance)."""
        if self.ftype.copy or not allows_quantization(name, ne, self.model.arch, leave_output=self.leave_output):
            return Choice(src_type)
        cat = category(name)
        if self.token_embd_type is not None and cat is C.TOKEN_EMBD and not (
                name == "per_layer_token_embd.weight" and self._override(name)):
            return Choice(self.token_embd_type, ("token embedding type",))
        if self.output_type is not None and cat is C.OUTPUT:
            return Choice(self.output_type, ("output tensor type",))
        new, reasons = self.ftype.default, []
        if not self.ftype.quantized:
            return Choice(new)
        manual = self._override(name)
        if manual is not None:
            self.override_hits[id(manual)] = self.override_hits.get(id(manual), 0) + 1
            new = manual.type
            reasons.append(f"tensor type override {manual.pattern!r}")
        elif not self.pure:
            new, why = self._rules(name, ne, cat, new)
            if why and new != self.ftype.default:
                reasons.append(why)
        new, warn = fallback(name, new, int(ne[0]))
        if warn:
            self.n_fallback += 1
        return Choice(new, tuple(reasons), warn)

    def unused_overrides(self) -> list[TensorTypeOverride]:
        """The tensor-type overrides that gave no tensor its type (so far in the pass)."""
        return [o for o in self.overrides if not self.override_hits.get(id(o))]

    def _override(self, name: str) -> TensorTypeOverride | None:
        return next((o for o in self.overrides if o.regex.search(name)), None)

    def _layer(self, counter: int, name: str) -> tuple[int, int]:
        """layer_info: the counter's value, or with experts the N of 'blk.N.' (checked)."""
        n = self.model.n_layer
        if max(1, self.model.n_expert) > 1:
            m = re.match(r"blk\.([+-]?\d+)\.", name)
            if not m:
                raise QuantizationError(f"tensor '{name}': failed to determine its layer")
            counter = int(m.group(1))
            if not 0 <= counter < n:
                raise QuantizationError(f"tensor '{name}': bad layer {counter}, must be in [0, {n})")
        return counter, n

    def _rules(self, name: str, ne, cat: Category, new: T.GGMLType) -> tuple[T.GGMLType, str | None]:
        """llama_tensor_get_type_impl for the file types of .ftypes: (type, why it moved)."""
        ft, m = self.ftype.name, self.model
        got = None
        if m.arch == "glm5-next" and any(s in name for s in GLM5_NEXT_Q8_0):
            return Q8_0, "glm5-next keeps it q8_0"
        if cat is C.OUTPUT or (self.tied and cat is C.TOKEN_EMBD):
            what = "output" if cat is C.OUTPUT else "tied embedding (the output)"
            if self.output_type is not None:
                return self.output_type, f"{what}: output tensor type"
            if ft == "MXFP4_MOE":
                return Q8_0, f"{what}: MXFP4_MOE"
            if m.arch == "falcon":
                return Q8_0, f"{what}: falcon"
            if int(ne[0]) % T.block_size(new):
                return Q8_0, f"{what}: rows of {ne[0]} not a multiple of {T.block_size(new)}"
            if ft in IQ_LOW_OUTPUT:
                return Q5_K, f"{what}: {ft}"
            return (Q6_K, what) if new != Q8_0 else (new, None)
        if ft == "MXFP4_MOE":
            # the experts' tensors (3-d) mxfp4, every other q8_0 (bailingmoe3: its 3-d MLA
            # projections are not experts, only its ffn_up/gate/down are)
            experts = len(ne) > 2 and int(ne[2]) > 1 and (
                m.arch != "bailingmoe3" or cat in (C.FFN_UP, C.FFN_GATE, C.FFN_DOWN))
            return (new, None) if experts else (Q8_0, "MXFP4_MOE: not an expert tensor")
        if cat is C.TOKEN_EMBD:
            to = TOKEN_EMBD_RULES.get(ft)
            return (to, f"token_embd: {ft}") if to is not None else (new, None)
        if ft in IQ_LOW:
            got = self._iq_low(name, cat, ft)
        elif cat in ATTN_V_LIKE:
            rule = ATTN_V_RULES.get(ft)
            got = rule(Ctx(self.i_attention_wv, self.n_attention_wv, m, self.has_imatrix)) if rule else None
            if m.is_70b and (got[0] if got else new) in (Q3_K, Q4_K):
                got = (Q5_K, "70B model")
            if m.n_expert == 8:
                got = (Q8_0, "8 experts")
            self.i_attention_wv += 1
        elif cat is C.ATTN_K:
            got = (Q8_0, "8 experts") if m.n_expert == 8 else ATTN_K_RULES.get(ft)
        elif cat is C.ATTN_Q:
            got = ATTN_Q_RULES.get(ft)
        elif cat is C.FFN_DOWN:
            i, n = self._layer(self.i_ffn_down, name)
            rule = FFN_DOWN_RULES.get(ft)
            got = rule(Ctx(i, n, m, self.has_imatrix)) if rule else None
            self.i_ffn_down += 1
        elif cat is C.ATTN_OUTPUT:
            if m.arch == "falcon":
                got = (Q4_K, "falcon") if ft == "Q3_K_L" else None
            elif m.n_expert == 8:
                got = (Q5_K, "8 experts") if ft in ATTN_OUTPUT_8_EXPERTS else None
            else:
                rule = ATTN_OUTPUT_RULES.get(ft)
                got = rule(Ctx(0, 0, m)) if rule else None
        elif cat in (C.FFN_GATE, C.FFN_UP):
            # its layer is checked as llama.cpp does; IQ3_XS gives the middle layers iq3_xxs
            gate = cat is C.FFN_GATE
            i, n = self._layer(self.i_ffn_gate if gate else self.i_ffn_up, name)
            if ft == "IQ3_XS" and n // 8 <= i < 7 * n // 8:
                got = (IQ3_XXS, f"IQ3_XS, layer {i} in [{n}/8, 7*{n}/8)")
            if gate:
                self.i_ffn_gate += 1
            else:
                self.i_ffn_up += 1
        if got is None:
            return new, None
        return got[0], f"{cat.value}: {got[1]}"

    def _iq_low(self, name: str, cat: Category, ft: str) -> tuple[T.GGMLType, str] | None:
        """The IQ_LOW file types' chain (before the others' and instead of them): its counters
        advance only for attn_v-like tensors and ffn_down, the latter's layer being its counter
        (not the name's, even with experts)."""
        m = self.model
        if cat in ATTN_V_LIKE:
            self.i_attention_wv += 1
            if m.n_gqa >= 4 or m.n_expert >= 4:
                return Q4_K, "n_gqa >= 4 or n_expert >= 4"
            return _iq_low_up(ft), f"{ft}'s attn_v"
        if m.n_expert == 8 and cat is C.ATTN_K:
            return Q4_K, "8 experts"
        if cat is C.FFN_DOWN:
            i, n = self.i_ffn_down, m.n_layer
            self.i_ffn_down += 1
            return (_iq_low_up(ft), f"layer {i} < {n}/8") if i < n // 8 else None
        if cat is C.ATTN_OUTPUT:
            if m.n_expert == 8:
                return Q5_K, "8 experts"
            if ft in ("IQ1_S", "IQ1_M"):
                return IQ2_XXS, f"{ft}'s attn_output"
            if ft in ("IQ2_S", "IQ2_M"):
                return IQ3_S, f"{ft}'s attn_output"
        return None
