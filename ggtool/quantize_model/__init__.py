"""Whole-model quantization: a GGUF model (or a .npy array) to any of llama-quantize's file types
(Q4_0 ... Q6_K, the K mixes Q3_K_S ... Q5_K_M, Q8_0, F16, BF16, F32), byte for byte llama.cpp's file.

This package is the API the `quantize` command uses; it re-exports the public names of its modules:
`.ftypes` (the file types: names, ids, default tensor types), `.mix` (which type each tensor gets:
llama.cpp's llama_tensor_get_type, as tables), `.rules` (options, the plan, the header),
`.convert` (pieces of rows read, dequantized and quantized; the default `RowConverter`) and
`.target` (a mix for a size: types chosen by measured sensitivity), `.write` (the writing loop: `run_quantization`, `quantize_file`).  Errors carry what and where as
fields (`RequantizeError`, `ImatrixRequiredError`, `InvalidDataError`, `FileTypeError`, `TargetTypeError`, `OverrideSyntaxError`, gguf_io's
`OutputPathError`); the command line words them.
"""

from __future__ import annotations

from ..gguf_io.write import OutputPathError, check_output_paths
from .convert import InvalidDataError, convert_rows, validate_piece
from .ftypes import ALIASES, FILE_TYPES, FileType, FileTypeError, file_type
from .mix import (
    Category,
    Choice,
    Mix,
    ModelInfo,
    TensorTypeOverride,
    allows_quantization,
    category,
    fallback,
    requires_imatrix,
)
from .rules import (
    GGML_QNT_VERSION,
    GGUF_DEFAULT_ALIGNMENT,
    RECORD_KEY,
    WRITABLE,
    ImatrixRequiredError,
    KVOverride,
    OutputFile,
    OverrideSyntaxError,
    QuantizeOptions,
    QuantizePlan,
    RequantizeError,
    TargetTypeError,
    TensorPlan,
    TensorTypeFileError,
    header_bytes,
    new_mix,
    parse_kv_override,
    parse_target_type,
    parse_tensor_type_override,
    plan_quantization,
    read_tensor_type_file,
    tensor_bytes,
)
from .target import (
    CANDIDATES,
    SizeTarget,
    TargetMix,
    TargetSizeError,
    TensorSensitivity,
    allocate,
    measure,
    parse_target,
    plan_for_target,
    rules_for,
)
from .write import (
    PIECE_BYTES,
    WINDOW_BYTES,
    QuantizeResult,
    RowConverter,
    preflight,
    quantize_file,
    run_quantization,
)

__all__ = [
    "CANDIDATES",
    "RECORD_KEY",
    "SizeTarget",
    "TargetMix",
    "TargetSizeError",
    "TensorSensitivity",
    "allocate",
    "measure",
    "parse_target",
    "plan_for_target",
    "rules_for",
    "ALIASES",
    "FILE_TYPES",
    "GGML_QNT_VERSION",
    "GGUF_DEFAULT_ALIGNMENT",
    "PIECE_BYTES",
    "WINDOW_BYTES",
    "WRITABLE",
    "Category",
    "Choice",
    "FileType",
    "FileTypeError",
    "ImatrixRequiredError",
    "InvalidDataError",
    "KVOverride",
    "Mix",
    "ModelInfo",
    "OutputFile",
    "OutputPathError",
    "OverrideSyntaxError",
    "QuantizeOptions",
    "QuantizePlan",
    "QuantizeResult",
    "RequantizeError",
    "RowConverter",
    "TargetTypeError",
    "TensorPlan",
    "TensorTypeFileError",
    "TensorTypeOverride",
    "allows_quantization",
    "category",
    "check_output_paths",
    "convert_rows",
    "fallback",
    "file_type",
    "header_bytes",
    "new_mix",
    "parse_kv_override",
    "parse_target_type",
    "parse_tensor_type_override",
    "plan_quantization",
    "preflight",
    "quantize_file",
    "read_tensor_type_file",
    "requires_imatrix",
    "run_quantization",
    "tensor_bytes",
    "validate_piece",
]
