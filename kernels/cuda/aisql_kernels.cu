// aisql's hand-written CUDA kernels (compiled to PTX by kernels/build.rs under the
// `cuda` feature, launched from kernels/src/cuda.rs). Each has a CPU twin in
// kernels/src/ that defines its contract:
//
// * `psa_*`: attention of a packed batch of suffixes, each over its own chain of
//   cached prefix segments, in one launch (the CPU twin is attention.rs). Online
//   softmax over [prefix segments ‖ causal suffix], f32 accumulation.
// * `rhead_*`: logits of a few vocabulary rows (the TRUE/FALSE answer ids) without
//   the full-vocabulary matmul (the CPU twin is head.rs `restricted_head`).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

template <typename T> __device__ __forceinline__ float to_f32(T x);
template <> __device__ __forceinline__ float to_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ float to_f32<__half>(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half(x); }

// Keys per shared-memory tile, threads per block, and the most output values one
// thread accumulates. The host (cuda.rs) chooses the rows per block so that
// rows_padded * (head_dim / MAX_ACC) <= PSA_THREADS; these constants are mirrored
// there.
#define PSA_BK 16
#define PSA_THREADS 256
#define PSA_MAX_ACC 32

// One block = one tile of up to `tq` query tokens of one sequence, for all `group`
// query heads of KV head blockIdx.y. Block row r is token r / group of the tile and
// query head blockIdx.y * group + r % group; rows_padded (a power of two >= tq*group)
// rows exist so that every row gets the same number of threads.
//
// Key sources, in order: the sequence's prefix segments (ranges of pk/pv, all keys
// visible), then its own suffix keys in k/v (key j visible to token i iff j <= i).
template <typename T>
__device__ __forceinline__ void prefix_suffix_attention(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
    const T* __restrict__ pk, const T* __restrict__ pv, T* __restrict__ out,
    const uint32_t* __restrict__ tile_seq, const uint32_t* __restrict__ tile_q0,
    const uint32_t* __restrict__ seq_start, const uint32_t* __restrict__ seq_len,
    const uint32_t* __restrict__ seq_seg_begin, const uint32_t* __restrict__ seg_off,
    const uint32_t* __restrict__ seg_len,
    int total, int ptotal, int head_dim, int group, int tq, int rows_padded, float scale)
{
    extern __shared__ float smem[];
    const int D = head_dim;
    const int S = D + 1;  // padded row stride: the score loop reads 16 K rows at one d without bank conflicts
    float* qs = smem;                   // rows_padded x S
    float* ks = qs + rows_padded * S;   // PSA_BK x S
    float* vs = ks + PSA_BK * S;        // PSA_BK x S
    float* ss = vs + PSA_BK * S;        // rows_padded x PSA_BK

    const int kvh = blockIdx.y;
    const int seq = tile_seq[blockIdx.x];
    const int q0 = tile_q0[blockIdx.x];
    const int start = seq_start[seq];
    const int len = seq_len[seq];
    const int ntok = min(tq, len - q0);
    const int rows = tq * group;

    for (int i = threadIdx.x; i < rows_padded * D; i += blockDim.x) {
        const int r = i / D, d = i % D;
        const int tok = r / group, h = kvh * group + r % group;
        qs[r * S + d] = (r < rows && tok < ntok)
            ? to_f32(q[((size_t)h * total + start + q0 + tok) * D + d]) : 0.f;
    }

    // This thread's outputs: row `my_row`, dims my_lane + tpr * c.
    const int tpr = blockDim.x / rows_padded;
    const int my_row = threadIdx.x / tpr;
    const int my_lane = threadIdx.x % tpr;
    const int nacc = D / tpr;
    const int my_tok = my_row / group;
    const bool my_valid = my_row < rows && my_tok < ntok;
    float acc[PSA_MAX_ACC];
#pragma unroll
    for (int c = 0; c < PSA_MAX_ACC; ++c) acc[c] = 0.f;
    float m = -INFINITY, l = 0.f;

    const int first_seg = seq_seg_begin[seq], end_seg = seq_seg_begin[seq + 1];
    for (int src = first_seg; src <= end_seg; ++src) {
        const bool causal = src == end_seg;
        const T* kb;
        const T* vb;
        int klen;
        if (!causal) {
            kb = pk + ((size_t)kvh * ptotal + seg_off[src]) * D;
            vb = pv + ((size_t)kvh * ptotal + seg_off[src]) * D;
            klen = seg_len[src];
        } else {
            kb = k + ((size_t)kvh * total + start) * D;
            vb = v + ((size_t)kvh * total + start) * D;
            klen = q0 + ntok;  // later keys are masked for every token of the tile
        }
        for (int k0 = 0; k0 < klen; k0 += PSA_BK) {
            const int nk = min(PSA_BK, klen - k0);
            __syncthreads();  // the previous tile's K/V/scores are consumed (and Q is loaded)
            for (int i = threadIdx.x; i < PSA_BK * D; i += blockDim.x) {
                const int j = i / D, d = i % D;
                const bool in = j < nk;
                ks[j * S + d] = in ? to_f32(kb[(size_t)(k0 + j) * D + d]) : 0.f;
                vs[j * S + d] = in ? to_f32(vb[(size_t)(k0 + j) * D + d]) : 0.f;
            }
            __syncthreads();
            for (int p = threadIdx.x; p < rows_padded * PSA_BK; p += blockDim.x) {
                const int r = p / PSA_BK, j = p % PSA_BK;
                const int tok = r / group;
                const bool visible = r < rows && tok < ntok && j < nk
                    && (!causal || k0 + j <= q0 + tok);
                float s = -INFINITY;
                if (visible) {
                    const float* qr = qs + r * S;
                    const float* kr = ks + j * S;
                    float dot = 0.f;
                    for (int d = 0; d < D; ++d) dot = fmaf(qr[d], kr[d], dot);
                    s = dot * scale;
                }
                ss[p] = s;
            }
            __syncthreads();
            if (my_valid) {
                const float* sr = ss + my_row * PSA_BK;
                float tile_max = -INFINITY;
                for (int j = 0; j < nk; ++j) tile_max = fmaxf(tile_max, sr[j]);
                if (tile_max > -INFINITY) {
                    const float m_new = fmaxf(m, tile_max);
                    const float correction = __expf(m - m_new);  // m = -inf gives 0
                    l *= correction;
#pragma unroll
                    for (int c = 0; c < PSA_MAX_ACC; ++c) acc[c] *= correction;
                    for (int j = 0; j < nk; ++j) {
                        const float pj = __expf(sr[j] - m_new);  // masked: exp(-inf) = 0
                        l += pj;
                        const float* vr = vs + j * S + my_lane;
#pragma unroll
                        for (int c = 0; c < PSA_MAX_ACC; ++c)
                            if (c < nacc) acc[c] = fmaf(pj, vr[c * tpr], acc[c]);
                    }
                    m = m_new;
                }
            }
        }
    }
    if (my_valid) {
        const int h = kvh * group + my_row % group;
        T* o = out + ((size_t)h * total + start + q0 + my_tok) * D + my_lane;
        const float inv = 1.f / l;  // l > 0: every token sees at least itself
#pragma unroll
        for (int c = 0; c < PSA_MAX_ACC; ++c)
            if (c < nacc) o[c * tpr] = from_f32<T>(acc[c] * inv);
    }
}

#define PSA(NAME, T)                                                                   \
    extern "C" __global__ void __launch_bounds__(PSA_THREADS) NAME(                    \
        const T* q, const T* k, const T* v, const T* pk, const T* pv, T* out,           \
        const uint32_t* tile_seq, const uint32_t* tile_q0, const uint32_t* seq_start,   \
        const uint32_t* seq_len, const uint32_t* seq_seg_begin, const uint32_t* seg_off, \
        const uint32_t* seg_len, int total, int ptotal, int head_dim, int group, int tq, \
        int rows_padded, float scale) {                                                 \
        prefix_suffix_attention<T>(q, k, v, pk, pv, out, tile_seq, tile_q0, seq_start,  \
            seq_len, seq_seg_begin, seg_off, seg_len, total, ptotal, head_dim, group,   \
            tq, rows_padded, scale);                                                    \
    }
PSA(psa_f32, float)
PSA(psa_bf16, __nv_bfloat16)
PSA(psa_f16, __half)

// One block per hidden row; warp w computes the dot products of selected rows
// w, w + warps, ... of the head with it. Output (n, nrows) in f32.
template <typename T>
__device__ __forceinline__ void restricted_head(
    const T* __restrict__ hidden, const T* __restrict__ head,
    const uint32_t* __restrict__ rows, float* __restrict__ out, int width, int nrows)
{
    const T* x = hidden + (size_t)blockIdx.x * width;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int r = warp; r < nrows; r += warps) {
        const T* w = head + (size_t)rows[r] * width;
        float s = 0.f;
        for (int d = lane; d < width; d += 32) s = fmaf(to_f32(x[d]), to_f32(w[d]), s);
        for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
        if (lane == 0) out[(size_t)blockIdx.x * nrows + r] = s;
    }
}

#define RHEAD(NAME, T)                                                                \
    extern "C" __global__ void NAME(const T* hidden, const T* head, const uint32_t* rows, \
                                    float* out, int width, int nrows) {                 \
        restricted_head<T>(hidden, head, rows, out, width, nrows);                      \
    }
RHEAD(rhead_f32, float)
RHEAD(rhead_bf16, __nv_bfloat16)
RHEAD(rhead_f16, __half)
