// Weight formats on the GPU: every GGUF block format as "eight consecutive weights of a row,
// as floats", so that one product kernel serves them all. Weights stay in the file's bytes;
// the layouts are described in crates/kernels/src/formats, whose scalar code these mirror.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

#define NEG_INF (__int_as_float(0xff800000))

// The GGML type ids (crates/gguf's GgmlType).
#define T_F32 0
#define T_F16 1
#define T_Q4_0 2
#define T_Q4_1 3
#define T_Q5_0 6
#define T_Q5_1 7
#define T_Q8_0 8
#define T_Q2_K 10
#define T_Q3_K 11
#define T_Q4_K 12
#define T_Q5_K 13
#define T_Q6_K 14
#define T_BF16 30
#define T_TQ1_0 34
#define T_TQ2_0 35
#define T_Q1_0 41
#define T_Q2_0 42

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// Every block starts at an even offset (all block sizes are even), so halves load directly.
__device__ __forceinline__ float half_at(const u8* p) { return h2f(*(const u16*)p); }

__device__ __forceinline__ u32 u32_at(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

// Scale and min of sub-block j (0..8) of Q4_K/Q5_K's 12 packed bytes.
__device__ __forceinline__ void scale_min_k4(int j, const u8* q, float* sc, float* mn) {
    if (j < 4) {
        *sc = (float)(q[j] & 63);
        *mn = (float)(q[j + 4] & 63);
    } else {
        *sc = (float)((q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4));
        *mn = (float)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

__device__ __forceinline__ int tq1_trit(u8 byte, int n) {
    const u8 pow3[5] = {1, 3, 9, 27, 81};
    u8 q = (u8)(byte * pow3[n]);
    return ((int)q * 3) >> 8;
}

// w[0..8] = weights j .. j+8 of the row at `row` (j a multiple of 8).
template <int T> __device__ __forceinline__ void dq8(const u8* __restrict__ row, int j, float* w);

template <> __device__ __forceinline__ void dq8<T_F32>(const u8* __restrict__ row, int j, float* w) {
    const float4* p = (const float4*)(row + 4 * (i64)j);
    float4 a = p[0], b = p[1];
    w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
    w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
}

template <> __device__ __forceinline__ void dq8<T_F16>(const u8* __restrict__ row, int j, float* w) {
    uint4 v = *(const uint4*)(row + 2 * (i64)j);
    u32 x[4] = {v.x, v.y, v.z, v.w};
    for (int i = 0; i < 4; i++) {
        w[2 * i] = h2f((u16)(x[i] & 0xffff));
        w[2 * i + 1] = h2f((u16)(x[i] >> 16));
    }
}

template <> __device__ __forceinline__ void dq8<T_BF16>(const u8* __restrict__ row, int j, float* w) {
    uint4 v = *(const uint4*)(row + 2 * (i64)j);
    u32 x[4] = {v.x, v.y, v.z, v.w};
    for (int i = 0; i < 4; i++) {
        w[2 * i] = __uint_as_float(x[i] << 16);
        w[2 * i + 1] = __uint_as_float(x[i] & 0xffff0000u);
    }
}

template <> __device__ __forceinline__ void dq8<T_Q4_0>(const u8* __restrict__ row, int j, float* w) {
    const u8* b = row + (j / 32) * 18;
    int o = j % 32;
    float d = half_at(b);
    const u8* qs = b + 2 + (o & 15);
    for (int i = 0; i < 8; i++) w[i] = (float)((o < 16 ? (qs[i] & 15) : (qs[i] >> 4)) - 8) * d;
}

template <> __device__ __forceinline__ void dq8<T_Q4_1>(const u8* __restrict__ row, int j, float* w) {
    const u8* b = row + (j / 32) * 20;
    int o = j % 32;
    float d = half_at(b), m = half_at(b + 2);
    const u8* qs = b + 4 + (o & 15);
    for (int i = 0; i < 8; i++) w[i] = (float)(o < 16 ? (qs[i] & 15) : (qs[i] >> 4)) * d + m;
}

// Q4_1 and Q5_1 without their minimum (ids of our own): llama.cpp adds each block's min times
// the activations' rounded sum, so the products that match it do the same.
#define T_Q4_1_NOMIN 1003
#define T_Q5_1_NOMIN 1007

template <> __device__ __forceinline__ void dq8<T_Q4_1_NOMIN>(const u8* __restrict__ row, int j, float* w) {
    const u8* b = row + (j / 32) * 20;
    int o = j % 32;
    float d = half_at(b);
    const u8* qs = b + 4 + (o & 15);
    for (int i = 0; i < 8; i++) w[i] = (float)(o < 16 ? (qs[i] & 15) : (qs[i] >> 4)) * d;
}

template <> __device__ __forceinline__ void dq8<T_Q5_0>(const u8* __restrict__ row, int j, float* w) {
    const u8* b = row + (j / 32) * 22;
    int o = j % 32;
    float d = half_at(b);
    u32 qh = u32_at(b + 2);
    const u8* qs = b + 6 + (o & 15);
    for (int i = 0; i < 8; i++) {
        int nib = o < 16 ? (qs[i] & 15) : (qs[i] >> 4);
        int h = (qh >> (o + i)) & 1;
        w[i] = (float)((nib | (h << 4)) - 16) * d;
    }
}

template <> __device__ __forceinline__ void dq8<T_Q5_1>(const u8* __restrict__ row, int j, float* w) {
    const u8* b = row + (j / 32) * 24;
    int o = j % 32;
    float d = half_at(b), m = half_at(b + 2);
    u32 qh = u32_at(b + 4);
    const u8* qs = b + 8 + (o & 15);
    for (int i = 0; i < 8; i++) {
        int nib = o < 16 ? (qs[i] & 15) : (qs[i] >> 4);
        int h = (qh >> (o + i)) & 1;
        w[i] = (float)(nib | (h << 4)) * d + m;
    }
}

template <> __device__ __forceinline__ void dq8<T_Q5_1_NOMIN>(const u8* __restrict__ row, int j, float* w) {
    const u8* b = row + (j / 32) * 24;
    int o = j % 32;
    float d = half_at(b);
    u32 qh = u32_at(b + 4);
    const u8* qs = b + 8 + (o & 15);
    for (int i = 0; i < 8; i++) {
        int nib = o < 16 ? (qs[i] & 15) : (qs[i] >> 4);
        int h = (qh >> (o + i)) & 1;
        w[i] = (float)(nib | (h << 4)) * d;
    }
}

template <> __device__ __forceinline__ void dq8<T_Q8_0>(const u8* __restrict__ row, int j, float* w) {
    const u8* b = row + (j / 32) * 34;
    float d = half_at(b);
    const i8* qs = (const i8*)(b + 2 + j % 32);
    for (int i = 0; i < 8; i++) w[i] = (float)qs[i] * d;
}

template <> __device__ __forceinline__ void dq8<T_Q2_K>(const u8* __restrict__ row, int j, float* w) {
    const u8* b = row + (j / 256) * 84;
    int k = j % 256, c = k / 128, r = k % 128, s = r / 32, hi = (r % 32) / 16, l = r % 16;
    u8 sc = b[c * 8 + s * 2 + hi];
    float d = half_at(b + 80), dmin = half_at(b + 82);
    float dl = d * (float)(sc & 15), ml = dmin * (float)(sc >> 4);
    const u8* q = b + 16 + 32 * c + 16 * hi + l;
    for (int i = 0; i < 8; i++) w[i] = dl * (float)((q[i] >> (2 * s)) & 3) - ml;
}

template <> __device__ __forceinline__ void dq8<T_Q3_K>(const u8* __restrict__ row, int j, float* w) {
    const u8* b = row + (j / 256) * 110;
    int k = j % 256, c = k / 128, r = k % 128, s = r / 32, hi = (r % 32) / 16, l = r % 16;
    int is = c * 8 + s * 2 + hi;
    const u8* packed = b + 96;
    int low = is < 8 ? (packed[is] & 15) : (packed[is - 8] >> 4);
    int high = (packed[8 + is % 4] >> (2 * (is / 4))) & 3;
    float dl = half_at(b + 108) * (float)((low | (high << 4)) - 32);
    u8 m = (u8)(1 << (c * 4 + s));
    const u8* hm = b + 16 * hi + l;
    const u8* q = b + 32 + 32 * c + 16 * hi + l;
    for (int i = 0; i < 8; i++) {
        int lo = (q[i] >> (2 * s)) & 3;
        int h = (hm[i] & m) ? 0 : 4;
        w[i] = dl * (float)(lo - h);
    }
}

template <> __device__ __forceinline__ void dq8<T_Q4_K>(const u8* __restrict__ row, int j, float* w) {
    const u8* b = row + (j / 256) * 144;
    int k = j % 256, c = k / 64, r = k % 64;
    float sc, mn;
    scale_min_k4(2 * c + (r >= 32), b + 4, &sc, &mn);
    float d1 = half_at(b) * sc, m1 = half_at(b + 2) * mn;
    const u8* q = b + 16 + 32 * c + (r & 31);
    for (int i = 0; i < 8; i++) w[i] = d1 * (float)(r < 32 ? (q[i] & 15) : (q[i] >> 4)) - m1;
}

template <> __device__ __forceinline__ void dq8<T_Q5_K>(const u8* __restrict__ row, int j, float* w) {
    const u8* b = row + (j / 256) * 176;
    int k = j % 256, c = k / 64, r = k % 64;
    float sc, mn;
    scale_min_k4(2 * c + (r >= 32), b + 4, &sc, &mn);
    float d1 = half_at(b) * sc, m1 = half_at(b + 2) * mn;
    const u8* qh = b + 16 + (r & 31);
    const u8* q = b + 48 + 32 * c + (r & 31);
    int shift = 2 * c + (r >= 32);
    for (int i = 0; i < 8; i++) {
        int lo = r < 32 ? (q[i] & 15) : (q[i] >> 4);
        int h = (qh[i] >> shift) & 1;
        w[i] = d1 * (float)(lo + 16 * h) - m1;
    }
}

template <> __device__ __forceinline__ void dq8<T_Q6_K>(const u8* __restrict__ row, int j, float* w) {
    const u8* b = row + (j / 256) * 210;
    int k = j % 256, n = k / 128, r = k % 128, qi = r / 32, l = r % 32;
    const u8* ql = b + 64 * n + l + (qi & 1) * 32;
    const u8* qh = b + 128 + 32 * n + l;
    float dsc = half_at(b + 208) * (float)((const i8*)(b + 192))[8 * n + l / 16 + 2 * qi];
    for (int i = 0; i < 8; i++) {
        int lo = qi < 2 ? (ql[i] & 15) : (ql[i] >> 4);
        int h = (qh[i] >> (2 * qi)) & 3;
        w[i] = dsc * (float)((lo | (h << 4)) - 32);
    }
}

template <> __device__ __forceinline__ void dq8<T_TQ1_0>(const u8* __restrict__ row, int j, float* w) {
    const u8* b = row + (j / 256) * 54;
    float d = half_at(b + 52);
    int k0 = j % 256;
    for (int i = 0; i < 8; i++) {
        int k = k0 + i, t;
        if (k < 160) t = tq1_trit(b[k % 32], k / 32);
        else if (k < 240) t = tq1_trit(b[32 + (k - 160) % 16], (k - 160) / 16);
        else t = tq1_trit(b[48 + (k - 240) % 4], (k - 240) / 4);
        w[i] = (float)(t - 1) * d;
    }
}

template <> __device__ __forceinline__ void dq8<T_TQ2_0>(const u8* __restrict__ row, int j, float* w) {
    const u8* b = row + (j / 256) * 66;
    int k = j % 256, jj = k / 128, r = k % 128, l = r / 32, m = r % 32;
    float d = half_at(b + 64);
    const u8* q = b + 32 * jj + m;
    for (int i = 0; i < 8; i++) w[i] = (float)(((q[i] >> (2 * l)) & 3) - 1) * d;
}

template <> __device__ __forceinline__ void dq8<T_Q1_0>(const u8* __restrict__ row, int j, float* w) {
    const u8* b = row + (j / 128) * 18;
    float d = half_at(b);
    u8 bits = b[2 + (j % 128) / 8];
    for (int i = 0; i < 8; i++) w[i] = ((bits >> i) & 1) ? d : -d;
}

template <> __device__ __forceinline__ void dq8<T_Q2_0>(const u8* __restrict__ row, int j, float* w) {
    const u8* b = row + (j / 64) * 18;
    float d = half_at(b);
    const u8* qs = b + 2 + (j % 64) / 4;
    for (int i = 0; i < 8; i++) w[i] = (float)(((qs[i / 4] >> (2 * (i % 4))) & 3) - 1) * d;
}

// One instance of a kernel template per format, named NAME_<format>.
#define FOR_EACH_FORMAT(X) \
    X(f32, T_F32) X(f16, T_F16) X(bf16, T_BF16) X(q4_0, T_Q4_0) X(q4_1, T_Q4_1) X(q5_0, T_Q5_0) \
    X(q5_1, T_Q5_1) X(q8_0, T_Q8_0) X(q2_k, T_Q2_K) X(q3_k, T_Q3_K) X(q4_k, T_Q4_K) X(q5_k, T_Q5_K) \
    X(q6_k, T_Q6_K) X(tq1_0, T_TQ1_0) X(tq2_0, T_TQ2_0) X(q1_0, T_Q1_0) X(q2_0, T_Q2_0)
