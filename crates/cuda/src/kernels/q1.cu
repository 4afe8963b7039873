// Q1_0 (and only Q1_0) products in integers: activations are rounded to int8 blocks of 32
// (llama.cpp's Q8_0 activations, with each block's sum kept), every four sign bits of a weight
// row are spread into four bytes of 0 or 1, and __dp4a sums four products at once. With
// b in {0, 1} standing for -1/+1: sum(w x) = d_w d_x (2 sum(b q) - sum(q)).

#define QK1 128

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ int warp_sum_i(int v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Round token rows of x (RMS-normed by norm_w first, unless NULL) to int8 blocks of 32:
// xq the values, xd each block's scale, xs each block's sum. `rows` picks x's rows (NULL:
// 0, 1, ...). Blocks of threads: (token row, 8 blocks of 32 per warp-set); each computes the
// row's norm itself (a re-read from cache) so that a row is spread over many of them.
extern "C" __global__ void quantize_acts(const float* __restrict__ x, const float* __restrict__ norm_w, float eps,
                                         const int* __restrict__ rows, int cols, i8* __restrict__ xq,
                                         float* __restrict__ xd, int* __restrict__ xs) {
    __shared__ float s32[32];
    int r = blockIdx.x;
    const float* xr = x + (i64)(rows ? rows[r] : r) * cols;
    float scale = 1.0f;
    if (norm_w) {
        float ss = 0.0f;
        const float4* x4 = (const float4*)xr;
#pragma unroll 8
        for (int c = threadIdx.x; c < cols / 4; c += blockDim.x) {
            float4 v = __ldg(x4 + c);
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        ss = block_sum(ss, s32);
        scale = rsqrtf(ss / (float)cols + eps);
    }
    int lane = threadIdx.x % 32, g = blockIdx.y * (blockDim.x / 32) + threadIdx.x / 32;
    if (g >= cols / 32) return;
    int c = g * 32 + lane;
    float v = norm_w ? xr[c] * scale * norm_w[c] : xr[c];
    float amax = warp_max(fabsf(v));
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    int q = (int)roundf(v * id);
    xq[(i64)r * cols + c] = (i8)q;
    int sum = warp_sum_i(q);
    if (lane == 0) {
        xd[(i64)r * (cols / 32) + g] = d;
        xs[(i64)r * (cols / 32) + g] = sum;
    }
}

// Four sign bits (bit i = weight i) as four bytes of 0 or 1: the multiply moves bit i to bit
// 8i (the shifted copies never overlap, so nothing carries), the mask keeps those.
__device__ __forceinline__ int spread4(u32 nibble) { return (int)((nibble * 0x00204081u) & 0x01010101u); }

// Q1_0 matrices are uploaded split in two (see crates/model's upload): first every row's sign
// bits (16 bytes per block, rows nb * 16 bytes apart), then every row's f16 scales (rows nb * 2
// bytes apart), so that a warp's loads of bits, scales and activations are all contiguous.

// One warp per row; each lane takes every 32nd run of 32 weights (4 bytes of bits, two int4 of
// activations: 128 contiguous bytes of bits per warp load). The token count is a
// template parameter so that a decode step (one token) keeps few registers and the device
// holds many warps (with MAX_TOKENS accumulators and loads a warp needs ~130 registers).
template <int NT>
__device__ __forceinline__ void q1_row(const u8* __restrict__ bits, const u16* __restrict__ scales, int cols,
                                       const i8* __restrict__ xq, const float* __restrict__ xd,
                                       const int* __restrict__ xs, int n_tok, float* acc) {
#pragma unroll 4
    for (int j = (threadIdx.x % 32) * 32; j < cols; j += 32 * 32) {
        u32 b32 = __ldg((const u32*)(bits + j / 8));
        float dw = h2f(__ldg(scales + j / QK1));
        int e[8];
#pragma unroll
        for (int i = 0; i < 8; i++) e[i] = spread4((b32 >> (4 * i)) & 15u);
        int g = j / 32;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (NT == 1 || t < n_tok) {
                const int4* xp = (const int4*)(xq + (i64)t * cols + j);
                int4 a = __ldg(xp), c = __ldg(xp + 1);
                int dot = __dp4a(e[0], a.x, 0);
                dot = __dp4a(e[1], a.y, dot);
                dot = __dp4a(e[2], a.z, dot);
                dot = __dp4a(e[3], a.w, dot);
                dot = __dp4a(e[4], c.x, dot);
                dot = __dp4a(e[5], c.y, dot);
                dot = __dp4a(e[6], c.z, dot);
                dot = __dp4a(e[7], c.w, dot);
                i64 at = (i64)t * (cols / 32) + g;
                acc[t] += dw * __ldg(xd + at) * (float)(2 * dot - __ldg(xs + at));
            }
        }
    }
}

// Y[t][row] (=, or += when add) the product of Q1_0 row `row` with token t's activations;
// token rows of Y are ldy apart. `W` is the split layout above, for `rows`.
template <int NT>
__device__ void q1_matvec(const u8* __restrict__ W, int rows, int cols, const i8* __restrict__ xq,
                          const float* __restrict__ xd, const int* __restrict__ xs, int n_tok, float* __restrict__ Y,
                          int ldy, int add) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= rows) return;
    int nb = cols / QK1;
    const u16* scales = (const u16*)(W + (i64)rows * nb * 16);
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    q1_row<NT>(W + (i64)row * nb * 16, scales + (i64)row * nb, cols, xq, xd, xs, n_tok, acc);
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t < n_tok) {
            float s = warp_sum(acc[t]);
            if (threadIdx.x % 32 == 0) {
                float* y = Y + (i64)t * ldy + row;
                *y = add ? *y + s : s;
            }
        }
    }
}

// The gated product of the MLP: Y[t][row] = silu(gate_row . x) * (up_row . x).
template <int NT>
__device__ void q1_glu(const u8* __restrict__ G, const u8* __restrict__ U, int rows, int cols,
                       const i8* __restrict__ xq, const float* __restrict__ xd, const int* __restrict__ xs,
                       int n_tok, float* __restrict__ Y) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= rows) return;
    int nb = cols / QK1;
    float g[NT], u[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) g[t] = u[t] = 0.0f;
    i64 bits_at = (i64)row * nb * 16, scales_at = (i64)rows * nb * 16 + (i64)row * nb * 2;
    q1_row<NT>(G + bits_at, (const u16*)(G + scales_at), cols, xq, xd, xs, n_tok, g);
    q1_row<NT>(U + bits_at, (const u16*)(U + scales_at), cols, xq, xd, xs, n_tok, u);
#pragma unroll
    for (int t = 0; t < NT; t++) {
        if (t < n_tok) {
            float gs = warp_sum(g[t]), us = warp_sum(u[t]);
            if (threadIdx.x % 32 == 0) Y[(i64)t * rows + row] = gs / (1.0f + expf(-gs)) * us;
        }
    }
}

#define Q1_KERNELS(NT)                                                                                            \
    extern "C" __global__ void q1_matvec_##NT(const u8* W, int rows, int cols, const i8* xq, const float* xd,     \
                                              const int* xs, int n_tok, float* Y, int ldy, int add) {             \
        q1_matvec<NT>(W, rows, cols, xq, xd, xs, n_tok, Y, ldy, add);                                             \
    }                                                                                                             \
    extern "C" __global__ void q1_glu_##NT(const u8* G, const u8* U, int rows, int cols, const i8* xq,            \
                                           const float* xd, const int* xs, int n_tok, float* Y) {                 \
        q1_glu<NT>(G, U, rows, cols, xq, xd, xs, n_tok, Y);                                                       \
    }
Q1_KERNELS(1)
Q1_KERNELS(2)
Q1_KERNELS(4)
Q1_KERNELS(8)

// Activations rounded as llama.cpp's CPU products round them before the integer dot of each
// weight format (so that a product on the GPU matches its reference to within the order of
// float sums): out = q * d per block. mode 0: Q8_0/Q8_1, blocks of 32, d = amax / 127 kept as
// an f16, q = round-half-away(x / d); mode 1: Q8_K, blocks of 256, d = max / -127 with max the
// first value of largest magnitude, q = min(127, round-half-even(x / d)). One warp per block.
extern "C" __global__ void round_acts(const float* __restrict__ x, float* __restrict__ out,
                                      float* __restrict__ sums, i64 n_blocks, int mode) {
    i64 blk = (i64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (blk >= n_blocks) return;
    int lane = threadIdx.x % 32;
    if (mode == 0) {
        i64 i = blk * 32 + lane;
        float v = x[i];
        float d = warp_max(fabsf(v)) / 127.0f;
        float id = d != 0.0f ? 1.0f / d : 0.0f;
        float q = roundf(v * id);
        out[i] = q * h2f(f2h(d));
        // Q8_1's sum, as its f16: d times the sum of the block's values.
        int qs = warp_sum_i((int)q);
        if (sums && lane == 0) sums[blk] = h2f(f2h((float)qs * d));
        return;
    }
    const float* xb = x + blk * 256;
    float v[8], best = 0.0f;
    int at = 1 << 30;
    for (int k = 0; k < 8; k++) {
        v[k] = xb[lane * 8 + k];
        if (fabsf(v[k]) > fabsf(best)) {
            best = v[k];
            at = lane * 8 + k;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float b2 = __shfl_xor_sync(0xffffffffu, best, o);
        int a2 = __shfl_xor_sync(0xffffffffu, at, o);
        if (fabsf(b2) > fabsf(best) || (fabsf(b2) == fabsf(best) && a2 < at)) {
            best = b2;
            at = a2;
        }
    }
    float iscale = best != 0.0f ? -127.0f / best : 0.0f;
    float d = best != 0.0f ? 1.0f / iscale : 0.0f;
    for (int k = 0; k < 8; k++) out[blk * 256 + lane * 8 + k] = (float)min(127, __float2int_rn(iscale * v[k])) * d;
}
