"""Docs that test themselves: every `$ ggtool ...` example in README.md and docs/*.md runs, and prints
what the doc shows.

Collected: in a fenced or indented code block, a line `$ COMMAND` (`\\` continuation lines joined; a
pipeline through `| ggtool ...` is part of it) and the output lines right after it, up to the next
`$ ` line, a blank line or the end of the block. A file's examples run in order in ONE bash process
(`set -o pipefail`), so `$ GEMMA=$(...)` sets up the ones after it, as a reader's shell would; its cwd
is a scratch directory holding a symlink to each top-level entry of the repository (so `fixtures/...`
and `docs/...` resolve as from the repo root, and files the examples write never land in the repo),
`/tmp/` in a command is that scratch directory, and the venv's `ggtool` and `python` come first on PATH.

Checks: shown output equals stdout (or, for a command that prints nothing on stdout, such as
`quantize`'s progress, stderr), blank lines aside (they end a shown output, so the doc cannot show
them), where a line that is just `...` matches any lines (none included) and `...` inside a line
matches any text in that line (the doc's mark where a figure varies: a timing). An `Error: ...` output must match stderr, with a non-zero exit status. No
output shown: the command must exit 0.

Not run, visibly: a block right after `<!-- not run: REASON -->`; the README's set-up blocks
(`<!-- setup:NAME -->`), which CI runs itself (.ci/run); and, skipped with the reason shown, a block
after `<!-- needs: TOOL -->` where TOOL (a program ggtool does not depend on, such as jq) is not on PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"^<!-- not run: (.+) -->$")
SETUP = re.compile(r"^<!-- setup:\w+ -->$")
NEEDS = re.compile(r"^<!-- needs: (\S+) -->$")


@dataclass
class Example:
    doc: str  # path relative to the repo root
    line: int  # 1-based line of the `$ `
    command: str
    output: list[str]
    skip: str | None  # why it is not run, or None
    needs: str | None = None  # a program the example runs besides ggtool, python and coreutils

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def _blocks(lines: list[str]):
    """(first line index, code lines, reason not run or None, tool needed or None) for each fenced or
    indented code block."""
    pending = needs = None
    i, prev_blank = 0, True
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if m := NOT_RUN.match(stripped):
            pending = m.group(1)
        elif SETUP.match(stripped):
            pending = "README set-up command: CI runs it (.ci/run)"
        elif m := NEEDS.match(stripped):
            needs = m.group(1)
        if stripped.startswith("```"):
            start, body = i + 1, []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith("```"):
                body.append(lines[i])
                i += 1
            yield start, body, pending, needs
            pending = needs = None
            prev_blank = False
        elif prev_blank and line.startswith("    ") and stripped:
            start, body = i, []
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                body.append(lines[i][4:])
                i += 1
            i -= 1
            yield start, body, pending, needs
            pending = needs = None
        prev_blank = not stripped or stripped.startswith("<!--")
        i += 1


def collect(path: Path) -> list[Example]:
    lines = path.read_text().splitlines()
    examples = []
    for start, body, skip, needs in _blocks(lines):
        j = 0
        while j < len(body):
            if not body[j].startswith("$ "):
                j += 1
                continue
            line_no, command = start + j + 1, body[j][2:]
            while command.endswith("\\") and j + 1 < len(body):
                j += 1
                command = command[:-1].rstrip() + " " + body[j].strip()
            j += 1
            output = []
            while j < len(body) and body[j].strip() and not body[j].startswith("$ "):
                output.append(body[j])
                j += 1
            examples.append(Example(str(path.relative_to(ROOT)), line_no, command, output, skip, needs))
    return examples


EXAMPLES = [ex for doc in DOCS for ex in collect(doc)]


@lru_cache(maxsize=None)
def run_doc(doc: str) -> dict[int, tuple[int, str, str]]:
    """Runs a doc's examples (those not excluded) in order in one bash: {line: (status, stdout, stderr)}."""
    scratch = Path(tempfile.mkdtemp(prefix="ggtool-docs-"))
    for entry in ROOT.iterdir():
        if not entry.name.startswith("."):
            (scratch / entry.name).symlink_to(entry)
    out = scratch / ".results"
    out.mkdir()
    script = ["set -o pipefail"]
    runnable = [ex for ex in EXAMPLES if ex.doc == doc and ex.skip is None and _has(ex.needs)]
    for ex in runnable:
        command = ex.command.replace("/tmp/", f"{scratch}/")
        script.append(f"{{ {command}\n}} >{out}/{ex.line}.out 2>{out}/{ex.line}.err; echo $? >{out}/{ex.line}.rc")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GGTOOL_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    try:
        subprocess.run(["bash", "-c", "\n".join(script)], cwd=scratch, env=env, stdin=subprocess.DEVNULL, timeout=300, check=False)
        results = {}
        for ex in runnable:
            rc = (out / f"{ex.line}.rc").read_text().strip()
            results[ex.line] = (int(rc), (out / f"{ex.line}.out").read_text(), (out / f"{ex.line}.err").read_text())
        return results
    finally:
        shutil.rmtree(scratch)  # removes the symlinks, never what they point to


def _has(tool: str | None) -> bool:
    return tool is None or shutil.which(tool) is not None


def matches(shown: list[str], printed: list[str]) -> bool:
    """shown == printed, where a `...` line matches any lines and `...` inside a line any text."""
    if not shown:
        return not printed
    if shown[0].strip() == "...":
        return any(matches(shown[1:], printed[k:]) for k in range(len(printed) + 1))
    if not printed:
        return False
    pattern = "".join(".*" if part == "..." else re.escape(part) for part in re.split(r"(\.\.\.)", shown[0]))
    return re.fullmatch(pattern, printed[0]) is not None and matches(shown[1:], printed[1:])


@pytest.mark.parametrize("ex", [ex for ex in EXAMPLES if ex.skip is None], ids=lambda ex: ex.id)
def test_doc_example_prints_what_the_doc_shows(ex):
    if not _has(ex.needs):
        pytest.skip(f"{ex.id} needs {ex.needs}, not on PATH")
    status, stdout, stderr = run_doc(ex.doc)[ex.line]
    shown = [line.replace("/tmp/", "") for line in ex.output]
    where = f"{ex.id}: $ {ex.command}"
    if shown and shown[0].startswith("Error:"):
        assert status != 0, f"{where}\nexits 0, the doc shows an error"
        assert matches(shown, [line for line in stderr.splitlines() if line.strip()]), f"{where}\nstderr:\n{stderr}"
        return
    assert status == 0, f"{where}\nexit {status}\nstderr:\n{stderr}"
    if shown:
        printed = [line for line in (stdout or stderr).splitlines() if line.strip()]
        assert matches(shown, printed), f"{where}\nshown:\n" + "\n".join(shown) + "\nprinted:\n" + "\n".join(printed[:40])


def test_doc_examples_exclusions_are_few_and_say_why():
    """Every doc example is collected, the excluded ones each with a reason; the README's set-up
    commands are never among those run (CI runs them)."""
    assert len(EXAMPLES) >= 25
    skipped = [ex for ex in EXAMPLES if ex.skip]
    assert all(ex.skip.strip() for ex in skipped)
    assert len(skipped) <= 3, [ex.id for ex in skipped]
    readme = (ROOT / "README.md").read_text().splitlines()
    setup = [body for _, body, skip, _ in _blocks(readme) if skip and skip.startswith("README set-up")]
    assert len(setup) == 2 and all("pip install" in body[0] for body in setup)
    run = {ex.command for ex in EXAMPLES if ex.skip is None}
    assert not run & {body[0] for body in setup}


def test_doc_example_matching_fails_on_a_difference():
    assert matches(["a", "...", "z"], ["a", "b", "c", "z"])
    assert matches(["wrote x in ... s"], ["wrote x in 0.03 s"])
    assert not matches(["[1,2]"], ["[1,3]"])
    assert not matches(["a", "..."], ["b"])
    assert not matches(["a"], ["a", "b"])
