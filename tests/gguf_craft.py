"""Hand-made GGUF bytes for hostile-file tests: every field under the test's control (counts, lengths,
offsets, dims), including the values no writer would produce."""

from __future__ import annotations

import struct

import numpy as np

STRING, ARRAY, UINT32 = 8, 9, 4


def gstr(b) -> bytes:
    """A GGUF string: u64 length + bytes."""
    if isinstance(b, str):
        b = b.encode()
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype: int, payload: bytes) -> bytes:
    return gstr(key) + struct.pack("<I", vtype) + payload


def kv_str(key, value) -> bytes:
    return kv(key, STRING, gstr(value))


def kv_u32(key, value: int) -> bytes:
    return kv(key, UINT32, struct.pack("<I", value))


def tensor_info(name, dims, ggml_type: int = 0, offset: int = 0) -> bytes:
    return (gstr(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
            + struct.pack("<IQ", ggml_type, offset))


def gguf(kvs=(), infos=(), data: bytes = b"", align: int = 32, n_tensors=None, n_kv=None, version: int = 3) -> bytes:
    """Header (counts default to the real ones), metadata, tensor infos, padding to `align`, data."""
    n_tensors = len(infos) if n_tensors is None else n_tensors
    n_kv = len(kvs) if n_kv is None else n_kv
    head = b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + b"".join(kvs) + b"".join(infos)
    return head + b"\0" * (-len(head) % align) + data


def f32_model(names=("a", "b"), n: int = 32, kvs=None) -> bytes:
    """A valid model of f32 vectors of n values (tensor k holds k, k+1, ...)."""
    kvs = [kv_str("general.architecture", "llama")] if kvs is None else kvs
    infos, data = [], b""
    for k, name in enumerate(names):
        infos.append(tensor_info(name, [n], 0, len(data)))
        blob = np.arange(k, k + n, dtype=np.float32).tobytes()
        data += blob + b"\0" * (-len(blob) % 32)
    return gguf(kvs, infos, data)
