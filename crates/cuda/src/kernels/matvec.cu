// Products of a weight matrix (any format, in the file's bytes) with a few tokens' f32
// activations: one warp per output row, each lane taking eight weights at a time, so that a
// warp reads its row once for all (up to MAX_TOKENS) tokens.

#define MAX_TOKENS 8

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Y[t][row] (=, or += when `add`) sum_c W[row][c] X[t][c], for t < n_tok <= MAX_TOKENS; token
// rows of Y are ldy apart.
// For Q4_1/Q5_1 with `S` (the activations' per-32 rounded sums, see round_acts), each block's
// min is added once times S, as llama.cpp's Q8_1 products do, instead of with every weight.
template <int T>
__device__ void matvec(const u8* __restrict__ W, i64 row_bytes, int rows, int cols,
                       const float* __restrict__ X, const float* __restrict__ S, int n_tok, float* __restrict__ Y,
                       int ldy, int add) {
    constexpr bool HAS_MIN = T == T_Q4_1 || T == T_Q5_1;
    constexpr int BLOCK_BYTES = T == T_Q4_1 ? 20 : 24;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int row = blockIdx.x * (blockDim.x / 32) + warp;
    if (row >= rows) return;
    const u8* w = W + row * row_bytes;
    float acc[MAX_TOKENS];
#pragma unroll
    for (int t = 0; t < MAX_TOKENS; t++) acc[t] = 0.0f;
    for (int j = lane * 8; j < cols; j += 256) {
        float wv[8];
        bool split_min = HAS_MIN && S;
        if constexpr (HAS_MIN) {
            if (split_min) dq8<T + 1000>(w, j, wv);
            else dq8<T>(w, j, wv);
        } else {
            dq8<T>(w, j, wv);
        }
#pragma unroll
        for (int t = 0; t < MAX_TOKENS; t++) {
            if (t < n_tok) {
                const float4* xp = (const float4*)(X + (i64)t * cols + j);
                float4 a = xp[0], b = xp[1];
                acc[t] += wv[0] * a.x + wv[1] * a.y + wv[2] * a.z + wv[3] * a.w
                        + wv[4] * b.x + wv[5] * b.y + wv[6] * b.z + wv[7] * b.w;
                if (split_min && j % 32 == 0)
                    acc[t] += half_at(w + (j / 32) * BLOCK_BYTES + 2) * S[(i64)t * (cols / 32) + j / 32];
            }
        }
    }
#pragma unroll
    for (int t = 0; t < MAX_TOKENS; t++) {
        if (t < n_tok) {
            float s = warp_sum(acc[t]);
            if (lane == 0) {
                float* y = Y + (i64)t * ldy + row;
                *y = add ? *y + s : s;
            }
        }
    }
}

// Rows `ids` of W, dequantized: out[r][c] = W[ids[r]][c]. grid.y = the row of `ids`.
template <int T>
__device__ void dequant_rows(const u8* __restrict__ W, i64 row_bytes, int cols, const int* __restrict__ ids,
                             float* __restrict__ out) {
    int r = blockIdx.y;
    const u8* w = W + (i64)ids[r] * row_bytes;
    for (int j = (blockIdx.x * blockDim.x + threadIdx.x) * 8; j < cols; j += gridDim.x * blockDim.x * 8) {
        float v[8];
        dq8<T>(w, j, v);
        for (int i = 0; i < 8; i++) out[(i64)r * cols + j + i] = v[i];
    }
}

#define MATVEC_KERNELS(name, T)                                                                          \
    extern "C" __global__ void matvec_##name(const u8* W, i64 row_bytes, int rows, int cols, const float* X, \
                                             const float* S, int n_tok, float* Y, int ldy, int add) {    \
        matvec<T>(W, row_bytes, rows, cols, X, S, n_tok, Y, ldy, add);                                   \
    }                                                                                                    \
    extern "C" __global__ void dequant_rows_##name(const u8* W, i64 row_bytes, int cols, const int* ids, \
                                                   float* out) {                                         \
        dequant_rows<T>(W, row_bytes, cols, ids, out);                                                   \
    }
FOR_EACH_FORMAT(MATVEC_KERNELS)
