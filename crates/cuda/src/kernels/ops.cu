// The small steps between products: RMS norm, q/k preparation (bias, per-head norm, RoPE),
// storing keys and values in the paged cache, SwiGLU, and causal attention over the cache.

#define BLOCK_TOKENS 16

__device__ __forceinline__ float block_sum(float v, float* shared32) {
    v = warp_sum(v);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = (blockDim.x + 31) / 32;
    __syncthreads();
    if (lane == 0) shared32[warp] = v;
    __syncthreads();
    float s = 0.0f;
    for (int i = 0; i < n_warps; i++) s += shared32[i];
    return s;
}

// out[i] = x[rows ? rows[i] : i] / rms * w, one block per output row.
extern "C" __global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w, float eps,
                                   const int* __restrict__ rows, float* __restrict__ out, int cols) {
    __shared__ float s32[32];
    int r = blockIdx.x;
    const float* xr = x + (i64)(rows ? rows[r] : r) * cols;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) ss += xr[c] * xr[c];
    ss = block_sum(ss, s32);
    float scale = rsqrtf(ss / (float)cols + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) out[(i64)r * cols + c] = xr[c] * scale * w[c];
}

// Cache layout per layer: [block][kv head][slot][dim], for keys and for values.
__device__ __forceinline__ i64 cache_row(int pos_slot, int head, int n_kv_heads) {
    return ((i64)(pos_slot / BLOCK_TOKENS) * n_kv_heads + head) * BLOCK_TOKENS + pos_slot % BLOCK_TOKENS;
}

__device__ __forceinline__ void store_kv(u16* p, float v) { *p = f2h(v); }
__device__ __forceinline__ void store_kv(float* p, float v) { *p = v; }

// For one (token, head) per block, heads of q first then of k: add the bias, RMS-norm the
// head (when its norm is not NULL), and rotate its first rope_dims dimensions by the token's
// angles (`cs`: rope_dims/2 cosines then as many sines per token; neox pairs (i, i + dims/2),
// otherwise (2i, 2i+1)). Queries go back in place; a key goes to the token's cache slot
// (`slots[t]` = block * BLOCK_TOKENS + position in block) with its value (plus bias) beside.
// Token rows of `qkv` (q, then k, then v) are ld floats apart.
template <typename C>
__device__ void qk_rope_store(float* qkv, int ld, const float* bq, const float* bk, const float* bv,
                              const float* q_norm, const float* k_norm, float eps, const float* __restrict__ cs,
                              const int* __restrict__ slots, C* kc, C* vc, int n_heads, int n_kv_heads, int head_dim,
                              int value_dim, int rope_dims, int neox) {
    __shared__ float s32[32];
    __shared__ float v[512];
    int t = blockIdx.x, h = blockIdx.y;
    bool is_q = h < n_heads;
    int hh = is_q ? h : h - n_heads;
    float* row = qkv + (i64)t * ld;
    float* x = is_q ? row + hh * head_dim : row + n_heads * head_dim + hh * head_dim;
    const float* bias = is_q ? bq : bk;
    const float* nw = is_q ? q_norm : k_norm;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) v[i] = x[i] + (bias ? bias[hh * head_dim + i] : 0.0f);
    if (nw) {
        float ss = 0.0f;
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x) ss += v[i] * v[i];
        ss = block_sum(ss, s32);
        float scale = rsqrtf(ss / (float)head_dim + eps);
        __syncthreads();
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x) v[i] = v[i] * scale * nw[i];
    }
    __syncthreads();
    const float* cos_ = cs + (i64)t * rope_dims;
    const float* sin_ = cos_ + rope_dims / 2;
    int half = rope_dims / 2;
    i64 crow = is_q ? 0 : cache_row(slots[t], hh, n_kv_heads);
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        float r = v[i];
        if (i < rope_dims) {
            int p = neox ? i % half : i / 2;
            bool first = neox ? i < half : (i % 2 == 0);
            float other = neox ? (first ? v[i + half] : v[i - half]) : (first ? v[i + 1] : v[i - 1]);
            r = first ? v[i] * cos_[p] - other * sin_[p] : other * sin_[p] + v[i] * cos_[p];
        }
        if (is_q) x[i] = r;
        else store_kv(kc + crow * head_dim + i, r);
    }
    if (!is_q) {
        const float* vr = row + (n_heads + n_kv_heads) * head_dim + hh * value_dim;
        for (int i = threadIdx.x; i < value_dim; i += blockDim.x)
            store_kv(vc + crow * value_dim + i, vr[i] + (bv ? bv[hh * value_dim + i] : 0.0f));
    }
}

__device__ __forceinline__ float load_kv(const u16* p) { return h2f(*p); }
__device__ __forceinline__ float load_kv(const float* p) { return *p; }

#define ATTN_WARPS 4
#define ATTN_POS 4
#define MAX_HEAD 256

// Causal attention for one (token, query head) per block: the token attends over positions
// 0 .. n_keys[t] of its sequence, found through its block table (`tables + table_at[t]`).
// Each warp takes every ATTN_WARPS-th position with a running (online) softmax; the warps'
// partial results are merged at the end.
template <typename C>
__device__ void attention(const float* __restrict__ q, int ld, const C* __restrict__ kc, const C* __restrict__ vc,
                          const int* __restrict__ tables, const int* __restrict__ table_at,
                          const int* __restrict__ n_keys, float* __restrict__ out, float* __restrict__ part,
                          int chunk, int n_heads, int n_kv_heads, int head_dim, int value_dim, float scale) {
    __shared__ float part_acc[ATTN_WARPS][MAX_HEAD];
    __shared__ float part_m[ATTN_WARPS], part_l[ATTN_WARPS];
    int t = blockIdx.x, h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int kvh = h / (n_heads / n_kv_heads);
    const float* qh = q + (i64)t * ld + h * head_dim;
    float qr[MAX_HEAD / 32], acc[MAX_HEAD / 32];
#pragma unroll
    for (int i = 0; i < MAX_HEAD / 32; i++) {
        int d = lane + 32 * i;
        // An f16 cache's products take q rounded to f16, as llama.cpp's (without flash attention).
        float qv = d < head_dim ? qh[d] : 0.0f;
        qr[i] = (sizeof(C) == 2 ? h2f(f2h(qv)) : qv) * scale;
        acc[i] = 0.0f;
    }
    const int* table = tables + table_at[t];
    // This block's share of the positions: chunk `blockIdx.z` (all of them when not split).
    int start = blockIdx.z * chunk, n = min(n_keys[t], start + chunk);
    float m = NEG_INF, l = 0.0f;
    // ATTN_POS positions per warp step, their loads issued together: one dependent chain
    // (table, keys, scores, values) per step rather than per position.
    for (int p0 = start + warp * ATTN_POS; p0 < n; p0 += ATTN_WARPS * ATTN_POS) {
        i64 rows[ATTN_POS];
        float s[ATTN_POS];
#pragma unroll
        for (int k = 0; k < ATTN_POS; k++) {
            int p = min(p0 + k, n - 1);
            rows[k] = cache_row(table[p / BLOCK_TOKENS] * BLOCK_TOKENS + p % BLOCK_TOKENS, kvh, n_kv_heads);
            s[k] = 0.0f;
        }
#pragma unroll
        for (int i = 0; i < MAX_HEAD / 32; i++) {
            int d = lane + 32 * i;
            if (d < head_dim) {
#pragma unroll
                for (int k = 0; k < ATTN_POS; k++) s[k] += qr[i] * load_kv(kc + rows[k] * head_dim + d);
            }
        }
        float m_new = m;
#pragma unroll
        for (int k = 0; k < ATTN_POS; k++) {
            s[k] = p0 + k < n ? warp_sum(s[k]) : NEG_INF;
            m_new = fmaxf(m_new, s[k]);
        }
        float corr = expf(m - m_new);
        float e[ATTN_POS];
        l *= corr;
#pragma unroll
        for (int k = 0; k < ATTN_POS; k++) {
            e[k] = p0 + k < n ? expf(s[k] - m_new) : 0.0f;
            l += e[k];
        }
#pragma unroll
        for (int i = 0; i < MAX_HEAD / 32; i++) {
            int d = lane + 32 * i;
            if (d < value_dim) {
                float a = acc[i] * corr;
#pragma unroll
                for (int k = 0; k < ATTN_POS; k++) a += e[k] * load_kv(vc + rows[k] * value_dim + d);
                acc[i] = a;
            }
        }
        m = m_new;
    }
#pragma unroll
    for (int i = 0; i < MAX_HEAD / 32; i++) {
        int d = lane + 32 * i;
        if (d < value_dim) part_acc[warp][d] = acc[i];
    }
    if (lane == 0) {
        part_m[warp] = m;
        part_l[warp] = l;
    }
    __syncthreads();
    float mm = NEG_INF;
    for (int w = 0; w < ATTN_WARPS; w++) mm = fmaxf(mm, part_m[w]);
    float ll = 0.0f;
    for (int w = 0; w < ATTN_WARPS; w++) ll += part_l[w] * (part_m[w] == NEG_INF ? 0.0f : expf(part_m[w] - mm));
    if (sizeof(C) == 2 && !part) {
        // With an f16 cache llama.cpp rounds the normalized weights to f16 before they scale
        // the values: a second pass over the keys, with the final max and sum.
        float a2[MAX_HEAD / 32];
#pragma unroll
        for (int i = 0; i < MAX_HEAD / 32; i++) a2[i] = 0.0f;
        for (int p0 = start + warp * ATTN_POS; p0 < n; p0 += ATTN_WARPS * ATTN_POS) {
            i64 rows[ATTN_POS];
            float s[ATTN_POS];
#pragma unroll
            for (int k = 0; k < ATTN_POS; k++) {
                int p = min(p0 + k, n - 1);
                rows[k] = cache_row(table[p / BLOCK_TOKENS] * BLOCK_TOKENS + p % BLOCK_TOKENS, kvh, n_kv_heads);
                s[k] = 0.0f;
            }
#pragma unroll
            for (int i = 0; i < MAX_HEAD / 32; i++) {
                int d = lane + 32 * i;
                if (d < head_dim) {
#pragma unroll
                    for (int k = 0; k < ATTN_POS; k++) s[k] += qr[i] * load_kv(kc + rows[k] * head_dim + d);
                }
            }
#pragma unroll
            for (int k = 0; k < ATTN_POS; k++) {
                float sk = warp_sum(s[k]);
                s[k] = p0 + k < n ? h2f(f2h(expf(sk - mm) / ll)) : 0.0f;
            }
#pragma unroll
            for (int i = 0; i < MAX_HEAD / 32; i++) {
                int d = lane + 32 * i;
                if (d < value_dim) {
#pragma unroll
                    for (int k = 0; k < ATTN_POS; k++) a2[i] += s[k] * load_kv(vc + rows[k] * value_dim + d);
                }
            }
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < MAX_HEAD / 32; i++) {
            int d = lane + 32 * i;
            if (d < value_dim) part_acc[warp][d] = a2[i];
        }
        __syncthreads();
        for (int d = threadIdx.x; d < value_dim; d += blockDim.x) {
            float o = 0.0f;
            for (int w = 0; w < ATTN_WARPS; w++) o += part_acc[w][d];
            out[((i64)t * n_heads + h) * value_dim + d] = o;
        }
        return;
    }
    // Split: this chunk's unnormalized sums, its max and its total weight, for
    // attention_combine; else the result.
    i64 at = (((i64)t * n_heads + h) * gridDim.z + blockIdx.z) * (value_dim + 2);
    for (int d = threadIdx.x; d < value_dim; d += blockDim.x) {
        float s = 0.0f;
        for (int w = 0; w < ATTN_WARPS; w++)
            if (part_m[w] != NEG_INF) s += part_acc[w][d] * expf(part_m[w] - mm);
        if (part) part[at + 2 + d] = s;
        else out[((i64)t * n_heads + h) * value_dim + d] = s / ll;
    }
    if (part && threadIdx.x == 0) {
        part[at] = mm;
        part[at + 1] = ll;
    }
}

// Merge the `splits` chunks of attention_* (split) per (token, head): one block each.
extern "C" __global__ void attention_combine(const float* __restrict__ part, float* __restrict__ out, int n_heads,
                                             int splits, int value_dim) {
    int t = blockIdx.x, h = blockIdx.y;
    const float* p = part + ((i64)t * n_heads + h) * splits * (value_dim + 2);
    float mm = NEG_INF;
    for (int s = 0; s < splits; s++) mm = fmaxf(mm, p[s * (value_dim + 2)]);
    float ll = 0.0f;
    for (int s = 0; s < splits; s++) {
        float m = p[s * (value_dim + 2)];
        if (m != NEG_INF) ll += p[s * (value_dim + 2) + 1] * expf(m - mm);
    }
    for (int d = threadIdx.x; d < value_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < splits; s++) {
            float m = p[s * (value_dim + 2)];
            if (m != NEG_INF) acc += p[s * (value_dim + 2) + 2 + d] * expf(m - mm);
        }
        out[((i64)t * n_heads + h) * value_dim + d] = acc / ll;
    }
}

#define CACHE_KERNELS(name, C)                                                                                   \
    extern "C" __global__ void qk_rope_store_##name(                                                             \
        float* qkv, int ld, const float* bq, const float* bk, const float* bv, const float* q_norm,              \
        const float* k_norm, float eps, const float* cs, const int* slots, C* kc, C* vc, int n_heads,             \
        int n_kv_heads, int head_dim, int value_dim, int rope_dims, int neox) {                                  \
        qk_rope_store<C>(qkv, ld, bq, bk, bv, q_norm, k_norm, eps, cs, slots, kc, vc, n_heads, n_kv_heads,       \
                         head_dim, value_dim, rope_dims, neox);                                                  \
    }                                                                                                            \
    extern "C" __global__ void attention_##name(const float* q, int ld, const C* kc, const C* vc,                \
                                                const int* tables, const int* table_at, const int* n_keys,        \
                                                float* out, float* part, int chunk, int n_heads, int n_kv_heads,  \
                                                int head_dim, int value_dim, float scale) {                       \
        attention<C>(q, ld, kc, vc, tables, table_at, n_keys, out, part, chunk, n_heads, n_kv_heads, head_dim,    \
                     value_dim, scale);                                                                           \
    }
CACHE_KERNELS(f16, u16)
CACHE_KERNELS(f32, float)

// g = silu(g) * u, elementwise over n values.
extern "C" __global__ void silu_mul(float* g, const float* u, i64 n) {
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
        float x = g[i];
        g[i] = x / (1.0f + expf(-x)) * u[i];
    }
}
