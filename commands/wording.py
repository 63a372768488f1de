"""Engine errors in the command line's words: the one place that knows which option a problem
came from and says which flag fixes it.

The engine's messages name what and where in its own terms ("input 'x'", "FILE: tensor 'w'") and
carry the parts as fields (`InputError.input/file/tensor`, `kind`, `details`, a `hint` a front end
may replace). Here an input is `--tensor NAME`, a GGUF file given whole `--gguf FILE`, and each
kind of problem gets the flag that fixes it.
"""

from __future__ import annotations

import sys

from ggtool.errors import GGToolError, ImatrixError, InputError

# generate's sampling parameters (ggtool.generate.Sampling fields) -> the options that set them
SAMPLING_OPTIONS = {
    "seed": "--seed", "temperature": "--temp", "top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p",
    "typical_p": "--typical", "xtc_probability": "--xtc-probability", "xtc_threshold": "--xtc-threshold",
    "top_n_sigma": "--top-n-sigma", "dynatemp_range": "--dynatemp-range", "dynatemp_exponent": "--dynatemp-exp",
    "repeat_last_n": "--repeat-last-n", "repeat_penalty": "--repeat-penalty",
    "frequency_penalty": "--frequency-penalty", "presence_penalty": "--presence-penalty",
    "dry_multiplier": "--dry-multiplier", "dry_base": "--dry-base", "dry_allowed_length": "--dry-allowed-length",
    "dry_penalty_last_n": "--dry-penalty-last-n", "dry_sequence_breakers": "--dry-sequence-breaker",
    "mirostat": "--mirostat", "mirostat_tau": "--mirostat-ent", "mirostat_eta": "--mirostat-lr",
    "order": "--samplers", "logit_bias": "--logit-bias",
}


def cli_message(e: BaseException) -> str:
    """`e`'s message as the command line says it (its str() for errors nothing here words)."""
    if not isinstance(e, GGToolError):
        return str(e)
    if e.kind == "sampling":                         # generate's sampling options
        return f"{SAMPLING_OPTIONS.get(e.field, e.field)} {_value(e.value)}: {e.reason}"
    if isinstance(e, ImatrixError):                  # quantize's --imatrix FILE
        return e.worded(file_label=lambda path: f"--imatrix {path}")
    if isinstance(e, InputError):
        return input_message(e)
    if e.kind == "target-size":                      # quantize's --target-bpw / --target-size
        flag = "--target-bpw" if e.what == "bpw" else "--target-size"
        return f"{flag} {e.value}: {e.reason}"
    if e.kind in ("regex-timeout", "regex-syntax"):     # a user regex: the flag it came from
        return f"--{e.origin}: {e}"
    if e.kind == "imatrix-required" and not e.missing_entry:    # quantize without --imatrix
        return f"{e}; give one with --imatrix FILE (made by ggtool imatrix or llama-imatrix)"
    flag = {"output-exists": " (use --force to overwrite it)",      # quantize's and set-metadata's OUTPUT
            "no-template": "; give one with --chat-template FILE",     # generate --chat
            "no-program": " with -f PROGRAM",                             # generate
            "too-long": " (--ctx-size)",
            "requantize": "; --allow-requantize does it anyway",        # quantize_model's rules
            "no-llama-cpp-build": ": name one, --numerics llama.cpp-avx2 or --numerics llama.cpp-avx512",
            "resume-exists": " (--resume continues it)",                    # perplexity's journal
            "base-ctx": " (give the file's -c, or none)"}.get(e.kind)
    if flag is not None:
        return f"{e}{flag}"
    dsl_errors = sys.modules.get("ggtool.dsl.errors")  # never imported: no DSLError to word (nor the DSL to load)
    if dsl_errors is not None and isinstance(e, dsl_errors.DSLError):
        return dsl_message(e)
    return str(e)


def _value(v) -> str:
    import math

    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else str(v)
    return str(v)


def input_message(e: InputError) -> str:
    """An InputError (SourceSyntaxError included) with --tensor and --gguf."""
    d = e.details
    if e.kind == "duplicate-input":
        return f"--tensor {e.input} is given twice"
    if e.kind == "stdin-shared":
        return f"only one --tensor can read stdin ('-'); {', '.join(d['names'])} all do"
    if e.input is None and e.file is None and "text" in d:   # NAME=SOURCE without a usable NAME
        return f"--tensor {e.message}"
    hint = {
        "whole-gguf": lambda: f" (or use --gguf {e.file} to make all of its tensors available)",
        "needs-conversion": lambda: f"; to use it converted to {d['target']}, say so: --tensor {d['name']}={d['spec']}",
        "ambiguous-tensor": lambda: f"; pick one with --tensor {e.tensor}={d['files'][0]}:{e.tensor}",
        "stdin-gguf": lambda: "; save it and use --gguf FILE or FILE.gguf:TENSOR",
        "text-needs-vocab": lambda: " (give the model with --gguf MODEL)",
    }.get(e.kind)
    return e.worded(input_label=lambda name: f"--tensor {name}", file_label=lambda path: f"--gguf {path}",
                    hint=hint() if hint else None)


def dsl_message(e) -> str:
    """A DSLError's first line (where, what), with flags in its hint and in the engine error that
    caused it, if any."""
    d, cause = e.details, e.__cause__
    if e.kind == "step-limit":
        e = e.with_hint(" (--max-steps N raises the limit)")
    elif e.kind == "unknown-output" and _looks_like_a_path(e.name):
        e = e.with_hint(f": --output names a tensor of the program; to write the result to the file {e.name}, "
                        f"use -o {e.name}")
    elif e.kind == "missing-input":
        e = e.with_hint(f" (give it with --tensor {d['name']}=...)")
    elif e.kind == "missing-placeholder":
        e = e.with_hint(f" (give --tensor {d['name']}=...)")
    elif e.kind == "input-type":
        e = e.with_hint(f" (e.g. --tensor {d['name']}={d['type']}:...)")
    if isinstance(cause, GGToolError) and not isinstance(cause, type(e)) and e.message.endswith(str(cause)):
        worded = cli_message(cause)
        if worded != str(cause):
            e = e.with_message(e.message[: len(e.message) - len(str(cause))] + worded)
    return str(e).splitlines()[0]


def _looks_like_a_path(name: str) -> bool:
    from ggtool.tensor_io import format_for_path

    return "/" in name or format_for_path(name) is not None
