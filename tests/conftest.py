"""Shared test helpers: a CliRunner that keeps stdout and stderr apart, result checks, fixture paths."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
STORIES = ROOT / "fixtures" / "stories260K.gguf"
TINY_LLAMA = ROOT / "fixtures" / "llama-2-tiny-random.gguf"

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/replay.py and friends

# A suite started with SIGINT ignored (a script's background job, nohup) would pass that on to every
# ggtool it starts, and the Ctrl-C tests would send a signal nobody gets: Ctrl-C is Python's own again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# Likewise SIGHUP under nohup: the suite keeps ignoring it (a handler that does nothing), while every
# ggtool it starts gets SIGHUP's default back (a caught signal is reset at exec, an ignored one is
# not), so the SIGHUP tests send it to processes that take it as a terminal would.
if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
    signal.signal(signal.SIGHUP, lambda signum, frame: None)


@pytest.fixture
def run():
    """run(*args, input=None) -> click Result, invoking the real `ggtool` group in-process."""
    from ggtool.commands import cli

    runner = CliRunner()

    def invoke(*args, input=None):
        return runner.invoke(cli, [str(a) for a in args], input=input, catch_exceptions=True, prog_name="ggtool")

    return invoke


def ok(result) -> str:
    """Assert success (exit 0, no traceback) and return stdout."""
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    assert result.exit_code == 0, f"exit {result.exit_code}\nstderr: {result.stderr}"
    assert "Traceback" not in result.stderr
    return result.stdout


def fails(result, *fragments: str, code: int = 1) -> str:
    """Assert a clean failure: the exit code, nothing on stdout, one `Error: ...` line (exit 1) or a
    click usage message (exit 2) containing every fragment, and no traceback. Returns stderr."""
    err = result.stderr
    assert result.exit_code == code, f"exit {result.exit_code} (wanted {code})\nstdout: {result.stdout}\nstderr: {err}"
    assert isinstance(result.exception, SystemExit) or result.exception is None, result.exc_info
    assert result.stdout == "", result.stdout
    assert "Traceback" not in err
    if code == 1:
        lines = [ln for ln in err.splitlines() if not ln.startswith("Warning: ")]
        assert len(lines) == 1 and lines[0].startswith("Error: "), err
    for f in fragments:
        assert f in err, f"{f!r} not in stderr:\n{err}"
    return err


@pytest.fixture
def npy(tmp_path):
    """npy(array, name='x.npy') -> path of a saved .npy."""

    def save(array, name: str = "x.npy") -> Path:
        p = tmp_path / name
        np.save(p, array)
        return p

    return save


def write_gguf(path, tensors: dict, arch: str = "test", kv: dict | None = None):
    """A small GGUF written with gguf-py. A tensor is an array, or (raw array, GGML type) for data
    already in that type's bytes; kv values are str, list, int (uint32) or float (float32)."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    for k, v in (kv or {}).items():
        if isinstance(v, str):
            w.add_string(k, v)
        elif isinstance(v, list):
            w.add_array(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        else:
            w.add_uint32(k, v)
    for name, arr in tensors.items():
        if isinstance(arr, tuple):
            w.add_tensor(name, arr[0], raw_dtype=arr[1])
        else:
            w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
