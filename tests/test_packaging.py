"""The installed package is complete and `import ggtool` is the library, with no click in it."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_every_engine_package_is_installed_by_pyproject():
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "ggtool").rglob("__init__.py")}
    assert found <= listed, f"packages missing from pyproject.toml: {sorted(found - listed)}"
    assert config["package-dir"]["ggtool.commands"] == "commands"


def test_import_ggtool_loads_no_click_and_exports_the_library():
    code = ("import sys, ggtool; assert 'click' not in sys.modules, 'the engine imported click'; "
            "names = ['Context', 'Tensor', 'Graph', 'Plan', 'WorkerPool', 'get_pool', 'quantize_q4_0']; "
            "print(all(getattr(ggtool, n) for n in names))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT / "tests")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "True"


def test_engine_sources_never_import_click():
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "ggtool").rglob("*.py")
                 if "import click" in p.read_text() or "from click" in p.read_text()]
    assert offenders == []
