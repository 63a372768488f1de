"""The installed package is complete and `import ggtool` is the library, with no click in it."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:   # the test extra brings tomli, the same parser, to 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_engine_package_is_installed_by_pyproject():
    config = PYPROJECT["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "ggtool").rglob("__init__.py")}
    assert found <= listed, f"packages missing from pyproject.toml: {sorted(found - listed)}"
    gone = listed - found - {"ggtool.commands"}      # setuptools fails the install on a folder that is gone
    assert not gone, f"pyproject.toml lists packages that do not exist: {sorted(gone)}"
    assert config["package-dir"]["ggtool.commands"] == "commands"


def test_the_shipped_programs_are_files_of_their_own_package():
    """generate's programs live in ggtool/programs/ as real files (no links into fixtures/, which
    holds test data only), installed as package data; SHIPPED names each."""
    from ggtool.generate.programs import PROGRAMS_DIR, SHIPPED

    assert PROGRAMS_DIR == ROOT / "ggtool" / "programs"
    for name in [*SHIPPED.values(), "transformer.gg"]:
        path = PROGRAMS_DIR / name
        assert path.is_file() and not path.is_symlink(), name
    assert PYPROJECT["tool"]["setuptools"]["package-data"]["ggtool.programs"] == ["*.gg"]
    assert sorted(p.name for p in PROGRAMS_DIR.glob("*.gg")) == sorted([*SHIPPED.values(), "transformer.gg"])
    assert list((ROOT / "fixtures").glob("*.gg")) == []


def test_the_classifiers_and_the_readme_name_each_python_from_requires_pythons_floor():
    """The Pythons ggtool supports are stated as one series: requires-python's floor, every 3.X
    classifier up from it with no gap, and the README's set-up sentence naming the first and last."""
    floor = re.fullmatch(r">=3\.(\d+)", PYPROJECT["project"]["requires-python"])
    assert floor, PYPROJECT["project"]["requires-python"]
    minors = [int(m) for c in PYPROJECT["project"]["classifiers"] for m in re.findall(r"^Programming Language :: Python :: 3\.(\d+)$", c)]
    assert minors and minors == list(range(int(floor[1]), int(floor[1]) + len(minors))), minors
    readme = (ROOT / "README.md").read_text()
    assert f"Python 3.{minors[0]} to 3.{minors[-1]}" in readme.split("<!-- setup:install -->")[0]


def test_import_ggtool_loads_no_click_and_exports_the_library():
    code = ("import sys, ggtool; assert 'click' not in sys.modules, 'the engine imported click'; "
            "names = ['Context', 'Tensor', 'Graph', 'Plan', 'WorkerPool', 'get_pool', 'quantize_q4_0']; "
            "print(all(getattr(ggtool, n) for n in names))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT / "tests")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True"


def test_python_dash_m_runs_from_a_plain_checkout(tmp_path):
    """docs/cli.md: `python -m ggtool` from a checkout with the dependencies installed but not ggtool:
    ggtool/__init__.py finds `ggtool.commands` in commands/ as an install maps it. Run with -S (no
    site: no editable install's finder) and the dependencies' site-packages on PYTHONPATH, from a
    copy of the checkout."""
    checkout = tmp_path / "checkout"
    for part in ("ggtool", "commands"):
        shutil.copytree(ROOT / part, checkout / part, ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "GGTOOL_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p.endswith("site-packages"))

    def run(*args):
        return subprocess.run([sys.executable, "-S", *args], capture_output=True, text=True, cwd=checkout, env=env,
                              timeout=120)

    r = run("-c", "import ggtool.commands.compute as c; print(c.__file__)")
    assert (r.returncode, r.stdout.strip()) == (0, str(checkout / "commands" / "compute.py")), r.stderr
    r = run("-m", "ggtool", "compute", "add(a, b)", "--tensor", "a=[1,2]", "--tensor", "b=[3,4]", "--threads", "2")
    assert (r.returncode, r.stdout, r.stderr) == (0, "[4,6]\n", "")


def test_engine_sources_never_import_click():
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "ggtool").rglob("*.py")
                 if "import click" in p.read_text() or "from click" in p.read_text()]
    assert offenders == []


WARNING_CASES = '''
import warnings


def deprecated_api():
    """A third-party API that warns whoever calls it (stacklevel=2), as click's deprecated ones do."""
    warnings.warn("deprecated_api is deprecated", DeprecationWarning, stacklevel=2)


def as_module(name, code):
    """Run `code` as module `name`'s: warnings are attributed to the module of the frame that warns."""
    exec(code, {"__name__": name, "deprecated_api": deprecated_api, "warnings": warnings})


def test_ours_calls_a_deprecated_api():
    as_module("ggtool.commands.quantize", "deprecated_api()")


def test_ours_warns():
    as_module("ggtool", "warnings.warn('careful', UserWarning)")


def test_numpy_warns_on_our_arithmetic():
    as_module("ggtool.ops.binary", "import numpy as np; np.float32(1) / np.float32(0)")


def test_theirs_warns():
    as_module("numba.core.config", "warnings.warn('theirs', DeprecationWarning)")


def test_theirs_calls_a_deprecated_api():
    as_module("gguf.gguf_writer", "deprecated_api()")


def test_a_lookalike_name_is_not_ours():
    as_module("ggtoolbox", "warnings.warn('not ours', UserWarning)")
'''


def test_warnings_from_our_modules_fail_the_tests(tmp_path):
    """pyproject.toml's filterwarnings: a warning attributed to ggtool's modules (raised there, or by
    a deprecated API they call) is an error; third-party modules' own warnings are not."""
    (tmp_path / "test_warning_cases.py").write_text(WARNING_CASES)
    r = subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT),
                        "-p", "no:cacheprovider", "-q", "-rfp", "-W", "ignore::pytest.PytestConfigWarning",
                        str(tmp_path / "test_warning_cases.py")],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    outcome = {line.split("::")[1].split()[0]: line.split()[0] for line in r.stdout.splitlines()
               if line.startswith(("PASSED", "FAILED"))}
    assert outcome == {
        "test_ours_calls_a_deprecated_api": "FAILED", "test_ours_warns": "FAILED",
        "test_numpy_warns_on_our_arithmetic": "FAILED", "test_theirs_warns": "PASSED",
        "test_theirs_calls_a_deprecated_api": "PASSED", "test_a_lookalike_name_is_not_ours": "PASSED"}, r.stdout


def test_the_type_table_is_gguf_pys():
    """ggtool.types holds GGML's type table itself (so the engine starts without gguf): every id,
    name and size gguf-py knows, but block_q8_1, which gguf-py 0.19 still sizes at its old 40 bytes."""
    import gguf

    from ggtool import types as T

    theirs = {t.name: (int(t), gguf.GGML_QUANT_SIZES.get(t)) for t in gguf.GGMLQuantizationType}
    ours = {t.name: (int(t), (T.block_size(t), T.type_size(t))) for t in T.GGMLType}
    assert ours.pop("Q8_1") == (9, (32, 36))
    assert theirs.pop("Q8_1")[0] == 9
    assert {k: v for k, v in theirs.items() if v[1] is not None} == {k: v for k, v in ours.items() if k in theirs}
    assert T.parse_type(gguf.GGMLQuantizationType.Q4_K) is T.GGMLType.Q4_K


def test_a_compute_on_npy_and_json_imports_no_gguf(tmp_path):
    """Neither the command line nor a worker process imports gguf (~60 ms of start-up) when no GGUF
    file is involved."""
    import numpy as np

    np.save(tmp_path / "x.npy", np.ones((4, 8), np.float32))
    loaded = "sorted(m for m in ('gguf', 'yaml') if m in sys.modules)"
    code = (f"import sys, atexit; atexit.register(lambda: print({loaded})); "
            "sys.argv[0] = 'ggtool'; from ggtool.__main__ import main; main()")
    r = subprocess.run([sys.executable, "-c", code, "compute", "add(x, y)", "--tensor", f"x={tmp_path / 'x.npy'}",
                        "--tensor", "y=[1,2,3,4,5,6,7,8]", "--threads", "2"], capture_output=True, text=True,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["[[2,3,4,5,6,7,8,9],[2,3,4,5,6,7,8,9],[2,3,4,5,6,7,8,9],[2,3,4,5,6,7,8,9]]", "[]"]
    worker = f"import sys; import ggtool.pool.worker; print({loaded})"   # what a worker imports before its loop
    r = subprocess.run([sys.executable, "-c", worker], capture_output=True, text=True, cwd=tmp_path)
    assert (r.returncode, r.stdout.strip()) == (0, "[]"), r.stderr


def test_a_gguf_command_loads_no_yaml_until_something_uses_it(tmp_path):
    """gguf-py imports PyYAML (for model cards ggtool never reads: ~20 ms of every GGUF command's
    start). The command line's `yaml` is a stand-in (gguf_io.reader._YamlOnFirstUse) that imports it at
    first use: a GGUF command never does; `import yaml` and `from yaml import ...` still work, and
    a library user's process gets PyYAML itself."""
    loaded = "('yaml.reader' in sys.modules, type(sys.modules['yaml']).__name__)"
    code = (f"import sys, atexit; atexit.register(lambda: print({loaded})); "
            "sys.argv[0] = 'ggtool'; from ggtool.__main__ import main; main()")
    r = subprocess.run([sys.executable, "-c", code, "inspect", str(ROOT / "fixtures" / "stories260K.gguf")],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == "(False, '_YamlOnFirstUse')"
    use = ("import sys, ggtool.role; ggtool.role.COMMAND_LINE = {}; from ggtool.gguf_io import reader; "
           "import yaml; from yaml import safe_dump; print(yaml.safe_load('a: [1, 2]'), safe_dump([3]).strip(), "
           "type(sys.modules['yaml']).__name__, type(yaml).__name__)")
    for command_line, kind in ((True, "_YamlOnFirstUse"), (False, "module")):
        r = subprocess.run([sys.executable, "-c", use.format(command_line)], capture_output=True, text=True, cwd=tmp_path)
        assert (r.returncode, r.stdout) == (0, f"{{'a': [1, 2]}} - 3 module {kind}\n"), r.stderr
