"""Run a rendered CUDA program on the CPU: the very source `CUDARenderer` writes, compiled
by g++ (C++20) behind a small shim, so its index math, its lane and block mappings, its
shuffles and its shared-memory staging are checked here, where no GPU is.

The shim gives each block of a launch `threads` OS threads (blocks run one after the
other): `threadIdx`/`blockIdx`/`blockDim` are thread-local, `__shared__` variables are
function statics (one copy, shared by the block's threads), `__syncthreads()` is a barrier
over the block, and `__shfl_xor_sync` exchanges through a per-warp slot array between two
barriers over the warp. A thread that returns early drops out of its barriers, as an exited
CUDA thread no longer takes part. Nothing here models timing, memory coalescing or the
real warp scheduler: it checks what the source computes, for tests on small sizes.
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from kernelsat.cachefile import cache_dir as default_cache_dir
from kernelsat.codegen.c import buffer_order, gather_error, int_buffers
from kernelsat.codegen.cuda import CUDARenderer, device_nests
from kernelsat.codegen.lower import CodegenError, KernelNest, LoweredProgram

SHIM = r"""
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>
struct ks_dim3 { unsigned x, y, z; };
static thread_local ks_dim3 threadIdx, blockIdx, blockDim;
struct ks_block {
  std::unique_ptr<std::barrier<>> all;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<float> slot;
};
static thread_local ks_block* ks_here;
#define __global__
#define __shared__ static
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline void __syncthreads() { ks_here->all->arrive_and_wait(); }
static inline float __shfl_xor_sync(unsigned, float v, int o) {
  unsigned t = threadIdx.x;
  std::barrier<>& w = *ks_here->warps[t >> 5];
  ks_here->slot[t] = v;
  w.arrive_and_wait();
  float r = ks_here->slot[(t & ~31u) | ((t & 31u) ^ (unsigned)o)];
  w.arrive_and_wait();
  return r;
}
static void ks_launch(long blocks, int threads, const std::function<void()>& body) {
  for (long b = 0; b < blocks; b++) {
    ks_block blk;
    blk.all.reset(new std::barrier<>(threads));
    for (int w = 0; w * 32 < threads; w++)
      blk.warps.emplace_back(new std::barrier<>(std::min(32, threads - 32 * w)));
    blk.slot.assign(threads, 0.0f);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; t++)
      pool.emplace_back([&, t] {
        threadIdx = {(unsigned)t, 0, 0};
        blockIdx = {(unsigned)b, 0, 0};
        blockDim = {(unsigned)threads, 1, 1};
        ks_here = &blk;
        body();
        blk.all->arrive_and_drop();
        blk.warps[t >> 5]->arrive_and_drop();
      });
    for (auto& th : pool) th.join();
  }
}
"""

FLAGS = ("-std=c++20", "-O1", "-pthread", "-shared", "-fPIC", "-w")


def host_source(prog: LoweredProgram, nests: list[KernelNest], renderer: CUDARenderer) -> str:
    """The shim, the CUDA source, and one `ks_launch_<symbol>(blocks, threads, buffers)` per
    launch."""
    wrappers = []
    ints = int_buffers(prog)
    for n in device_nests(nests)[0]:  # an integer input (gather labels, issue 18 3b) is an int*
        args = ", ".join(f"(int*)a[{i}]" if b in ints else f"a[{i}]"
                         for i, b in enumerate(n.params))
        wrappers.append(
            f'extern "C" void ks_launch_{n.symbol}(long blocks, int threads, float** a) {{\n'
            f"  ks_launch(blocks, threads, [=] {{ {n.symbol}({args}); }});\n}}")
    return "\n".join([SHIM, renderer.render(prog, nests), *wrappers]) + "\n"


def run_on_cpu(prog: LoweredProgram, nests: list[KernelNest], inputs: Mapping[str, np.ndarray],
               cache: Path | None = None) -> np.ndarray:
    """The float32 output of the CUDA program (`nests` under their knobs) run through the
    shim; temporaries and the output start as NaN (an unwritten element stays NaN)."""
    if shutil.which("g++") is None:
        raise CodegenError("g++ not found: running CUDA source on the CPU needs g++ (C++20)")
    renderer = CUDARenderer()
    source = host_source(prog, nests, renderer)
    folder = cache or default_cache_dir() / "cuda_cpu"
    folder.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256((source + " ".join(FLAGS)).encode()).hexdigest()[:24]
    lib = folder / f"ks_{digest}.so"
    if not lib.exists():
        src = folder / f"ks_{digest}.cpp"
        src.write_text(source)
        tmp = folder / f"ks_{digest}.tmp.so"
        proc = subprocess.run(["g++", *FLAGS, "-o", str(tmp), str(src)], capture_output=True,
                              text=True, timeout=300)
        if proc.returncode != 0:
            raise CodegenError(f"g++ failed on {src}:\n{proc.stderr[-3000:]}")
        tmp.replace(lib)
    dll = ctypes.CDLL(str(lib))
    bufs: dict[str, np.ndarray] = {
        b: np.full(prog.buffers[b].size, np.nan, np.float32) for b in buffer_order(prog)}
    for info in prog.inputs:
        dtype = np.int32 if info.dtype == "i32" else np.float32
        bufs[info.name] = np.ascontiguousarray(inputs[info.user_name], dtype).reshape(-1)
    launched, scratch = device_nests(nests)  # a kernel with no rows: its phases
    bufs.update({b: np.full(n, np.nan, np.float32) for b, n in scratch.items()})
    for nest, launch in zip(launched, renderer.launches(launched), strict=True):
        fn = getattr(dll, f"ks_launch_{nest.symbol}")
        fn.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p)]
        fn.restype = None
        ptrs = (ctypes.c_void_p * len(nest.params))(*(bufs[b].ctypes.data for b in nest.params))
        fn(launch.blocks, launch.threads, ptrs)
    if "ks_gather_error" in source:  # a gather's label out of range (issue 18 part 3b)
        error = gather_error(prog, (ctypes.c_longlong * 5).in_dll(dll, "ks_gather_error"))
        if error is not None:
            raise error
    return bufs["out"].reshape(prog.buffers["out"].shape)
