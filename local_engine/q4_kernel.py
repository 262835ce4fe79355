"""The C++ source of the group-quantised GEMM (`quant4.py` builds it once per machine and calls it).

Why our own kernel: no maintained PyTorch CPU kernel runs 4-bit group-wise weights fast at batch 1. Measured on
this project's 2-core AMD EPYC (AVX-512 VNNI) kind (`../shared/reference/local-engine-speed.md`), all of
SmolLM2-135M's GEMVs took 102 ms through `torch.ops.aten._weight_int4pack_mm_for_cpu` (group 32) against
~17.6 ms for fp32 through oneDNN and ~5 ms for fbgemm's dynamic int8 linear; fbgemm has no 4-bit path, and
Inductor did not fuse a dequantise-then-matmul. The approach here is llama.cpp's (the idea, not its code):
quantise each activation row to int8 per group of 32 (scale = max |x| / 127), then take integer dot products
of int8 activations with the 4-bit (or 8-bit) weights of the same group, and scale each group's int32 sum by
weight scale x activation scale in fp32.

Layout (prepared at load, `quant4.pack`): output rows in tiles of 16. For a tile, group g and chunk c,
64 bytes hold 4 bytes per row r: in 4-bit mode byte b packs k = 32g + 8c + b (low nibble) and k + 4 (high
nibble), so one 512-bit load, a mask and a shift give two registers of "4 consecutive k of 16 rows", each
multiplied by a broadcast of 4 activation bytes with one `vpdpbusd` (u8 x s8 -> int32, AVX-512 VNNI): no
horizontal sums anywhere, the 16 outputs of a tile come out as one vector. 8-bit mode stores weight + 128
(unsigned) and subtracts 128 x sum(qx) per group in int32 (exact). Scales and minimums are 16 rows contiguous
per group, fp16 (the 32-value GGUF blocks, as stored) or fp32 (K-quants, whose scale is a product fp16 cannot
hold; measured +2 % on SmolLM2's layer GEMVs with the weights in cache). The weight formats, as template
flags: 4-bit with a minimum (Q4_0, Q4_1, Q4_K); 8-bit (Q8_0, Q5_0), with a minimum (Q5_1, Q5_K), with one
scale per 16 inputs (Q6_K: chunks 0-3 and 4-7 of a group are two int32 partial sums, the 8-bit offset taken
per half from 128 x the half's sum(qx)), or both (rows of mixed types stacked into one GEMM).

Numerics: every int32 group sum is exact; the fp32 part per output is, group after group,
`acc = fma(float(isum), d * dx, acc)` (per half with 16-wide scales, low half first) then (with a minimum)
`acc = fma(m, dx * sum(qx), acc)`, in the same order
whatever the batch, the tile split across threads or the code path (the scalar fallback does the identical
operations, `std::fma` included), so a row's result is bitwise the same alone or in any batch, on any number
of threads. Rows of the batch are processed up to 4 at a time against one load of the weights (prefill),
which changes no operation of any row.

Threads: `at::parallel_for` over tiles of output rows (PyTorch's intra-op pool, the caller's thread count).
That needs the extension compiled with `-fopenmp`: without it ATen's header-only parallel_for runs serially,
silently (it did until 2026-12: every q4/q8 GEMM ran on one core; `parallel_width()` now tells, and a test checks).
With it, on a 2-core AMD EPYC, a 500-row q4 prefill GEMM runs 1.9x faster and the LM head GEMV 1.5x.
CPU features are checked at run time (`__builtin_cpu_supports`): the AVX-512 and AVX2 code is compiled with
target attributes, so the module builds without `-march=native`. Without VNNI (most AVX2 CPUs: AMD before
Zen 4, Intel client parts before AVX-VNNI) the same tiles run on 256-bit registers with `vpmaddubsw` +
`vpmaddwd` in place of `vpdpbusd` (the same exact int32 sums; on one such 2-core AMD EPYC a 500-token q4
prefill took 26 s on the scalar path); with neither, scalar.
"""

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <immintrin.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace {

constexpr int GROUP = 32;
constexpr int TILE = 16;
// Software prefetch distance of the weight stream, in bytes of packed 4-bit weights ahead (scales: the same number of
// groups ahead). A decode GEMV streams every weight once from DRAM and does little work per byte: the hardware
// prefetcher alone left the 4-bit layer GEMVs of SmolLM2-135M ~10 % slower on a 2-core AMD EPYC (AVX2), at 1 and
// 2 threads (0 / 512 / 1024 / 2048 / 4096 bytes measured side by side: 2048 and 4096 were best, alike).
constexpr int PREFETCH = 2048;

struct Rows {  // activation rows quantised per group of 32
  const int8_t* q;      // [M, K]
  const float* dx;      // [M, G] activation scale per group
  const float* sx;      // [M, G] dx * sum(q) (minimum term)
  const int32_t* si;    // [M, G] 128 * sum(q) (8-bit offset)
  const int32_t* sh;    // [M, 2G] 128 * sum(q) of each half group (8-bit offset under 16-wide scales)
  int64_t K, G;
};

// 2: AVX-512 VNNI, 1: AVX2 + FMA + F16C (no VNNI: u8 x s8 products through vpmaddubsw), 0: scalar
inline int simd_level() {
  static const int level =
      (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni")) ? 2
      : (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) ? 1
      : 0;
  return level;
}
inline bool simd_ok() { return simd_level() > 0; }

// ---------------------------------------------------------------- activation quantisation
void quantize_scalar(const float* x, const float* cs, int64_t K, int8_t* q, float* dx, float* sx, int32_t* si,
                     int32_t* sh) {
  const int64_t G = K / GROUP;
  for (int64_t g = 0; g < G; ++g) {
    float v[GROUP];
    float amax = 0.0f;
    for (int j = 0; j < GROUP; ++j) {
      v[j] = cs ? x[g * GROUP + j] * cs[g * GROUP + j] : x[g * GROUP + j];
      amax = std::fmax(amax, std::fabs(v[j]));
    }
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    int32_t s[2] = {0, 0};
    for (int j = 0; j < GROUP; ++j) {
      const int32_t qi = (int32_t)std::nearbyint(v[j] * inv);
      q[g * GROUP + j] = (int8_t)qi;
      s[j / 16] += qi;
    }
    dx[g] = amax / 127.0f;
    sx[g] = dx[g] * (float)(s[0] + s[1]);
    si[g] = 128 * (s[0] + s[1]);
    sh[2 * g] = 128 * s[0];
    sh[2 * g + 1] = 128 * s[1];
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
void quantize_avx512(const float* x, const float* cs, int64_t K, int8_t* q, float* dx, float* sx, int32_t* si,
                     int32_t* sh) {
  const int64_t G = K / GROUP;
  for (int64_t g = 0; g < G; ++g) {
    __m512 a = _mm512_loadu_ps(x + g * GROUP);
    __m512 b = _mm512_loadu_ps(x + g * GROUP + 16);
    if (cs) {
      a = _mm512_mul_ps(a, _mm512_loadu_ps(cs + g * GROUP));
      b = _mm512_mul_ps(b, _mm512_loadu_ps(cs + g * GROUP + 16));
    }
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    const __m512 vi = _mm512_set1_ps(inv);
    // round to nearest even (the default MXCSR mode), as std::nearbyint in the scalar path
    const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, vi));
    const __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, vi));
    _mm_storeu_si128((__m128i*)(q + g * GROUP), _mm512_cvtsepi32_epi8(qa));
    _mm_storeu_si128((__m128i*)(q + g * GROUP + 16), _mm512_cvtsepi32_epi8(qb));
    const int32_t s0 = _mm512_reduce_add_epi32(qa), s1 = _mm512_reduce_add_epi32(qb);
    dx[g] = amax / 127.0f;
    sx[g] = dx[g] * (float)(s0 + s1);
    si[g] = 128 * (s0 + s1);
    sh[2 * g] = 128 * s0;
    sh[2 * g + 1] = 128 * s1;
  }
}

// The same rounding as the scalar path (vcvtps2dq rounds to nearest even under the default MXCSR mode, as
// std::nearbyint does), without a libm call per value: on an AVX2 machine the scalar loop cost about 4 us per
// 576-wide row, more than a small GEMV itself.
__attribute__((target("avx2,fma,f16c")))
inline int32_t hsum8(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

__attribute__((target("avx2,fma,f16c")))
void quantize_avx2(const float* x, const float* cs, int64_t K, int8_t* q, float* dx, float* sx, int32_t* si,
                   int32_t* sh) {
  const int64_t G = K / GROUP;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t g = 0; g < G; ++g) {
    __m256 v[4];
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(x + g * GROUP + i * 8);
      if (cs) v[i] = _mm256_mul_ps(v[i], _mm256_loadu_ps(cs + g * GROUP + i * 8));
    }
    const __m256 a = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                   _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const float amax = _mm_cvtss_f32(m4);
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    const __m256 vi = _mm256_set1_ps(inv);
    __m256i qi[4];
    for (int i = 0; i < 4; ++i) qi[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], vi));
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]), _mm256_packs_epi32(qi[2], qi[3]));
    _mm256_storeu_si256((__m256i*)(q + g * GROUP), _mm256_permutevar8x32_epi32(packed, order));
    const int32_t s0 = hsum8(_mm256_add_epi32(qi[0], qi[1])), s1 = hsum8(_mm256_add_epi32(qi[2], qi[3]));
    dx[g] = amax / 127.0f;
    sx[g] = dx[g] * (float)(s0 + s1);
    si[g] = 128 * (s0 + s1);
    sh[2 * g] = 128 * s0;
    sh[2 * g + 1] = 128 * s1;
  }
}

// ---------------------------------------------------------------- tile kernels (16 output rows)
// Template flags: Q4 (4-bit weights, always with a minimum), MIN (a per-group minimum term), HALF (one
// scale per 16 inputs: two int32 partial sums per group), S (the scale type: c10::Half or float).
inline int32_t word(const int8_t* p) { int32_t w; std::memcpy(&w, p, 4); return w; }

template <bool Q4, bool MIN, bool HALF, typename S>
void tile_scalar(const uint8_t* qs, const S* d, const S* m, const Rows& x, int64_t row, float* out) {
  constexpr int NS = HALF ? 2 : 1;
  float acc[TILE];
  for (int r = 0; r < TILE; ++r) acc[r] = 0.0f;
  const int8_t* xq = x.q + row * x.K;
  for (int64_t g = 0; g < x.G; ++g) {
    int32_t is[NS][TILE] = {};
    const int8_t* xg = xq + g * GROUP;
    if (Q4) {
      const uint8_t* p = qs + g * 256;
      for (int c = 0; c < 4; ++c)
        for (int r = 0; r < TILE; ++r)
          for (int b = 0; b < 4; ++b) {
            const uint8_t byte = p[c * 64 + r * 4 + b];
            is[0][r] += (int32_t)(byte & 15) * xg[c * 8 + b] + (int32_t)(byte >> 4) * xg[c * 8 + 4 + b];
          }
    } else {
      const uint8_t* p = qs + g * 512;
      for (int c = 0; c < 8; ++c)
        for (int r = 0; r < TILE; ++r)
          for (int b = 0; b < 4; ++b) is[HALF && c >= 4][r] += (int32_t)p[c * 64 + r * 4 + b] * xg[c * 4 + b];
    }
    const int64_t at = row * x.G + g;
    const float dxg = x.dx[at];
    for (int r = 0; r < TILE; ++r) {
      for (int h = 0; h < NS; ++h) {
        int32_t v = is[h][r];
        if (!Q4) v -= HALF ? x.sh[2 * at + h] : x.si[at];
        const float scale = (float)d[(g * NS + h) * TILE + r] * dxg;
        acc[r] = std::fma((float)v, scale, acc[r]);
      }
      if (MIN) acc[r] = std::fma((float)m[g * TILE + r], x.sx[at], acc[r]);
    }
  }
  for (int r = 0; r < TILE; ++r) out[r] = acc[r];
}

template <typename S>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
inline __m512 load16(const S* p) {
  if constexpr (std::is_same_v<S, float>) return _mm512_loadu_ps(p);
  else return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p));
}

template <bool Q4, bool MIN, bool HALF, typename S, int R>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,fma")))
void tile_avx512(const uint8_t* qs, const S* d, const S* m, const Rows& x, int64_t row0, float* out,
                 int64_t ldo) {
  constexpr int NS = HALF ? 2 : 1;
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int64_t g = 0; g < x.G; ++g) {
    __m512i is[NS][R];
    for (int h = 0; h < NS; ++h)
      for (int r = 0; r < R; ++r) is[h][r] = _mm512_setzero_si512();
    if (Q4) {
      const uint8_t* p = qs + g * 256;
      for (int c = 0; c < 4; ++c) {
        const __m512i v = _mm512_loadu_si512((const void*)(p + c * 64));
        const __m512i lo = _mm512_and_si512(v, low);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        for (int r = 0; r < R; ++r) {
          const int8_t* xg = x.q + (row0 + r) * x.K + g * GROUP + c * 8;
          is[0][r] = _mm512_dpbusd_epi32(is[0][r], lo, _mm512_set1_epi32(word(xg)));
          is[0][r] = _mm512_dpbusd_epi32(is[0][r], hi, _mm512_set1_epi32(word(xg + 4)));
        }
      }
    } else {
      const uint8_t* p = qs + g * 512;
      for (int c = 0; c < 8; ++c) {
        const __m512i v = _mm512_loadu_si512((const void*)(p + c * 64));
        const int h = HALF && c >= 4;
        for (int r = 0; r < R; ++r) {
          const int8_t* xg = x.q + (row0 + r) * x.K + g * GROUP + c * 4;
          is[h][r] = _mm512_dpbusd_epi32(is[h][r], v, _mm512_set1_epi32(word(xg)));
        }
      }
    }
    __m512 dv[NS];
    for (int h = 0; h < NS; ++h) dv[h] = load16(d + (g * NS + h) * TILE);
    __m512 mv = _mm512_setzero_ps();
    if (MIN) mv = load16(m + g * TILE);
    for (int r = 0; r < R; ++r) {
      const int64_t at = (row0 + r) * x.G + g;
      const __m512 dxv = _mm512_set1_ps(x.dx[at]);
      for (int h = 0; h < NS; ++h) {
        __m512i v = is[h][r];
        if (!Q4) v = _mm512_sub_epi32(v, _mm512_set1_epi32(HALF ? x.sh[2 * at + h] : x.si[at]));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), _mm512_mul_ps(dv[h], dxv), acc[r]);
      }
      if (MIN) acc[r] = _mm512_fmadd_ps(mv, _mm512_set1_ps(x.sx[at]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * ldo, acc[r]);
}

template <typename S>
__attribute__((target("avx2,fma,f16c")))
inline __m256 load8(const S* p) {
  if constexpr (std::is_same_v<S, float>) return _mm256_loadu_ps(p);
  else return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
}

// The AVX-512 tile on 256-bit registers, one half of 8 output rows at a time (each 64-byte chunk holds both
// halves; doing them one after the other keeps every accumulator of 4 activation rows in the 16 ymm registers).
// 4-bit weights: vpmaddubsw gives int16 sums of two products, at most 2 x 15 x 127 = 3810, so the 8 of a
// group add up in int16 (at most 30480, no overflow) before one vpmaddwd widens them: the same exact int32
// sum as 8 dot4s, in about half the instructions. 8-bit weights are stored + 128 (unsigned); vpmaddubsw would
// saturate on those, so the signed weight w = stored ^ 0x80 is multiplied as |w| x (x with w's sign) (exact),
// which gives sum(w x) directly: the same int32 as sum((w + 128) x) - 128 sum(x), so no offset is subtracted.
// The fp32 steps are the scalar ones, lane by lane.
template <bool Q4, bool MIN, bool HALF, typename S, int R>
__attribute__((target("avx2,fma,f16c")))
void tile_avx2(const uint8_t* qs, const S* d, const S* m, const Rows& x, int64_t row0, float* out,
               int64_t ldo) {
  constexpr int NS = HALF ? 2 : 1;
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i flip = _mm256_set1_epi8((char)0x80);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int j = 0; j < 2; ++j) {
    __m256 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < x.G; ++g) {
      __m256i is[NS][R];
      if (Q4) {
        const uint8_t* p = qs + g * 256 + j * 32;
        if (j == 0) {  // the first pass over the tile's groups: fetch ahead
          for (int c = 0; c < 4; ++c) _mm_prefetch((const char*)(p + PREFETCH + c * 64), _MM_HINT_T0);
          if ((g & 1) == 0) {
            _mm_prefetch((const char*)(d + g * TILE) + PREFETCH / 8, _MM_HINT_T0);
            if (MIN) _mm_prefetch((const char*)(m + g * TILE) + PREFETCH / 8, _MM_HINT_T0);
          }
        }
        __m256i s16[R];
        for (int r = 0; r < R; ++r) s16[r] = _mm256_setzero_si256();
        for (int c = 0; c < 4; ++c) {
          const __m256i v = _mm256_loadu_si256((const __m256i*)(p + c * 64));
          const __m256i lo = _mm256_and_si256(v, low);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
          for (int r = 0; r < R; ++r) {
            const int8_t* xg = x.q + (row0 + r) * x.K + g * GROUP + c * 8;
            s16[r] = _mm256_add_epi16(s16[r], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(word(xg))));
            s16[r] = _mm256_add_epi16(s16[r], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(word(xg + 4))));
          }
        }
        for (int r = 0; r < R; ++r) is[0][r] = _mm256_madd_epi16(s16[r], ones);
      } else {
        for (int h = 0; h < NS; ++h)
          for (int r = 0; r < R; ++r) is[h][r] = _mm256_setzero_si256();
        const uint8_t* p = qs + g * 512 + j * 32;
        if (j == 0) {  // the first pass over the tile's groups: fetch ahead
          for (int c = 0; c < 8; ++c) _mm_prefetch((const char*)(p + PREFETCH + c * 64), _MM_HINT_T0);
          if ((g & 1) == 0) _mm_prefetch((const char*)(d + g * NS * TILE) + PREFETCH / 16, _MM_HINT_T0);
        }
        for (int c = 0; c < 8; ++c) {
          const int h = HALF && c >= 4;
          const __m256i w = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(p + c * 64)), flip);
          const __m256i aw = _mm256_sign_epi8(w, w);
          for (int r = 0; r < R; ++r) {
            const int8_t* xg = x.q + (row0 + r) * x.K + g * GROUP + c * 4;
            const __m256i xv = _mm256_sign_epi8(_mm256_set1_epi32(word(xg)), w);
            is[h][r] = _mm256_add_epi32(is[h][r], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xv), ones));
          }
        }
      }
      __m256 dv[NS];
      for (int h = 0; h < NS; ++h) dv[h] = load8(d + (g * NS + h) * TILE + j * 8);
      const __m256 mv = MIN ? load8(m + g * TILE + j * 8) : _mm256_setzero_ps();
      for (int r = 0; r < R; ++r) {
        const int64_t at = (row0 + r) * x.G + g;
        const __m256 dxv = _mm256_set1_ps(x.dx[at]);
        for (int h = 0; h < NS; ++h)
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[h][r]), _mm256_mul_ps(dv[h], dxv), acc[r]);
        if (MIN) acc[r] = _mm256_fmadd_ps(mv, _mm256_set1_ps(x.sx[at]), acc[r]);
      }
    }
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + r * ldo + j * 8, acc[r]);
  }
}

template <bool Q4, bool MIN, bool HALF, typename S>
void run_tile(bool simd, const uint8_t* qs, const S* d, const S* m, const Rows& x, int64_t M, float* out,
              int64_t ldo) {
  int64_t row = 0;
  if (simd && simd_level() == 1) {
    for (; row + 4 <= M; row += 4) tile_avx2<Q4, MIN, HALF, S, 4>(qs, d, m, x, row, out + row * ldo, ldo);
    switch (M - row) {
      case 3: tile_avx2<Q4, MIN, HALF, S, 3>(qs, d, m, x, row, out + row * ldo, ldo); break;
      case 2: tile_avx2<Q4, MIN, HALF, S, 2>(qs, d, m, x, row, out + row * ldo, ldo); break;
      case 1: tile_avx2<Q4, MIN, HALF, S, 1>(qs, d, m, x, row, out + row * ldo, ldo); break;
      default: break;
    }
    return;
  }
  if (simd) {
    for (; row + 4 <= M; row += 4) tile_avx512<Q4, MIN, HALF, S, 4>(qs, d, m, x, row, out + row * ldo, ldo);
    switch (M - row) {
      case 3: tile_avx512<Q4, MIN, HALF, S, 3>(qs, d, m, x, row, out + row * ldo, ldo); break;
      case 2: tile_avx512<Q4, MIN, HALF, S, 2>(qs, d, m, x, row, out + row * ldo, ldo); break;
      case 1: tile_avx512<Q4, MIN, HALF, S, 1>(qs, d, m, x, row, out + row * ldo, ldo); break;
      default: break;
    }
    return;
  }
  for (; row < M; ++row) tile_scalar<Q4, MIN, HALF, S>(qs, d, m, x, row, out + row * ldo);
}

// tiles [t0, t1) of the output (each 16 columns of every row): the unit a thread takes
template <bool Q4, bool MIN, bool HALF, typename S>
void run_tiles(bool simd, const uint8_t* qs, const S* d, const S* m, const Rows& x, int64_t M, int64_t T,
               int64_t t0, int64_t t1, float* out) {
  const int64_t G = x.G;
  const int64_t tile_bytes = G * (Q4 ? 256 : 512);
  const int64_t tile_scales = G * (HALF ? 2 : 1) * TILE;
  const int64_t ldo = T * TILE;
  for (int64_t t = t0; t < t1; ++t)
    run_tile<Q4, MIN, HALF, S>(simd, qs + t * tile_bytes, d + t * tile_scales, MIN ? m + t * G * TILE : nullptr,
                               x, M, out + t * TILE, ldo);
}

// A packed weight as the kernel reads it (`group_gemm`'s arguments, checked).
struct Packed {
  const uint8_t* qs;
  const void* d;
  const void* m;  // nullptr: no minimum
  const float* cs;  // column scale or nullptr
  bool f32;  // scale type: float, else c10::Half
  int64_t bits;
  bool half;  // one scale per 16 inputs
  int64_t T, K, G;
};

Packed packed_of(const torch::Tensor& qs, const torch::Tensor& d, const torch::Tensor& m,
                 const torch::Tensor& col_scale, int64_t bits, int64_t K) {
  TORCH_CHECK(bits == 4 || bits == 8, "bits must be 4 or 8");
  const int64_t G = K / GROUP, T = qs.size(0);
  TORCH_CHECK(K % GROUP == 0 && qs.dim() == 3 && qs.size(1) == G && qs.size(2) == (bits == 4 ? 256 : 512) &&
                  qs.scalar_type() == at::kByte,
              "packed weight does not match the input's width");
  const bool f32 = d.scalar_type() == at::kFloat;
  TORCH_CHECK((f32 || d.scalar_type() == at::kHalf) && d.is_contiguous() && qs.is_contiguous(), "bad scales");
  TORCH_CHECK(d.dim() == 3 && d.size(0) == T && (d.size(1) == G || d.size(1) == 2 * G) && d.size(2) == TILE,
              "scales must be [T, G or 2G, 16]");
  const bool half = d.size(1) == 2 * G;
  const bool has_min = m.numel() > 0;
  TORCH_CHECK(bits == 8 || (has_min && !half), "4-bit weights take a minimum and one scale per group");
  TORCH_CHECK(!has_min || (m.scalar_type() == d.scalar_type() && m.is_contiguous() && m.numel() == T * G * TILE),
              "minimums must be [T, G, 16] of the scales' type");
  TORCH_CHECK(col_scale.numel() == 0 || (col_scale.numel() == K && col_scale.scalar_type() == at::kFloat &&
                                         col_scale.is_contiguous()),
              "col_scale must have K entries");
  return Packed{qs.data_ptr<uint8_t>(), d.data_ptr(), has_min ? m.data_ptr() : nullptr,
                col_scale.numel() ? col_scale.data_ptr<float>() : nullptr, f32, bits, half, T, K, G};
}

template <typename S>
void tiles_of(const Packed& w, bool simd, const Rows& x, int64_t M, int64_t t0, int64_t t1, float* out) {
  const S* d = (const S*)w.d;
  const S* m = (const S*)w.m;
  const bool has_min = m != nullptr;
  if (w.bits == 4) run_tiles<true, true, false, S>(simd, w.qs, d, m, x, M, w.T, t0, t1, out);
  else if (w.half && has_min) run_tiles<false, true, true, S>(simd, w.qs, d, m, x, M, w.T, t0, t1, out);
  else if (w.half) run_tiles<false, false, true, S>(simd, w.qs, d, m, x, M, w.T, t0, t1, out);
  else if (has_min) run_tiles<false, true, false, S>(simd, w.qs, d, m, x, M, w.T, t0, t1, out);
  else run_tiles<false, false, false, S>(simd, w.qs, d, m, x, M, w.T, t0, t1, out);
}

// out [M, 16 T] = tiles [t0, t1) of x (quantised rows) times w
void gemm_tiles(const Packed& w, bool simd, const Rows& x, int64_t M, int64_t t0, int64_t t1, float* out) {
  if (w.f32) tiles_of<float>(w, simd, x, M, t0, t1, out);
  else tiles_of<c10::Half>(w, simd, x, M, t0, t1, out);
}

// Activation rows quantised per group, in scratch that lives as long as the thread (no allocation per call; a
// decode step makes ~120 GEMMs). Rows [r0, r1) of x [M, K] (times the column scale cs, when given).
struct RowScratch {
  std::vector<int8_t> q;
  std::vector<float> dx, sx;
  std::vector<int32_t> si, sh;
  Rows reserve(int64_t M, int64_t K) {
    const int64_t G = K / GROUP;
    if ((int64_t)q.size() < M * K) q.resize(M * K);
    if ((int64_t)dx.size() < M * G) { dx.resize(M * G); sx.resize(M * G); si.resize(M * G); sh.resize(2 * M * G); }
    return Rows{q.data(), dx.data(), sx.data(), si.data(), sh.data(), K, G};
  }
};

// Groups [g0, g1) of row r of x [M, K] (times the column scale cs, when given) into `rows`: groups are
// quantised independently, so a row quantised in pieces (by several threads) is bitwise the row quantised whole.
void quantize_groups(bool simd, const float* x, const float* cs, const Rows& rows, int64_t r, int64_t g0,
                     int64_t g1) {
  const int64_t K = rows.K, G = rows.G, k0 = g0 * GROUP, n = (g1 - g0) * GROUP, at = r * G + g0;
  const float* xr = x + r * K + k0;
  const float* c = cs ? cs + k0 : nullptr;
  int8_t* q = const_cast<int8_t*>(rows.q) + r * K + k0;
  float* dx = const_cast<float*>(rows.dx) + at;
  float* sx = const_cast<float*>(rows.sx) + at;
  int32_t* si = const_cast<int32_t*>(rows.si) + at;
  int32_t* sh = const_cast<int32_t*>(rows.sh) + 2 * at;
  if (simd && simd_level() == 2) quantize_avx512(xr, c, n, q, dx, sx, si, sh);
  else if (simd && simd_level() == 1) quantize_avx2(xr, c, n, q, dx, sx, si, sh);
  else quantize_scalar(xr, c, n, q, dx, sx, si, sh);
}

// Rows [r0, r1) of x [M, K], whole.
void quantize_rows(bool simd, const float* x, const float* cs, const Rows& rows, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) quantize_groups(simd, x, cs, rows, r, 0, rows.G);
}

}  // namespace

bool simd_available() { return simd_ok(); }

// How many threads one at::parallel_for of this extension runs on (its team size at the caller's setting):
// 1 if the extension was built without OpenMP, whose parallel_for then runs serially (as the q4 kernel did,
// unnoticed, before `-fopenmp`: decode GEMVs on one core of two).
int64_t parallel_width() {
  std::vector<char> seen(256, 0);
  at::parallel_for(0, 1024, 1, [&](int64_t, int64_t) {
    const int t = at::get_thread_num();
    if (t >= 0 && t < 256) seen[t] = 1;
  });
  int64_t n = 0;
  for (char c : seen) n += c;
  return n;
}

std::string simd_name() {
  const int level = simd_level();
  return level == 2 ? "avx512vnni" : level == 1 ? "avx2" : "scalar";
}

// x [M, K] fp32; qs [T, G, 256 | 512] uint8; d [T, G, 16] or [T, 2G, 16] (one scale per 16 inputs, 8-bit only),
// fp16 or fp32; m [T, G, 16] of d's type (required for 4-bit, optional for 8-bit: empty = none);
// col_scale [K] fp32 or empty (multiplies x before quantisation); returns [M, 16 T] fp32.
torch::Tensor group_gemm(torch::Tensor x, torch::Tensor qs, torch::Tensor d, torch::Tensor m,
                         torch::Tensor col_scale, int64_t bits, bool use_simd) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x must be a 2-D float32 tensor");
  x = x.contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  const Packed w = packed_of(qs, d, m, col_scale, bits, K);
  const bool simd = use_simd && simd_ok();
  thread_local RowScratch scratch;
  const Rows rows = scratch.reserve(M, K);
  const float* xp = x.data_ptr<float>();
  at::parallel_for(0, M, 64, [&](int64_t b, int64_t e) { quantize_rows(simd, xp, w.cs, rows, b, e); });
  auto out = torch::empty({M, w.T * TILE}, x.options());
  float* op = out.data_ptr<float>();
  // at least ~64k multiply-adds per task: a parallel region costs more than a few tiles of a GEMV
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, M * K * TILE));
  at::parallel_for(0, w.T, grain, [&](int64_t b, int64_t e) { gemm_tiles(w, simd, rows, M, b, e, op); });
  return out;
}
"""

FUNCTIONS = ["group_gemm", "parallel_width", "simd_available", "simd_name"]
