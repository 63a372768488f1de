"""First-ever runs (ggtool.kernels.cache, ggtool.compiling.warm): in the command line's process a
kernel not in the cache runs its numpy twin and is wished for; the background compiler compiles
what is wished for, marks it ready and leaves nothing behind; a library's process compiles."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

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
    r = subprocess.run([sys.executable, "-m", "ggtool.compiling.warm"], stdin=subprocess.DEVNULL, cwd=ROOT,
                       env=env, timeout=300, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    tag = sys.implementation.cache_tag
    assert os.listdir(os.path.join(root, "ready")) == [f"quantize:Q8_0_cpu.{tag}"]
    assert os.listdir(os.path.join(root, "wanted")) == []
    assert any(f.endswith(".nbi") for _, _, fs in os.walk(root) for f in fs)     # numba's cache files
    assert not [f for _, _, fs in os.walk(root) for f in fs if f.endswith(".tmp")]


def test_a_kernel_numba_cannot_keep_in_the_cache_is_marked_failed_not_ready(tmp_path):
    """Under NUMBA_OPT=0 numba cannot cache ggtool's kernels (their code holds this process's
    addresses): it warns and compiles them anew in every process. The background compiler marks
    such a kernel failed, not ready (each later run compiled it in process, behind a screen of
    numba's warnings), and says why; the runner's node kernels compile at all there (their cache
    locator lacked the `_py_file` numba's warning reads: an AttributeError)."""
    env = {**_env(tmp_path), "NUMBA_OPT": "0"}
    wish = _python("""
        from ggtool.kernels import cache
        for name in ("node:scale_f32", "quantize:Q8_0", "quantize:Q8_0_cpu"):    # the last two share callees
            path = cache.marker("wanted", name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "w").close()
        print(cache.cache_dir())
    """, env)
    root = wish.stdout.strip()
    r = subprocess.run([sys.executable, "-m", "ggtool.compiling.warm"], stdin=subprocess.DEVNULL, cwd=ROOT,
                       env=env, timeout=300, capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    tag = sys.implementation.cache_tag
    assert not os.path.exists(os.path.join(root, "ready")) and os.listdir(os.path.join(root, "wanted")) == []
    for name in ("node:scale_f32", "quantize:Q8_0", "quantize:Q8_0_cpu"):
        failed = os.path.join(root, "failed", f"{name}.{tag}")
        assert open(failed).read() == "numba cannot keep it in the cache (NUMBA_OPT=0?)\n"
    here = _python("""
        import warnings
        import numpy    # before the filter: numpy's ImportWarning on NPY_DISABLE_CPU_FEATURES (.ci/avx2-host) is not ours
        warnings.simplefilter("error")
        from ggtool.compiling import warm
        print(warm.compile_kernel("node:scale_f32"))
    """, env)
    assert here.returncode == 0 and here.stdout == "False\n" and here.stderr == "", here.stderr
    kept = _python("""
        from ggtool.compiling import warm
        print(warm.compile_kernel("node:scale_f32"))
    """, _env(tmp_path / "default"))
    assert kept.returncode == 0 and kept.stdout == "True\n", kept.stderr


def test_a_float_product_the_command_line_wishes_for_is_compiled_for_the_next_run(tmp_path):
    """F32 x F32 products (a prompt's attention) wished for `dot:f32`, which the compiler dropped as
    naming no kernel: every command line ran numpy's twin for them for ever (a 512-token gemma-3-270m
    prompt took 13 s on one thread instead of 5.7)."""
    env = _env(tmp_path)
    wish = _python("""
        import numpy as np
        import ggtool.role
        ggtool.role.COMMAND_LINE = True
        from ggtool import types as T
        from ggtool.kernels import cache
        from ggtool.quant import matmul
        for t, dtype in ((T.F32, np.float32), (T.F16, np.float16)):
            w, x = np.ones((256, 256), dtype), np.ones((256, 256), dtype)   # more than a twin's small work
            out = np.empty((256, 256), np.float32)
            matmul.mul_mat_into(t, w, x, out)
            assert (out == 256).all()
        print(cache.cache_dir())
    """, env)
    assert wish.returncode == 0, wish.stderr
    root = wish.stdout.strip()
    tag = sys.implementation.cache_tag
    both = [f"dot:f16.{tag}", f"dot:f32.{tag}"]
    wanted = sorted(os.listdir(os.path.join(root, "wanted")))
    assert wanted == both or set(wanted) < set(both)      # the compiler it started may have begun
    deadline = time.monotonic() + 240     # that compiler takes a wish away once it is compiled (or dropped)
    while os.listdir(os.path.join(root, "wanted")):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert not os.path.exists(os.path.join(root, "failed"))
    assert os.path.isdir(os.path.join(root, "ready")) and sorted(os.listdir(os.path.join(root, "ready"))) == both
    assert os.listdir(os.path.join(root, "wanted")) == [] and not os.path.exists(os.path.join(root, "failed"))


def test_every_kernel_the_command_line_may_wish_for_is_one_the_compiler_knows():
    """A wish the compiler does not know is dropped without a word: the dots mul_mat asks for (every
    type with a twin: F32 and F16, and the block types whose records multiply a packed form of
    ``kernels.dot``), the quantizers' and float_rows' kernels."""
    from ggtool import qtypes
    from ggtool import types as T
    from ggtool.compiling import warm

    twinned = [t for t in qtypes.REGISTRY if qtypes.get(t).packed_form is not None]
    assert len(twinned) == 10
    wishes = {f"dot:{T.type_name(t)}" for t in (T.F32, T.F16, *twinned)}
    wishes |= {f"quantize:{k}" for k in warm.QUANTIZERS} | {"float_rows:exp", "float_rows:seq_sum"}
    assert "dot:f32" in wishes and "dot:q4_0" in wishes
    assert sorted(n for n in wishes if not warm.known(n)) == []


# -- what the compiled code depends on --------------------------------------------------------------
AVX512 = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 85\ncpu MHz\t\t: 2000.1\nflags\t\t: fpu avx2 fma avx512f avx512bw\n\nprocessor\t: 1\n"
AVX2 = AVX512.replace(" avx512f avx512bw", "").replace(": 85", ": 63")


def test_the_kernel_folder_is_keyed_by_the_cpu_target_and_numba(tmp_path, monkeypatch):
    """A cache shared by an AVX-512 and an AVX2 host (an NFS home) gives each its own folder, so
    neither meets the other's code or ready marks; NUMBA_CPU_NAME/NUMBA_CPU_FEATURES, numba's
    codegen settings and numba's version move it too; a CPU's clock speed does not."""
    from ggtool.kernels import cache

    wide, narrow = tmp_path / "wide", tmp_path / "narrow"
    wide.write_text(AVX512)
    narrow.write_text(AVX2)
    key = cache.kernel_key({}, str(wide))
    assert key.startswith("kernels-") and key != cache.kernel_key({}, str(narrow))
    (tmp_path / "again").write_text(AVX512.replace("2000.1", "3100.0"))
    assert cache.kernel_key({}, str(tmp_path / "again")) == key
    assert cache.kernel_key({"NUMBA_CPU_NAME": "haswell"}, str(wide)) not in (key, cache.kernel_key({}, str(narrow)))
    assert cache.kernel_key({"NUMBA_OPT": "0"}, str(wide)) != key
    portable = {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": "+avx2,+fma"}
    assert cache.kernel_key(portable, str(wide)) == cache.kernel_key(portable, str(narrow))   # host-independent code
    monkeypatch.setattr(cache, "_package_version", lambda name: b"0.0.1" if name == "numba" else b"x")
    assert cache.kernel_key({}, str(wide)) != key


def test_the_kernel_folder_follows_the_kernel_sources_numba_checks(tmp_path):
    """numba keeps a kernel for its module's path, size and time: another copy of ggtool (a second
    checkout, another venv) or a module rewritten gets another folder, so no ready mark there says
    a kernel is cached that numba would compile anew."""
    import shutil

    from ggtool.kernels import cache

    here = Path(os.path.dirname(os.path.dirname(os.path.abspath(cache.__file__))))    # as the key takes it
    copy = tmp_path / "ggtool"
    for sub in cache.KERNEL_FOLDERS:
        shutil.copytree(here / sub, copy / sub, copy_function=shutil.copy2)
    key = cache.kernel_key({}, package=str(here))
    assert cache.kernel_key({}, package=str(here)) == key == cache.kernel_key({})
    other = cache.kernel_key({}, package=str(copy))
    assert other != key and cache.kernel_key({}, package=str(copy)) == other
    st = os.stat(copy / "kernels" / "dot.py")
    os.utime(copy / "kernels" / "dot.py", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert cache.kernel_key({}, package=str(copy)) != other


def test_numba_itself_never_loads_code_compiled_for_another_cpu(tmp_path):
    """The layer below: in one NUMBA_CACHE_DIR, a function compiled for skylake-avx512 is not loaded
    for haswell (numba keys each cached function by its target: codegen.magic_tuple); it is for
    skylake-avx512 again."""
    module = tmp_path / "mod" / "tiny_kernel.py"
    module.parent.mkdir()
    module.write_text("import numba\n@numba.njit(cache=True)\ndef f(x):\n    return x * 2 + 1\n")
    code = "import sys; sys.path.insert(0, sys.argv[1]); import tiny_kernel as m; m.f(3); print(len(m.f.stats.cache_hits))"
    hits = []
    for cpu, features in (("skylake-avx512", "+avx512f,+avx2,+fma"), ("haswell", "+avx2,+fma"), ("skylake-avx512", "+avx512f,+avx2,+fma")):
        env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "shared"), "NUMBA_CPU_NAME": cpu, "NUMBA_CPU_FEATURES": features}
        r = subprocess.run([sys.executable, "-c", code, str(module.parent)], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        hits.append(int(r.stdout))
    assert hits == [0, 0, 1]


# -- the compile queue ------------------------------------------------------------------------------
def test_the_background_compiler_skips_and_removes_what_names_no_kernel(tmp_path):
    """Before: an unknown name in wanted/ made the background compiler fail on it after every run,
    and it never compiled anything. Now each such entry is removed, the others compiled, another
    Python's entries left alone, and a kernel that fails is marked failed/ (not tried again)."""
    env = _env(tmp_path)
    root = _python("from ggtool.kernels import cache; print(cache.cache_dir())", env).stdout.strip()
    tag = sys.implementation.cache_tag
    wanted = Path(root, "wanted")
    wanted.mkdir(parents=True)
    for name in ("bogus", "dot:zz", "quantize:Q9", "dot:", "quantize:Q8_0_cpu"):
        (wanted / f"{name}.{tag}").touch()
    (wanted / "no-tag").touch()
    (wanted / f"a-folder.{tag}").mkdir()
    os.symlink(tmp_path / "outside", wanted / f"quantize:F16.{tag}")
    (wanted / "quantize:Q8_0.cpython-399").touch()                         # another Python's
    r = subprocess.run([sys.executable, "-m", "ggtool.compiling.warm"], stdin=subprocess.DEVNULL, cwd=ROOT,
                       env=env, timeout=300, capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert sorted(os.listdir(wanted)) == ["quantize:Q8_0.cpython-399"]
    assert os.listdir(Path(root, "ready")) == [f"quantize:Q8_0_cpu.{tag}"]
    assert not (tmp_path / "outside").exists()


def test_a_kernel_that_fails_to_compile_is_marked_and_not_tried_again(tmp_path, monkeypatch):
    from ggtool.compiling import warm
    from ggtool.kernels import cache

    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cache, "_dirs", {})
    monkeypatch.setattr(sys, "stdin", type("In", (), {"buffer": type("B", (), {"read": lambda self: b""})()})())
    tag = sys.implementation.cache_tag
    (tmp_path / "wanted").mkdir()
    (tmp_path / "wanted" / f"dot:q4_0.{tag}").touch()
    monkeypatch.setitem(warm.KINDS, "dot", (lambda arg: 1 / 0, warm.KINDS["dot"][1]))
    warm.main()
    assert (tmp_path / "failed" / f"dot:q4_0.{tag}").read_text() == "ZeroDivisionError: division by zero\n"
    assert os.listdir(tmp_path / "wanted") == [] and not (tmp_path / "ready").exists()
    (tmp_path / "wanted" / f"dot:q4_0.{tag}").touch()
    assert warm._pending(str(tmp_path)) == [] and os.listdir(tmp_path / "wanted") == []


def test_a_link_at_the_lock_or_a_marker_is_never_followed(tmp_path):
    env = _env(tmp_path)
    root = Path(_python("from ggtool.kernels import cache; print(cache.cache_dir())", env).stdout.strip())
    outside = tmp_path / "outside"
    (root / "wanted").mkdir(parents=True)
    os.symlink(outside, root / "compile.lock")
    r = subprocess.run([sys.executable, "-m", "ggtool.compiling.warm"], stdin=subprocess.DEVNULL, cwd=ROOT,
                       env=env, timeout=300, capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "" and not outside.exists()
    os.unlink(root / "compile.lock")
    os.symlink(outside, root / "wanted" / f"dot:q4_0.{sys.implementation.cache_tag}")
    code = "import ggtool.role; ggtool.role.COMMAND_LINE = True\nfrom ggtool.kernels import cache\ncache._compiler = 0\n" \
           "print(cache.use_kernel('dot:q4_0'))"
    r = _python(code, env)
    assert r.returncode == 0 and r.stdout.strip() == "False" and not outside.exists(), r.stderr


@pytest.mark.parametrize("how", ["group-writable", "a link of another user's"])
def test_a_kernel_cache_that_cannot_be_trusted_is_bypassed_with_one_warning(tmp_path, how):
    """The command line says so in one line, runs the twin, writes nothing there, and starts no
    background compiler."""
    root = tmp_path / "cache"
    if how == "group-writable":
        root.mkdir()
        os.chmod(root, 0o775)
    else:
        if os.geteuid() != 0:
            pytest.skip("a link of another user's needs root")
        (tmp_path / "theirs").mkdir(mode=0o700)
        os.symlink(tmp_path / "theirs", root)
        os.lchown(root, 12345, -1)
    env = {**_env(tmp_path), "GGTOOL_CACHE_DIR": str(root)}
    r = subprocess.run([sys.executable, "-c", QUANTIZED_CLI], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 0 and r.stdout == "[31.996094,31.996094]\n", r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith(f"Warning: ggtool's cache is not used: {root} ")
    assert ("chmod go-w" in line) if how == "group-writable" else ("another user's" in line)
    assert [f for _, _, fs in os.walk(tmp_path) for f in fs] == []


QUANTIZED_CLI = """
import sys
sys.argv = ["ggtool", "compute", "mul_mat(w, x)", "--tensor", "w=q8_0:[" + ",".join(["[" + ",".join(["1"] * 32) + "]"] * 2) + "]",
            "--tensor", "x=[" + ",".join(["1"] * 32) + "]"]
from ggtool.commands import console
console()
"""


F16 = """
import warnings
import numpy as np          # before the filter: numpy's ImportWarning on NPY_DISABLE_CPU_FEATURES (.ci/avx2-host) is not ours
warnings.simplefilter("always")
from ggtool.kernels import quantize
out = np.zeros(3, np.uint16)
quantize.fp32_to_fp16(np.array([1.0, 2.5, -3.0], np.float32), out)
print(out.tolist(), len(quantize.fp32_to_fp16.dispatcher.stats.cache_hits))
"""


def test_a_damaged_compiled_kernel_is_compiled_anew_and_reported(tmp_path):
    """numba's cache files carry no check of their own: a flipped byte in an index made every later
    run fail (UnicodeDecodeError in pickle), one in a data file could be loaded as machine code.
    ggtool's kernels keep theirs behind a CRC-32: a damaged file is one warning, removed, compiled
    anew; the run after loads the new one."""
    env = {**_env(tmp_path), "NUMBA_CACHE_DIR": str(tmp_path / "k")}
    first = _python(F16, env)
    assert first.returncode == 0 and first.stdout == "[15360, 16640, 49664] 0\n", first.stderr
    (index,) = (tmp_path / "k").rglob("quantize.fp32_to_fp16-*.nbi")
    (data,) = (tmp_path / "k").rglob("quantize.fp32_to_fp16-*.nbc")
    assert _python(F16, env).stdout == "[15360, 16640, 49664] 1\n"        # loaded from the cache
    for damaged in (data, index):
        raw = bytearray(damaged.read_bytes())
        raw[len(raw) // 2] ^= 0x10
        damaged.write_bytes(raw)
        again = _python(F16, env)
        assert again.returncode == 0 and again.stdout == "[15360, 16640, 49664] 0\n", again.stderr
        assert again.stderr.count("CacheWarning") == 1
        assert f"a compiled kernel in the cache was refused and is compiled anew: {damaged} does not match its checksum" \
            in again.stderr
        after = _python(F16, env)
        assert after.stdout == "[15360, 16640, 49664] 1\n" and after.stderr == "", after.stderr


LOAD_THEN_COMPILE = """
    import sys
    import numpy as np
    from ggtool.kernels import nodes, quantize
    from ggtool.kernels.jit import numba
    out = np.zeros(3, np.uint16)
    quantize.fp32_to_fp16(np.array([1.0, 2.5, -3.0], np.float32), out)
    nodes.address("scale_f32")
    registries = ("numba.np.linalg", "numba.typed.typedlist", "numba.np.random.generator_methods",
                  "numba.np.arrayobj")
    print(out.tolist(), len(quantize.fp32_to_fp16.dispatcher.stats.cache_hits),
          [m for m in registries if m in sys.modules])
    print(numba.njit(lambda a, s: a.sum() + len(s))(np.arange(4.0), "ab"))    # a compile, strings and all
    print(numba.njit(lambda n: np.empty(n).size)(5))                # numba.np.arrayobj's own code
"""


def test_loading_cached_kernels_sets_up_none_of_numbas_compiler_and_a_compile_after_still_can(tmp_path):
    """numba refreshes its CPU target (every typing and lowering registry it has, ~0.14 s) before it
    loads a function from its cache; only compiling reads them, and numba's compiler refreshes
    first: a process that loads its kernels from the cache (a cached command line, each worker of
    its pool) sets up the runtime alone (``jit._init_target``), and one that compiles afterwards
    compiles as before. Nor does it import numba.np.arrayobj (~45 ms), whose globals the
    environment of numba.carray's code names (``jit._LightImports``)."""
    env = {**_env(tmp_path), "NUMBA_CACHE_DIR": str(tmp_path / "k")}
    first = _python(LOAD_THEN_COMPILE, env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines()[0].startswith("[15360, 16640, 49664] 0 ['numba.np.linalg'")   # compiled
    cached = _python(LOAD_THEN_COMPILE, env)
    assert cached.returncode == 0 and cached.stdout == "[15360, 16640, 49664] 1 []\n8.0\n5\n", cached.stderr


def test_a_cached_kernel_whose_light_load_fails_is_loaded_as_numba_loads_it(tmp_path):
    """Where loading without numba's refresh fails (a numba whose cached code needs more than its
    runtime), the load is numba's own: refresh, then load; the kernel still comes from the cache."""
    env = {**_env(tmp_path), "NUMBA_CACHE_DIR": str(tmp_path / "k")}
    assert _python(F16, env).stdout == "[15360, 16640, 49664] 0\n"
    failing_once = """
        from numba.core import caching
        real, failed = caching.Cache._load_overload, []
        def once(self, sig, ctx):
            if not failed:
                failed.append(1)
                raise RuntimeError("needs the registries")
            return real(self, sig, ctx)
        caching.Cache._load_overload = once
    """
    r = _python(textwrap.dedent(failing_once) + F16, env)
    assert r.returncode == 0 and r.stdout == "[15360, 16640, 49664] 1\n", r.stderr


CACHE_WHEN_USED = """
    import numpy as np
    from numba.core.registry import CPUDispatcher
    from ggtool.kernels import dot, nodes, quantize
    made = [type(d._cache).__name__ for m in (dot, nodes, quantize) for d in vars(m).values()
            if isinstance(d, CPUDispatcher)]
    print(len(made) > 20, set(made))
    out = np.zeros(3, np.uint16)
    quantize.fp32_to_fp16(np.array([1.0, 2.5, -3.0], np.float32), out)
    d = quantize.fp32_to_fp16.dispatcher
    print(out.tolist(), type(d._cache).__name__, len(d.stats.cache_hits))
"""


def test_a_kernels_cache_is_made_when_it_is_first_used(tmp_path):
    """Importing the kernels makes no numba cache (each looks for its files: ~35 ms of a cached
    model run, for dispatchers a run that loads its node kernels compiled never calls); the first
    call makes the checked one, which compiles and keeps the kernel, then loads it."""
    env = {**_env(tmp_path), "NUMBA_CACHE_DIR": str(tmp_path / "k")}
    first = _python(CACHE_WHEN_USED, env)
    assert first.returncode == 0, first.stderr
    assert first.stdout == "True {'_CacheWhenUsed'}\n[15360, 16640, 49664] _CheckedCache 0\n"
    again = _python(CACHE_WHEN_USED, env)
    assert again.stdout == "True {'_CacheWhenUsed'}\n[15360, 16640, 49664] _CheckedCache 1\n", again.stderr


def test_every_module_whose_compiled_functions_others_compile_in_is_shared():
    """numba checks a cached kernel against its own module's source only: a kernel module that
    imports another's compiled functions (x86_float, x86_legacy, x86_kquants take x86's lanes and
    reductions) would keep running their old code after that module changes, unless the other is in
    cache.SHARED (whose sources key the cache)."""
    import ast
    import importlib
    from pathlib import Path

    from numba.core.registry import CPUDispatcher

    from ggtool.kernels import cache

    root = Path(cache.__file__).parent
    missing = []
    for path in sorted(root.glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                mod = importlib.import_module(f"ggtool.kernels.{node.module}")
                if any(isinstance(getattr(mod, a.name, None), CPUDispatcher) for a in node.names) \
                        and f"{node.module}.py" not in cache.SHARED:
                    missing.append((path.name, node.module))
    assert not missing, missing
    assert "x86.py" in cache.SHARED


def test_the_dots_and_the_runner_s_kernels_compile_each_shared_callee_once(tmp_path):
    """numba compiles a function apart for each constant argument and for read-only arrays: the
    Python path's dots passed constants and read-only weights where the runner's node kernels pass
    values and raw-address arrays, and every shared callee (the activation passes, the F32 product,
    the Q8_0 quantizer) was compiled twice in a process that compiles both (~2.5 s of ~27 s CPU for
    a gemma-3 generation's kernels). Each now has one compiled form. And none of them compiles
    numba's own ``.view`` to another element size or ``np.zeros`` (~0.1-0.3 s CPU each kind of array:
    the K-quants' activation pass and quantizer viewed bytes as float32, the 32-value one zeroed two
    arrays it then wrote whole)."""
    r = _python("""
        from numba.core import dispatcher
        from ggtool.compiling import warm
        from ggtool.kernels import dot, dot_float, dot_k, quantize
        compiled, core = [], dispatcher._FunctionCompiler._compile_core
        def noted(self, args, return_type):
            compiled.append(self.py_func.__qualname__)
            return core(self, args, return_type)
        dispatcher._FunctionCompiler._compile_core = noted
        for name in ("quantize:Q8_0_cpu", "quantize:Q8_K", "dot:q4_K", "dot:q6_K", "dot:q8_0", "dot:f32",
                     "node:mm_convert", "node:mm_q32", "node:mm_k", "node:mm_f32"):
            warm.compile_kernel(name)
        for fn in (dot._act_pairs, dot_k._act_pairs_k, dot_float._dot_rows, dot_float._transpose, quantize._q8_0):
            print(fn.__name__, len(fn.signatures))
        print("_act_pairs_compiles", compiled.count("_act_pairs"))     # the hook sees each compile
        for impl in ("ol_compatible_view", "ol_np_zeros"):
            print(impl, sum(q.startswith(impl + ".") for q in compiled))
    """, dict(_env(tmp_path), NUMBA_CACHE_DIR=str(tmp_path / "numba")))     # a new cache: all compiled here
    assert r.returncode == 0, r.stderr
    counts = dict(line.split() for line in r.stdout.split("\n") if line)
    assert counts == {"_act_pairs": "1", "_act_pairs_k": "1", "_dot_rows": "1", "_transpose": "1", "_q8_0": "1",
                      "_act_pairs_compiles": "1", "ol_compatible_view": "0", "ol_np_zeros": "0"}


def test_view_as_and_read_only_are_numpy_s_view_and_a_read_only_view():
    """`native.view_as` (numpy's same-size ``.view``, which numba compiles ~0.1-0.2 s a pair of types)
    and `native.read_only`: the same memory, shape and strides; a view's reference keeps its array
    alive (no leak, no early free); an element type of another size, or a write through a read-only
    array, is refused at compile time."""
    import numba
    import numpy as np

    from ggtool.kernels.native import read_only, view_as

    @numba.njit(cache=False)
    def bits(x):
        u = view_as(x, np.uint32)
        u[0, 1] = np.uint32(0x3F800000)            # 1.0f, written through the view
        return u

    @numba.njit(cache=False)
    def fresh(n):
        return view_as(np.arange(n).astype(np.float32), np.int32)   # the view outlives its name

    @numba.njit(cache=False)
    def frozen(x):
        return read_only(x)

    @numba.njit(cache=False)
    def write_through(x):
        read_only(x)[0, 0] = 1.0

    @numba.njit(cache=False)
    def other_size(x):
        return view_as(x, np.uint16)

    x = np.zeros((2, 3), np.float32)
    before = sys.getrefcount(x)
    for _ in range(100):
        u = bits(x)
    assert sys.getrefcount(x) - before == 1                 # u's reference, no other
    assert u.dtype == np.uint32 and u.shape == (2, 3) and u.strides == x.strides and x[0, 1] == 1.0
    assert np.shares_memory(u, x)
    assert (fresh(5) == np.arange(5, dtype=np.float32).view(np.int32)).all()
    assert np.shares_memory(frozen(x), x)
    (arg,), ret = frozen.nopython_signatures[0].args, frozen.nopython_signatures[0].return_type
    assert arg.mutable and not ret.mutable and (ret.dtype, ret.ndim, ret.layout) == (arg.dtype, arg.ndim, arg.layout)
    with pytest.raises(numba.core.errors.TypingError):
        write_through(x)                                    # read-only to the compiler
    with pytest.raises(numba.core.errors.TypingError):
        other_size(x)
