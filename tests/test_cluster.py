"""--ray: a real Ray cluster, and ggtool without Ray.

The cluster tests start `ray start --head --num-cpus 2` inside a network namespace of their own
(`unshare -n`, then `ip link set lo up`): Ray binds to a machine's first non-loopback address
whatever it is told, and test traffic must stay on loopback. They need root, unshare and ip, and
Ray importable (the `cluster` extra: `pip install -e '.[test,cluster]'`; the README's test command
installs `test` only, so there they skip); where any is missing they skip, saying which. The head is stopped by ending the `ray start --block` process this test started, never by
`ray stop` (which would stop every Ray cluster of the machine).
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import ROOT, STORIES, fails, ok

TEXT = ROOT / "fixtures" / "genesis.txt"
TYPES = "q4_0,q8_0,q4_k_m,q2_k"
ARGS = ["-c", "64", "--chunks", "4"]
NO_RAY = "Ray is not installed: pip install -e '.[cluster]' (the cluster extra) to run the Ray tests"
NUMBERS = ("type", "bytes", "bpw", "ppl", "ppl_unc", "kld", "kld_unc", "same_top", "pareto")


def numbers(text: str) -> list[dict]:
    return [{k: r[k] for k in NUMBERS} for r in csv.DictReader(io.StringIO(text))]


# -- without Ray ----------------------------------------------------------------------------------------

def test_ggtool_never_imports_ray_itself():
    """Only ggtool/evaluate/cluster.py names Ray; a sweep without --ray leaves it unimported."""
    hits = []
    for top in ("ggtool", "commands"):
        for p in (ROOT / top).rglob("*.py"):
            src = p.read_text(encoding="utf-8")
            if "import ray" in src or "from ray" in src:
                hits.append(p.relative_to(ROOT).as_posix())
    assert hits == ["ggtool/evaluate/cluster.py"]


def test_a_sweep_without_ray_loads_no_ray(tmp_path):
    code = textwrap.dedent(f"""
        import sys
        from click.testing import CliRunner
        from ggtool.commands import cli
        r = CliRunner().invoke(cli, ["sweep", "--gguf", {str(STORIES)!r}, "--types", "q8_0", "-f", {str(TEXT)!r},
                                     "-o", {str(tmp_path / "d")!r}, "-c", "64", "--chunks", "2", "-q", "--csv"])
        assert r.exit_code == 0, r.output
        print("ray" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"


@pytest.mark.parametrize("command", ["sweep", "perplexity", "imatrix"])
def test_ray_not_installed(tmp_path, command):
    """--ray where Ray cannot be imported: one line saying how to install it, nothing written."""
    argv = {"sweep": ["sweep", "--gguf", str(STORIES), "--types", "q8_0", "-f", str(TEXT), "-o", str(tmp_path / "d")],
            "perplexity": ["perplexity", "--gguf", str(STORIES), "-f", str(TEXT)],
            "imatrix": ["imatrix", "--gguf", str(STORIES), "-f", str(TEXT), "-o", str(tmp_path / "i.gguf")]}[command]
    code = textwrap.dedent(f"""
        import sys
        sys.modules["ray"] = None          # import ray raises ImportError, as where it is not installed
        from click.testing import CliRunner
        from ggtool.commands import cli
        r = CliRunner().invoke(cli, {argv + ["-c", "64", "--ray", "127.0.0.1:1"]!r})
        sys.stdout.write(str(r.exit_code) + "\\n" + r.stderr)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    status, *err = out.stdout.splitlines()
    assert status == "1" and err == ["Error: Ray is not installed: pip install 'ggtool[cluster]' (or pip install ray)"]
    assert os.listdir(tmp_path) == []


def test_unreachable_address_is_one_line_within_seconds(run, tmp_path):
    pytest.importorskip("ray", reason=NO_RAY)
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()                                           # a port nobody listens on
    t0 = time.monotonic()
    fails(run("sweep", "--gguf", STORIES, "--types", "q8_0", "-f", TEXT, "-o", tmp_path / "d", *ARGS, "--ray",
              f"127.0.0.1:{port}"), f"Error: cannot reach the Ray cluster at 127.0.0.1:{port}")
    assert time.monotonic() - t0 < 10
    fails(run("perplexity", "--gguf", STORIES, "-f", TEXT, "--ray", "nonsense"), "is not a Ray address")
    assert not (tmp_path / "d").exists()


def test_ray_auto_finds_this_hosts_cluster_or_says_none_runs(run, tmp_path, monkeypatch):
    """RAY_ADDRESS=auto (Ray's own convention: the cluster `ray start` left on this host) is taken as
    Ray takes it; with none running, one line."""
    pytest.importorskip("ray", reason=NO_RAY)
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))     # where Ray looks for this host's cluster: none there
    fails(run("perplexity", "--gguf", STORIES, "-f", TEXT, "-c", "128", "--chunks", "1"),
          "Error: cannot join the Ray cluster at auto")


# -- files a task reads: the caller's path, or shipped bytes (no Ray needed) ------------------------------

def test_a_node_seeing_another_file_at_the_path_is_refused(tmp_path):
    from ggtool.evaluate import EvaluateError
    from ggtool.evaluate.distribute import FileSource

    p = tmp_path / "model.gguf"
    p.write_bytes(STORIES.read_bytes())
    src = FileSource.of(p)
    assert src.local_path() == str(p)
    with open(p, "r+b") as f:                        # an older copy on a node: same size, other bytes
        f.seek(64)
        f.write(b"\0\1\2\3")
    with pytest.raises(EvaluateError, match="does not see the file the caller sees") as e:
        src.local_path()
    assert e.value.kind == "not-shared"
    p.unlink()
    with pytest.raises(EvaluateError, match="does not see the file"):
        src.local_path()


def test_shipped_bytes_are_written_once_checked_and_rewritten_when_damaged(tmp_path, monkeypatch):
    import tempfile

    from ggtool.evaluate import EvaluateError
    from ggtool.evaluate.distribute import FileSource

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    data = STORIES.read_bytes()
    src = FileSource.of(STORIES).shipped(data)                      # the object store's value, fetched as is
    copy = src.local_path()
    assert copy.startswith(str(tmp_path / f"ggtool-shipped-{os.getuid()}")) and open(copy, "rb").read() == data
    assert os.stat(copy).st_ino == os.stat(src.local_path()).st_ino   # written once
    with open(copy, "r+b") as f:
        f.truncate(1000)                                              # damaged: written again
    assert src.local_path() == copy and open(copy, "rb").read() == data
    bad = FileSource.of(STORIES).shipped(data[:-1])
    os.unlink(copy)
    with pytest.raises(EvaluateError, match=f"the shipped copy is {len(data) - 1} bytes, not {len(data)}"):
        bad.local_path()
    assert not os.path.exists(copy) and [n for n in os.listdir(os.path.dirname(copy)) if n.startswith(".part")] == []


@pytest.mark.parametrize("planted", ["symlink", "open-to-others", "file"])
def test_a_planted_folder_of_shipped_files_is_refused(tmp_path, monkeypatch, planted):
    import tempfile

    from ggtool.evaluate import EvaluateError
    from ggtool.evaluate.distribute import FileSource

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folder = tmp_path / f"ggtool-shipped-{os.getuid()}"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    if planted == "symlink":
        os.symlink(elsewhere, folder)
    elif planted == "open-to-others":
        folder.mkdir()
        os.chmod(folder, 0o777)
    else:
        folder.write_text("x")
    with pytest.raises(EvaluateError, match="not this user's own private directory") as e:
        FileSource.of(STORIES).shipped(STORIES.read_bytes()).local_path()
    assert e.value.kind == "ship-cache" and os.listdir(elsewhere) == []


def test_imatrix_as_tasks_is_the_one_process_matrix_within_float32_rounding():
    """The local executor (the tasks a cluster runs, here): the same entries and counts as a run in
    one process, the sums within float32 rounding (batches summed from zero, then added), PPL equal."""
    import numpy as np

    from ggtool.evaluate import Model, read_text, tokenize_text
    from ggtool.evaluate.collect import ImatrixRun
    from ggtool.evaluate.distribute import LocalExecutor
    from ggtool.evaluate.schedule import Schedule

    m = Model(STORIES, 64)
    tokens = tokenize_text(m.vocab, read_text(TEXT))
    runs = []
    for ex in (None, LocalExecutor()):
        run = ImatrixRun(m, tokens, dataset=str(TEXT), n_chunks=12, schedule=Schedule(64, 128, 64), executor=ex)
        reports = [(r.index, round(r.ppl, 9)) for r in run]
        runs.append((run, reports))
    (one, rep1), (tasks, rep2) = runs
    assert rep1 == rep2 and len(rep1) == 12                        # 6 batches of 2 chunks, PPL chunk by chunk
    a, b = one.collector.stats, tasks.collector.stats
    assert sorted(a.sums) == sorted(b.sums) and len(a.sums) > 10
    for name in a.sums:
        assert np.array_equal(a.counts[name], b.counts[name])
        np.testing.assert_allclose(b.sums[name], a.sums[name], rtol=1e-5, atol=0)
    assert one.result["ppl"] == tasks.result["ppl"]


# -- a real cluster, in a namespace of its own ---------------------------------------------------------------

def _namespace_or_skip() -> None:
    pytest.importorskip("ray", reason=NO_RAY)
    if os.geteuid() != 0:
        pytest.skip("a network namespace needs root (unshare -n)")
    for tool in ("unshare", "ip"):
        if shutil.which(tool) is None:
            pytest.skip(f"no {tool} on this machine: no network namespace for Ray's test cluster")
    r = subprocess.run(["unshare", "-n", "ip", "link", "set", "lo", "up"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot make a network namespace here: {r.stderr.strip() or r.returncode}")


def _in_namespace(tmp_path, body: str, timeout: int = 420) -> subprocess.CompletedProcess:
    """Run `body` (bash) in a new network namespace with a Ray head of 2 CPUs at $RAY (127.0.0.1:PORT)."""
    import tempfile

    bindir = os.path.dirname(sys.executable)
    temp = tempfile.mkdtemp(prefix="ggr-", dir="/tmp")      # Ray's socket paths must stay under 108 bytes
    script = textwrap.dedent(f"""
        set -u
        ip link set lo up
        export PATH={bindir}:$PATH RAY_USAGE_STATS_ENABLED=0
        RAY=127.0.0.1:6379
        setsid ray start --head --block --num-cpus 2 --node-ip-address 127.0.0.1 --port 6379 \\
            --include-dashboard=false --disable-usage-stats --temp-dir {temp} > {tmp_path}/head.log 2>&1 &
        HEAD=$!
        stop() {{ kill -TERM -- -$HEAD 2>/dev/null; sleep 2; kill -KILL -- -$HEAD 2>/dev/null; wait $HEAD 2>/dev/null; }}
        trap stop EXIT
        for i in $(seq 1 120); do
            kill -0 $HEAD 2>/dev/null || exit 10
            python -c "import socket; socket.create_connection(('127.0.0.1', 6379), 1)" 2>/dev/null && break
            sleep 0.5
        done
        sleep 2
    """) + textwrap.dedent(body)
    try:
        return subprocess.run(["unshare", "-n", "bash", "-c", script], capture_output=True, text=True, cwd=tmp_path,
                              timeout=timeout)
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def _local_sweep(run, d) -> str:
    return ok(run("sweep", "--gguf", STORIES, "--types", TYPES, "-f", TEXT, "-o", d, *ARGS, "--csv", "-q"))


def test_ray_sweep_perplexity_and_imatrix_equal_one_machine(run, tmp_path):
    """A sweep of stories260K over 4 types on the cluster: the table of the run without Ray, digit
    for digit; `perplexity --ray` and `imatrix --ray` too (imatrix: the file of the local executor,
    the same tasks in this process, byte for byte)."""
    _namespace_or_skip()
    want = numbers(_local_sweep(run, tmp_path / "local"))
    ppl = ok(run("perplexity", "--gguf", STORIES, "-f", TEXT, "-c", "64", "--chunks", "6", "--json", "-q"))
    r = _in_namespace(tmp_path, f"""
        ggtool sweep --gguf {STORIES} --types {TYPES} -f {TEXT} -o {tmp_path}/ray {' '.join(ARGS)} --ray $RAY \\
            --csv -q > {tmp_path}/ray.csv || exit 11
        ggtool perplexity --gguf {STORIES} -f {TEXT} -c 64 --chunks 6 --json -q --ray $RAY > {tmp_path}/ppl.json || exit 12
        ggtool imatrix --gguf {STORIES} -f {TEXT} -c 64 --chunks 40 -o {tmp_path}/ray-imatrix.gguf -q --ray $RAY \\
            --ray-ship ship || exit 13
    """)
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:], (tmp_path / "head.log").read_text()[-2000:])
    assert numbers((tmp_path / "ray.csv").read_text()) == want
    import json

    a, b = json.loads(ppl), json.loads((tmp_path / "ppl.json").read_text())
    assert (a["ppl"], a["ppl_unc"], a["scored"]) == (b["ppl"], b["ppl_unc"], b["scored"])
    from ggtool.evaluate import Model, read_text, tokenize_text
    from ggtool.evaluate.collect import ImatrixRun
    from ggtool.evaluate.distribute import LocalExecutor

    m = Model(STORIES, 64)
    im = ImatrixRun(m, tokenize_text(m.vocab, read_text(TEXT)), dataset=str(TEXT), n_chunks=40,
                    executor=LocalExecutor())
    for _ in im:
        pass
    assert im.bytes() == (tmp_path / "ray-imatrix.gguf").read_bytes()


def test_ray_sweep_survives_a_killed_worker(run, tmp_path):
    """A worker killed while it evaluates a chunk: Ray runs the task again, and the table is the
    same (each chunk's result is taken once, by its index)."""
    _namespace_or_skip()
    want = numbers(_local_sweep(run, tmp_path / "local"))
    r = _in_namespace(tmp_path, f"""
        ggtool sweep --gguf {STORIES} --types {TYPES} -f {TEXT} -o {tmp_path}/ray {' '.join(ARGS)} --ray $RAY \\
            --csv -q > {tmp_path}/ray.csv 2> {tmp_path}/ray.err &
        SWEEP=$!
        for i in $(seq 1 600); do
            VICTIM=$(ps -eo pid=,args= | awk '$2 ~ /^ray::ggtool-score_chunk/ {{print $1; exit}}')
            [ -n "$VICTIM" ] && break
            sleep 0.1
        done
        [ -n "$VICTIM" ] || exit 21
        kill -KILL $VICTIM && echo "killed $VICTIM" > {tmp_path}/killed
        wait $SWEEP || exit 22
    """)
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:], (tmp_path / "head.log").read_text()[-2000:])
    assert (tmp_path / "killed").read_text().startswith("killed ")
    # stdout is the CSV alone: Ray's word of the dead worker went to stderr
    assert (tmp_path / "ray.csv").read_text().startswith("type,"), (tmp_path / "ray.csv").read_text()[:500]
    assert numbers((tmp_path / "ray.csv").read_text()) == want
