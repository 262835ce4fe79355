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
(unsigned) and subtracts 128 x sum(qx) per group in int32 (exact). Scales (and 4-bit minimums) are fp16, 16
rows contiguous per group.

Numerics: every int32 group sum is exact; the fp32 part per output is, group after group,
`acc = fma(float(isum), d * dx, acc)` then (4-bit) `acc = fma(m, dx * sum(qx), acc)`, in the same order
whatever the batch, the tile split across threads or the code path (the scalar fallback does the identical
operations, `std::fma` included), so a row's result is bitwise the same alone or in any batch, on any number
of threads. Rows of the batch are processed up to 4 at a time against one load of the weights (prefill),
which changes no operation of any row.

Threads: `at::parallel_for` over tiles of output rows (PyTorch's intra-op pool, the caller's thread count).
CPU features are checked at run time (`__builtin_cpu_supports`): the AVX-512 code is compiled with a target
attribute, so the module builds without `-march=native` and runs (scalar) on CPUs without VNNI.
"""

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <immintrin.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int GROUP = 32;
constexpr int TILE = 16;

struct Rows {  // activation rows quantised per group of 32
  const int8_t* q;    // [M, K]
  const float* dx;    // [M, G] activation scale per group
  const float* sx;    // [M, G] dx * sum(q) (4-bit minimum term)
  const int32_t* si;  // [M, G] 128 * sum(q) (8-bit offset)
  int64_t K, G;
};

inline bool simd_ok() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  return ok;
}

// ---------------------------------------------------------------- activation quantisation
void quantize_scalar(const float* x, const float* cs, int64_t K, int8_t* q, float* dx, float* sx, int32_t* si) {
  const int64_t G = K / GROUP;
  for (int64_t g = 0; g < G; ++g) {
    float v[GROUP];
    float amax = 0.0f;
    for (int j = 0; j < GROUP; ++j) {
      v[j] = cs ? x[g * GROUP + j] * cs[g * GROUP + j] : x[g * GROUP + j];
      amax = std::fmax(amax, std::fabs(v[j]));
    }
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    int32_t s = 0;
    for (int j = 0; j < GROUP; ++j) {
      const int32_t qi = (int32_t)std::nearbyint(v[j] * inv);
      q[g * GROUP + j] = (int8_t)qi;
      s += qi;
    }
    dx[g] = amax / 127.0f;
    sx[g] = dx[g] * (float)s;
    si[g] = 128 * s;
  }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
void quantize_avx512(const float* x, const float* cs, int64_t K, int8_t* q, float* dx, float* sx, int32_t* si) {
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
    const int32_t s = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
    dx[g] = amax / 127.0f;
    sx[g] = dx[g] * (float)s;
    si[g] = 128 * s;
  }
}

// ---------------------------------------------------------------- tile kernels (16 output rows)
inline int32_t word(const int8_t* p) { int32_t w; std::memcpy(&w, p, 4); return w; }

template <bool Q4>
void tile_scalar(const uint8_t* qs, const c10::Half* d, const c10::Half* m, const Rows& x, int64_t row,
                 float* out) {
  float acc[TILE];
  for (int r = 0; r < TILE; ++r) acc[r] = 0.0f;
  const int8_t* xq = x.q + row * x.K;
  for (int64_t g = 0; g < x.G; ++g) {
    int32_t is[TILE] = {0};
    const int8_t* xg = xq + g * GROUP;
    if (Q4) {
      const uint8_t* p = qs + g * 256;
      for (int c = 0; c < 4; ++c)
        for (int r = 0; r < TILE; ++r)
          for (int b = 0; b < 4; ++b) {
            const uint8_t byte = p[c * 64 + r * 4 + b];
            is[r] += (int32_t)(byte & 15) * xg[c * 8 + b] + (int32_t)(byte >> 4) * xg[c * 8 + 4 + b];
          }
    } else {
      const uint8_t* p = qs + g * 512;
      for (int c = 0; c < 8; ++c)
        for (int r = 0; r < TILE; ++r)
          for (int b = 0; b < 4; ++b) is[r] += (int32_t)p[c * 64 + r * 4 + b] * xg[c * 4 + b];
    }
    const float dxg = x.dx[row * x.G + g];
    for (int r = 0; r < TILE; ++r) {
      int32_t v = is[r];
      if (!Q4) v -= x.si[row * x.G + g];
      const float scale = (float)d[g * TILE + r] * dxg;
      acc[r] = std::fma((float)v, scale, acc[r]);
      if (Q4) acc[r] = std::fma((float)m[g * TILE + r], x.sx[row * x.G + g], acc[r]);
    }
  }
  for (int r = 0; r < TILE; ++r) out[r] = acc[r];
}

template <bool Q4, int R>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,fma")))
void tile_avx512(const uint8_t* qs, const c10::Half* d, const c10::Half* m, const Rows& x, int64_t row0,
                 float* out, int64_t ldo) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int64_t g = 0; g < x.G; ++g) {
    __m512i is[R];
    for (int r = 0; r < R; ++r) is[r] = _mm512_setzero_si512();
    if (Q4) {
      const uint8_t* p = qs + g * 256;
      for (int c = 0; c < 4; ++c) {
        const __m512i v = _mm512_loadu_si512((const void*)(p + c * 64));
        const __m512i lo = _mm512_and_si512(v, low);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        for (int r = 0; r < R; ++r) {
          const int8_t* xg = x.q + (row0 + r) * x.K + g * GROUP + c * 8;
          is[r] = _mm512_dpbusd_epi32(is[r], lo, _mm512_set1_epi32(word(xg)));
          is[r] = _mm512_dpbusd_epi32(is[r], hi, _mm512_set1_epi32(word(xg + 4)));
        }
      }
    } else {
      const uint8_t* p = qs + g * 512;
      for (int c = 0; c < 8; ++c) {
        const __m512i v = _mm512_loadu_si512((const void*)(p + c * 64));
        for (int r = 0; r < R; ++r) {
          const int8_t* xg = x.q + (row0 + r) * x.K + g * GROUP + c * 4;
          is[r] = _mm512_dpbusd_epi32(is[r], v, _mm512_set1_epi32(word(xg)));
        }
      }
    }
    const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(d + g * TILE)));
    __m512 mv = _mm512_setzero_ps();
    if (Q4) mv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(m + g * TILE)));
    for (int r = 0; r < R; ++r) {
      const int64_t at = (row0 + r) * x.G + g;
      __m512i v = is[r];
      if (!Q4) v = _mm512_sub_epi32(v, _mm512_set1_epi32(x.si[at]));
      const __m512 scale = _mm512_mul_ps(dv, _mm512_set1_ps(x.dx[at]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(v), scale, acc[r]);
      if (Q4) acc[r] = _mm512_fmadd_ps(mv, _mm512_set1_ps(x.sx[at]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * ldo, acc[r]);
}

template <bool Q4>
void run_tile(bool simd, const uint8_t* qs, const c10::Half* d, const c10::Half* m, const Rows& x, int64_t M,
              float* out, int64_t ldo) {
  int64_t row = 0;
  if (simd) {
    for (; row + 4 <= M; row += 4) tile_avx512<Q4, 4>(qs, d, m, x, row, out + row * ldo, ldo);
    switch (M - row) {
      case 3: tile_avx512<Q4, 3>(qs, d, m, x, row, out + row * ldo, ldo); break;
      case 2: tile_avx512<Q4, 2>(qs, d, m, x, row, out + row * ldo, ldo); break;
      case 1: tile_avx512<Q4, 1>(qs, d, m, x, row, out + row * ldo, ldo); break;
      default: break;
    }
    return;
  }
  for (; row < M; ++row) tile_scalar<Q4>(qs, d, m, x, row, out + row * ldo);
}

}  // namespace

bool simd_available() { return simd_ok(); }

// x [M, K] fp32; qs [T, G, 256 | 512] uint8; d, m [T, G, 16] fp16 (m: 4-bit only, else empty);
// col_scale [K] fp32 or empty (multiplies x before quantisation); returns [M, 16 T] fp32.
torch::Tensor group_gemm(torch::Tensor x, torch::Tensor qs, torch::Tensor d, torch::Tensor m,
                         torch::Tensor col_scale, int64_t bits, bool use_simd) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x must be a 2-D float32 tensor");
  TORCH_CHECK(bits == 4 || bits == 8, "bits must be 4 or 8");
  x = x.contiguous();
  const int64_t M = x.size(0), K = x.size(1), G = K / GROUP, T = qs.size(0);
  TORCH_CHECK(K % GROUP == 0 && qs.size(1) == G && qs.size(2) == (bits == 4 ? 256 : 512),
              "packed weight does not match the input's width");
  TORCH_CHECK(d.scalar_type() == at::kHalf && d.is_contiguous() && qs.is_contiguous(), "bad scales");
  const bool simd = use_simd && simd_ok();
  const float* cs = col_scale.numel() ? col_scale.data_ptr<float>() : nullptr;
  TORCH_CHECK(!cs || col_scale.numel() == K, "col_scale must have K entries");
  // the quantised activations live in per-thread scratch (no allocation per call; a decode step makes ~120)
  thread_local std::vector<int8_t> q;
  thread_local std::vector<float> dx, sx;
  thread_local std::vector<int32_t> si;
  if ((int64_t)q.size() < M * K) q.resize(M * K);
  if ((int64_t)dx.size() < M * G) { dx.resize(M * G); sx.resize(M * G); si.resize(M * G); }
  const float* xp = x.data_ptr<float>();
  int8_t* qp = q.data();
  float* dxp = dx.data();
  float* sxp = sx.data();
  int32_t* sip = si.data();
  at::parallel_for(0, M, 64, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      if (simd) quantize_avx512(xp + r * K, cs, K, qp + r * K, dxp + r * G, sxp + r * G, sip + r * G);
      else quantize_scalar(xp + r * K, cs, K, qp + r * K, dxp + r * G, sxp + r * G, sip + r * G);
    }
  });
  Rows rows{qp, dxp, sxp, sip, K, G};
  auto out = torch::empty({M, T * TILE}, x.options());
  float* op = out.data_ptr<float>();
  const uint8_t* qsp = qs.data_ptr<uint8_t>();
  const c10::Half* dp = d.data_ptr<c10::Half>();
  const c10::Half* mp = bits == 4 ? m.data_ptr<c10::Half>() : nullptr;
  const int64_t tile_bytes = G * (bits == 4 ? 256 : 512);
  const int64_t ldo = T * TILE;
  // at least ~64k multiply-adds per task: a parallel region costs more than a few tiles of a GEMV
  const int64_t grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, M * K * TILE));
  at::parallel_for(0, T, grain, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const c10::Half* mt = mp ? mp + t * G * TILE : nullptr;
      if (bits == 4) run_tile<true>(simd, qsp + t * tile_bytes, dp + t * G * TILE, mt, rows, M, op + t * TILE, ldo);
      else run_tile<false>(simd, qsp + t * tile_bytes, dp + t * G * TILE, mt, rows, M, op + t * TILE, ldo);
    }
  });
  return out;
}
"""

FUNCTIONS = ["group_gemm", "simd_available"]
