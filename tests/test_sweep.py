"""`ggtool sweep` and ggtool.evaluate.sweep: the cells, the table, resuming, the chart, and what is refused.

stories260K over 4 file types at -c 64, 4 chunks (its rows of 64 make Q2_K fall back to Q4_0: two
types, one file, both on the front). The distributed procedure without a cluster (LocalExecutor)
gives the same numbers as the run in one process; test_cluster.py checks Ray's.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import struct
import zlib

import pytest
from conftest import ROOT, STORIES, fails, ok

TEXT = ROOT / "fixtures" / "genesis.txt"
TYPES = "q4_0,q8_0,q4_k_m,q2_k"
ARGS = ["-c", "64", "--chunks", "4"]
NUMBERS = ("type", "bytes", "bpw", "ppl", "ppl_unc", "kld", "kld_unc", "same_top", "pareto")


def numbers(csv_text: str) -> list[dict]:
    """The rows' numbers, without the times."""
    return [{k: r[k] for k in NUMBERS} for r in csv.DictReader(io.StringIO(csv_text))]


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """A finished sweep: (its DIR, the CSV it printed)."""
    from click.testing import CliRunner

    from ggtool.commands import cli

    d = tmp_path_factory.mktemp("sweep") / "out"
    r = CliRunner().invoke(cli, ["sweep", "--gguf", str(STORIES), "--types", TYPES, "-f", str(TEXT), "-o", str(d),
                                 *ARGS, "--csv", "-q"], prog_name="ggtool")
    assert r.exit_code == 0, r.stderr
    return d, r.stdout


def test_sweep_table_files_and_front(swept):
    d, out = swept
    rows = numbers(out)
    assert [r["type"] for r in rows] == ["base", "Q4_0", "Q8_0", "Q4_K_M", "Q2_K"]
    by = {r["type"]: r for r in rows}
    assert float(by["Q8_0"]["kld"]) < float(by["Q4_K_M"]["kld"]) < float(by["Q4_0"]["kld"])
    assert by["Q8_0"]["bytes"] == str(os.path.getsize(d / "Q8_0.gguf"))
    assert by["Q2_K"]["kld"] == by["Q4_0"]["kld"]               # the same file (fallback), the same numbers
    assert all(by[t]["pareto"] == "True" for t in ("Q4_0", "Q8_0", "Q4_K_M", "Q2_K"))
    rec = json.loads((d / "results.json").read_text())
    assert rec["n_chunk"] == 4 and [r["type"] for r in rec["rows"]] == ["Q4_0", "Q8_0", "Q4_K_M", "Q2_K"]
    assert 0 < rec["rows"][0]["same_top"] < 1 and rec["base_row"]["kld"] == 0.0
    # every quantized file is ggtool quantize's
    from ggtool.quantize_model import QuantizeOptions, quantize_file

    quantize_file(STORIES, d.parent / "q4_k_m.gguf", QuantizeOptions(type="Q4_K_M"))
    assert (d.parent / "q4_k_m.gguf").read_bytes() == (d / "Q4_K_M.gguf").read_bytes()


def test_chart_png_and_svg(swept):
    d, _ = swept
    png = (d / "kld-vs-size.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", png[16:24])
    idat = png[png.index(b"IDAT") + 4:png.index(b"IEND") - 8]
    raw = zlib.decompress(idat)
    assert len(raw) == h * (1 + 3 * w)                          # every row there, filter byte + RGB
    assert b"\xc8\x1e\x1e" in raw                               # the front's red
    svg = (d / "kld-vs-size.svg").read_text()
    assert svg.startswith("<svg") and "<polyline" in svg and "Q4_K_M" in svg and "Q2_K/Q4_0" in svg.replace(
        "Q4_0/Q2_K", "Q2_K/Q4_0")


def test_pareto_front():
    from ggtool.evaluate.chart import pareto_front

    pts = [(3.0, 0.1), (1.0, 0.5), (2.0, 0.05), (2.5, 0.2), (1.0, 0.6), (float("nan"), 0.0)]
    assert pareto_front(pts) == [1, 2]


def test_resume_keeps_cells_and_redoes_a_damaged_one(swept, run, tmp_path):
    d, out = swept
    d2 = tmp_path / "copy"
    shutil.copytree(d, d2)
    (d2 / "Q8_0.json").write_text("{ not json")
    os.unlink(d2 / "Q4_K_M.json")
    os.unlink(d2 / "Q4_K_M.quant.json")
    (d2 / "Q4_0.json").write_text(json.dumps({"kind": "ggtool-sweep-cell", "identity": {"type": "Q4_0"}}))
    r = run("sweep", "--gguf", STORIES, "--types", TYPES, "-f", TEXT, "-o", d2, *ARGS, "--csv")
    assert numbers(ok(r)) == numbers(out)
    err = r.stderr
    assert f"Warning: {d2}/Q8_0.json is damaged (not a JSON record); that cell is done again" in err
    assert f"Warning: {d2}/Q4_0.json was made with other settings (allow_requantize)" in err
    assert "Q2_K: 277,024 bytes" in err and "(kept from an earlier run)" in err
    assert err.count("quantizing") == 1                          # Q4_K_M only: Q8_0's and Q4_0's files were kept


def test_resume_of_another_sweep_is_refused(swept, run, tmp_path):
    d, _ = swept
    d2 = tmp_path / "copy"
    shutil.copytree(d, d2)
    fails(run("sweep", "--gguf", STORIES, "--types", "q4_0", "-f", TEXT, "-o", d2, "-c", "32", "--chunks", "4"),
          f"Error: {d2}: holds a sweep of another n_ctx, tokens; give another directory")
    (d2 / "manifest.json").write_text("[1, 2")
    fails(run("sweep", "--gguf", STORIES, "--types", "q4_0", "-f", TEXT, "-o", d2, *ARGS), "manifest is damaged")


def test_a_cell_whose_file_changed_is_redone(swept, run, tmp_path):
    d, out = swept
    d2 = tmp_path / "copy"
    shutil.copytree(d, d2)
    with open(d2 / "Q8_0.gguf", "r+b") as f:       # the same size, other bytes
        f.seek(100)
        f.write(b"\xff\xff\xff\xff")
    r = run("sweep", "--gguf", STORIES, "--types", TYPES, "-f", TEXT, "-o", d2, *ARGS, "--csv")
    assert numbers(ok(r)) == numbers(out)
    assert "Q8_0.json describes another Q8_0.gguf than the one there" in r.stderr
    assert (d2 / "Q8_0.gguf").read_bytes() == (d / "Q8_0.gguf").read_bytes()


def test_a_symlinked_cell_is_not_followed(swept, run, tmp_path):
    d, out = swept
    d2 = tmp_path / "copy"
    shutil.copytree(d, d2)
    victim = tmp_path / "victim.json"
    victim.write_text("keep me")
    os.unlink(d2 / "Q4_0.json")
    os.symlink(victim, d2 / "Q4_0.json")
    r = run("sweep", "--gguf", STORIES, "--types", TYPES, "-f", TEXT, "-o", d2, *ARGS, "--csv")
    assert numbers(ok(r)) == numbers(out)
    assert "Q4_0.json is a symbolic link (not followed)" in r.stderr
    assert victim.read_text() == "keep me" and not os.path.islink(d2 / "Q4_0.json")


def test_distributed_procedure_equals_one_process(swept, tmp_path):
    """The tasks (each chunk, each quantization) run by the local executor: the same numbers."""
    from ggtool.evaluate.distribute import LocalExecutor
    from ggtool.evaluate.sweep import Sweep, SweepOptions, csv_text

    d, out = swept
    s = Sweep(SweepOptions(str(STORIES), TYPES, str(TEXT), str(tmp_path / "local"), n_ctx=64, n_chunks=4),
              LocalExecutor())
    for _ in s.run():
        pass
    assert numbers(csv_text([s.result.base] + s.result.rows)) == numbers(out)


@pytest.mark.parametrize("types, what", [("q4_0,q9_9", "unknown file type 'q9_9'"), ("q4_0,,q8_0", "empty entry"),
                                         ("iq9_xxs", "unknown file type 'iq9_xxs'")])
def test_bad_types(run, tmp_path, types, what):
    fails(run("sweep", "--gguf", STORIES, "--types", types, "-f", TEXT, "-o", tmp_path / "d", *ARGS), what,
          code=2 if "unknown" in what else 1)
    assert not (tmp_path / "d").exists()


def test_bad_dirs(run, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    fails(run("sweep", "--gguf", STORIES, "--types", "q4_0", "-f", TEXT, "-o", f, *ARGS), f"{f}: is not a directory")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "link"
    os.symlink(elsewhere, link)
    fails(run("sweep", "--gguf", STORIES, "--types", "q4_0", "-f", TEXT, "-o", link, *ARGS),
          f"{link}: is a symbolic link (to {elsewhere}); give the directory itself")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    fails(run("sweep", "--gguf", STORIES, "--types", "q4_0", "-f", TEXT, "-o", busy, *ARGS),
          "is not empty and holds no sweep (manifest.json)")
    assert os.listdir(busy) == ["notes.txt"] and os.listdir(elsewhere) == []


def test_a_sweep_running_in_dir_refuses_a_second(swept, run, tmp_path):
    """Two sweeps in one DIR at once: the second is refused (DIR's lock, held by the first) and
    touches nothing; a lock planted as a symbolic link is not followed."""
    import fcntl

    d, out = swept
    d2 = tmp_path / "copy"
    shutil.copytree(d, d2)
    os.unlink(d2 / "Q8_0.json")
    before = sorted(os.listdir(d2))
    with open(d2 / ".ggtool-sweep.lock", "a") as held:           # the first sweep, still running
        fcntl.flock(held, fcntl.LOCK_EX)
        fails(run("sweep", "--gguf", STORIES, "--types", TYPES, "-f", TEXT, "-o", d2, *ARGS, "-q"),
              f"Error: {d2}: another sweep is running in this directory; wait for it, or give another")
        assert sorted(os.listdir(d2)) == before
    assert numbers(ok(run("sweep", "--gguf", STORIES, "--types", TYPES, "-f", TEXT, "-o", d2, *ARGS, "--csv",
                          "-q"))) == numbers(out)                 # released: it runs
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    os.unlink(d2 / ".ggtool-sweep.lock")
    os.symlink(victim, d2 / ".ggtool-sweep.lock")
    fails(run("sweep", "--gguf", STORIES, "--types", TYPES, "-f", TEXT, "-o", d2, *ARGS, "-q"),
          "cannot open its lock .ggtool-sweep.lock")
    assert victim.read_text() == "keep me"


def test_a_symlinked_quantized_file_is_replaced_not_followed(swept, run, tmp_path):
    """DIR/T.gguf planted as a link to a file elsewhere: the cell is redone, the link replaced by
    the file, and the file it pointed to left as it was."""
    d, out = swept
    d2 = tmp_path / "copy"
    shutil.copytree(d, d2)
    victim = tmp_path / "victim.gguf"
    victim.write_bytes((d / "Q8_0.gguf").read_bytes())             # even the right bytes: not trusted
    os.unlink(d2 / "Q8_0.gguf")
    os.symlink(victim, d2 / "Q8_0.gguf")
    r = run("sweep", "--gguf", STORIES, "--types", TYPES, "-f", TEXT, "-o", d2, *ARGS, "--csv")
    assert numbers(ok(r)) == numbers(out)
    assert "Q8_0.json describes Q8_0.gguf, which is missing" in r.stderr
    assert not os.path.islink(d2 / "Q8_0.gguf") and victim.read_bytes() == (d / "Q8_0.gguf").read_bytes()
    assert victim.stat().st_nlink == 1 and victim.stat().st_ino != (d2 / "Q8_0.gguf").stat().st_ino
    # the results planted as a link: replaced in DIR, the file elsewhere untouched
    os.unlink(d2 / "results.csv")
    os.symlink(victim, d2 / "results.csv")
    ok(run("sweep", "--gguf", STORIES, "--types", TYPES, "-f", TEXT, "-o", d2, *ARGS, "-q"))
    assert not os.path.islink(d2 / "results.csv") and victim.read_bytes() == (d / "Q8_0.gguf").read_bytes()


def test_short_text_and_json(run, tmp_path, swept):
    short = tmp_path / "short.txt"
    short.write_text("In the beginning God created the heaven and the earth.")
    fails(run("sweep", "--gguf", STORIES, "--types", "q4_0", "-f", short, "-o", tmp_path / "d", *ARGS), "at least 128")
    d, _ = swept
    rec = json.loads(ok(run("sweep", "--gguf", STORIES, "--types", TYPES, "-f", TEXT, "-o", d, *ARGS, "--json", "-q")))
    assert rec["kind"] == "sweep" and len(rec["rows"]) == 4


def test_base_logits_file_as_base(run, tmp_path, swept):
    """--base with a base-logits file: read where it is; the numbers are those against the source's."""
    d, out = swept
    r = run("sweep", "--gguf", STORIES, "--types", "q8_0", "-f", TEXT, "-o", tmp_path / "b", *ARGS, "--base",
            d / "base.bin", "--csv", "-q")
    got = numbers(ok(r))
    assert got == [x for x in numbers(out) if x["type"] == "Q8_0"]
    assert not (tmp_path / "b" / "base.bin").exists()
