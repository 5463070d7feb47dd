#!/usr/bin/env bash
# The GPU check in one command (bench/gpu_check.py says what it checks and times).
#
#   bench/gpu_check.sh --prepare [--no-optimize]
#       On a machine with network access (no GPU needed): download pycuda's source
#       distribution and the wheels the GPU machine lacks (pytools, platformdirs, mako,
#       siphash24) into .gpu/ (git-ignored through .git/info/exclude), and save the
#       optimized attention and matmul programs (`kernelsat optimize -t h200`) as
#       .gpu/programs/*.sexpr. Checks that .gpu/ stays under the 64 MiB a device call
#       may carry.
#
#   bench/gpu_check.sh [RESULTS_FILE] [gpu_check.py options...]
#       On the machine with the NVIDIA GPU (its own python3 with numpy and torch): build
#       pycuda from .gpu/ when it is not importable (falls back to CuPy when the build
#       fails), then run bench/gpu_check.py, writing RESULTS_FILE (default
#       $OUT/gpu_check.md, else out/gpu_check.md). Exits 2 with the reason in the
#       results file when there is no GPU or no runtime; never waits on a device.
#       Total wall time stays under GPU_CHECK_SECONDS (default 540).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GPU_DIR="$ROOT/.gpu"
CARRY_LIMIT=$((64 * 1024 * 1024))
PY=${PYTHON:-python3}
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
WHEELS=(pytools platformdirs mako siphash24)

die() { echo "gpu_check.sh: $*" >&2; exit 1; }

prepare() {
    local optimize=1
    [[ "${1:-}" == "--no-optimize" ]] && optimize=0
    cd "$ROOT" || die "cannot cd to $ROOT"
    local exclude
    exclude=$(git rev-parse --git-path info/exclude 2>/dev/null) || die "not a git checkout: $ROOT"
    mkdir -p "$(dirname "$exclude")"
    grep -qxF '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
    mkdir -p "$GPU_DIR/wheels" "$GPU_DIR/programs"
    rm -f "$GPU_DIR"/pycuda-*.tar.gz "$GPU_DIR"/wheels/*.whl
    # the sdist alone (its build needs setuptools, wheel and numpy: all on the GPU image)
    timeout 300 "$PY" -m pip download -q --no-deps --no-binary pycuda -d "$GPU_DIR" pycuda \
        || die "pip could not download pycuda's source distribution"
    timeout 300 "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$GPU_DIR/wheels" "${WHEELS[@]}" \
        || die "pip could not download the wheels ${WHEELS[*]}"
    if [[ $optimize == 1 ]]; then
        "$ROOT/.venv/bin/python" "$ROOT/bench/gpu_check.py" --prepare-programs "$GPU_DIR/programs" \
            || echo "gpu_check.sh: warning: optimized programs not saved; the check will time the specs' own terms" >&2
    fi
    local size
    size=$(du -sb "$GPU_DIR" | cut -f1)
    ls -l "$GPU_DIR" "$GPU_DIR/wheels" "$GPU_DIR/programs"
    if (( size > CARRY_LIMIT / 2 )); then
        die ".gpu/ is $size bytes: over half the 64 MiB a device call may carry"
    fi
    echo "gpu_check.sh: .gpu/ ready ($size bytes). On the GPU machine: bench/gpu_check.sh \"\$OUT/gpu_check.md\" (carry .gpu)"
}

# pycuda from the sdist in .gpu/, into $1 (a scratch folder); "" on success
build_pycuda() {
    local scratch=$1 sdist
    sdist=$(ls "$GPU_DIR"/pycuda-*.tar.gz 2>/dev/null | head -n1)
    [[ -n "$sdist" ]] || { echo "no pycuda sdist in .gpu/ (run bench/gpu_check.sh --prepare)"; return 1; }
    local nvcc cuda_root="" c
    nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null) || { echo "nvcc not found"; return 1; }
    for c in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda "$(dirname "$(dirname "$(readlink -f "$nvcc")")")"; do
        if [[ -n "$c" && -f "$c/include/cuda.h" ]]; then cuda_root=$c; break; fi
    done
    [[ -n "$cuda_root" ]] || { echo "no CUDA root with include/cuda.h (set CUDA_HOME)"; return 1; }
    rm -rf "$scratch" && mkdir -p "$scratch/lib" && tar xzf "$sdist" -C "$scratch" || { echo "cannot unpack $sdist"; return 1; }
    # -lcuda: the toolkit's stub, else the driver's library (often only libcuda.so.1)
    local libcuda=${LIBCUDA:-} d f
    [[ -n "$libcuda" ]] || for d in "$cuda_root/lib64/stubs" "$cuda_root/lib/stubs" /usr/local/nvidia/lib64 \
             /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64; do
        for f in "$d/libcuda.so" "$d/libcuda.so.1"; do
            [[ -e "$f" ]] && { libcuda=$f; break 2; }
        done
    done
    [[ -n "$libcuda" ]] || libcuda=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so/ {print $NF; exit}')
    [[ -n "$libcuda" ]] || { echo "no libcuda.so (stub or driver) to link pycuda against"; return 1; }
    ln -sf "$libcuda" "$scratch/lib/libcuda.so"
    local src
    src=$(ls -d "$scratch"/pycuda-*/ | head -n1)
    (
        cd "$src" || exit 1
        "$PY" configure.py --cuda-root="$cuda_root" --cudadrv-lib-dir="$scratch/lib" \
            --no-cuda-enable-curand > "$scratch/configure.log" 2>&1 || exit 1
        timeout "${PYCUDA_BUILD_SECONDS:-300}" "$PY" setup.py build_ext --inplace -j "$(nproc)" \
            > "$scratch/build.log" 2>&1
    ) || { echo "pycuda build failed (log: $scratch/build.log): $(tail -n 3 "$scratch/build.log" 2>/dev/null)"; return 1; }
    echo "$src"
}

run_check() {
    cd "$ROOT" || die "cannot cd to $ROOT"
    local results=${1:-}
    [[ -n "$results" && "$results" != --* ]] && shift || results=""
    if [[ -z "$results" ]]; then
        results="${OUT:-$ROOT/out}/gpu_check.md"
    fi
    local start=$SECONDS budget=${GPU_CHECK_SECONDS:-540}
    mkdir -p "$(dirname "$results")" || die "cannot create the folder of $results"
    local missing
    missing=$(timeout 60 "$PY" -c "import numpy" 2>&1 | tail -n 1) || {
        printf '# kernelsat GPU check\n\n**No GPU check was run:** %s cannot import numpy (%s)\n' \
            "$PY" "$missing" > "$results"
        echo "gpu_check.sh: $PY cannot import numpy ($missing); wrote $results" >&2
        return 2
    }
    local site=/tmp/gpu-check-site scratch=/tmp/gpu-check-build
    mkdir -p "$site"
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    if ! timeout 60 "$PY" -c "import pycuda.driver" 2> /dev/null; then
        if ls "$GPU_DIR"/wheels/*.whl > /dev/null 2>&1; then
            timeout 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
                --upgrade --target "$site" "$GPU_DIR"/wheels/*.whl \
                || echo "gpu_check.sh: warning: the wheels in .gpu/wheels did not install" >&2
        fi
        if command -v nvidia-smi > /dev/null; then
            echo "gpu_check.sh: building pycuda from its source distribution..."
            local built
            if built=$(build_pycuda "$scratch"); then
                export PYTHONPATH="$built:$PYTHONPATH"
                echo "gpu_check.sh: pycuda built in $((SECONDS - start)) s"
            else
                echo "gpu_check.sh: $built; trying CuPy instead" >&2
            fi
        fi
    fi
    local left=$((budget - (SECONDS - start) - 20))
    (( left > 60 )) || die "no time left for the check after the pycuda build"
    timeout --kill-after=10 "$left" "$PY" "$ROOT/bench/gpu_check.py" --results "$results" \
        --budget-s $((left - 30)) "$@"
    local rc=$?
    (( rc == 124 || rc == 137 )) && echo "gpu_check.sh: the check ran past ${left} s and was stopped; partial results in $results" >&2
    echo "gpu_check.sh: exit $rc, results in $results"
    return $rc
}

case "${1:-}" in
    --prepare) shift; prepare "$@" ;;
    -h|--help) sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' ;;
    *) run_check "$@" ;;
esac
