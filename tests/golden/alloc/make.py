"""Regenerate alloc.json with GGML's own graph allocator (not run by pytest).

    cmake -S ggml -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build --target ggml-base
    cc -O1 -o probe probe.c -Iggml/include -Lbuild/src -lggml-base -Wl,-rpath,$PWD/build/src
    python tests/golden/alloc/make.py ./probe [./probe-at-another-commit ...] > tests/golden/alloc/alloc.json

Each graph is built by ggtool (DSL, inputs without data), described to the probe tensor by tensor
(type, ne, nb, op, sources, view source, flags; leafs marked as having data) and expanded there in
the same order, so ggml builds the same graph; the probe prints what ggml_gallocr allocates. With
several probes, every one must give the same numbers.
"""

from __future__ import annotations

import json
import subprocess
import sys

from ggtool import Context
from ggtool.dsl import build, parse
from ggtool.tensor import FLAG_OUTPUT
from ggtool.tensor_io import Inputs, parse_named_source

CASES = [
    {"program": "@tests/golden/alloc/llama.gg", "gguf": ["fixtures/stories260K.gguf"], "tensors": ["tokens=i32[1]"], "outputs": []},
    {"program": "@tests/golden/alloc/llama.gg", "gguf": ["fixtures/stories260K.gguf"], "tensors": ["tokens=i32[16]"], "outputs": []},
    {"program": "@tests/golden/alloc/llama.gg", "gguf": ["fixtures/stories260K.gguf"], "tensors": ["tokens=i32[512]"], "outputs": []},
    {"program": "@tests/golden/alloc/llama.gg", "gguf": ["fixtures/llama-2-tiny-random.gguf"], "tensors": ["tokens=i32[16]"],
     "outputs": []},
    {"program": "@tests/golden/alloc/llama.gg", "gguf": ["fixtures/stories260K.gguf"], "tensors": ["tokens=i32[16]"],
     "outputs": ["x-0", "kq_soft-1", "logits"]},
    {"program": "h = relu(mul_mat(w, x))\ng = silu(h)\ny = add(scale(g, 0.5), h)\nt = transpose(y)\nz = cont(t)\n"
                "soft_max(rms_norm(z, 1e-5))",
     "gguf": [], "tensors": ["w=f32[64,96]", "x=f32[64,24]"], "outputs": []},
    {"program": "a = relu(x)\nb = sqr(a)\nc = cpy(b, a)\nd = mul(c, x)\ne = reshape_1d(d, 512)\n"
                "f = view_1d(e, 256, 1024)\nn = neg(f)",
     "gguf": [], "tensors": ["x=f32[32,16]"], "outputs": ["b", "n"]},
]

ABOUT = ("ggml_gallocr_reserve + ggml_gallocr_alloc_graph on ggml_backend_cpu_buffer_type() over the graphs ggtool "
         "builds (tests/golden/alloc/probe.c, linked against ggml-base at 475e012 and at d99724f: identical). "
         "node_offsets[i]: where nodes[i]'s data starts in the compute buffer, null when it is not in it. Leafs "
         "have data already (ggml_gallocr leaves them alone); the outputs (the program's, or `outputs`) are "
         "flagged GGML_TENSOR_FLAG_OUTPUT, with the source of an output that is a view.")


def load(case):
    """The case's graph and its outputs, built by ggtool without reading any tensor data."""
    src = case["program"]
    if src.startswith("@"):
        with open(src[1:], encoding="utf-8") as f:
            src = f.read()
    env = Inputs([parse_named_source(o) for o in case["tensors"]], case["gguf"], read_data=False)
    built = build(parse(src), Context(), env, outputs=case["outputs"] or None)
    return built.graph, [t for _, t in built.outputs]


def describe(graph, outputs) -> str:
    """The probe's input: every tensor the graph reaches, in creation order, then the expands."""
    reach, stack = set(), list(outputs)
    while stack:
        t = stack.pop()
        if id(t) not in reach:
            reach.add(id(t))
            stack.extend(s for s in (*t.src, t.view_src) if s is not None)
    order = [t for t in graph.ctx.tensors if id(t) in reach]
    ids = {id(t): i for i, t in enumerate(order)}
    outs = {id(t) for t in outputs} | {id(t.view_src) for t in outputs if t.view_src is not None}
    lines = []
    for t in order:
        srcs = list(t.src)
        while srcs and srcs[-1] is None:
            srcs.pop()
        flags = t.flags | (FLAG_OUTPUT if id(t) in outs else 0)
        vs = -1 if t.view_src is None else ids[id(t.view_src)]
        fields = ["T", ids[id(t)], int(t.type), *t.ne, *t.nb, t.op, int(t.op == "NONE"), vs, t.view_offs, flags,
                  len(srcs), *[-1 if s is None else ids[id(s)] for s in srcs], t.name or f"t{ids[id(t)]}"]
        lines.append(" ".join(map(str, fields)))
    lines += [f"E {ids[id(t)]}" for t in outputs]
    return "\n".join(lines) + "\n"


def run_probe(probe: str, graph, outputs) -> tuple[int, list[int | None]]:
    out = subprocess.run([probe], input=describe(graph, outputs), capture_output=True, text=True, check=True).stdout
    size, offsets = None, []
    for line in out.splitlines():
        parts = line.split(" ", 3)
        if parts[0] == "size":
            size = int(parts[1])
        elif parts[0] == "node":
            offsets.append(None if int(parts[2]) < 0 else int(parts[2]))
    if len(offsets) != graph.n_nodes:
        raise SystemExit(f"ggml built {len(offsets)} nodes, ggtool {graph.n_nodes}")
    return size, offsets


def main(probes: list[str]) -> None:
    results = []
    for probe in probes:
        res = []
        for case in CASES:
            graph, outputs = load(case)
            size, offsets = run_probe(probe, graph, outputs)
            res.append(dict(case, compute_buffer_size=size, node_names=[t.name for t in graph.nodes],
                            node_offsets=offsets))
        results.append(res)
    if any(r != results[0] for r in results):
        raise SystemExit("the probes disagree")
    print("{\n" + f'"about": {json.dumps(ABOUT)},\n"cases": [')
    print(",\n".join("  " + json.dumps(c) for c in results[0]))
    print("]\n}")


if __name__ == "__main__":
    main(sys.argv[1:])
