"""README's layout table names every package and top-level module of ggtool/ and commands/, so
that it cannot fall behind the tree again (it once left out kernels/, types.py and errors.py)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def layout_table() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("## Layout\n")
    return text[start:text.index("\n## ", start + 1)]


def test_every_package_and_module_of_ggtool_is_in_the_layout_table():
    table = layout_table()
    named = set(re.findall(r"`([\w./]+)`", table))
    entries = [p.name + ("/" if p.is_dir() else "") for p in sorted((ROOT / "ggtool").iterdir())
               if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"]
    assert len(entries) > 20
    missing = [e for e in entries if e not in named and f"ggtool/{e}" not in named]
    assert missing == []


def test_the_layout_table_names_no_module_that_is_gone():
    table = layout_table()
    gone = [name for name in re.findall(r"`ggtool/([\w./]+)`", table) if not (ROOT / "ggtool" / name).exists()]
    assert gone == []
