"""The CI scripts: .ci/run and .ci/matrix read the README's set-up commands from one place, and
.ci/matrix finds one interpreter per Python 3.X (its run itself is the README's commands, run by CI)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ("bash", "dirname", "sed", "awk", "sort", "seq", "head", "tail")   # what .ci/matrix --list runs

pytestmark = pytest.mark.skipif(any(shutil.which(t) is None for t in TOOLS), reason="needs bash and coreutils")


def test_the_readme_has_exactly_the_two_setup_commands_the_ci_scripts_run():
    """Each installs into the checkout's .venv, never into the Python that runs it (Debian's and
    Ubuntu's refuse that, PEP 668), and works in a shell of its own (.ci/run runs each with bash -c)."""
    r = subprocess.run(["bash", "-c", '. .ci/readme.sh && readme_commands && printf "%s\\n" "$install_cmd" "$test_cmd"'],
                       capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert r.returncode == 0, r.stderr
    install, test = r.stdout.splitlines()
    venv = "python3 -m venv .venv && . .venv/bin/activate && "   # both make or reuse .venv: each runs alone
    assert install.startswith(venv + "pip install -e . && ggtool kernels --compile && ggtool compute ")
    assert test == venv + "pip install -e '.[test]' && python -m pytest -q"
    assert (ROOT / "README.md").read_text().count("<!-- setup:") == 2


def fake_python(path: Path, version: str | None) -> None:
    """An interpreter that reports `version`, or, for None, one that cannot run (as pyenv's shim for
    a version it has not selected)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = f"echo {version}" if version else 'echo "pyenv: $0: command not found" >&2; exit 127'
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def test_matrix_takes_the_newest_python_per_minor_version_from_pyenv_and_path(tmp_path):
    """Per 3.X the newest patch release of pyenv's and PATH's wins; pyenv's pre-releases and
    free-threaded builds, an interpreter that does not run and one below requires-python's floor are
    passed over; a classified version with none is named."""
    bin_dir, pyenv = tmp_path / "bin", tmp_path / "pyenv"
    bin_dir.mkdir()
    for tool in TOOLS:
        (bin_dir / tool).symlink_to(shutil.which(tool))
    fake_python(pyenv / "versions/3.12.3/bin/python3", "3.12.3")
    fake_python(pyenv / "versions/3.12.7/bin/python3", "3.12.7")
    fake_python(pyenv / "versions/3.11.9/bin/python3", "3.11.9")
    fake_python(pyenv / "versions/3.13.0t/bin/python3", "3.13.0")
    fake_python(pyenv / "versions/3.14-dev/bin/python3", "3.14.0")
    fake_python(pyenv / "versions/3.9.18/bin/python3", "3.9.18")
    fake_python(bin_dir / "python3.11", "3.11.4")
    fake_python(bin_dir / "python3.12", None)
    fake_python(bin_dir / "python3.14", "3.14.1")
    env = {"PATH": str(bin_dir), "PYENV_ROOT": str(pyenv), "HOME": str(tmp_path)}
    r = subprocess.run(["bash", ".ci/matrix", "--list"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "python 3.10   no interpreter found",
        f"python 3.11.9  {pyenv}/versions/3.11.9/bin/python3",
        f"python 3.12.7  {pyenv}/versions/3.12.7/bin/python3",
        "python 3.13   no interpreter found",
        f"python 3.14.1  {bin_dir}/python3.14",
    ]
    r = subprocess.run(["bash", ".ci/matrix", "--list", "3.9"], capture_output=True, text=True, cwd=ROOT, env=env,
                       timeout=60)
    assert r.returncode == 2 and r.stdout == "" and "not Python 3.10 or newer" in r.stderr


def floor_pins(pyproject: str, leave_out=()) -> list[str]:
    spec = importlib.util.spec_from_file_location("floor_pins", ROOT / ".ci" / "floor_pins.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.floor_pins(pyproject, leave_out)


def test_floors_pins_each_requirement_that_holds_here_to_its_highest_floor():
    """.ci/floors installs these: the `>=` bound of each requirement whose marker holds for this
    Python, a name's highest (a test-extra floor above a dependency's), the left-out ones left out."""
    pyproject = """
[project]
dependencies = ["a>=1.0; python_version < '3.0'", "a>=2.0; python_version >= '3.0'", "b>=0.5", "model>=1"]
[project.optional-dependencies]
test = ["b>=0.7", "c>=3; python_version < '3.0'"]
"""
    assert floor_pins(pyproject, ["model"]) == ["a==2.0", "b==0.7"]
    with pytest.raises(SystemExit, match="no single >= floor"):
        floor_pins('[project]\ndependencies = ["a<2"]\n')


def test_floors_of_pyproject_are_within_its_requirements():
    """Every dependency and test tool gets a floor on this Python, and each floor satisfies every
    requirement of its name that holds here (no floor below another's range)."""
    from pip._vendor.packaging.requirements import Requirement

    if sys.version_info >= (3, 11):
        import tomllib
    else:
        import tomli as tomllib
    text = (ROOT / "pyproject.toml").read_text()
    project = tomllib.loads(text)["project"]
    reqs = [Requirement(r) for r in project["dependencies"] + project["optional-dependencies"]["test"]]
    reqs = [r for r in reqs if r.marker is None or r.marker.evaluate()]
    pins = dict(p.split("==") for p in floor_pins(text))
    assert set(pins) == {r.name for r in reqs}
    assert all(r.specifier.contains(pins[r.name]) for r in reqs)
