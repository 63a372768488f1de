"""The generation loop: the prompt in one batch, then one token per step until EOS or n tokens."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass
class Event:
    """One generated token, with the time so far: the prompt's evaluation and the steps after it."""

    token: int
    prompt_seconds: float
    generate_seconds: float


def generate(session, prompt: list[int], n_predict: int, sample: Callable, stop_ids=frozenset(),
             clock: Callable[[], float] = time.perf_counter) -> Iterator[Event]:
    """Yield each new token of `session` after `prompt`: at most `n_predict`, and none after a
    token of `stop_ids` (which is yielded)."""
    if n_predict <= 0 or not prompt:
        return
    from ..compiling.first_run import repeating

    session.prepare(len(prompt), 1)
    later = ahead(session, n_predict)
    with repeating(n_predict, later) as steps:     # a kernel not compiled yet: its twin's cost counts once a step to come
        t0 = clock()
        logits = session.eval(prompt)
        prompt_seconds = clock() - t0
        t1 = clock()
        for i in range(n_predict):
            token = sample(logits)
            yield Event(token, prompt_seconds, clock() - t1)
            if token in stop_ids or i + 1 == n_predict:
                return
            steps.next(n_predict - 1 - i)
            logits = session.eval([token])


def ahead(session, n_predict: int) -> dict[str, float]:
    """Before a generation of n_predict steps: the kernels of its step that a first-ever run would
    compile start compiling now, in side processes (ggtool.compiling.first_run.prepare: the dots;
    prepare_runner: the compiled runner's, with one thread, where it pays). Returns what each dot's
    twin costs a step (first_run.step_seconds), for first_run.repeating: the prompt is counted once."""
    if not hasattr(session, "graph"):
        return {}
    from ..compiling.first_run import meanwhile, prepare, prepare_runner, processes_ahead, step_seconds
    from ..threads import free_cpus

    graph, free = session.graph(1), free_cpus()
    step = products(graph)
    started = prepare(step, n_predict, free)
    if getattr(session, "pool", None) is None or getattr(session, "n_threads", 1) <= 1:
        from ..runner import kernels_used
        numerics = getattr(session, "numerics", "ggml")
        prepare_runner(lambda: kernels_used(graph.nodes, numerics), 0, n_predict, free)
        if started and free > processes_ahead():   # a CPU of its own for this process while it waits
            meanwhile(tile_packers(graph, numerics, started))
    return step_seconds(step)


def tile_packers(graph, numerics: str, dots):
    """What the wait for a dot compiling ahead does meanwhile, in one process with a CPU of its own
    beside the compiling processes (the prompt's first product waits ~2 s while a first-ever run's
    dots compile): repack every weight tile the step's products will read, in the order they read
    them (``ops.matmul.tile_packers``), which their first calls would do later, one after the other:
    the products whose dot compiles ahead (`dots`, "dot:<type>"; another's calls run its twin, which
    reads the blocks as they are). Where the compiles take every free CPU it would only slow them
    (two cores: 6.1 s either way for a 311M model's 64 tokens, docs/engine.md). Nothing under
    llama.cpp's numerics (its products read other blocks)."""
    from .. import types as T
    from ..kernels.numerics import is_llama_cpp
    from ..ops import matmul

    if is_llama_cpp(numerics):
        return
    for n in graph.nodes:
        if n.op == "MUL_MAT" and f"dot:{T.type_name(n.src[0].type)}" in dots:
            yield from matmul.tile_packers(n)


def products(graph) -> list[tuple]:
    """The matrix products of a graph as the first-ever-run policy weighs them
    (ggtool.compiling.first_run.prepare): weight type name, rows, row length, activation rows."""
    from .. import types as T

    return [(T.type_name(n.src[0].type), n.src[0].nrows, n.src[0].ne[0], n.src[1].nrows)
            for n in graph.nodes if n.op == "MUL_MAT"]
