// Host emulation of the CUDA device features used by aisql_kernels.cu.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>
#include <functional>
#include <algorithm>

struct dim3 { unsigned x = 0, y = 0, z = 0; };
inline thread_local dim3 threadIdx, blockIdx, blockDim;
inline dim3 g_gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(x)
#define __shared__

// Dynamic shared memory: `extern __shared__ float smem[]` inside the kernel resolves
// to this namespace-scope buffer (block-scope extern declaration).
constexpr size_t SMEM_FLOATS = 1 << 16;
float smem[SMEM_FLOATS];

inline std::barrier<>* g_block_barrier = nullptr;
inline void __syncthreads() { g_block_barrier->arrive_and_wait(); }

// Warp shuffle: per-warp exchange buffer + per-warp barrier (all 32 lanes call it).
constexpr int MAX_WARPS = 32;
inline float g_shfl_buf[MAX_WARPS][32];
inline std::barrier<>* g_warp_barrier[MAX_WARPS];
inline float __shfl_down_sync(unsigned mask, float v, unsigned offset) {
    if (mask != 0xffffffffu) { fprintf(stderr, "emu: partial shuffle mask unsupported\n"); abort(); }
    const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
    g_shfl_buf[w][lane] = v;
    g_warp_barrier[w]->arrive_and_wait();
    const float r = (lane + offset < 32) ? g_shfl_buf[w][lane + offset] : v;
    g_warp_barrier[w]->arrive_and_wait();
    return r;
}

using std::min;
using std::max;
inline float __expf(float x) { return expf(x); }

// Emulated launch: blocks run one at a time, each with blockDim.x std::threads.
// Before each block the first `shared_bytes` of smem are poisoned with NaN and the
// rest with a canary pattern, which is checked after the block (overrun detection).
inline uint32_t g_canary = 0x7fbadbadu;  // a NaN pattern too
inline long g_smem_overruns = 0;
template <class F>
void emu_launch(dim3 grid, dim3 block, size_t shared_bytes, F&& kernel) {
    if (shared_bytes > sizeof(smem)) { fprintf(stderr, "emu: too much shared memory\n"); abort(); }
    const int nthreads = block.x;
    g_gridDim = grid;
    const size_t nf = shared_bytes / 4;
    for (unsigned by = 0; by < grid.y; ++by)
        for (unsigned bx = 0; bx < grid.x; ++bx) {
            for (size_t i = 0; i < nf; ++i) smem[i] = std::nanf("");
            for (size_t i = nf; i < SMEM_FLOATS; ++i) memcpy(&smem[i], &g_canary, 4);
            std::barrier<> bar(nthreads);
            g_block_barrier = &bar;
            std::vector<std::unique_ptr<std::barrier<>>> wb;
            for (int w = 0; w < (nthreads + 31) / 32; ++w) {
                wb.emplace_back(new std::barrier<>(std::min(32, nthreads - 32 * w)));
                g_warp_barrier[w] = wb.back().get();
            }
            std::vector<std::thread> ts;
            ts.reserve(nthreads);
            for (int t = 0; t < nthreads; ++t)
                ts.emplace_back([&, t] {
                    threadIdx = {(unsigned)t, 0, 0};
                    blockIdx = {bx, by, 0};
                    blockDim = block;
                    kernel();
                });
            for (auto& t : ts) t.join();
            for (size_t i = nf; i < SMEM_FLOATS; ++i)
                if (memcmp(&smem[i], &g_canary, 4) != 0) {
                    ++g_smem_overruns;
                    fprintf(stderr, "emu: shared-memory write past shared_bytes at float %zu (block %u,%u)\n", i, bx, by);
                    break;
                }
        }
}
