"""Ready `.device/` for `bench/device.sh`: what issue 30's figures need on a machine with more cores that
has no network (the device machine: 16 cores, Python 3.12 with numpy, numba, click, jinja2, regex, tqdm,
pyyaml, CMake and a C++ compiler; no gguf).

    python bench/device_bundle.py [--sdist llama_cpp_python-X.tar.gz] [--out .device]

It writes, in --out (ignored by git: `.device/` is in .gitignore):
- `llama.cpp.tar.gz`: llama.cpp's sources from llama-cpp-python's source distribution (its
  vendor/llama.cpp), only what CMake needs to build `llama-bench` and `llama-completion` on the CPU:
  the other backends, tools, tests, models and docs are left out, and tools/CMakeLists.txt names the
  two tools alone (about 3 MB where the distribution is 77 MB);
- `wheels/`: gguf-py (pure Python; the device's Python lacks it), from this environment's pip cache
  or PyPI.

Then, with a device lent (`status`: can_start_another), one call of about ten minutes:

    run(command="bash bench/device.sh", carry=[".device"], timeout_s=590)

whose files ($OUT) hold the bench records (docs/engine.md, "Measuring on more cores").
"""

from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SDIST = Path("/work/bench-env/sdist/llama_cpp_python-0.3.36.tar.gz")

# llama.cpp's top-level entries CMake reads for a CPU build of its library, common and two tools
KEEP = ("CMakeLists.txt", "LICENSE", "cmake/", "common/", "ggml/", "include/", "src/", "vendor/",
        "tools/llama-bench/", "tools/completion/", "licenses/")
# ggml's backends other than the CPU's: CMake adds them only when asked
OTHER_BACKENDS = ("ggml-blas", "ggml-cann", "ggml-cuda", "ggml-et", "ggml-hexagon", "ggml-hip", "ggml-metal",
                  "ggml-musa", "ggml-opencl", "ggml-openvino", "ggml-rpc", "ggml-sycl", "ggml-virtgpu",
                  "ggml-vulkan", "ggml-webgpu", "ggml-zdnn", "ggml-zendnn")
TOOLS_CMAKE = b"""# written by ggtool's bench/device_bundle.py: the two tools its bench runs
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(llama-bench)
add_subdirectory(completion)
"""
GGUF = "gguf==0.17.1"


def kept(rel: str) -> bool:
    """Whether a path under vendor/llama.cpp goes in the bundle."""
    if not any(rel == k.rstrip("/") or rel.startswith(k) for k in KEEP):
        return False
    parts = rel.split("/")
    return not (len(parts) > 2 and parts[:2] == ["ggml", "src"] and parts[2] in OTHER_BACKENDS)


def bundle_sources(sdist: Path, out: Path) -> int:
    """llama.cpp.tar.gz from the distribution's vendor/llama.cpp; returns its size."""
    target = out / "llama.cpp.tar.gz"
    tmp = target.with_suffix(".part")
    with tarfile.open(sdist) as src, tarfile.open(tmp, "w:gz") as dst:
        prefix = None
        for m in src:
            name = m.name
            if prefix is None:
                prefix = name.split("/", 1)[0] + "/vendor/llama.cpp/"
            if not name.startswith(prefix) or not (m.isfile() or m.isdir()):
                continue
            rel = name[len(prefix):]
            if not rel or not kept(rel):
                continue
            m.name = "llama.cpp/" + rel
            dst.addfile(m, src.extractfile(m) if m.isfile() else None)
        info = tarfile.TarInfo("llama.cpp/tools/CMakeLists.txt")
        info.size = len(TOOLS_CMAKE)
        dst.addfile(info, io.BytesIO(TOOLS_CMAKE))
    tmp.replace(target)
    return target.stat().st_size


def fetch_wheels(out: Path) -> list[str]:
    """gguf's wheel (pure Python) into out/wheels."""
    wheels = out / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d",
                    str(wheels), GGUF], check=True)
    return sorted(p.name for p in wheels.iterdir())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sdist", type=Path, default=SDIST, help="llama-cpp-python's source distribution")
    ap.add_argument("--out", type=Path, default=ROOT / ".device")
    a = ap.parse_args()
    if not a.sdist.is_file():
        sys.exit(f"device_bundle: {a.sdist} is not there: pip download --no-deps --no-binary :all: "
                 "llama-cpp-python==0.3.36 -d DIR, then --sdist DIR/llama_cpp_python-0.3.36.tar.gz")
    a.out.mkdir(parents=True, exist_ok=True)
    size = bundle_sources(a.sdist, a.out)
    print(f"{a.out / 'llama.cpp.tar.gz'}: {size / 1e6:.1f} MB")
    print(f"{a.out / 'wheels'}: {', '.join(fetch_wheels(a.out))}")


if __name__ == "__main__":
    main()
