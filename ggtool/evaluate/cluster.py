"""Ray as an executor of ggtool.evaluate.distribute's tasks (docs/cluster.md). Ray is an optional
extra (`pip install 'ggtool[cluster]'`): this module is the only one that imports it, and only when
a cluster is asked for.

`RayExecutor(address)` connects to a running cluster (`ray start` as the head on one host, then
`ray start` with the head's HOST:PORT on the others), after checking within seconds that the address answers. Each
task asks for one CPU; a task whose worker dies is run again by Ray (`max_retries`), and the caller
takes one result per task, so nothing is counted twice. Files: `ship` is "shared" (every node reads
the caller's paths), "ship" (each file's bytes go through the object store, written once per node
into a private cache folder), or "auto": one probe per node says whether it sees the caller's file
at its path (the same size and digest); where one does not, the file is shipped.
"""

from __future__ import annotations

import os
import socket

from ..errors import GGToolError
from .distribute import FileSource

SHIP_MODES = ("auto", "shared", "ship")
CONNECT_SECONDS = 5.0
MAX_RETRIES = 3


class ClusterError(GGToolError):
    """The cluster cannot be used: `kind` is "no-ray" (not installed), "unreachable", "address",
    "task" (a task failed after its retries), "ship"; `address` where it matters."""

    def __init__(self, message: str, *, kind: str, address: str | None = None):
        self.kind, self.address = kind, address
        super().__init__(message)


def import_ray():
    try:
        import ray
    except ImportError:
        raise ClusterError("Ray is not installed: pip install 'ggtool[cluster]' (or pip install ray)",
                           kind="no-ray") from None
    return ray


def _host_port(address: str) -> tuple[str, int]:
    a = address.strip()
    if a.startswith("ray://"):
        a = a[len("ray://"):]
    host, sep, port = a.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterError(f"{address!r} is not a Ray address (HOST:PORT, as the head's `ray start` prints it)",
                           kind="address", address=address)
    return host.strip("[]"), int(port)


def check_reachable(address: str, seconds: float = CONNECT_SECONDS) -> None:
    """A TCP connection to the cluster's address within `seconds`, or a ClusterError saying why."""
    host, port = _host_port(address)
    try:
        with socket.create_connection((host, port), timeout=seconds):
            pass
    except socket.timeout:
        raise ClusterError(f"cannot reach the Ray cluster at {address}: no answer within {seconds:g} s",
                           kind="unreachable", address=address) from None
    except OSError as e:
        raise ClusterError(f"cannot reach the Ray cluster at {address}: {e.strerror or e}", kind="unreachable",
                           address=address) from None


def _diagnostics_to_stderr(ray) -> None:
    """Ray's driver prints the cluster's error messages (a worker died, a task is retried) on stdout,
    where ggtool's data goes (a CSV, a JSON record): they go to stderr instead. Ray's printer is
    looked up by its module at each message, so wrapping it there is enough; where a Ray release
    moves it, nothing is wrapped (tests/test_cluster.py's killed-worker test then fails on stdout)."""
    w = getattr(getattr(ray, "_private", None), "worker", None)
    printer = getattr(w, "print_to_stdstream", None)
    if printer is None or getattr(printer, "ggtool_stderr", False):
        return

    def to_stderr(data, *args, **kw):
        return printer({**data, "is_err": True}, *args, **kw)

    to_stderr.ggtool_stderr = True
    w.print_to_stdstream = to_stderr


def _run_task(fn, *args):
    """What a Ray worker runs: a distribute task, its shipped files fetched from the object store."""
    import ray

    return fn(*args, fetch=ray.get)


def _probe(source: FileSource) -> bool:
    try:
        source.local_path()
        return True
    except GGToolError:
        return False


class RayExecutor:
    """distribute's executor interface on a Ray cluster (see the module)."""

    name = "ray"

    def __init__(self, address: str, *, ship: str = "auto", max_retries: int = MAX_RETRIES):
        if ship not in SHIP_MODES:
            raise ClusterError(f"ship mode {ship!r}: use one of {', '.join(SHIP_MODES)}", kind="ship")
        ray = import_ray()
        kw = {}
        if address.strip() != "auto":   # "auto": Ray finds the cluster this host started (`ray start`)
            check_reachable(address)
            host, _ = _host_port(address)
            if host in ("127.0.0.1", "localhost", "::1"):
                kw["_node_ip_address"] = "127.0.0.1"
        _diagnostics_to_stderr(ray)
        try:
            ray.init(address=address, log_to_driver=False, logging_level="ERROR", configure_logging=True,
                     include_dashboard=False, **kw)
        except Exception as e:       # Ray's own errors (ConnectionError, RuntimeError...): one line
            raise ClusterError(f"cannot join the Ray cluster at {address}: {str(e).splitlines()[0] if str(e) else e}",
                               kind="unreachable", address=address) from None
        self.ray, self.address, self.ship_mode, self.max_retries = ray, address, ship, max_retries
        self._remote = ray.remote(_run_task)
        self._probe = ray.remote(_probe)
        self._shipped: dict[str, FileSource] = {}
        self._cache: dict = {}

    @property
    def workers(self) -> int:
        """CPUs of the cluster (each task takes one)."""
        return int(self.ray.cluster_resources().get("CPU", 1))

    def put(self, obj):
        return self.ray.put(obj)

    def put_cached(self, key, make):
        """make()'s value in the object store, once per key (a base file's rows, read by every type)."""
        ref = self._cache.get(key)
        if ref is None:
            ref = self._cache[key] = self.ray.put(make())
        return ref

    def ship(self, path: str) -> FileSource:
        """The FileSource a task reads `path` through (see the module: shared, shipped, or probed)."""
        src = FileSource.of(path)
        if src.path in self._shipped and self._shipped[src.path].digest == src.digest:
            return self._shipped[src.path]
        mode = self.ship_mode
        if mode == "auto":
            mode = "shared" if self._seen_everywhere(src) else "ship"
        if mode == "ship":
            with open(src.path, "rb") as f:
                src = src.shipped(self.ray.put(f.read()))
        self._shipped[src.path] = src
        return src

    def _seen_everywhere(self, src: FileSource) -> bool:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = [n["NodeID"] for n in self.ray.nodes() if n.get("Alive")]
        refs = [self._probe.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False))
                .remote(FileSource(src.path, src.size, src.digest)) for n in nodes]
        return all(self.ray.get(refs))

    def submit(self, fn, *args):
        job = args[0] if args else None
        name = f"ggtool-{fn.__name__}-{getattr(job, 'index', '')}"
        return self._remote.options(num_cpus=1, max_retries=self.max_retries, retry_exceptions=False,
                                    name=name).remote(fn, *args)

    def get(self, handle):
        try:
            return self.ray.get(handle)
        except GGToolError:
            raise
        except self.ray.exceptions.RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, GGToolError):
                raise cause from None
            raise ClusterError(f"a task failed on the cluster: {str(cause or e).splitlines()[0]}", kind="task",
                               address=self.address) from None
        except self.ray.exceptions.RayError as e:
            raise ClusterError(f"a task was lost after {self.max_retries} retries: {str(e).splitlines()[0]}",
                               kind="task", address=self.address) from None

    def ordered(self, handles: list):
        for h in handles:
            yield self.get(h)

    def close(self) -> None:
        try:
            self.ray.shutdown()
        except Exception:   # pragma: no cover - a driver leaving a cluster that is gone
            pass


def executor_for(address: str | None, *, ship: str = "auto"):
    """A RayExecutor for `address` ("" or None: none). Where the command line's Ray address lands."""
    if not address:
        return None
    return RayExecutor(address, ship=ship)


def environment_address() -> str | None:
    """RAY_ADDRESS, Ray's own variable, where it is set."""
    return os.environ.get("RAY_ADDRESS") or None
