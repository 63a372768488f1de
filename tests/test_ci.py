"""The CI scripts: .ci/run and .ci/matrix read the README's set-up commands from one place, and
.ci/matrix finds one interpreter per Python 3.X (its run itself is the README's commands, run by CI)."""

from __future__ import annotations

import shutil
import subprocess
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
    assert install.startswith(venv + "pip install -e . && ggtool compute ")
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
