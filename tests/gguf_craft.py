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


def split_model(src, out, per_shard: int) -> list:
    """gguf-split's layout, written with gguf-py's own splitting writer: `src`'s tensors in shards of
    `per_shard` named OUT-0000k-of-0000n.gguf, its metadata in the first shard only, the split keys
    (split.no, split.count, split.tensors.count) in every one. Returns the shard paths."""
    from pathlib import Path

    import gguf

    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(out), r.fields["general.architecture"].contents(), split_max_tensors=per_shard)
    w.kv_data[0].clear()      # the writer's own general.architecture: re-added in the source's order
    for key, f in r.fields.items():
        if key.startswith("GGUF."):
            continue
        vtype = f.types[0]
        w.add_key_value(key, f.contents(), vtype, f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None)
    for t in r.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = Path(out)
    n = -(-len(r.tensors) // per_shard)
    return [out.with_name(f"{out.stem}-{k:05d}-of-{n:05d}.gguf") for k in range(1, n + 1)]
