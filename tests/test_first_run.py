"""The first-ever-run policy (ggtool.compiling.first_run): in the command line, a kernel not in the
cache runs its numpy twin while the work is small, and is compiled in process, marked ready and
announced once on stderr when the twin's work (a generation's steps counted) would cost more than
compiling it; a library's process, and every cached kernel, run compiled."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

from ggtool import role
from ggtool.compiling import first_run, warm
from ggtool.errors import CacheWarning
from ggtool.kernels import cache

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def cli(monkeypatch, tmp_path, capsys):
    """This process as the command line's, with an empty cache of its own; compiling is recorded,
    not done, and no background compiler starts."""
    monkeypatch.setenv("GGTOOL_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setattr(role, "COMMAND_LINE", True)
    monkeypatch.setattr(role, "POOL_WORKER", False)
    monkeypatch.setattr(cache, "_decided", {})
    monkeypatch.setattr(cache, "_compiler", object())       # as if the background compiler were started
    monkeypatch.setattr(first_run, "_compiled", set())
    monkeypatch.setattr(first_run, "_spent", {})
    monkeypatch.setattr(first_run, "_told", [False])
    monkeypatch.setattr(first_run, "_looked", {})
    monkeypatch.setattr(first_run, "READY_LOOK", 0.0)      # every call looks for a ready marker
    compiled = []
    monkeypatch.setattr(warm, "compile_kernel", lambda name: compiled.append(name) or True)   # kept in the cache
    return compiled, capsys


BUDGET = first_run.COMPILE_SECONDS["dot"]


def test_small_work_runs_the_twin_and_wishes_for_the_kernel(cli):
    compiled, capsys = cli
    assert not first_run.use_compiled("dot:q4_0", BUDGET / 10)
    assert os.path.exists(cache.marker("wanted", "dot:q4_0"))            # for the background compiler
    assert not os.path.exists(cache.marker("ready", "dot:q4_0"))
    assert compiled == [] and capsys.readouterr().err == ""


def test_twin_work_past_the_compile_cost_compiles_in_process_once(cli):
    """A ski rental: the twin runs until its calls would cost more than compiling, then the kernel is
    compiled here, marked ready (no longer wanted) and used from then on; stderr says so once."""
    compiled, capsys = cli
    answers = [first_run.use_compiled("dot:q4_0", BUDGET / 4) for _ in range(6)]
    assert answers == [False] * 4 + [True] * 2
    assert compiled == ["dot:q4_0"]
    assert os.path.exists(cache.marker("ready", "dot:q4_0"))
    assert not os.path.exists(cache.marker("wanted", "dot:q4_0"))
    assert first_run.use_compiled("quantize:Q8_0_cpu", 10.0)             # another kernel: no second notice
    assert compiled == ["dot:q4_0", "quantize:Q8_0_cpu"]
    assert capsys.readouterr().err.count("compiling ggtool's kernels for this CPU (once, ~") == 1


def test_a_kernel_compiled_in_process_that_numba_could_not_keep_is_used_not_marked_ready(cli, monkeypatch):
    """Under NUMBA_OPT=0 numba cannot cache a kernel (``warm.compile_kernel`` says so): this process
    runs it, and it is not marked ready, so the next run weighs it again rather than compiling it
    in process unasked."""
    compiled, _ = cli
    monkeypatch.setattr(warm, "compile_kernel", lambda name: compiled.append(name) or False)
    assert first_run.use_compiled("dot:q4_0", 2 * BUDGET)
    assert first_run.use_compiled("dot:q4_0", 2 * BUDGET)
    assert compiled == ["dot:q4_0"]
    assert not os.path.exists(cache.marker("ready", "dot:q4_0"))


def test_a_generation_counts_each_step_for_the_steps_to_come(cli):
    """Under repeating(n) the twin's calls of a step count once for every step still to come: a
    generation of many steps compiles at its first step what one step alone would run as a twin."""
    compiled, _ = cli
    step = 1.5 * BUDGET / 100                             # one step's twin work, in two calls
    with first_run.repeating(100) as steps:
        assert not first_run.use_compiled("dot:q4_0", step / 2)          # 100 x half a step: within
        assert first_run.use_compiled("dot:q4_0", step / 2)              # 100 x a whole step: past it
    assert compiled == ["dot:q4_0"]
    with first_run.repeating(10) as steps:                # 10 such steps: twins throughout
        for left in range(10, 0, -1):
            steps.next(left)
            assert not first_run.use_compiled("dot:q6_K", step / 2)
            assert not first_run.use_compiled("dot:q6_K", step / 2)
    assert compiled == ["dot:q4_0"]
    assert first_run._repeats[-1].left == 1               # the hint ends with its block


def test_a_prompt_counts_once_where_the_steps_twin_cost_is_known(cli):
    """A generation's first time is its prompt: larger work, computed once. Where a step's twin cost
    is known (``step_seconds`` of the step's products: repeating's `later`), the prompt's own calls
    count once and each step to come at what a step costs. Without it, a 311M model's 8-token prompt
    counted its attention products 64 times over and compiled the F32 dot in process (6.5 s) for
    steps whose twin costs ~4 ms each."""
    compiled, _ = cli
    prompt, step = BUDGET / 10, BUDGET / 1000
    with first_run.repeating(64, {"dot:f32": step}) as steps:
        assert not first_run.use_compiled("dot:f32", prompt)             # 1 x prompt + 63 x step: within
        for left in range(63, 0, -1):
            steps.next(left)
            assert not first_run.use_compiled("dot:f32", step)
    assert compiled == []
    with first_run.repeating(64) as steps:                # not known: the prompt counts for every step
        assert first_run.use_compiled("dot:f32", prompt)
    assert compiled == ["dot:f32"]
    with first_run.repeating(64, {"dot:q4_0": BUDGET / 32}) as steps:   # known, and past the budget
        assert first_run.use_compiled("dot:q4_0", prompt)
        assert first_run.use_compiled("dot:q5_0", prompt)                 # another's not known: as above
    assert compiled == ["dot:f32", "dot:q4_0", "dot:q5_0"]


def test_step_seconds_are_the_twin_cost_of_each_dot_of_a_step_and_its_activations_quantizer():
    """A step's twin cost by kernel: each product's dot, and the quantizer of its activations (which
    runs each step too: without it, the prompt's conversion was counted once a step to come)."""
    products = [("q4_0", 2048, 2048, 1), ("f32", 288, 128, 16), ("q4_0", 5632, 2048, 3), ("q8_K", 1, 256, 1),
                ("q6_K", 32000, 2048, 1)]
    cost = first_run.step_seconds(products)
    # q8_K: no twin, no dot of its own; f32: its activations taken as they are
    assert list(cost) == ["quantize:Q8_0_cpu", "dot:q4_0", "dot:f32", "quantize:Q8_K", "dot:q6_K"]
    assert cost["dot:q4_0"] == first_run.dot_seconds("q4_0", 2048, 2048, 1) + first_run.dot_seconds("q4_0", 5632, 2048, 3)
    assert cost["quantize:Q8_0_cpu"] == first_run.quantize_seconds(2048) + first_run.quantize_seconds(3 * 2048)
    assert cost["dot:f32"] == first_run.dot_seconds("f32", 288, 128, 16)
    assert cost["quantize:Q8_K"] == first_run.quantize_seconds(2048)


def test_a_generation_weighs_its_prompt_by_its_steps_products(cli, monkeypatch):
    """generate.loop.ahead gives repeating the twin cost of the step graph's products (the prompt is
    then counted once), and starts nothing without a free CPU."""
    import ggtool
    from ggtool import threads
    from ggtool.generate import loop
    from ggtool.ops import FUNCTIONS as F

    ctx = ggtool.Context()
    w, x = ctx.new_tensor("f32", [256, 64]), ctx.new_tensor("f32", [256, 2])
    step = ggtool.Graph(ctx).expand(F["mul_mat"](ctx, w, x))

    weighed = []        # what repeating knows of a step, as each batch is computed

    class Session:
        def graph(self, n):
            assert n == 1
            return step

        def prepare(self, *sizes):
            pass

        def eval(self, tokens):
            weighed.append(first_run._repeats[-1].later)
            return np.zeros(4, np.float32)

    monkeypatch.setattr(threads, "free_cpus", lambda cpus=None: 1)
    monkeypatch.setattr(first_run, "_spawn", lambda *a, **k: pytest.fail("nothing compiles ahead on one free CPU"))
    later = {"dot:f32": first_run.dot_seconds("f32", 64, 256, 2)}
    assert loop.ahead(Session(), 64) == later
    assert loop.ahead(object(), 64) == {}                 # a session without a step graph
    assert len(list(loop.generate(Session(), [1, 2, 3], 3, lambda logits: 0))) == 3
    assert weighed == [later] * 3                         # the prompt's time and each step's


def test_a_kernel_compiled_meanwhile_is_used(cli):
    """Another participant (the caller, or a worker) compiled it and marked it ready: this process
    loads it from the cache instead of running the twin or compiling it again."""
    compiled, _ = cli
    assert not first_run.use_compiled("dot:q8_0", 0.0)
    ready = cache.marker("ready", "dot:q8_0")
    os.makedirs(os.path.dirname(ready), exist_ok=True)
    open(ready, "w").close()
    assert first_run.use_compiled("dot:q8_0", 0.0) and compiled == []


def test_a_library_process_and_a_cached_kernel_run_compiled(cli, monkeypatch):
    compiled, _ = cli
    monkeypatch.setattr(role, "COMMAND_LINE", False)
    assert first_run.use_compiled("dot:q5_0", 0.0) and compiled == []


def test_an_unwritable_cache_or_stderr_does_not_stop_the_compile(cli, monkeypatch, tmp_path):
    compiled, _ = cli
    monkeypatch.setenv("GGTOOL_CACHE_DIR", str(tmp_path / "file"))
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setattr(sys, "stderr", open(os.devnull, "w"))
    sys.stderr.close()
    with warnings.catch_warnings():     # the cache says so once a process, a CacheWarning (kernels.cache)
        warnings.simplefilter("ignore", CacheWarning)
        assert first_run.use_compiled("dot:q4_K", 10 * BUDGET)
    assert compiled == ["dot:q4_K"]


def test_the_twin_cost_model_grows_with_the_work():
    small, large = first_run.dot_seconds("q4_0", 64, 256, 1), first_run.dot_seconds("q4_0", 5632, 2048, 1)
    assert small < 1e-3 < large and first_run.dot_seconds("q6_K", 5632, 2048, 1) > large
    assert first_run.dot_seconds("q4_0", 5632, 2048, 512) > 10 * large
    assert first_run.quantize_seconds(10**6) > first_run.quantize_seconds(10**3)


CODE = """
    import sys
    import numpy as np
    import ggtool.role
    ggtool.role.COMMAND_LINE = True
    from ggtool import quant as Q
    from ggtool.compiling import first_run
    from ggtool.kernels import cache
    x = np.linspace(-3, 3, 32 * 64, dtype=np.float32).reshape(64, 32)
    with first_run.repeating({n}):
        print(Q.quantize_q8_0_cpu(x).tobytes().hex())
    print("numba" in sys.modules, os.path.exists(cache.marker("ready", "quantize:Q8_0_cpu")))
"""


def _python(code: str, tmp_path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["GGTOOL_CACHE_DIR"] = str(tmp_path)
    return subprocess.run([sys.executable, "-c", "import os\n" + textwrap.dedent(code)], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=300, stdin=subprocess.DEVNULL)


def test_the_command_line_compiles_large_work_and_gives_the_twin_s_bytes(tmp_path):
    """End to end, in a fresh process: small work runs the twin (numba never loads); the same work
    repeated a million times compiles the kernel in process, says so, and gives the same bytes."""
    small = _python(CODE.format(n=1), tmp_path / "small")
    large = _python(CODE.format(n=10**6), tmp_path / "large")
    assert small.returncode == 0 and large.returncode == 0, small.stderr + large.stderr
    assert small.stdout.splitlines()[0] == large.stdout.splitlines()[0]
    assert small.stdout.splitlines()[1] == "False False"
    assert large.stdout.splitlines()[1] == "True True"
    assert "compiling ggtool's kernels for this CPU" not in small.stderr
    assert large.stderr.count("compiling ggtool's kernels for this CPU (once, ~") == 1
    assert "`ggtool kernels` compiles them all ahead)..." in large.stderr     # how no run waits for it
    ref = np.frombuffer(bytes.fromhex(small.stdout.splitlines()[0]), np.uint8)
    assert ref.size == 64 * 34


class _Proc:
    """A compile-ahead process as first_run holds it (of one kernel or a list): done (or failed) when
    first looked at."""

    def __init__(self, names, code: int):
        self.names, self.code, self.waited = [names] if isinstance(names, str) else names, code, False

    def wait(self):
        if not self.waited and self.code == 0:
            for n in self.names:
                first_run._mark_ready(n)
        self.waited = True
        return self.code

    poll = wait

    def kill(self):
        self.code = -9


def test_kernels_of_a_large_generation_compile_ahead_side_by_side(cli, monkeypatch):
    """prepare(): the dots whose twins a generation would outgrow start compiling at once, a process a
    family, each family's activation quantizers after its dots where their twins would cost the work
    more than QUANTIZE_AHEAD, where 2 CPUs are free; the first call of a dot waits for it; a failed
    process leaves its kernels to compile here."""
    compiled, capsys = cli
    started = []
    monkeypatch.setattr(first_run, "_ahead", {})
    monkeypatch.setattr(first_run, "_spawn", lambda names: started.append(names) or _Proc(names, int("dot:q6_K" in names)))
    products = [("q4_0", 5632, 2048, 64), ("q4_0", 2048, 5632, 64), ("q6_K", 32000, 2048, 64), ("f32", 512, 64, 64),
                ("q8_0", 16, 32, 64)]          # 512 x 64 f32 products and 16 rows of q8_0 stay a twin's work
    assert first_run.prepare(products, repeats=1, free_cpus=2) == []          # once: the twins are cheaper
    assert first_run.prepare(products, repeats=512, free_cpus=1) == []        # no CPU to spare: at first use
    assert first_run.prepare(products, repeats=512, free_cpus=2) == ["dot:q4_0", "quantize:Q8_0_cpu",
                                                                     "dot:q6_K", "quantize:Q8_K"]
    assert started == [["dot:q4_0", "quantize:Q8_0_cpu"], ["dot:q6_K", "quantize:Q8_K"]]
    said = first_run.ahead_seconds([first_run.compile_seconds(n) for n in started], 2)
    assert f"compiling ggtool's kernels for this CPU (once, ~{said:.0f} s;" in capsys.readouterr().err
    assert said > max(map(first_run.compile_seconds, started)) + 0.7           # two processes beside the run
    assert first_run.use_compiled("dot:q4_0", 0.0) and compiled == []        # its process compiled it
    assert first_run.use_compiled("quantize:Q8_0_cpu", 0.0) and compiled == []
    assert first_run.use_compiled("dot:q6_K", 10.0) and compiled == ["dot:q6_K"]   # failed: compiled here
    assert first_run.prepare(products, repeats=512, free_cpus=2) == []        # nothing twice


def test_the_notice_says_the_longest_family_stretched_by_the_processes_beside_the_run():
    """ahead_seconds: what the notice says compiling ahead adds, ~0.7 s to start a process and numba,
    plus the longest family's CPU seconds, longer where its processes and the run's own outnumber the
    free CPUs (they share them)."""
    assert first_run.ahead_seconds([2.0], free_cpus=2) == pytest.approx(2.7)          # one process, a CPU each
    assert first_run.ahead_seconds([2.0, 3.0], free_cpus=2) == pytest.approx(3.0 * 1.5 + 0.7)
    assert first_run.ahead_seconds([2.0, 3.0], free_cpus=16) == pytest.approx(3.7)
    assert first_run.ahead_seconds([2.0, 3.0], free_cpus=0) == pytest.approx(3.0 * 3 + 0.7)
    assert first_run.ahead_seconds([], free_cpus=2) == pytest.approx(0.7)


def test_a_generation_s_attention_products_compile_ahead_with_the_smaller_family(cli, monkeypatch):
    """A decode step's F32 products (attention's, against the KV cache) cost the twin ~7 ns each: over
    a long generation they compile ahead too, in the family that costs least to compile; the first
    call of a kernel waits only for it, not for the kernels its process compiles after it."""
    compiled, _ = cli
    spawned = []
    monkeypatch.setattr(first_run, "_ahead", {})
    monkeypatch.setattr(first_run, "AHEAD_POLL", 0.001)
    monkeypatch.setattr(first_run, "_spawn", lambda names: spawned.append(names) or _Group(names))
    products = [("q4_0", 2048, 2048, 1), ("q8_0", 2048, 2048, 1), ("q6_K", 32000, 2048, 1),
                *[("f32", 141, 256, 4)] * 18]              # a layer's attention product, 18 layers
    assert first_run.prepare(products, repeats=1, free_cpus=2) == []
    assert first_run.prepare(products, repeats=1000, free_cpus=2) == ["dot:q4_0", "dot:q8_0", "dot:q6_K", "dot:f32"]
    assert spawned == [["dot:q4_0", "dot:q8_0"], ["dot:q6_K", "dot:f32"]]      # a decode row's quantizers: twins
    first_run._mark_ready("dot:q6_K")                   # its process goes on with the others
    assert first_run.use_compiled("dot:q6_K", 10.0) and first_run._ahead["dot:f32"].poll() is None
    first_run._ahead["dot:f32"].done()
    assert first_run.use_compiled("dot:f32", 10.0) and compiled == []


def test_attention_products_compile_with_the_family_that_ends_first(cli, monkeypatch):
    """gemma-3's dots: Q5_0 and Q8_0 share their packed form (one tile compiled for both: the second
    costs ~0 s), so the 32-value family is the cheaper one although it has as many kernels as the
    K-quants': the F32 products compile there, and the two processes end together (before, they
    joined the K-quants by count: 6.1 s to the last kernel against 4.1 s for the other process)."""
    spawned = []
    monkeypatch.setattr(first_run, "_ahead", {})
    monkeypatch.setattr(first_run, "_spawn", lambda names: spawned.append(names) or _Group(names))
    products = [("q4_K", 2048, 640, 1), ("q6_K", 2048, 640, 1), ("q5_0", 2048, 640, 1), ("q8_0", 262144, 640, 1),
                *[("f32", 141, 256, 4)] * 18]
    assert first_run.compile_seconds(["dot:q5_0", "dot:q8_0"]) < first_run.compile_seconds(["dot:q4_K", "dot:q6_K"])
    first_run.prepare(products, repeats=1000, free_cpus=2)
    assert spawned == [["dot:q4_K", "dot:q6_K"], ["dot:q5_0", "dot:q8_0", "dot:f32"]]


def test_a_quantizer_compiles_after_its_dots_and_no_call_waits_for_it(cli, monkeypatch):
    """A decode step's activation quantizer costs its twin ~40 us a call: compiled ahead only where
    the work's calls would cost more than QUANTIZE_AHEAD (a 311M model's 64 tokens: no), and then
    after its family's dots, which every step waits for; until its process has marked it ready its
    calls run the twin (the same bytes) instead of waiting, and then the kernel."""
    compiled, _ = cli
    spawned = []
    monkeypatch.setattr(first_run, "_ahead", {})
    monkeypatch.setattr(first_run, "_spawn", lambda names: spawned.append(names) or _Group([names] if isinstance(names, str) else names))
    decode = [("q4_0", 5632, 2048, 1), ("q4_0", 2048, 5632, 1)] * 4          # 4 layers' products with Q8_0 rows
    assert first_run.step_seconds(decode)["quantize:Q8_0_cpu"] * 64 < first_run.QUANTIZE_AHEAD
    assert first_run.prepare(decode, repeats=64, free_cpus=2) == ["dot:q4_0"]
    wide = [("q4_K", 2048, 2048, 1)] * 126                                      # gemma-3's ~127 a step
    assert first_run.step_seconds(wide)["quantize:Q8_K"] * 128 > first_run.QUANTIZE_AHEAD
    assert first_run.prepare(wide, repeats=128, free_cpus=2) == ["dot:q4_K", "quantize:Q8_K"]
    group = first_run._ahead["quantize:Q8_K"]
    assert not first_run.use_compiled("quantize:Q8_K", 100.0)                   # compiling: the twin, no wait
    assert compiled == [] and first_run._ahead["quantize:Q8_K"] is group      # nor compiled here, however dear
    first_run._mark_ready("quantize:Q8_K")
    assert first_run.use_compiled("quantize:Q8_K", 0.0) and compiled == []
    assert "quantize:Q8_K" not in first_run._ahead


def test_a_cheap_float_product_runs_its_twin_while_its_dot_compiles_a_block_type_s_waits(cli, monkeypatch):
    """gemma-3's prompt waited ~2 s for dot:f32 (compiled last in its family) before its attention
    products, whose twin costs ~2 ms a layer: a call of a float dot compiling ahead whose twin costs
    less than TWIN_WHILE_AHEAD runs the twin; a dearer one waits, and so does any call of a block
    type's dot (its twin decodes every weight: it would take the CPU the compile needs)."""
    compiled, _ = cli
    monkeypatch.setattr(first_run, "AHEAD_POLL", 0.001)
    f32, q4 = _Group(["dot:f32"]), _Group(["dot:q4_0"])
    monkeypatch.setattr(first_run, "_ahead", {"dot:f32": f32, "dot:q4_0": q4})
    polls = []
    real_sleep = first_run.time.sleep

    def sleep(s):                       # the waits: the compile ends at the third look
        polls.append(s)
        if len(polls) == 3:
            q4.done() if q4.code is None else f32.done()
        real_sleep(0)

    monkeypatch.setattr(first_run.time, "sleep", sleep)
    assert not first_run.use_compiled("dot:f32", first_run.TWIN_WHILE_AHEAD / 5) and polls == []   # no wait
    assert first_run.use_compiled("dot:q4_0", first_run.TWIN_WHILE_AHEAD / 5) and len(polls) == 3     # waited
    assert "dot:f32" in first_run._ahead and compiled == []
    polls.clear()
    assert first_run.use_compiled("dot:f32", first_run.TWIN_WHILE_AHEAD * 5) and len(polls) == 3      # dear: waited
    assert compiled == [] and first_run._ahead == {}


def test_a_twin_s_call_looks_for_a_ready_marker_once_in_a_while(cli, monkeypatch):
    """Each call of a kernel not compiled used to look for its ready marker (the cache's folder and a
    stat: ~25 us, as much as a decode row's quantizer twin itself): now once every READY_LOOK
    seconds a kernel, so a kernel another process compiles is taken up within READY_LOOK."""
    compiled, _ = cli
    monkeypatch.setattr(first_run, "READY_LOOK", 3600.0)
    looks = []
    real = first_run._ready
    monkeypatch.setattr(first_run, "_ready", lambda name: looks.append(name) or real(name))
    for _ in range(100):
        assert not first_run.use_compiled("dot:q8_0", 0.0)
    assert looks == ["dot:q8_0"]
    first_run._mark_ready("dot:q8_0")
    assert not first_run.use_compiled("dot:q8_0", 0.0)                          # not looked at again yet
    monkeypatch.setattr(first_run, "READY_LOOK", 0.0)
    assert first_run.use_compiled("dot:q8_0", 0.0) and compiled == []
    assert looks == ["dot:q8_0", "dot:q8_0"]


def test_weights_are_repacked_while_their_kernel_compiles_ahead(cli, monkeypatch):
    """mul_mat's first call of a dot compiling ahead repacks its weights before it waits (the wait is
    the compile's; the packing is this process's own work), once, and computes the twin's bits."""
    from ggtool import qtypes, quant
    from ggtool import types as T
    from ggtool.quant import matmul

    compiled, _ = cli
    group = _Group(["dot:q8_0"])
    monkeypatch.setattr(first_run, "_ahead", {"dot:q8_0": group})
    monkeypatch.setattr(first_run, "AHEAD_POLL", 0.001)
    rng = np.random.default_rng(3)
    w = quant.quantize_q8_0(rng.standard_normal((5, 64), dtype=np.float32))
    act = quant.quantize_q8_0_cpu(rng.standard_normal((2, 64), dtype=np.float32))
    seen = []

    def pack():
        seen.append(group.poll())
        group.done()                        # the compile ends while this process packs
        return qtypes.get(T.Q8_0).pack(w)

    out, ref = np.empty((2, 5), np.float32), np.empty((2, 5), np.float32)
    matmul.mul_mat_into(T.Q8_0, w, act, out, pack)
    qtypes.get(T.Q8_0).mul_mat_twin(w, act, ref)
    assert seen == [None] and compiled == []            # packed while still compiling; not compiled here
    assert np.array_equal(out.view(np.uint32), ref.view(np.uint32))


def test_a_long_generation_compiles_its_float_products_once_the_twin_would_cost_more(cli):
    """F32 products between numba's start and FLOAT_TWIN_MAX are weighed as the block types' dots:
    one step runs the twin, a thousand steps to come compile the kernel (in this process here)."""
    from ggtool import types as T
    from ggtool.quant import matmul

    compiled, _ = cli
    m, n, k = 32, 512, 256                  # above FLOAT_TWIN_SMALL: weighed whether numba is loaded or not
    assert m * n * k > matmul.FLOAT_TWIN_SMALL
    assert matmul._twin(T.F32, m, n, k) and compiled == []
    with first_run.repeating(1000):
        assert not matmul._twin(T.F32, m, n, k)
    assert compiled == ["dot:f32"]


def test_a_compile_ahead_process_is_isolated_and_fills_the_cache(tmp_path, monkeypatch):
    """The real process, started by ggtool.isolation: python -I in "/", this process's sys.path given
    explicitly, a filtered environment; a ggtool package and a sitecustomize planted in the working
    directory and on PYTHONPATH never run in it. It compiles the kernel into the cache and marks it ready."""
    planted = tmp_path / "planted"
    for where in (planted / "ggtool", planted):
        where.mkdir(parents=True, exist_ok=True)
    trap = f"open({str(tmp_path / 'ran')!r}, 'a').write(__name__)\n"
    (planted / "ggtool" / "__init__.py").write_text(trap)
    (planted / "sitecustomize.py").write_text(trap)
    monkeypatch.chdir(planted)
    monkeypatch.setenv("PYTHONPATH", str(planted))
    monkeypatch.setenv("GGTOOL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    proc = first_run._spawn("quantize:Q8_K")
    assert proc.args[:2] == [sys.executable, "-I"] and proc.wait(timeout=300) == 0
    assert not (tmp_path / "ran").exists()
    assert os.path.isfile(cache.marker("ready", "quantize:Q8_K"))
    assert not os.path.exists(cache.marker("wanted", "quantize:Q8_K"))
    assert any(f.endswith(".nbi") for _, _, fs in os.walk(tmp_path / "cache") for f in fs)


def test_a_compile_ahead_process_needs_a_cache(tmp_path, monkeypatch):
    """Where the cache cannot be used (a file at its name), no process starts: the kernel compiles in
    process at first use."""
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("GGTOOL_CACHE_DIR", str(tmp_path / "file"))
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)     # set once numba is loaded (kernels.jit): else it wins
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        assert first_run._spawn("quantize:Q8_K") is None


class _Group:
    """A process compiling the runner's kernels ahead (prepare_runner): each marked ready when `done`,
    or none of them when it failed."""

    def __init__(self, names):
        self.names, self.code = list(names), None

    def done(self, code: int = 0) -> None:
        if code == 0:
            for n in self.names:
                first_run._mark_ready(n)
        self.code = code

    def poll(self):
        return self.code

    def wait(self):
        return self.code

    def kill(self):
        self.code = -9


@pytest.fixture
def runner_ahead(cli, monkeypatch):
    """cli, with the runner's compile-ahead processes recorded (`_Group`s), not started."""
    from ggtool import compute, runner

    monkeypatch.setattr(runner, "WORTH_NUMBA", 0)
    monkeypatch.setattr(compute, "COMPILED", True)
    monkeypatch.setattr(first_run, "_ahead", {})
    monkeypatch.setattr(first_run, "_runner_pending", {})
    monkeypatch.setattr(first_run, "_stamp", [0])
    groups = []
    monkeypatch.setattr(first_run, "_spawn", lambda names, nice=False: groups.append(_Group(names)) or groups[-1])
    return groups


def _norm_graph():
    import ggtool
    from ggtool.ops import FUNCTIONS as F

    ctx = ggtool.Context()
    x = ctx.new_tensor("f32", [640, 3])
    x.set_data((np.random.default_rng(3).standard_normal((3, 640)) * 3).astype(np.float32))
    y = F["scale"](ctx, F["rms_norm"](ctx, x, 1e-6), 0.37)
    return ggtool.Graph(ctx).expand(y), y


def test_the_runners_kernels_compile_ahead_for_large_work_only(runner_ahead, capsys):
    """prepare_runner(): the runner's loop and the node kernels a generation uses start compiling, in
    one process, where its steps from Python would cost more than compiling them; never for small
    work, without a free CPU, for kernels cached already, or twice."""
    from ggtool import runner

    g, _ = _norm_graph()
    names, n = runner.kernels_used(g.nodes, "ggml")
    assert (names, n) == (["rms_norm_f32", "scale_f32"], 2)
    cost = first_run.COMPILE_SECONDS["runner"] + 2 * first_run.COMPILE_SECONDS["node"]
    enough = int(cost / (first_run.PYTHON_NODE * n)) + 1
    assert first_run.prepare_runner(names, n, repeats=1, free_cpus=2) == []            # small work
    assert first_run.prepare_runner(names, n, repeats=enough - 2, free_cpus=2) == []
    assert first_run.prepare_runner(names, n, repeats=enough, free_cpus=1) == []       # no CPU to spare
    assert runner_ahead == [] and capsys.readouterr().err == ""
    started = first_run.prepare_runner(names, n, repeats=enough, free_cpus=2)
    assert started == ["runner", "node:rms_norm_f32", "node:scale_f32"] == runner_ahead[0].names
    assert capsys.readouterr().err.count("compiling ggtool's kernels for this CPU") == 1
    assert first_run.prepare_runner(names, n, repeats=enough, free_cpus=2) == []      # nothing twice
    runner_ahead[0].done()
    first_run.stamp()
    assert first_run.prepare_runner(names, n, repeats=enough, free_cpus=2) == []      # ready now
    assert len(runner_ahead) == 1


@pytest.mark.parametrize("outcome", [0, 1])
def test_a_frozen_graph_switches_to_the_runner_once_its_kernels_are_ready(runner_ahead, outcome):
    """While the runner's kernels compile ahead, a generation's (frozen) graph computes from Python;
    from the first compute after they are ready it runs on the runner, with the same bits; a failed
    compile leaves it to Python, with the same bits too."""
    import ggtool
    from ggtool import compute, runner

    g, y = _norm_graph()
    compute.freeze(g)
    names, n = runner.kernels_used(g.nodes, "ggml")
    assert first_run.prepare_runner(names, n, repeats=10 ** 7, free_cpus=2)
    results, on_runner = [], []
    for step in range(4):
        if step == 2:
            runner_ahead[0].done(outcome)
        plan = ggtool.graph_compute(g, 1)
        results.append(np.array(y.data).tobytes())
        on_runner.append(compute._bound(g, plan) is not None)
    assert on_runner == [False, False] + [outcome == 0] * 2
    assert len(set(results)) == 1
    assert first_run._runner_pending == {}


def test_a_compile_ahead_process_of_several_kernels_goes_on_past_a_failure(tmp_path, monkeypatch):
    """The runner's compile-ahead process (python -I, niced): each kernel marked ready as it is done;
    one that fails does not stop the others, and the exit code says one failed."""
    monkeypatch.setenv("GGTOOL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setattr(cache, "_dirs", {})
    proc = first_run._spawn(["node:no_such_kernel", "node:scale_f32"], nice=True)
    assert proc.args[:2] == [sys.executable, "-I"] and proc.wait(timeout=300) == 1
    assert os.path.isfile(cache.marker("ready", "node:scale_f32"))
    assert not os.path.exists(cache.marker("ready", "node:no_such_kernel"))


def test_dots_of_a_family_compile_ahead_in_one_process(cli, monkeypatch):
    """The 32-value dots share one process (their activation pass compiled once, numba loaded once),
    the K-quants another; the first call of each waits for its family's process."""
    compiled, _ = cli
    spawned = []
    monkeypatch.setattr(first_run, "_ahead", {})

    def spawn(names):
        spawned.append(names)
        return _Group([names] if isinstance(names, str) else names)

    monkeypatch.setattr(first_run, "_spawn", spawn)
    products = [("q4_0", 32000, 2048, 1), ("q8_0", 32000, 2048, 1), ("q4_K", 32000, 2048, 1), ("q6_K", 32000, 2048, 1)]
    assert first_run.prepare(products, repeats=64, free_cpus=2) == ["dot:q4_0", "dot:q8_0", "dot:q4_K", "dot:q6_K"]
    assert spawned == [["dot:q4_0", "dot:q8_0"], ["dot:q4_K", "dot:q6_K"]]
    first_run._ahead["dot:q4_0"].done()
    assert first_run.use_compiled("dot:q8_0", 10.0) and first_run.use_compiled("dot:q4_0", 10.0)
    first_run._ahead["dot:q4_K"].done(1)                 # failed: each compiles here at its first call
    assert first_run.use_compiled("dot:q6_K", 10.0) and compiled == ["dot:q6_K"]


class _Slow(_Group):
    """A compile-ahead process that ends by itself after `polls` looks (a wait that never looks at
    the ready marker in between still ends: a broken wait fails its test, never hangs it)."""

    def __init__(self, names, polls: int = 200):
        super().__init__(names)
        self.polls = polls

    def poll(self):
        self.polls -= 1
        if self.code is None and self.polls <= 0:
            self.done()
        return self.code


def test_a_wait_for_a_kernel_compiling_ahead_does_the_work_given_meanwhile(cli, monkeypatch):
    """While the first call of a dot waits for its process, this process does the work it was given
    (a generation: repacking the weight tiles its products read next), one piece between two looks
    at the ready marker; a piece that raises ends the work (its own call raises it later, where it
    belongs) but not the wait, and what is left once no dot compiles ahead any more is dropped."""
    monkeypatch.setattr(first_run, "_ahead", {})
    monkeypatch.setattr(first_run, "_meanwhile", [])
    monkeypatch.setattr(first_run, "AHEAD_POLL", 0.001)
    groups = []

    def spawn(names):
        groups.append(_Slow([names] if isinstance(names, str) else names))
        return groups[-1]

    monkeypatch.setattr(first_run, "_spawn", spawn)
    products = [("q4_0", 5632, 2048, 1), ("q8_0", 2048, 2048, 1), ("q6_K", 32000, 2048, 1)]
    assert first_run.prepare(products, repeats=512, free_cpus=3) == ["dot:q4_0", "dot:q8_0", "dot:q6_K"]
    assert first_run.processes_ahead() == 2
    done = []

    def piece(i, ready=None):
        def run():
            done.append(i)
            if ready is not None:
                first_run._mark_ready(ready)
        return run

    first_run.meanwhile(piece(i, "dot:q4_0" if i == 2 else None) for i in range(10))
    assert first_run.use_compiled("dot:q4_0", 0.0) and done == [0, 1, 2]     # ready after the third piece
    assert first_run._meanwhile                                             # dots still ahead: the rest kept

    def fails():
        done.append("fails")
        raise ValueError("a damaged weight: raised again by its own call")

    first_run.meanwhile(iter([fails, piece(9)]))
    assert first_run.use_compiled("dot:q8_0", 0.0) and done == [0, 1, 2, "fails"]   # its process ended it
    assert first_run._meanwhile == []
    first_run.meanwhile(iter([piece("last", "dot:q6_K"), piece(10)]))
    assert first_run.use_compiled("dot:q6_K", 0.0) and done[-1] == "last"
    assert first_run._meanwhile == [] and first_run.processes_ahead() == 0    # no dot ahead: the rest dropped


@pytest.mark.parametrize("free, processes, given", [(3, 2, True), (2, 2, False), (2, 1, True)])
def test_a_generation_repacks_while_it_waits_only_with_a_cpu_of_its_own(monkeypatch, free, processes, given):
    """`generate.loop.ahead` gives the waits the step's tiles to repack only where the free CPUs
    outnumber the processes compiling ahead (the runner's counted): else the repacking would take
    the CPU the compiles need."""
    from ggtool import threads
    from ggtool.generate import loop

    calls = []
    monkeypatch.setattr(first_run, "prepare", lambda step, n, free_cpus: ["dot:q4_0"])
    monkeypatch.setattr(first_run, "prepare_runner", lambda *a: calls.append("runner"))
    monkeypatch.setattr(first_run, "processes_ahead", lambda: calls.append("counted") or processes)
    monkeypatch.setattr(first_run, "meanwhile", lambda work: calls.append("meanwhile"))
    monkeypatch.setattr(threads, "free_cpus", lambda: free)

    class Session:
        pool = None

        def graph(self, n):
            return type("G", (), {"nodes": []})()

    loop.ahead(Session(), 64)
    assert calls == ["runner", "counted", "meanwhile"] if given else calls == ["runner", "counted"]
