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
# written and quantized and the kernel cache filled by one short run; the build tried on the model (one
# that crashes there is built again without AMX: build.log says why); then the benches, the most wanted
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
llama_options() {  # CMake options for this CPU: native (as the issue's figures were), or with `no-amx` its
  # features from /proc/cpuinfo one by one, AMX left out (a VM whose CPU lists AMX crashed in AMX's mul_mat)
  local o="-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF"
  o+=" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF"
  [ "${1:-}" = no-amx ] || { echo "$o -DGGML_NATIVE=ON"; return; }
  local flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) " name flag
  o+=" -DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
  for name in SSE42:sse4_2 AVX:avx AVX2:avx2 FMA:fma F16C:f16c BMI2:bmi2 AVX_VNNI:avx_vnni AVX512:avx512f \
      AVX512_VNNI:avx512_vnni AVX512_BF16:avx512_bf16 AVX512_VBMI:avx512vbmi; do
    flag=${name#*:}
    if [[ "$flags" == *" $flag "* ]]; then o+=" -DGGML_${name%%:*}=ON"; else o+=" -DGGML_${name%%:*}=OFF"; fi
  done
  echo "$o"
}
build_llama() {  # build_llama FOLDER [no-amx]: llama-bench and llama-completion from the bundled sources
  # shellcheck disable=SC2046
  cmake -S "$work/llama.cpp" -B "$1" -G Ninja $(llama_options "${2:-}") &&
    cmake --build "$1" -j "$(nproc)" --target llama-bench llama-completion
}
tar xzf .device/llama.cpp.tar.gz -C "$work" || { log "the bundled llama.cpp sources do not unpack"; exit 2; }
if [ -n "${DEVICE_LLAMA_BUILD:-}" ]; then
  ln -sfn "$DEVICE_LLAMA_BUILD" "$work/build"
  true &
else
  build_llama "$work/build" > "$OUT/build.log" 2>&1 &
fi
build=$!

# the model (bench_scaling's own: gguf-py from seed 0, then ggtool quantize), and the kernel cache
log "model"
model=$(cd "$work" && python3 - "$work/models" "$here/bench" 2>> "$OUT/device.log" <<'EOF' | tail -n 1
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
import bench_scaling
print(bench_scaling.model_path(Path(sys.argv[1]), "issue", 0, "Q4_0"))
EOF
)
[ -f "$model" ] || { log "the model could not be made"; exit 4; }
log "kernels compiled ahead (ggtool kernels --compile), then a warm-up (the model's packs)"
timeout 150 python3 -m ggtool kernels --compile --quiet >> "$OUT/device.log" 2>&1 || log "the kernels did not all compile"
timeout 150 python3 bench/bench_scaling.py --shape issue --models-dir "$work/models" --threads 1,4 --repeat 1 \
  --gen 8 --prompt 64 --no-llama >> "$OUT/device.log" 2>&1 || log "warm-up failed or cut short"

# llama.cpp checked on the model (a build whose kernels crash on this CPU is built again without AMX)
smoke() { [ -x "$1/bin/llama-bench" ] && timeout 120 "$1/bin/llama-bench" -m "$model" -t 2 -r 1 -p 8 -n 1 >> "$OUT/build.log" 2>&1; }
llama=(--no-llama)
if wait $build && smoke "$work/build"; then
  llama=(--llama-bench "$work/build/bin/llama-bench")
else
  log "llama.cpp's native build did not build or crashed on the model (build.log): building it without AMX"
  if build_llama "$work/build-no-amx" no-amx >> "$OUT/build.log" 2>&1 && smoke "$work/build-no-amx"; then
    llama=(--llama-bench "$work/build-no-amx/bin/llama-bench")
  else
    log "llama.cpp was not built (build.log): ggtool alone"
  fi
fi
log "llama.cpp: ${llama[*]}"

log "scaling"
timeout "${DEVICE_STAGE_LIMIT:-240}" python3 bench/bench_scaling.py --shape issue --models-dir "$work/models" \
  --threads "${DEVICE_THREADS:-16,8,4,2,1,0}" --repeat 1 "${llama[@]}" --json "$OUT/scaling.json" 2>&1 | tee "$OUT/scaling.txt" \
  | grep -v '^{' || log "scaling cut short"

log "overhead"
timeout 120 python3 bench/bench_overhead.py --nodes 1000,20000 --threads "${DEVICE_OVERHEAD_THREADS:-2,4,8,16}" --rounds 5 --no-busy \
  --ggml "$(dirname "${llama[1]:-$work/build/bin/x}")" --ggml-headers "$work/llama.cpp/ggml/include" 2>&1 | tee "$OUT/overhead.txt" \
  || log "overhead cut short"

left=$(( 560 - ($(date +%s) - start) ))
if [ "$left" -gt 150 ]; then
  log "scaling, a second round ($left s left)"
  timeout $(( left - 20 )) python3 bench/bench_scaling.py --shape issue --models-dir "$work/models" \
    --threads "${DEVICE_THREADS:-16,8,4,2,1}" --repeat 1 "${llama[@]}" --json "$OUT/scaling2.json" 2>&1 | tee "$OUT/scaling2.txt" \
    | grep -v '^{' || log "second round cut short"
fi
log "done"
