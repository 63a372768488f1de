"""Whole-model quantization: a GGUF model (or a .npy array) to a Q4_0 / Q8_0 GGUF file, or a pure
Q4_K / Q5_K / Q6_K one.

This package is the API the `quantize` command uses; it re-exports the public names of its modules:
`.rules` (which type each tensor gets: llama.cpp's rules, the plan, the header), `.convert` (pieces
of rows read, dequantized and quantized; the default `RowConverter`) and `.write` (the writing loop:
`run_quantization`, `quantize_file`).  Errors carry what and where as fields (`RequantizeError`,
`MixNotBuiltError`, `TargetTypeError`, gguf_io's `OutputPathError`); the command line words them.
"""

from __future__ import annotations

from ..gguf_io.write import OutputPathError, check_output_paths
from .convert import convert_rows
from .rules import (
    FILE_TYPES,
    GGML_QNT_VERSION,
    GGUF_DEFAULT_ALIGNMENT,
    PURE_ONLY,
    TARGET_TYPES,
    MixNotBuiltError,
    OutputFile,
    QuantizeOptions,
    QuantizePlan,
    RequantizeError,
    TargetTypeError,
    TensorPlan,
    choose_type,
    header_bytes,
    parse_target_type,
    plan_quantization,
    tensor_bytes,
)
from .write import (
    PIECE_BYTES,
    WINDOW_BYTES,
    QuantizeResult,
    RowConverter,
    quantize_file,
    run_quantization,
)

__all__ = [
    "FILE_TYPES",
    "GGML_QNT_VERSION",
    "GGUF_DEFAULT_ALIGNMENT",
    "OutputFile",
    "OutputPathError",
    "PIECE_BYTES",
    "PURE_ONLY",
    "TARGET_TYPES",
    "WINDOW_BYTES",
    "MixNotBuiltError",
    "QuantizeOptions",
    "QuantizePlan",
    "QuantizeResult",
    "RequantizeError",
    "RowConverter",
    "TargetTypeError",
    "TensorPlan",
    "check_output_paths",
    "choose_type",
    "convert_rows",
    "header_bytes",
    "parse_target_type",
    "plan_quantization",
    "quantize_file",
    "run_quantization",
    "tensor_bytes",
]
