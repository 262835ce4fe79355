"""The C++ source of the per-row ops that sit between the group GEMMs (built into the same extension).

Why: once the q4/q8 GEMVs run in the group kernel, a decode step of SmolLM2-135M spends about as long in
the small ops between them as in the GEMMs. RMSNorm alone was 5 ATen ops (`pow`, `mean`, `add_`, `rsqrt_`,
`mul`) per norm, 60 norms a token: 3.5 ms of a 26 ms token on a 2-core AMD EPYC (`benchmarks/decode_profile.py`),
nearly all of it dispatch; decode attention (gather, two bmm, softmax) was 3 ms, SwiGLU 1.1 ms. Here a residual
add and the norm that reads it are one call, decode attention reads the paged pool in one call, and SwiGLU is
one call. Measured on that machine, q4 decode with an 8-bit head, 2 threads: 44 -> 54 tok/s (norms), -> 58.7
(attention), -> 66.6 (SwiGLU).

Numerics: per row, the sum of squares runs in 8 interleaved fp32 partial sums (lane l takes columns
l, l + 8, ...), added in a fixed tree at the end, then `1 / sqrt(sum / K + eps)`, then one multiply per value;
with `-ffp-contract=off` the compiler may vectorise the lanes but not reorder them. Attention's dot products
use the same lanes; its softmax and weighted sum run in slot order. SwiGLU is `g / (1 + e^-g) * u` per value
with libm's `expf` (ATen's uses Sleef's). So a row's result depends on that row only: the same alone, in any
batch and on any number of threads (rows are split across threads, never a row; attention's tasks are (row,
query head)). The AVX2 attention runs the scalar loops' exact operations per value, only more of them at once:
4 slots' scores in 4 independent chains, and 64 output values held in registers across the slots (measured on
the 2-core AVX2 EPYC: the decode attention of a 128-token generation fell from ~0.72 to ~0.41 ms a token on the
calling thread, with the padded tail skipped and 9 tasks in place of 3). The orders differ from
ATen's, so the values differ from the ATen path's in the last bits; the quantised modes, which already differ
from fp32 by their weights, use these ops, fp32 and int8 keep ATen's (`models/decoder.py`).
"""

SOURCE = r"""
namespace {

constexpr int LANES = 8;

inline float dot_lanes(const float* a, const float* b, int64_t D) {
  float acc[LANES] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + LANES <= D; k += LANES)
    for (int l = 0; l < LANES; ++l) acc[l] += a[k + l] * b[k + l];
  for (int l = 0; k < D; ++k, ++l) acc[l] += a[k] * b[k];
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

inline float row_inv_rms(const float* x, int64_t K, float eps) {
  return 1.0f / std::sqrt(dot_lanes(x, x, K) / (float)K + eps);
}

void check_rows(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 2 && t.scalar_type() == at::kFloat && t.is_contiguous() && t.device().is_cpu(),
              name, " must be a contiguous 2-D float32 CPU tensor");
}

// out = (res [+= delta]) * 1/rms per row, then times `weight` per column when given (a second rounding)
void normalize_rows(float* res, const float* delta, float* out, int64_t M, int64_t K, float eps,
                    const float* weight = nullptr) {
  // a norm is ~K multiply-adds: thread only when there are many rows (prefill), whole rows per thread
  at::parallel_for(0, M, std::max<int64_t>(1, 16384 / std::max<int64_t>(1, K)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      float* x = res + r * K;
      if (delta)
        for (int64_t k = 0; k < K; ++k) x[k] += delta[r * K + k];
      const float inv = row_inv_rms(x, K, eps);
      float* y = out + r * K;
      if (weight)
        for (int64_t k = 0; k < K; ++k) y[k] = (x[k] * inv) * weight[k];
      else
        for (int64_t k = 0; k < K; ++k) y[k] = x[k] * inv;
    }
  });
}

}  // namespace

namespace {

// Columns [k0, k1) of one row: o[k] = silu(g[k]) * u[k], g = gate_up[0, inter), u = gate_up[inter, 2 inter);
// silu(g) = g / (1 + e^-g)
inline void swiglu_row(const float* gate_up, float* o, int64_t inter, int64_t k0, int64_t k1) {
  const float* u = gate_up + inter;
  for (int64_t k = k0; k < k1; ++k) o[k] = gate_up[k] / (1.0f + std::exp(-gate_up[k])) * u[k];
}

}  // namespace

// swiglu_row per row of gate_up [M, 2 * inter] (gate half, then up half) -> [M, inter], contiguous for the
// down GEMM
torch::Tensor swiglu_rows(torch::Tensor gate_up, int64_t inter) {
  check_rows(gate_up, "gate_up");
  TORCH_CHECK(gate_up.size(1) == 2 * inter, "gate_up must be [M, 2 * inter]");
  const int64_t M = gate_up.size(0);
  auto out = torch::empty({M, inter}, gate_up.options());
  const float* gu = gate_up.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, M, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, inter)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) swiglu_row(gu + r * 2 * inter, op + r * inter, inter, 0, inter);
  });
  return out;
}

namespace {

// The same 8 lanes as dot_lanes, one 256-bit register (a multiply, then an add: the scalar loop's roundings),
// summed in the same tree: bitwise dot_lanes.
__attribute__((target("avx2")))
inline float dot_lanes_avx2(const float* a, const float* b, int64_t D) {
  __m256 acc = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + LANES <= D; k += LANES)
    acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(a + k), _mm256_loadu_ps(b + k)));
  float l[LANES];
  _mm256_storeu_ps(l, acc);
  for (int i = 0; k < D; ++k, ++i) l[i] += a[k] * b[k];
  return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

__attribute__((target("avx2")))
inline void add_scaled_avx2(float* o, float w, const float* v, int64_t D) {  // o += w * v, value by value
  const __m256 wv = _mm256_set1_ps(w);
  int64_t d = 0;
  for (; d + 8 <= D; d += 8)
    _mm256_storeu_ps(o + d, _mm256_add_ps(_mm256_loadu_ps(o + d), _mm256_mul_ps(wv, _mm256_loadu_ps(v + d))));
  for (; d < D; ++d) o[d] += w * v[d];
}

// Scores of 4 slots at once against one query: 4 independent dot_lanes_avx2 chains (the same multiply, add and
// tree per slot, so each score is bitwise dot_lanes), for the instruction-level parallelism one chain lacks.
__attribute__((target("avx2")))
inline void dot4_avx2(const float* q, const float* k0, const float* k1, const float* k2, const float* k3,
                      int64_t D, float* out) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  for (int64_t k = 0; k < D; k += LANES) {  // D % 8 == 0 (the caller checks)
    const __m256 qv = _mm256_loadu_ps(q + k);
    a0 = _mm256_add_ps(a0, _mm256_mul_ps(qv, _mm256_loadu_ps(k0 + k)));
    a1 = _mm256_add_ps(a1, _mm256_mul_ps(qv, _mm256_loadu_ps(k1 + k)));
    a2 = _mm256_add_ps(a2, _mm256_mul_ps(qv, _mm256_loadu_ps(k2 + k)));
    a3 = _mm256_add_ps(a3, _mm256_mul_ps(qv, _mm256_loadu_ps(k3 + k)));
  }
  float l[4][LANES];
  _mm256_storeu_ps(l[0], a0);
  _mm256_storeu_ps(l[1], a1);
  _mm256_storeu_ps(l[2], a2);
  _mm256_storeu_ps(l[3], a3);
  for (int i = 0; i < 4; ++i)
    out[i] = ((l[i][0] + l[i][4]) + (l[i][2] + l[i][6])) + ((l[i][1] + l[i][5]) + (l[i][3] + l[i][7]));
}

// o[0, D) = sum over slots of w_l * v_l, each value accumulated in slot order (a multiply, then an add, from 0:
// the scalar loop's roundings), 64 values at a time held in registers across the slots.
__attribute__((target("avx2")))
inline void weighted_sum_avx2(float* o, const float* w, const float* kv, const int64_t* idx, int64_t L,
                              int64_t D) {
  for (int64_t d0 = 0; d0 < D; d0 += 64) {  // D % 8 == 0
    const int n = (int)std::min<int64_t>(8, (D - d0) / LANES);
    __m256 acc[8];
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
    for (int64_t l = 0; l < L; ++l) {
      const __m256 wv = _mm256_set1_ps(w[l]);
      const float* v = kv + idx[l] * D + d0;
      for (int j = 0; j < n; ++j) acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(wv, _mm256_loadu_ps(v + j * LANES)));
    }
    for (int j = 0; j < n; ++j) _mm256_storeu_ps(o + d0 + j * LANES, acc[j]);
  }
}

// One decode attention call's arguments; its work is B * H tasks (row b, query head), each independent.
struct Attention {
  const float* q;  // [B, H*D], row stride qstride
  int64_t qstride;
  const float* kv;  // [2*KVH, S, D]
  const int64_t* gather;  // [B, L]
  const float* mask;  // [B, L] or nullptr
  const float* sinks;  // [KVH, G] or nullptr
  float* out;  // [B, H*D], zeroed
  int64_t B, KVH, S, D, L, H, G;
};

Attention attention_of(const torch::Tensor& q, const torch::Tensor& kvc, const torch::Tensor& gather,
                       const torch::Tensor& mask, const torch::Tensor& sinks, int64_t kv_heads,
                       const torch::Tensor& out) {
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kFloat && q.stride(1) == 1, "q must be [B, H*D] float32");
  TORCH_CHECK(kvc.dim() == 3 && kvc.scalar_type() == at::kFloat && kvc.is_contiguous(), "kvc must be [2KVH, S, D]");
  TORCH_CHECK(gather.dim() == 2 && gather.scalar_type() == at::kLong && gather.is_contiguous(), "gather: [B, L] int64");
  const int64_t B = q.size(0), KVH = kv_heads, S = kvc.size(1), D = kvc.size(2), L = gather.size(1);
  TORCH_CHECK(kvc.size(0) == 2 * KVH && q.size(1) % (D * KVH) == 0 && gather.size(0) == B, "shapes disagree");
  const int64_t H = q.size(1) / D, G = H / KVH;
  const bool has_mask = mask.numel() > 0, has_sinks = sinks.numel() > 0;
  TORCH_CHECK(!has_mask || (mask.scalar_type() == at::kFloat && mask.is_contiguous() && mask.numel() == B * L),
              "mask must be [B, L] float32");
  TORCH_CHECK(!has_sinks || (sinks.scalar_type() == at::kFloat && sinks.is_contiguous() && sinks.numel() == H),
              "sinks must be [KVH, G] float32");
  TORCH_CHECK(out.is_contiguous() && out.size(0) == B && out.size(1) == H * D, "out must be [B, H*D]");
  return Attention{q.data_ptr<float>(), q.stride(0), kvc.data_ptr<float>(), gather.data_ptr<int64_t>(),
                   has_mask ? mask.data_ptr<float>() : nullptr, has_sinks ? sinks.data_ptr<float>() : nullptr,
                   out.data_ptr<float>(), B, KVH, S, D, L, H, G};
}

// Task (row b, query head hq, reading KV head hq / G): scores in slot order, max, e^(s - max) summed in slot
// order (+ e^(sink - max)), then the values weighted in slot order. `p` holds L floats. One task per query head,
// not per KV head: 9 tasks for SmolLM2's 9 heads (3 KV heads) share out over 2 threads as 5 + 4, not 2 + 1.
void attention_task(const Attention& a, int64_t task, float* p, bool simd) {
  const int64_t b = task / a.H, hq = task % a.H, h = hq / a.G, D = a.D;
  const int64_t* idx = a.gather + b * a.L;
  // The padding at the end of a row's context (mask -inf: the row's length rounded up to DECODE_BUCKET) is
  // skipped: its weight is e^-inf = 0, so it changes no max, no sum and no weighted value (0 x a finite value
  // added is exact), and the result is bitwise the one with the padding computed, at up to 63 slots less work.
  int64_t L = a.L;
  if (a.mask)
    while (L > 1 && a.mask[b * a.L + L - 1] == -INFINITY) --L;  // (a row masked whole keeps its NaNs)
  const float* qrow = a.q + b * a.qstride + hq * D;
  const float* keys = a.kv + h * a.S * D;
  const float* values = a.kv + (a.KVH + h) * a.S * D;
  const bool fast = simd && D % LANES == 0;
  int64_t l = 0;
  if (fast)
    for (; l + 4 <= L; l += 4)
      dot4_avx2(qrow, keys + idx[l] * D, keys + idx[l + 1] * D, keys + idx[l + 2] * D, keys + idx[l + 3] * D, D,
                p + l);
  for (; l < L; ++l) p[l] = simd ? dot_lanes_avx2(qrow, keys + idx[l] * D, D) : dot_lanes(qrow, keys + idx[l] * D, D);
  if (a.mask)
    for (l = 0; l < L; ++l) p[l] = p[l] + a.mask[b * a.L + l];
  float mx = a.sinks ? a.sinks[hq] : -INFINITY;
  for (l = 0; l < L; ++l) mx = std::fmax(mx, p[l]);
  float sum = 0.0f;
  for (l = 0; l < L; ++l) {
    p[l] = std::exp(p[l] - mx);
    sum += p[l];
  }
  if (a.sinks) sum += std::exp(a.sinks[hq] - mx);
  const float inv = 1.0f / sum;
  for (l = 0; l < L; ++l) p[l] *= inv;
  float* orow = a.out + b * a.H * D + hq * D;
  if (fast) {
    weighted_sum_avx2(orow, p, values, idx, L, D);
    return;
  }
  for (l = 0; l < L; ++l) {
    const float* val = values + idx[l] * D;
    if (simd) {
      add_scaled_avx2(orow, p[l], val, D);
      continue;
    }
    const float w = p[l];
    for (int64_t d = 0; d < D; ++d) orow[d] += w * val[d];
  }
}

inline bool attention_simd() { return simd_level() >= 1; }

}  // namespace

// One decode row's attention per (row, KV head), read straight from the paged pool through the row's gather
// list: q [B, H*D] (row stride free), kvc [2*KVH, S, D] (key heads, then value heads), gather [B, L] int64 slots,
// mask [B, L] additive (padding: -inf) or empty, sinks [KVH, G] logits or empty. Returns [B, H*D].
// A row's result depends on that row only (`attention_task`); `use_simd`: AVX2 where the CPU has it, bitwise
// the scalar loops.
torch::Tensor decode_attention(torch::Tensor q, torch::Tensor kvc, torch::Tensor gather, torch::Tensor mask,
                               torch::Tensor sinks, int64_t kv_heads, bool use_simd) {
  TORCH_CHECK(q.dim() == 2 && kvc.dim() == 3, "q must be [B, H*D] and kvc [2KVH, S, D]");
  auto out = torch::zeros({q.size(0), q.size(1)}, q.options().memory_format(at::MemoryFormat::Contiguous));
  const Attention a = attention_of(q, kvc, gather, mask, sinks, kv_heads, out);
  const bool simd = use_simd && attention_simd();
  const int64_t grain = std::max<int64_t>(1, 32768 / std::max<int64_t>(1, a.L * a.D));
  at::parallel_for(0, a.B * a.H, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> p(a.L);
    for (int64_t task = begin; task < end; ++task) attention_task(a, task, p.data(), simd);
  });
  return out;
}

// x [M, K] -> x * 1/sqrt(mean(x^2) + eps) per row (a new tensor)
torch::Tensor rms_rows(torch::Tensor x, double eps) {
  check_rows(x, "x");
  auto out = torch::empty_like(x);
  normalize_rows(x.data_ptr<float>(), nullptr, out.data_ptr<float>(), x.size(0), x.size(1), (float)eps);
  return out;
}

// x [M, K] -> rms_rows(x) * weight per column: the final norm before a quantised LM head (the fused decode step
// makes the same calls, so its logits are the Python path's)
torch::Tensor rms_weighted_rows(torch::Tensor x, torch::Tensor weight, double eps) {
  check_rows(x, "x");
  TORCH_CHECK(weight.dim() == 1 && weight.numel() == x.size(1) && weight.scalar_type() == at::kFloat &&
                  weight.is_contiguous(),
              "weight must be [K] float32");
  auto out = torch::empty_like(x);
  normalize_rows(x.data_ptr<float>(), nullptr, out.data_ptr<float>(), x.size(0), x.size(1), (float)eps,
                 weight.data_ptr<float>());
  return out;
}

// residual += delta (in place), then rms_rows(residual): the residual stream's add and the next norm in one call
torch::Tensor add_rms_rows_(torch::Tensor residual, torch::Tensor delta, double eps) {
  check_rows(residual, "residual");
  delta = delta.contiguous();  // an MoE layer's sum may arrive as a view
  check_rows(delta, "delta");
  TORCH_CHECK(delta.sizes() == residual.sizes(), "delta must have the residual's shape");
  auto out = torch::empty_like(residual);
  normalize_rows(residual.data_ptr<float>(), delta.data_ptr<float>(), out.data_ptr<float>(), residual.size(0),
                 residual.size(1), (float)eps);
  return out;
}
"""

FUNCTIONS = ["add_rms_rows_", "decode_attention", "rms_rows", "rms_weighted_rows", "swiglu_rows"]
