// meridian-kernels: per-row softmax entropy, top-k entropy bound and EAT update.
//
// Compiled at run time by NVRTC (src/cuda/module.rs) for the device's own sm_XY; needs no
// headers. One block of BLOCK threads per row; each thread streams its share of the row
// once (16-byte loads with the evict-first hint), keeping an online state: a reference m
// (a running maximum with SLACK nats of slack), f32 sums of e = 2^((x - m) c) and e (x - m)
// flushed into float64 every FLUSH_EVERY vectors, rescaled in float64 when m moves. The
// block then merges the threads' states in float64. This mirrors src/cpu/avx2.rs, and the
// float64 definitions are meridian_core::signals (entropy_from_logits,
// entropy_from_top_logprobs, Eat::update); tests/gpu.rs checks agreement to 1e-5.

#define BLOCK 512
#define WARPS (BLOCK / 32)
#define FLUSH_EVERY 8
#define UNROLL 4  // 16-byte loads each thread has in flight before it does arithmetic
#define MAX_K 32

typedef unsigned long long u64;
typedef unsigned int u32;

// Must match ExpParams (src/params.rs): #[repr(C)] f32 x4 then f64.
struct Params {
    float c_hi, c_lo, dmin, slack;
    double inv_t;
};

__device__ __forceinline__ float f32_inf() { return __int_as_float(0x7f800000); }
__device__ __forceinline__ double f64_inf() { return __longlong_as_double(0x7ff0000000000000LL); }
__device__ __forceinline__ double f64_nan() { return __longlong_as_double(0x7ff8000000000000LL); }

// 16 bytes, read once: streaming (evict-first) global load.
__device__ __forceinline__ void ld16(const unsigned char* p, u32& a, u32& b, u32& c, u32& d) {
    asm("ld.global.cs.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "l"(p));
}

__device__ __forceinline__ float f16_to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

template <int DT> struct Elt;

template <> struct Elt<0> {  // float32
    static constexpr int ESZ = 4;
    static constexpr int VEC = 4;
    __device__ static __forceinline__ float one(const unsigned char* p) { return *(const float*)p; }
    __device__ static __forceinline__ void vec(const unsigned char* p, float* v) {
        u32 w[4];
        ld16(p, w[0], w[1], w[2], w[3]);
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = __uint_as_float(w[i]);
    }
};

template <> struct Elt<1> {  // bfloat16: the high half of a float32
    static constexpr int ESZ = 2;
    static constexpr int VEC = 8;
    __device__ static __forceinline__ float one(const unsigned char* p) {
        u32 bits = *(const unsigned short*)p;
        return __uint_as_float(bits << 16);
    }
    __device__ static __forceinline__ void vec(const unsigned char* p, float* v) {
        u32 w[4];
        ld16(p, w[0], w[1], w[2], w[3]);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            v[2 * i] = __uint_as_float(w[i] << 16);
            v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    }
};

template <> struct Elt<2> {  // float16
    static constexpr int ESZ = 2;
    static constexpr int VEC = 8;
    __device__ static __forceinline__ float one(const unsigned char* p) {
        return f16_to_f32(*(const unsigned short*)p);
    }
    __device__ static __forceinline__ void vec(const unsigned char* p, float* v) {
        u32 w[4];
        ld16(p, w[0], w[1], w[2], w[3]);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            v[2 * i] = f16_to_f32((unsigned short)(w[i] & 0xffffu));
            v[2 * i + 1] = f16_to_f32((unsigned short)(w[i] >> 16));
        }
    }
};

// One thread's online state, in raw logit units (d = x - m; exp uses d * c).
struct Acc {
    float m, mth, z, s;
    double z64, s64;
    int n;
};

// A thread's k largest values, descending; thr is what a value must beat.
struct Top {
    float v[MAX_K];
    int len, k;
    float thr;
};

__device__ __forceinline__ void flush(Acc& a) {
    a.z64 += (double)a.z;
    a.s64 += (double)a.s;
    a.z = 0.0f;
    a.s = 0.0f;
    a.n = 0;
}

// Moves the reference up to m2, rescaling the float64 sums exactly. Rare (cold), so
// out of line; by value so the hot state stays in registers.
__device__ __noinline__ Acc rebase(Acc a, float m2, float slack, double inv_t) {
    flush(a);
    if (a.m == -f32_inf()) {
        a.z64 = 0.0;  // only dmin stand-ins were summed under a -inf reference
        a.s64 = 0.0;
    } else {
        double shift = (double)a.m - (double)m2;
        double sc = exp(shift * inv_t);
        a.s64 = sc * (a.s64 + shift * a.z64);
        a.z64 *= sc;
    }
    a.m = m2;
    a.mth = m2 + slack;
    return a;
}

__device__ __noinline__ void offer(Top& t, float x) {
    int j = (t.len < t.k) ? t.len++ : t.k - 1;
    while (j > 0 && t.v[j - 1] < x) {
        t.v[j] = t.v[j - 1];
        --j;
    }
    t.v[j] = x;
    t.thr = (t.len < t.k) ? -f32_inf() : t.v[t.k - 1];
}

template <int N, bool TOPK>
__device__ __forceinline__ void take(Acc& a, Top& t, const float* v, const Params& p) {
    float vmax = v[0];
#pragma unroll
    for (int i = 1; i < N; ++i) vmax = fmaxf(vmax, v[i]);  // fmaxf ignores NaN
    if (vmax > a.mth) a = rebase(a, vmax, p.slack, p.inv_t);  // false for NaN and -inf
#pragma unroll
    for (int i = 0; i < N; ++i) {
        if (TOPK && v[i] > t.thr) offer(t, v[i]);
        float d = fmaxf(v[i] - a.m, p.dmin);  // NaN and -inf become dmin
        float e = exp2f(fmaf(d, p.c_hi, d * p.c_lo));
        a.z += e;
        a.s = fmaf(e, d, a.s);
    }
    if (++a.n == FLUSH_EVERY) flush(a);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Streams one row of n elements through this thread's state.
template <int DT, bool TOPK>
__device__ __forceinline__ void stream_row(const unsigned char* row, long long n, const Params& p, Acc& a,
                                           Top& t) {
    typedef Elt<DT> E;
    // Elements before the first 16-byte boundary (the host checks ESZ alignment).
    long long head = (long long)(((16u - (u32)((u64)row & 15u)) & 15u) / E::ESZ);
    if (head > n) head = n;
    const long long nvec = (n - head) / E::VEC;
    const long long tail = head + nvec * E::VEC;
    for (long long i = threadIdx.x; i < head; i += BLOCK) {
        float v = E::one(row + i * E::ESZ);
        take<1, TOPK>(a, t, &v, p);
    }
    const unsigned char* body = row + head * E::ESZ;
    long long i = threadIdx.x;
    // UNROLL loads in flight per thread before any arithmetic.
    for (; i + (UNROLL - 1) * BLOCK < nvec; i += UNROLL * BLOCK) {
        float v[UNROLL][E::VEC];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) E::vec(body + (i + u * BLOCK) * 16, v[u]);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) take<E::VEC, TOPK>(a, t, v[u], p);
    }
    for (; i < nvec; i += BLOCK) {
        float v[E::VEC];
        E::vec(body + i * 16, v);
        take<E::VEC, TOPK>(a, t, v, p);
    }
    for (long long j = tail + threadIdx.x; j < n; j += BLOCK) {
        float v = E::one(row + j * E::ESZ);
        take<1, TOPK>(a, t, &v, p);
    }
    flush(a);
}

struct RowResult {
    float max;   // the row maximum (raw), +inf / -inf for degenerate rows
    double z;    // sum e^{(x - max)/T}
    double s;    // sum e^{(x - max)/T} (x - max), raw units
};

// Merges every thread's state; the result is valid in thread 0.
__device__ __forceinline__ RowResult merge_block(const Acc& a, const Params& p) {
    __shared__ float sm_max[WARPS];
    __shared__ double sm_z[WARPS], sm_s[WARPS];
    __shared__ float sm_m;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float wm = warp_max(a.m);
    if (lane == 0) sm_max[w] = wm;
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = sm_max[0];
        for (int i = 1; i < WARPS; ++i) m = fmaxf(m, sm_max[i]);
        sm_m = m;
    }
    __syncthreads();
    const float M = sm_m;
    double z = 0.0, s = 0.0;
    if (a.m != -f32_inf() && M != f32_inf()) {
        double shift = (double)a.m - (double)M;
        double sc = exp(shift * p.inv_t);
        z = a.z64 * sc;
        s = sc * (a.s64 + shift * a.z64);
    }
    z = warp_sum(z);
    s = warp_sum(s);
    if (lane == 0) {
        sm_z[w] = z;
        sm_s[w] = s;
    }
    __syncthreads();
    RowResult r;
    r.max = M;
    r.z = 0.0;
    r.s = 0.0;
    if (threadIdx.x == 0) {
        for (int i = 0; i < WARPS; ++i) {
            r.z += sm_z[i];
            r.s += sm_s[i];
        }
    }
    return r;
}

__device__ __forceinline__ void init(Acc& a, Top& t, int k) {
    a.m = -f32_inf();
    a.mth = -f32_inf();
    a.z = a.s = 0.0f;
    a.z64 = a.s64 = 0.0;
    a.n = 0;
    t.len = 0;
    t.k = k;
    t.thr = (k > 0) ? -f32_inf() : f32_inf();
}

template <int DT>
__device__ __forceinline__ void entropy_row(const unsigned char* x, long long vocab, Params p, float* out) {
    Acc a;
    Top t;
    init(a, t, 0);
    const unsigned char* row = x + (u64)blockIdx.x * (u64)vocab * Elt<DT>::ESZ;
    stream_row<DT, false>(row, vocab, p, a, t);
    RowResult r = merge_block(a, p);
    if (threadIdx.x == 0) {
        double h = 0.0;  // +inf, empty and all -inf/NaN rows: 0, as in meridian-core
        if (r.max != f32_inf() && r.max != -f32_inf() && r.z > 0.0) h = fmax(log(r.z) - r.s * p.inv_t / r.z, 0.0);
        out[blockIdx.x] = (float)h;
    }
}

__device__ __forceinline__ bool is_fin(double v) { return v == v && v != f64_inf() && v != -f64_inf(); }

template <int DT>
__device__ __forceinline__ void topk_row(const unsigned char* x, long long vocab, Params p, float* out, int k) {
    Acc a;
    Top t;
    init(a, t, k);
    const unsigned char* row = x + (u64)blockIdx.x * (u64)vocab * Elt<DT>::ESZ;
    stream_row<DT, true>(row, vocab, p, a, t);
    RowResult r = merge_block(a, p);

    // k rounds of a block argmax over each thread's next unused value.
    __shared__ float sm_v[WARPS], sm_top[MAX_K];
    __shared__ int sm_i[WARPS], sm_win;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int next = 0;
    for (int round = 0; round < k; ++round) {
        float cand = (next < t.len) ? t.v[next] : -f32_inf();
        int who = threadIdx.x;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, cand, o);
            int ow = __shfl_xor_sync(0xffffffffu, who, o);
            if (ov > cand || (ov == cand && ow < who)) {
                cand = ov;
                who = ow;
            }
        }
        if (lane == 0) {
            sm_v[w] = cand;
            sm_i[w] = who;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            float bv = sm_v[0];
            int bi = sm_i[0];
            for (int i = 1; i < WARPS; ++i)
                if (sm_v[i] > bv || (sm_v[i] == bv && sm_i[i] < bi)) {
                    bv = sm_v[i];
                    bi = sm_i[i];
                }
            sm_top[round] = bv;
            sm_win = bi;
        }
        __syncthreads();
        if (threadIdx.x == sm_win) ++next;
    }
    if (threadIdx.x != 0) return;
    // log p_i = (x_i - max)/T - log Z, then entropy_from_top_logprobs (meridian-core), in
    // float64. Not x_i/T - (max/T + log Z): for |x| ~ 1e30 that cancels every digit.
    double lz = (r.max == f32_inf()) ? f64_nan() : log(r.z);
    double s = 0.0, total = 0.0, pmin = 1.0;
    int kk = 0;
    for (int i = 0; i < k; ++i) {
        double l = ((double)sm_top[i] - (double)r.max) * p.inv_t - lz;
        if (!is_fin(l)) continue;
        double pr = exp(l);
        if (pr > 0.0) s -= pr * log(pr);
        total += pr;
        pmin = fmin(pmin, pr);
        ++kk;
    }
    double res = fmax(1.0 - total, 0.0);
    double lower = s, upper = s;
    if (!(res <= 1e-12 || kk == 0 || vocab <= kk)) {
        lower = s + res * log(1.0 / fmax(pmin, 1e-300));
        upper = fmax(s + res * log((double)(vocab - kk) / res), lower);
    }
    float* o = out + 4 * (u64)blockIdx.x;
    o[0] = (float)s;
    o[1] = (float)lower;
    o[2] = (float)upper;
    o[3] = (float)res;
}

#define ENTRY(NAME, DT)                                                                              \
    extern "C" __global__ void __launch_bounds__(BLOCK)                                              \
        mk_entropy_##NAME(const unsigned char* x, long long vocab, Params p, float* out) {           \
        entropy_row<DT>(x, vocab, p, out);                                                           \
    }                                                                                                \
    extern "C" __global__ void __launch_bounds__(BLOCK)                                              \
        mk_topk_##NAME(const unsigned char* x, long long vocab, Params p, float* out, int k) {       \
        topk_row<DT>(x, vocab, p, out, k);                                                           \
    }

ENTRY(f32, 0)
ENTRY(bf16, 1)
ENTRY(f16, 2)

// One EAT step per active row: meridian_core::signals::Eat::update, operation for
// operation (no FMA contraction, so the results are bit-identical to the CPU's).
extern "C" __global__ void mk_eat_update(const float* x, const unsigned char* active, double* ema, double* var,
                                         u32* steps, unsigned char* stop, int batch, double alpha, double delta,
                                         u32 warmup) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= batch || (active != 0 && active[i] == 0)) return;
    double xv = (double)x[i], m = ema[i], v = var[i];
    u32 n = steps[i];
    double b = __dadd_rn(1.0, -alpha);
    if (n == 0) {
        m = xv;
    } else {
        m = __dadd_rn(__dmul_rn(alpha, xv), __dmul_rn(b, m));
        double d = __dadd_rn(xv, -m);
        v = __dadd_rn(__dmul_rn(alpha, __dmul_rn(d, d)), __dmul_rn(b, v));
    }
    n = (n == 0xffffffffu) ? n : n + 1;
    ema[i] = m;
    var[i] = v;
    steps[i] = n;
    stop[i] = (n > warmup && v < delta) ? 1 : 0;
}
