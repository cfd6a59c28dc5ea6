// Runs the CUDA kernels of ../aisql_kernels.cu, compiled unchanged as host C++ over
// the shims in shim/ (one std::thread per CUDA thread, std::barrier for
// __syncthreads), against naive double-precision references, so the kernels are
// checked on machines without a GPU. The launch metadata and block shape are
// rebuilt here exactly as psa_plan and psa_shape in kernels/src/launch.rs build them.
//
//   g++ -std=c++20 -O1 -pthread -Ishim harness.cpp -o harness && ./harness [quick]
//
// kernels/src/cuda_tests.rs runs it in `cargo test`; run.sh adds ASan/UBSan and TSan.
#include "cuda_runtime_emu.h"
#ifndef KERNEL_SRC
#define KERNEL_SRC "../aisql_kernels.cu"
#endif
#include KERNEL_SRC

#include <map>
#include <optional>
#include <random>
#include <string>
#include <chrono>

// ---- conversions for the test side ----
template <class T> T to_t(float x);
template <> float to_t<float>(float x) { return x; }
template <> __nv_bfloat16 to_t<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __half to_t<__half>(float x) { return __float2half(x); }
template <class T> float to_fl(T x);
template <> float to_fl<float>(float x) { return x; }
template <> float to_fl<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> float to_fl<__half>(__half x) { return __half2float(x); }
template <class T> const char* tname();
template <> const char* tname<float>() { return "f32"; }
template <> const char* tname<__nv_bfloat16>() { return "bf16"; }
template <> const char* tname<__half>() { return "f16"; }

// ---- launch.rs psa_shape, replicated ----
struct PsaShape { int rows_padded, tokens, shared_bytes; };
std::optional<PsaShape> psa_shape(int head_dim, int group) {
    const int BK = 16, THREADS = 256, MAX_ACC = 32, LIMIT = 48 * 1024;
    for (int rp : {32, 16, 8, 4, 2, 1}) {
        int tpr = THREADS / rp, stride = head_dim + 1;
        int sb = 4 * (rp * stride + 2 * BK * stride + rp * BK);
        bool fits = group >= 1 && rp >= group && head_dim % tpr == 0 && head_dim / tpr <= MAX_ACC && sb <= LIMIT;
        if (fits) return PsaShape{rp, rp / group, sb};
    }
    return std::nullopt;
}

struct Seq { int len; std::vector<int> segs; };
struct Case {
    std::string name;
    int D, kvh, group;
    std::vector<int> seg_lens;     // distinct prefix segments (each its own (kvh,len,D) tensor)
    std::vector<Seq> seqs;         // packed in order
    std::vector<int> which;        // empty: all
    float qmul = 1.f;              // scales q (peakier softmax when > 1)
};

static std::mt19937_64 rng(12345);
static std::vector<float> randn(size_t n, float mul = 1.f) {
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng) * mul;
    return v;
}
template <class T> std::vector<T> quant(const std::vector<float>& f) {
    std::vector<T> r(f.size());
    for (size_t i = 0; i < f.size(); ++i) r[i] = to_t<T>(f[i]);
    return r;
}
template <class T> std::vector<float> dequant(const std::vector<T>& t) {
    std::vector<float> r(t.size());
    for (size_t i = 0; i < t.size(); ++i) r[i] = to_fl<T>(t[i]);
    return r;
}
// Exactly-sized heap copy (so ASan sees over-reads of each metadata array separately).
template <class T> T* heap(const std::vector<T>& v) {
    T* p = new T[v.size()];
    std::copy(v.begin(), v.end(), p);
    return p;
}

struct Result { double max_diff, max_other, max_ref; bool nan; int tiles, rp, tokens; };

template <class T>
Result run_psa(const Case& c) {
    const int D = c.D, kvh = c.kvh, group = c.group, H = kvh * group;
    auto shape = psa_shape(D, group);
    if (!shape) { fprintf(stderr, "no psa_shape for %d/%d\n", D, group); abort(); }
    int total = 0;
    std::vector<int> starts;
    for (auto& s : c.seqs) { starts.push_back(total); total += s.len; }
    const float scale = 1.f / std::sqrt((float)D);
    // inputs (quantized to T, reference uses the quantized values)
    auto q = quant<T>(randn((size_t)H * total * D, c.qmul));
    auto k = quant<T>(randn((size_t)kvh * total * D));
    auto v = quant<T>(randn((size_t)kvh * total * D));
    std::vector<std::vector<T>> segk, segv;
    for (int L : c.seg_lens) { segk.push_back(quant<T>(randn((size_t)kvh * L * D))); segv.push_back(quant<T>(randn((size_t)kvh * L * D))); }

    std::vector<int> which = c.which;
    if (which.empty()) for (int i = 0; i < (int)c.seqs.size(); ++i) which.push_back(i);

    // ---- metadata exactly as launch.rs psa_plan builds it ----
    std::map<int, int> seg_index;  // tensor identity -> distinct index
    std::vector<int> dseg;         // distinct index -> segment id
    std::vector<uint32_t> seg_off, seg_len, seq_seg_begin{0}, seq_segs;
    int ptotal = 0;
    for (int i : which) {
        for (int s : c.seqs[i].segs) {
            auto it = seg_index.find(s);
            int id;
            if (it == seg_index.end()) {
                id = seg_off.size();
                seg_index[s] = id;
                dseg.push_back(s);
                seg_off.push_back(ptotal);
                seg_len.push_back(c.seg_lens[s]);
                ptotal += c.seg_lens[s];
            } else id = it->second;
            seq_segs.push_back(id);
        }
        seq_seg_begin.push_back(seq_segs.size());
    }
    std::vector<T> pk, pv;  // cat along dim 1 of (kvh, len, D)
    if (dseg.empty()) { pk.assign(D, to_t<T>(0.f)); pv = pk; }
    else {
        pk.resize((size_t)kvh * ptotal * D); pv.resize(pk.size());
        for (int h = 0; h < kvh; ++h)
            for (size_t di = 0; di < dseg.size(); ++di) {
                int s = dseg[di], L = c.seg_lens[s];
                for (int t = 0; t < L; ++t)
                    for (int d = 0; d < D; ++d) {
                        size_t dst = ((size_t)h * ptotal + seg_off[di] + t) * D + d;
                        size_t src = ((size_t)h * L + t) * D + d;
                        pk[dst] = segk[s][src]; pv[dst] = segv[s][src];
                    }
            }
    }
    std::vector<uint32_t> seg_off_of, seg_len_of;
    for (auto s : seq_segs) { seg_off_of.push_back(seg_off[s]); seg_len_of.push_back(seg_len[s]); }
    std::vector<uint32_t> tile_seq, tile_q0, seq_start, seq_len;
    for (size_t local = 0; local < which.size(); ++local) {
        auto& s = c.seqs[which[local]];
        seq_start.push_back(starts[which[local]]);
        seq_len.push_back(s.len);
        for (int q0 = 0; q0 < s.len; q0 += shape->tokens) { tile_seq.push_back(local); tile_q0.push_back(q0); }
    }

    // ---- emulated launch ----
    T* dq = heap(q); T* dk = heap(k); T* dv = heap(v); T* dpk = heap(pk); T* dpv = heap(pv);
    std::vector<T> out0((size_t)H * total * D, to_t<T>(0.f));
    T* dout = heap(out0);
    uint32_t *m_ts = heap(tile_seq), *m_tq = heap(tile_q0), *m_ss = heap(seq_start), *m_sl = heap(seq_len),
             *m_sb = heap(seq_seg_begin), *m_so = heap(seg_off_of), *m_sg = heap(seg_len_of);
    auto fn = std::is_same_v<T, float> ? (void*)&psa_f32 : std::is_same_v<T, __nv_bfloat16> ? (void*)&psa_bf16 : (void*)&psa_f16;
    using F = void (*)(const T*, const T*, const T*, const T*, const T*, T*, const uint32_t*, const uint32_t*,
                       const uint32_t*, const uint32_t*, const uint32_t*, const uint32_t*, const uint32_t*,
                       int, int, int, int, int, int, float);
    F kern = (F)fn;
    if (!tile_seq.empty())
        emu_launch(dim3{(unsigned)tile_seq.size(), (unsigned)kvh, 1}, dim3{256, 1, 1}, shape->shared_bytes, [&] {
            kern(dq, dk, dv, dpk, dpv, dout, m_ts, m_tq, m_ss, m_sl, m_sb, m_so, m_sg, total, ptotal, D, group,
                 shape->tokens, shape->rows_padded, scale);
        });
    std::vector<float> out(H * (size_t)total * D);
    for (size_t i = 0; i < out.size(); ++i) out[i] = to_fl<T>(dout[i]);

    // ---- naive reference (double accumulation) ----
    auto qf = dequant(q), kf = dequant(k), vf = dequant(v);
    std::vector<std::vector<float>> skf, svf;
    for (size_t s = 0; s < segk.size(); ++s) { skf.push_back(dequant(segk[s])); svf.push_back(dequant(segv[s])); }
    std::vector<char> in_which(c.seqs.size(), 0);
    for (int i : which) in_which[i] = 1;
    Result r{0, 0, 0, false, (int)tile_seq.size(), shape->rows_padded, shape->tokens};
    for (size_t i = 0; i < out.size(); ++i) if (std::isnan(out[i]) || std::isinf(out[i])) r.nan = true;
    for (size_t si = 0; si < c.seqs.size(); ++si) {
        auto& s = c.seqs[si];
        for (int h = 0; h < H; ++h) {
            int g = h / group;
            for (int t = 0; t < s.len; ++t) {
                const float* qr = &qf[((size_t)h * total + starts[si] + t) * D];
                const float* o = &out[((size_t)h * total + starts[si] + t) * D];
                if (!in_which[si]) {
                    for (int d = 0; d < D; ++d) r.max_other = std::max(r.max_other, (double)std::fabs(o[d]));
                    continue;
                }
                std::vector<const float*> ks, vs;
                for (int sg : s.segs)
                    for (int j = 0; j < c.seg_lens[sg]; ++j) {
                        ks.push_back(&skf[sg][((size_t)g * c.seg_lens[sg] + j) * D]);
                        vs.push_back(&svf[sg][((size_t)g * c.seg_lens[sg] + j) * D]);
                    }
                for (int j = 0; j <= t; ++j) {
                    ks.push_back(&kf[((size_t)g * total + starts[si] + j) * D]);
                    vs.push_back(&vf[((size_t)g * total + starts[si] + j) * D]);
                }
                std::vector<double> sc(ks.size());
                double mx = -1e300;
                for (size_t j = 0; j < ks.size(); ++j) {
                    double dot = 0;
                    for (int d = 0; d < D; ++d) dot += (double)qr[d] * ks[j][d];
                    sc[j] = dot * scale;
                    mx = std::max(mx, sc[j]);
                }
                double l = 0;
                for (auto& x : sc) { x = std::exp(x - mx); l += x; }
                for (int d = 0; d < D; ++d) {
                    double acc = 0;
                    for (size_t j = 0; j < ks.size(); ++j) acc += sc[j] * vs[j][d];
                    acc /= l;
                    r.max_ref = std::max(r.max_ref, std::fabs(acc));
                    double diff = std::fabs(acc - o[d]);
                    if (std::isnan(o[d])) diff = INFINITY;
                    r.max_diff = std::max(r.max_diff, diff);
                }
            }
        }
    }
    delete[] dq; delete[] dk; delete[] dv; delete[] dpk; delete[] dpv; delete[] dout;
    delete[] m_ts; delete[] m_tq; delete[] m_ss; delete[] m_sl; delete[] m_sb; delete[] m_so; delete[] m_sg;
    return r;
}

template <class T>
double run_rhead(int n, int width, int vocab, std::vector<uint32_t> rows) {
    auto hid = quant<T>(randn((size_t)n * width));
    auto head = quant<T>(randn((size_t)vocab * width));
    T* dh = heap(hid); T* dw = heap(head); uint32_t* dr = heap(rows);
    std::vector<float> o0((size_t)n * rows.size(), 0.f);
    float* dout = heap(o0);
    using F = void (*)(const T*, const T*, const uint32_t*, float*, int, int);
    F kern = std::is_same_v<T, float> ? (F)(void*)&rhead_f32 : std::is_same_v<T, __nv_bfloat16> ? (F)(void*)&rhead_bf16 : (F)(void*)&rhead_f16;
    emu_launch(dim3{(unsigned)n, 1, 1}, dim3{256, 1, 1}, 0, [&] { kern(dh, dw, dr, dout, width, (int)rows.size()); });
    double md = 0;
    for (int i = 0; i < n; ++i)
        for (size_t r = 0; r < rows.size(); ++r) {
            double acc = 0;
            for (int d = 0; d < width; ++d) acc += (double)to_fl<T>(hid[(size_t)i * width + d]) * to_fl<T>(head[(size_t)rows[r] * width + d]);
            double diff = std::fabs(acc - dout[i * rows.size() + r]);
            if (std::isnan(dout[i * rows.size() + r])) diff = INFINITY;
            md = std::max(md, diff);
        }
    delete[] dh; delete[] dw; delete[] dr; delete[] dout;
    return md;
}

int main(int argc, char** argv) {
    bool quick = argc > 1 && std::string(argv[1]) == "quick";
    int failures = 0;
    auto t0 = std::chrono::steady_clock::now();
    // Segments: 0:37  1:5  2:16  3:300  4:0 (empty segment tensor)
    std::vector<int> seg_lens = {37, 5, 16, 300, 0};
    std::vector<Seq> mix = {
        {1, {}}, {3, {0}}, {3, {0}}, {15, {0, 1}}, {17, {2}}, {40, {}},
        {17, {0, 1}}, {40, {3}}, {3, {3, 1}}, {1, {1}}, {15, {4, 2}},
    };
    std::vector<Seq> light = {  // no 300-token prefix: cheaper, for the many-shape sweep
        {1, {}}, {3, {0}}, {3, {0}}, {15, {0, 1}}, {17, {2}}, {40, {}}, {17, {0, 1}}, {1, {1}}, {15, {4, 2}},
    };
    std::vector<Case> cases;
    for (int D : {16, 64, 128})
        for (int g : {1, 2, 4, 5})
            cases.push_back({"light D" + std::to_string(D) + " g" + std::to_string(g), D, 2, g, seg_lens, light, {}});
    cases.push_back({"mix(300-prefix) D128 g4 kvh2", 128, 2, 4, seg_lens, mix, {}});
    cases.push_back({"mix(300-prefix) D64 g5 kvh1", 64, 1, 5, seg_lens, mix, {}});
    cases.push_back({"mix D16 g1 kvh3", 16, 3, 1, seg_lens, mix, {}});
    cases.push_back({"subset which={1,3,7,10} D64 g4", 64, 2, 4, seg_lens, mix, {1, 3, 7, 10}});
    cases.push_back({"subset which={5} (no prefix) D128 g2", 128, 1, 2, seg_lens, mix, {5}});
    cases.push_back({"subset which={2,8} D16 g5", 16, 2, 5, seg_lens, mix, {2, 8}});
    cases.push_back({"peaky q*8 D64 g4", 64, 1, 4, seg_lens, light, {}, 8.f});
    cases.push_back({"D256 g8 (rp8,tok1)", 256, 1, 8, seg_lens, {{3, {0}}, {17, {1, 2}}, {1, {}}}, {}});
    cases.push_back({"D256 g1 (rp8,tok8)", 256, 1, 1, seg_lens, {{3, {0}}, {17, {1, 2}}, {1, {}}}, {}});
    cases.push_back({"D32 g3 (tok10)", 32, 2, 3, seg_lens, light, {}});
    cases.push_back({"D8 g1", 8, 1, 1, seg_lens, light, {}});
    cases.push_back({"D128 g16 (rp32 tok2)", 128, 1, 16, seg_lens, {{3, {0}}, {17, {1, 2}}, {1, {}}}, {}});
    cases.push_back({"long suffix 70 D64 g2", 64, 1, 2, seg_lens, {{70, {0}}, {33, {}}}, {}});
    cases.push_back({"zero-length suffixes mixed in D64 g4", 64, 2, 4, seg_lens,
                     {{0, {0}}, {3, {0}}, {0, {}}, {17, {0, 1}}, {0, {3}}}, {}});
    cases.push_back({"which only zero-length seqs (no launch)", 64, 1, 4, seg_lens, {{0, {0}}, {5, {1}}, {0, {}}}, {0, 2}});
    cases.push_back({"which in reverse order {7,4,1} D128 g5", 128, 1, 5, seg_lens, mix, {7, 4, 1}});
    cases.push_back({"same segment twice [0,0] D64 g2", 64, 1, 2, seg_lens, {{17, {0, 0}}, {3, {1, 0, 1}}}, {}});
    if (quick) cases.resize(3);

    auto report = [&](const char* t, const Case& c, Result r, double tol) {
        bool ok = !r.nan && r.max_diff <= tol && r.max_other == 0;
        if (!ok) ++failures;
        printf("%-5s %-40s rp=%2d tok=%2d tiles=%3d  max|diff|=%.3e (max|ref|=%.2f)  other-rows max=%g  %s%s\n", t,
               c.name.c_str(), r.rp, r.tokens, r.tiles, r.max_diff, r.max_ref, r.max_other, r.nan ? "NaN/Inf! " : "",
               ok ? "OK" : "FAIL");
        fflush(stdout);
    };
    for (auto& c : cases) report("f32", c, run_psa<float>(c), 1e-4);
    if (!quick) {
        for (int i : {1, 8, 10, 13}) {  // light D16 g2, D128 g1, D128 g4 and the 300-prefix mix D64 g5
            report("bf16", cases[i], run_psa<__nv_bfloat16>(cases[i]), 3e-2);
            report("f16", cases[i], run_psa<__half>(cases[i]), 5e-3);
        }
    }
    std::vector<std::pair<int, std::vector<uint32_t>>> rh = {
        {96, {3, 999, 0, 512, 7, 8, 100, 640, 41}}, {96, {1, 2, 3, 4, 5, 6, 7, 8}},
        {1024, {3, 999, 0, 512, 7, 8, 100, 640, 41}}, {1024, {10, 20, 30, 40, 50, 60, 70, 999}}, {33, {5}}};
    for (auto& [w, rows] : rh) {
        double d = run_rhead<float>(5, w, 1000, rows);
        bool ok = d <= 1e-3 * std::sqrt((double)w);
        if (!ok) ++failures;
        printf("f32   rhead width=%4d nrows=%zu                      max|diff|=%.3e %s\n", w, rows.size(), d, ok ? "OK" : "FAIL");
        if (!quick) {
            double db = run_rhead<__nv_bfloat16>(5, w, 1000, rows);
            bool okb = db <= 1e-3 * std::sqrt((double)w);  // inputs exact in bf16, f32 accumulation
            if (!okb) ++failures;
            printf("bf16  rhead width=%4d nrows=%zu                      max|diff|=%.3e %s\n", w, rows.size(), db, okb ? "OK" : "FAIL");
        }
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("shared-memory overruns: %ld; failures: %d; %.1fs\n", g_smem_overruns, failures, secs);
    return failures || g_smem_overruns ? 1 : 0;
}
