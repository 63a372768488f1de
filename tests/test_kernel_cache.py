"""First-ever runs (ggtool.kernels.cache, ggtool.kernels.warm): in the command line's process a
kernel not in the cache runs its numpy twin and is wished for; the background compiler compiles
what is wished for, marks it ready and leaves nothing behind; a library's process compiles."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE = """
    import sys
    import numpy as np
    import ggtool.role
    ggtool.role.COMMAND_LINE = {cli}
    from ggtool import quant as Q
    from ggtool.kernels import cache
    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(2, 32)
    print(Q.quantize_q8_0_cpu(x).tobytes().hex())
    print("numba" in sys.modules, os.path.exists(cache.marker("wanted", "quantize:Q8_0_cpu")))
"""


def _env(tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["GGTOOL_CACHE_DIR"] = str(tmp_path)
    return env


def _python(code: str, env: dict, stdin=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "import os\n" + textwrap.dedent(code)], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=300, stdin=stdin)


def test_the_command_line_runs_the_twin_of_a_kernel_not_compiled_and_wishes_for_it(tmp_path):
    cli = _python(CODE.format(cli=True), _env(tmp_path / "cli"))
    lib = _python(CODE.format(cli=False), _env(tmp_path / "lib"))
    assert cli.returncode == 0 and lib.returncode == 0, cli.stderr + lib.stderr
    assert cli.stdout.splitlines()[0] == lib.stdout.splitlines()[0]          # the same bytes
    assert cli.stdout.splitlines()[1] == "False True"                        # no numba, a wish
    assert lib.stdout.splitlines()[1] == "True False"                        # a library compiles


def test_the_background_compiler_compiles_what_is_wished_for_and_marks_it_ready(tmp_path):
    env = _env(tmp_path)
    wish = _python("""
        from ggtool.kernels import cache
        path = cache.marker("wanted", "quantize:Q8_0_cpu")
        os.makedirs(os.path.dirname(path))
        open(path, "w").close()
        print(cache.cache_dir())
    """, env)
    root = wish.stdout.strip()
    r = subprocess.run([sys.executable, "-m", "ggtool.kernels.warm"], stdin=subprocess.DEVNULL, cwd=ROOT,
                       env=env, timeout=300, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    tag = sys.implementation.cache_tag
    assert os.listdir(os.path.join(root, "ready")) == [f"quantize:Q8_0_cpu.{tag}"]
    assert os.listdir(os.path.join(root, "wanted")) == []
    assert any(f.endswith(".nbi") for _, _, fs in os.walk(root) for f in fs)     # numba's cache files
    assert not [f for _, _, fs in os.walk(root) for f in fs if f.endswith(".tmp")]
