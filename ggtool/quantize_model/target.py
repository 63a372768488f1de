"""A mix for a size: per-tensor types chosen by measured sensitivity to fit a target size.

No llama.cpp file type is chosen for a size: each is a hand-picked table (`.mix`). Here every
tensor llama.cpp would quantize is quantized (a sample of its rows) to each candidate type (the
registry's block types, `candidate_types`: those needing importances only where the tensor has
them); its sensitivity to a type is the importance-weighted relative error of that
quantization,

    err(t) = sum_rows sum_j w_j (x_ij - q_t(x)_ij)^2  /  sum_rows sum_j w_j x_ij^2

with `w` the importance matrix's entry for the tensor (mean squared activation of column j, so
the numerator estimates the energy of the error in the tensor's outputs), or 1 without one. The
sum of these errors over tensors is minimised under the size by the greedy of a knapsack on each
tensor's lower convex hull of (bytes, error): the step with the largest error removed per byte
added is taken first while it fits. The choice becomes one tensor-type rule (PATTERN=TYPE, as
llama-quantize takes them) per tensor kind and type (anchored regular expressions naming the
layers), so llama-quantize given the same rules (in its tensor type file) and importance matrix
writes the same types; the rules are recorded in the file under ``quantize.tensor_types`` (a
string array of PATTERN=TYPE).

The size is the whole file (header, metadata, padding and all): ``bpw`` means file bytes * 8 /
the model's weights, so a file made for 4.5 is no larger than 4.5 bits per weight.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from .. import quant as Q
from .. import types as T
from ..errors import GGToolError
from .mix import allows_quantization, fallback
from .rules import QuantizeOptions, QuantizePlan, RequantizeError, TensorPlan, plan_quantization

_G = T.GGMLType
# registry types (ggtool.qtypes) never offered, and why. llama-quantize writes each of them per
# tensor with --tensor-type, but:
LEFT_OUT = {
    # ternary: {-1, 0, 1} times one scale per 256 values, for BitNet-style weights trained to be
    # ternary; on an ordinary model's weights the relative error is 0.67-0.68 (gemma-3-270m's
    # ffn_down and attn_output, 256 rows each: 9x q2_K's, 3x iq1_s's at 1.56 bits), a point that
    # would be the cheapest of a tensor without importances, taken at a low target, at garbage quality
    _G.TQ1_0: "ternary (BitNet-style models only)",
    _G.TQ2_0: "ternary (BitNet-style models only)",
    # llama.cpp gives it only the experts of a MoE (MXFP4_MOE: the 3-d ffn_*_exps tensors; every
    # dense tensor q8_0), for weights trained in it (gpt-oss); a power-of-two scale per 32 values:
    # on dense weights 0.014 where iq4_xs is 0.005-0.006 at the same 4.25 bits (the same rows).
    # (Rows of 64*k+32... columns, which take no 256-value type, would gain a 4.25-bit step from it;
    # llama.cpp's own rules never write it there.)
    _G.MXFP4: "MoE experts only (llama.cpp's MXFP4_MOE)",
}


def _bits(t: T.GGMLType) -> float:
    return T.row_size(t, T.block_size(t)) * 8.0 / T.block_size(t)


def candidate_types(imatrix: bool = True) -> tuple[T.GGMLType, ...]:
    """The types a size target chooses from, fewest bits per weight first: every block type of the
    registry (the legacy types, the K-quants, IQ*; llama-quantize writes each as a tensor's own type:
    rules.WRITABLE) but those of LEFT_OUT. Without an importance matrix, not those llama-quantize or
    GGML refuse without one (the records' needs_imatrix, ggml_requires_imatrix: IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS,
    IQ2_S, IQ3_XXS); with one they are candidates of the tensors that have an entry (`measure`)."""
    from ..qtypes import REGISTRY
    from .rules import WRITABLE
    reg = [t for t in REGISTRY if t not in LEFT_OUT and t in WRITABLE
           and (imatrix or not needs_importances(t))]
    return tuple(sorted(reg, key=lambda t: (_bits(t), int(t))))


def needs_importances(t: T.GGMLType) -> bool:
    """A type quantized only with importances (llama-quantize's tensor_requires_imatrix or GGML's
    assert): not a candidate of a tensor without an importance-matrix entry."""
    from ..qtypes import REGISTRY
    r = REGISTRY.get(t)
    return r is not None and (r.needs_imatrix or r.ggml_requires_imatrix)


# every candidate (with an importance matrix); without one, candidate_types(imatrix=False)
CANDIDATES = candidate_types(imatrix=True)
# the file type that names a mix (general.file_type) by the type holding most of its weights
_FILE_TYPE_OF = {_G.Q2_K: "Q2_K", _G.Q3_K: "Q3_K_M", _G.Q4_K: "Q4_K_M", _G.Q5_K: "Q5_K_M", _G.Q6_K: "Q6_K",
                 T.Q8_0: "Q8_0", T.Q4_0: "Q4_0", _G.Q4_1: "Q4_1", _G.Q5_0: "Q5_0", _G.Q5_1: "Q5_1",
                 _G.IQ4_NL: "IQ4_NL", _G.IQ4_XS: "IQ4_XS", _G.IQ3_S: "IQ3_S", _G.IQ3_XXS: "IQ3_XXS",
                 _G.IQ2_S: "IQ2_M", _G.IQ2_XS: "IQ2_XS", _G.IQ2_XXS: "IQ2_XXS", _G.IQ1_M: "IQ1_M",
                 _G.IQ1_S: "IQ1_S"}
SAMPLE_ROWS = 256      # rows of each tensor measured (evenly spaced; all of them when fewer)
_SUFFIX = {"k": 1000, "m": 1000 ** 2, "g": 1000 ** 3, "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3}


class TargetSizeError(GGToolError):
    """A size target that cannot be met or read: `what` ('bpw' or 'size'), `value` as given,
    `reason`; `smallest_bytes` / `smallest_bpw` when the target is below the smallest mix.
    Its str() is the engine's ("a target of 3 bits per weight: ..."); the command line names
    its flag (commands/wording.py)."""

    kind = "target-size"

    def __init__(self, what: str, value, reason: str, smallest_bytes: int | None = None,
                 smallest_bpw: float | None = None):
        self.what, self.value, self.reason = what, value, reason
        self.smallest_bytes, self.smallest_bpw = smallest_bytes, smallest_bpw
        shown = f"a target of {value} bits per weight" if what == "bpw" else f"a target size of {value}"
        super().__init__(f"{shown}: {reason}")


@dataclass(frozen=True)
class SizeTarget:
    """The largest file wanted: `bpw` bits per weight of the whole file, or `size` bytes."""

    bpw: float | None = None
    size: int | None = None
    given: str | None = None        # as the user wrote it (errors quote it)

    def max_bytes(self, n_weights: int) -> int:
        return self.size if self.size is not None else int(math.floor(self.bpw * n_weights / 8))

    @property
    def what(self) -> str:
        return "bpw" if self.bpw is not None else "size"

    @property
    def shown(self):
        if self.given is not None:
            return self.given
        return self.bpw if self.bpw is not None else self.size


def parse_target(bpw: float | str | None = None, size: int | str | None = None) -> SizeTarget:
    """A target from `bpw` (bits per weight of the whole file: a finite number above 0) or `size`
    (bytes, or with a suffix K/M/G (powers of 1000) or KiB/MiB/GiB); exactly one of them."""
    if (bpw is None) == (size is None):
        raise TargetSizeError("bpw" if bpw is not None else "size", bpw if bpw is not None else size,
                              "give exactly one of a bits-per-weight target and a size target")
    if bpw is not None:
        try:
            b = float(bpw)
        except (TypeError, ValueError):
            raise TargetSizeError("bpw", bpw, "not a number") from None
        if not math.isfinite(b) or b <= 0:
            raise TargetSizeError("bpw", bpw, "bits per weight must be a finite number above 0")
        return SizeTarget(bpw=b, given=str(bpw))
    text = str(size).strip().lower().replace(" ", "")
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(k|m|g|kib|mib|gib)?b?", text)
    if not m:
        raise TargetSizeError("size", size, "expected bytes, or a number with K, M, G, KiB, MiB or GiB")
    n = int(float(m.group(1)) * _SUFFIX.get(m.group(2) or "", 1))
    if n <= 0:
        raise TargetSizeError("size", size, "the size must be above 0 bytes")
    return SizeTarget(size=n, given=str(size))


@dataclass
class Option:
    """One type a tensor can take: its stored type (after llama.cpp's fallback), bytes, error."""

    type: T.GGMLType
    bytes: int
    error: float


@dataclass
class TensorSensitivity:
    """A tensor's options, cheapest first (one per distinct stored type)."""

    name: str
    ne: tuple[int, ...]
    options: list[Option]
    weighted: bool        # measured with importances (else plain squared error)


@dataclass
class TargetMix:
    """The chosen mix: each tensor's type, the rules that give them, the plan written from them."""

    target: SizeTarget
    types: dict[str, T.GGMLType]
    rules: list[str]
    plan: QuantizePlan
    sensitivities: list[TensorSensitivity] = field(default_factory=list)
    predicted_error: float = 0.0

    @property
    def file_bytes(self) -> int:
        return self.plan.file_bytes()

    @property
    def bits_per_weight(self) -> float:
        n = self.plan.n_elements
        return self.file_bytes * 8.0 / n if n else 0.0


# ------------------------------------------------------------------------------------ measuring

def _sample(rows: int, most: int) -> np.ndarray:
    return np.arange(rows) if rows <= most else np.unique(np.linspace(0, rows - 1, most).round().astype(np.int64))


def weighted_error(x: np.ndarray, q: np.ndarray, w: np.ndarray | None) -> float:
    """sum w (x - q)^2 / sum w x^2 over the rows given (w per column; 1 without); 0 for a zero tensor."""
    d = (x - q).astype(np.float64) ** 2
    s = x.astype(np.float64) ** 2
    if w is not None:
        d, s = d * w, s * w
    den = float(s.sum())
    return float(d.sum()) / den if den > 0 else 0.0


def _rows(t: TensorPlan, idx: np.ndarray) -> np.ndarray:
    """Rows `idx` of a tensor as float32 (the 2-d view: every row of every matrix of a 3-d tensor)."""
    from .convert import source_rows
    ne0 = int(t.ne[0])
    out = []
    for r in idx:
        raw = source_rows(t.src_path, t.src_offset, t.src_type, ne0, int(r), int(r) + 1)
        out.append(np.asarray(Q.dequantize(raw, t.src_type), dtype=np.float32).reshape(ne0)
                   if (T.is_quantized(t.src_type) or t.src_type == _G.BF16)
                   else np.asarray(raw, dtype=np.float32).reshape(ne0))
    return np.stack(out)


def measure(t: TensorPlan, importances, candidates=CANDIDATES, sample_rows: int = SAMPLE_ROWS) -> TensorSensitivity:
    """The error of each candidate type on a sample of the tensor's rows (llama.cpp's fallback
    applied: a type whose blocks do not divide the rows is measured as the type it falls back to;
    a type that needs importances is left out where `importances` is None)."""
    ne0 = int(t.ne[0])
    n_rows = t.n_elements // ne0
    idx = _sample(n_rows, sample_rows)
    x = _rows(t, idx)
    per = int(t.ne[1]) if len(t.ne) > 1 else 1
    if importances is not None and np.ndim(importances) == 2:
        w = np.asarray(importances, dtype=np.float32)[idx // per]        # per expert, per row
    else:
        w = None if importances is None else np.asarray(importances, dtype=np.float32)
    seen: dict[T.GGMLType, Option] = {}
    for c in candidates:
        st, _ = fallback(t.name, c, ne0)
        if st in seen or (w is None and needs_importances(st)):
            continue
        if w is not None and w.ndim == 2:
            q = np.concatenate([Q.dequantize(Q.quantize(x[i:i + 1], st, t.name, imatrix=w[i]), st).reshape(1, ne0)
                                for i in range(len(x))])
        else:
            q = Q.dequantize(Q.quantize(x, st, t.name, imatrix=w), st).reshape(x.shape)
        seen[st] = Option(st, T.row_size(st, t.n_elements), weighted_error(x, q, w))
    opts = sorted(seen.values(), key=lambda o: (o.bytes, o.error))
    return TensorSensitivity(t.name, tuple(t.ne), opts, w is not None)


# ----------------------------------------------------------------------------------- allocating

def _hull(options: list[Option]) -> list[Option]:
    """The lower convex hull of (bytes, error), cheapest first: the options a greedy may step through
    (an option no cheaper and no better than another, or above the hull, is never worth taking)."""
    pts = []
    for o in options:
        if pts and o.error >= pts[-1].error:
            continue               # more bytes and no less error: dominated
        while len(pts) >= 2:
            a, b = pts[-2], pts[-1]
            # b is above the segment a->o: drop it
            if (b.error - a.error) * (o.bytes - a.bytes) >= (o.error - a.error) * (b.bytes - a.bytes):
                pts.pop()
            else:
                break
        pts.append(o)
    return pts


def allocate(sens: list[TensorSensitivity], budget: int) -> dict[str, Option] | None:
    """Each tensor's option minimising the sum of errors with total bytes <= budget (greedy on
    the hulls: largest error removed per byte first; a step that does not fit is skipped and the
    next tried). None when even the cheapest options do not fit."""
    hulls = {s.name: _hull(s.options) for s in sens}
    at = {n: 0 for n in hulls}
    used = sum(h[0].bytes for h in hulls.values())
    if used > budget:
        return None
    while True:
        best, best_gain = None, 0.0
        for n, h in hulls.items():
            i = at[n]
            if i + 1 < len(h):
                db = h[i + 1].bytes - h[i].bytes
                gain = (h[i].error - h[i + 1].error) / db if db > 0 else math.inf
                if used + db <= budget and gain > best_gain:
                    best, best_gain = n, gain
        if best is None:
            break
        h, i = hulls[best], at[best]
        used += h[i + 1].bytes - h[i].bytes
        at[best] = i + 1
    return {n: hulls[n][i] for n, i in at.items()}


# -------------------------------------------------------------------------------------- rules

def _kind(name: str) -> tuple[str, int | None]:
    m = re.match(r"blk\.(\d+)\.(.+)$", name)
    return (m.group(2), int(m.group(1))) if m else (name, None)


def rules_for(types: dict[str, T.GGMLType]) -> list[str]:
    """PATTERN=TYPE rules (llama-quantize's tensor-type syntax) giving exactly these tensors
    these types: per tensor kind and type, one anchored pattern naming its layers."""
    groups: dict[tuple[str, bool, T.GGMLType], list[int | None]] = defaultdict(list)
    for name, t in types.items():
        kind, layer = _kind(name)
        groups[(kind, layer is None, t)].append(layer)    # a top-level "x" apart from blk.N.x
    rules = []
    for (kind, top, t), layers in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], int(kv[0][2]))):
        tail = re.escape(kind)
        if top:
            pat = f"^{tail}$"
        else:
            alts = "|".join(str(n) for n in sorted(layers))
            pat = f"^blk\\.({alts})\\.{tail}$" if len(layers) > 1 else f"^blk\\.{alts}\\.{tail}$"
        rules.append(f"{pat}={T.type_name(t)}")
    return rules


# ------------------------------------------------------------------------------------ the front

def _file_type_name(types: dict[str, T.GGMLType], sizes: dict[str, int]) -> str:
    by = defaultdict(int)
    for n, t in types.items():
        if T.is_quantized(t):          # a file type whose default is not quantized would ignore the rules
            by[t] += sizes[n]
    top = max(by, key=lambda t: by[t]) if by else T.Q8_0
    return _FILE_TYPE_OF.get(top, "Q8_0")


def plan_for_target(input_path: str, opts: QuantizeOptions, target: SizeTarget, *,
                    candidates=None, sample_rows: int = SAMPLE_ROWS,
                    on_tensor: Callable[[int, int, str], None] | None = None,
                    output_path: str | None = None, force: bool = False) -> TargetMix:
    """Measure every quantizable tensor, choose the mix for the target and plan its file (the
    options' own tensor-type rules, purity and file type are replaced by the chosen ones).
    With `output_path`, the outputs the run would refuse (one that exists without `force`, one
    not writable, one that is an input) are refused first, before anything is measured.
    `candidates`: the types to choose from (default `candidate_types`, with or without the
    importance matrix's)."""
    from ..gguf_io import GGUFFile
    from .rules import parse_tensor_type_override

    if candidates is None:
        candidates = candidate_types(imatrix=opts.imatrix is not None)
    base = replace(opts, type="Q8_0", pure=True, tensor_types=[], output_tensor_type=None,
                   token_embedding_type=None, dry_run=True, recorded_tensor_types=())
    plan0 = plan_quantization(input_path, base)          # refuses a requantization not allowed, at once
    if plan0.npy is not None:
        raise TargetSizeError(target.what, target.shown, "a size target needs a GGUF model (a .npy array is one tensor)")
    arch = str(GGUFFile(input_path).metadata("general.architecture", "") or "")
    eligible = [t for t in plan0.tensors
                if allows_quantization(t.name, t.ne, arch, leave_output=opts.leave_output_tensor)]
    quantized = [t for t in eligible if T.is_quantized(t.src_type)]
    if quantized and not opts.allow_requantize:
        # every candidate may be chosen: a tensor already quantized could be requantized (refused
        # now, before the measuring, as the plan of any file type refuses it)
        t = quantized[0]
        first = next((c for c in candidates if not needs_importances(c)), candidates[0])
        raise RequantizeError(t.name, t.src_type, fallback(t.name, first, int(t.ne[0]))[0], len(quantized))
    if output_path is not None:
        from .write import preflight
        preflight(plan0, output_path, force=force)
    max_bytes = target.max_bytes(plan0.n_elements)
    sens = []
    for k, t in enumerate(eligible):
        if on_tensor is not None:
            on_tensor(k, len(eligible), t.name)
        w = t.imatrix if t.imatrix is not None or opts.imatrix is None else _weights(opts, t)
        sens.append(measure(t, w, candidates, sample_rows))
    fixed = plan0.file_bytes() - sum(t.dst_bytes for t in eligible)
    sizes = {t.name: t.n_elements for t in eligible}
    budget = max_bytes - fixed
    for _ in range(16):
        chosen = allocate(sens, budget)
        cheapest = chosen is None
        if cheapest:        # the cheapest mix: it fits (a shorter header than the last try's), or nothing does
            chosen = {s.name: _hull(s.options)[0] for s in sens}
        types = {n: o.type for n, o in chosen.items()}
        plan = _plan(input_path, opts, types, sizes, parse_tensor_type_override)
        over = plan.file_bytes() - max_bytes
        if over > 0 and cheapest:
            smallest = plan.file_bytes()
            bpw = smallest * 8.0 / plan0.n_elements
            raise TargetSizeError(target.what, target.shown,
                                  f"the smallest mix of {', '.join(T.type_name(c) for c in candidates)} is "
                                  f"{smallest:,} bytes ({bpw:.3f} bits per weight), above the target of {max_bytes:,} bytes",
                                  smallest_bytes=smallest, smallest_bpw=bpw)
        if over <= 0:
            got = {t.name: t.dst_type for t in plan.tensors if t.name in types}
            if got != types:    # the rules must give exactly the chosen types
                bad = next(n for n in types if got.get(n) != types[n])
                raise GGToolError(f"tensor '{bad}': the rules gave {T.type_name(got.get(bad))}, "
                                  f"not the chosen {T.type_name(types[bad])}")
            return TargetMix(target, types, list(plan.options.recorded_tensor_types), plan, sens,
                             sum(o.error for o in chosen.values()))
        # the header and padding of this plan, measured: the tensors get what is left (less than
        # they used, so the choice changes)
        budget = sum(o.bytes for o in chosen.values()) - over
    raise TargetSizeError(target.what, target.shown, "no mix found that fits (the header kept growing)")


def _weights(opts: QuantizeOptions, t: TensorPlan):
    try:
        return opts.imatrix.weights_for(t.name, tuple(t.ne))
    except GGToolError:
        return None


def _plan(input_path, opts: QuantizeOptions, types, sizes, parse) -> QuantizePlan:
    rules = rules_for(types)
    final = replace(opts, type=_file_type_name(types, sizes), pure=False,
                    tensor_types=[parse(r) for r in rules], output_tensor_type=None, token_embedding_type=None,
                    recorded_tensor_types=tuple(rules))
    return plan_quantization(input_path, final)
