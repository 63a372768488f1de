"""Replays the golden step language (tests/golden/README.md) through the engine."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import ggtool
from ggtool.ops import FUNCTIONS
from ggtool.tensor import FLAG_PARAM

GOLDEN = Path(__file__).parent / "golden"


def load_json(name: str) -> dict:
    return json.loads((GOLDEN / name).read_text())


def load_npz(name: str):
    return np.load(GOLDEN / name)


def _args(step: dict) -> tuple[list, dict]:
    params = dict(step.get("params", {}))
    args = []
    if step["op"] == "permute":
        args = list(params.pop("axes"))
    return args, params


class Replay:
    """Runs steps in a fresh context; `ids` maps step ids to tensors, `trace` mirrors memory.json."""

    def __init__(self, steps, data=None, mem_size=None, no_alloc=False):
        self.ctx = ggtool.Context(mem_size, no_alloc=no_alloc)
        self.ids: dict[str, ggtool.Tensor] = {}
        self.graph = None
        self.plan = None
        self.trace: list[dict] = []
        for i, step in enumerate(steps):
            self.step(i, step, data)

    def step(self, i: int, step: dict, data) -> None:
        ctx = self.ctx
        rec: dict = {"step": i}
        if "new_tensor" in step:
            nt = step["new_tensor"]
            t = ctx.new_tensor(nt["type"], nt["ne"])
            if "name" in step:
                t.name = step["name"]
            if step.get("param"):
                t.flags |= FLAG_PARAM
            if "data" in step and data is not None:
                t.data[...] = data[step["data"]].reshape(t.data.shape)
            if "data_values" in step:
                t.data[...] = np.asarray(step["data_values"], dtype=t.data.dtype).reshape(t.data.shape)
            self.ids[step["id"]] = t
        elif "op" in step:
            args, params = _args(step)
            srcs = [self.ids[a] for a in step["args"]]
            t = FUNCTIONS[step["op"]](ctx, *srcs, *args, **params)
            self.ids[step["id"]] = t
        elif "new_graph" in step:
            g = step["new_graph"]
            self.graph = ggtool.Graph(ctx, g.get("size", 2048), g.get("grads", False))
            rec["graph_offset"] = self.graph.offset
        elif "expand" in step:
            self.graph.expand(self.ids[step["expand"]])
        elif "compute" in step:
            self.plan = ggtool.graph_compute(self.graph, step["compute"]["n_threads"])
            rec["status"] = 0  # GGML_STATUS_SUCCESS: failures raise instead
            rec["plan"] = {"n_threads": self.plan.n_threads, "work_size": self.plan.work_size}
            rec["work_buffer_offset"] = self.plan.work_offset
        if "id" in step:
            t = self.ids[step["id"]]
            rec.update(id=step["id"], struct_offset=t.struct_offset, data_offset=t.data_offset,
                       nbytes=t.nbytes)
        rec["used_mem"] = ctx.used_mem
        self.trace.append(rec)

    def id_of(self, t) -> str:
        return next(k for k, v in self.ids.items() if v is t)

    def record(self, t) -> dict:
        """The fields of a golden tensor record that the engine defines."""
        return {
            "name": t.name, "type": ggtool.types.type_name(t.type), "ne": list(t.ne), "nb": list(t.nb),
            "op": t.op, "op_desc": t.op_desc, "flags": t.flags,
            "src": [self.id_of(s) for s in t.src if s is not None],
            "view_src": None if t.view_src is None else self.id_of(t.view_src),
            "view_offs": t.view_offs, "op_params": [int(x) for x in t.op_params],
            "nbytes": t.nbytes, "is_contiguous": t.is_contiguous(),
        }


def nmse(out: np.ndarray, ref: np.ndarray) -> float:
    out = out.astype(np.float64)
    ref = ref.astype(np.float64)
    finite = np.isfinite(ref)
    assert np.array_equal(np.isfinite(out), finite), "non-finite positions differ"
    assert np.array_equal(out[~finite], ref[~finite]), "non-finite values differ"
    den = np.sum(ref[finite] ** 2)
    num = np.sum((out[finite] - ref[finite]) ** 2)
    return float(num / den) if den else float(num)
