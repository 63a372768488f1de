#!/usr/bin/env bash
# Issue 30's figures on a machine with more cores, in one call of under ten minutes: ggtool against
# llama.cpp built there, at 1, 2, 4, 8 and 16 threads (bench_scaling) and the cost of an empty node at 2,
# 4, 8 and 16 participants (bench_overhead). For the device machine (16 cores, no network): ready
# `.device/` here first (`python bench/device_bundle.py`), then
#
#     run(command="bash bench/device.sh", carry=[".device"], timeout_s=590)
#
# Each stage writes its record into $OUT as it ends (a stage cut short by the call's limit loses only
# itself): machine.txt, build.log, scaling.txt/.json (the table and its record), overhead.txt, device.log.
# Stages: gguf-py and ggtool put in a folder of their own (the machine's numpy and numba used);
# llama.cpp built (CPU, native) from the bundled sources in the background while the 311M model is
# written and quantized and the kernel cache filled by one short run; then the benches, the most wanted
# figures first. DEVICE_STAGE_LIMIT (seconds, default 240) bounds the scaling stage; DEVICE_THREADS and
# DEVICE_OVERHEAD_THREADS the thread counts; DEVICE_WORK the work folder (kept models are reused);
# DEVICE_LLAMA_BUILD a llama.cpp build folder to use instead of building one (a rehearsal elsewhere).
set -u -o pipefail
OUT=${OUT:-/tmp/ggtool-device-out}
mkdir -p "$OUT"
here=$(pwd)
work=${DEVICE_WORK:-/tmp/ggtool-device}
mkdir -p "$work"
export PYTHONUNBUFFERED=1 GGTOOL_CACHE_DIR="$work/cache" NUMBA_CACHE_DIR="$work/numba"
start=$(date +%s)
log() { echo "[$(( $(date +%s) - start ))s] $*" | tee -a "$OUT/device.log"; }

[ -f .device/llama.cpp.tar.gz ] || { log "no .device/llama.cpp.tar.gz: run python bench/device_bundle.py here first"; exit 2; }

{ nproc; lscpu; python3 -VV; python3 -c "import numpy, numba; print('numpy', numpy.__version__, 'numba', numba.__version__)"
  cmake --version | head -1; c++ --version | head -1; } > "$OUT/machine.txt" 2>&1
log "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"

# gguf-py from its wheel, and ggtool as installed (ggtool.commands is commands/), by links to this tree:
# nothing else, the machine's own numpy, numba, click, jinja2, regex and tqdm
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$work/site" .device/wheels/*.whl \
  >> "$OUT/device.log" 2>&1 || { log "installing gguf-py failed"; exit 3; }
mkdir -p "$work/site/ggtool" && for f in "$here"/ggtool/*; do ln -sfn "$f" "$work/site/ggtool/"; done \
  && ln -sfn "$here/commands" "$work/site/ggtool/commands"
export PYTHONPATH="$work/site"
python3 -c "import ggtool, gguf, numba; from ggtool.kernels import runner" >> "$OUT/device.log" 2>&1 \
  || { log "ggtool does not import here (numba and numpy?): see machine.txt"; exit 3; }

# llama.cpp, in the background (DEVICE_LLAMA_BUILD: a build folder of llama.cpp's to use instead)
if [ -n "${DEVICE_LLAMA_BUILD:-}" ]; then
  mkdir -p "$work/llama.cpp/ggml" && ln -sfn "$DEVICE_LLAMA_BUILD" "$work/build"
  tar xzf .device/llama.cpp.tar.gz -C "$work" llama.cpp/ggml/include &
else (
  tar xzf .device/llama.cpp.tar.gz -C "$work" &&
  cmake -S "$work/llama.cpp" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF &&
  cmake --build "$work/build" -j "$(nproc)" --target llama-bench llama-completion
) > "$OUT/build.log" 2>&1 &
fi
build=$!

# the model (bench_scaling's own: gguf-py from seed 0, then ggtool quantize), and the kernel cache
log "model"
(cd "$work" && python3 - "$work/models" "$here/bench") >> "$OUT/device.log" 2>&1 <<'EOF' \
  || { log "the model could not be made"; exit 4; }
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
import bench_scaling
print(bench_scaling.model_path(Path(sys.argv[1]), "issue", 0, "Q4_0"))
EOF
log "warm-up (kernels compiled into the cache)"
timeout 150 python3 bench/bench_scaling.py --shape issue --models-dir "$work/models" --threads 1,4 --repeat 1 \
  --gen 8 --prompt 64 --no-llama >> "$OUT/device.log" 2>&1 || log "warm-up failed or cut short"

wait $build && [ -x "$work/build/bin/llama-bench" ] && llama=(--llama-bench "$work/build/bin/llama-bench") \
  || { llama=(--no-llama); log "llama.cpp was not built (build.log): ggtool alone"; }
log "llama.cpp: ${llama[*]}"

log "scaling"
timeout "${DEVICE_STAGE_LIMIT:-240}" python3 bench/bench_scaling.py --shape issue --models-dir "$work/models" \
  --threads "${DEVICE_THREADS:-16,8,4,2,1,0}" --repeat 1 "${llama[@]}" --json "$OUT/scaling.json" 2>&1 | tee "$OUT/scaling.txt" \
  | grep -v '^{' || log "scaling cut short"

log "overhead"
timeout 120 python3 bench/bench_overhead.py --nodes 1000,20000 --threads "${DEVICE_OVERHEAD_THREADS:-2,4,8,16}" --rounds 5 --no-busy \
  --ggml "$work/build/bin" --ggml-headers "$work/llama.cpp/ggml/include" 2>&1 | tee "$OUT/overhead.txt" \
  || log "overhead cut short"

left=$(( 560 - ($(date +%s) - start) ))
if [ "$left" -gt 150 ]; then
  log "scaling, a second round ($left s left)"
  timeout $(( left - 20 )) python3 bench/bench_scaling.py --shape issue --models-dir "$work/models" \
    --threads "${DEVICE_THREADS:-16,8,4,2,1}" --repeat 1 "${llama[@]}" --json "$OUT/scaling2.json" 2>&1 | tee "$OUT/scaling2.txt" \
    | grep -v '^{' || log "second round cut short"
fi
log "done"
