"""The C++ source of the fused decode step: every layer of a quantised decode step in one call, GIL released.

Why: once the group GEMMs and the row ops run in C++ (q4_kernel.py, row_ops_kernel.py), what is left of a
decode step of SmolLM2-135M outside them is Python: the loop over 30 layers, ~15 calls a layer through
pybind11 and the interpreter, and the thread-count toggles around each GEMM (ctypes). Measured on a 2-core
AMD EPYC (AVX2), q4 with an 8-bit head at 2 threads: ~2 ms of a 9.5 ms token (`forward_rest` in
`benchmarks/decode_profile.py`), all of it while holding the GIL that the server's event loop needs to
stream the previous token.

What it does: exactly the calls `DecoderModel.forward` makes for a dense layer, in the same order and on the
same buffers: the qkv GEMM into the step's buffer, RoPE as the same in-place complex multiply, the KV write
(`index_copy_`), decode attention per decode group, the o GEMM, the residual add + norm, gate/up, SwiGLU,
down, and the next norm. The operations are the same ATen and extension functions, so the result is bitwise
the Python loop's (tested), and a row's result still depends on that row only. It is called only for the
steps it covers (decode rows only, dense layers without q/k norm, every matrix in the group layout); any other
step runs the Python loop.

Threads: the GEMMs get `threads` OpenMP threads and everything between them one (`toggle`), as the Python
loop's `many()` does, through the same OpenMP runtime (`omp_set_num_threads` for the calling thread).
"""

SOURCE = r"""
#include <omp.h>
#include <pybind11/pybind11.h>

namespace {

constexpr int64_t PARTS = 4;  // a GEMM's tensors: packed weights, scales, minimums, column scales

torch::Tensor fused_gemm(const torch::Tensor& x, const std::vector<torch::Tensor>& w, int64_t at,
                         int64_t bits, int64_t out_features, const torch::Tensor& bias, bool simd) {
  auto out = group_gemm(x, w[at], w[at + 1], w[at + 2], w[at + 3], bits, simd);
  if (out.size(1) != out_features) out = out.slice(1, 0, out_features).contiguous();
  if (bias.numel() > 0) out.add_(bias);
  return out;
}

}  // namespace

// residual [T, hidden] (the embedded tokens; updated in place and returned: the last layer's output, before the
// final norm); h [T, hidden] its first norm; qkv [T, H*D + 2*KVH*D] the step's buffer; rope [T, H + KVH, D/2]
// complex64, this step's rotation table; slots [T] int64; kv_cache [layers, 2*KVH, S, D].
// Per layer l: weights[16 l ...] = (qkv, o, gate_up, down) x (qs, d, m, col_scale); meta[8 l ...] = their bits
// and out_features; biases[4 l ...] (empty: none); sinks[l] (empty: none); layer_layout[l] the layout it reads.
// Decode groups: groups[3 g ...] = (rows (empty: the range), gather [B, L], mask [B, L] or empty),
// group_meta[3 g ...] = (layout, start, end).
torch::Tensor decode_layers(torch::Tensor residual, torch::Tensor h, torch::Tensor qkv, torch::Tensor rope,
                            torch::Tensor slots, torch::Tensor kv_cache, std::vector<torch::Tensor> weights,
                            std::vector<int64_t> meta, std::vector<torch::Tensor> biases,
                            std::vector<torch::Tensor> sinks, std::vector<int64_t> layer_layout,
                            std::vector<torch::Tensor> groups, std::vector<int64_t> group_meta, int64_t heads,
                            int64_t kv_heads, int64_t head_dim, int64_t inter, double eps, int64_t threads,
                            bool toggle, bool use_simd) {
  const int64_t layers = kv_cache.size(0);
  const int64_t T = residual.size(0);
  const int64_t qs = heads * head_dim, kvs = kv_heads * head_dim;
  TORCH_CHECK((int64_t)weights.size() == 4 * PARTS * layers && (int64_t)meta.size() == 8 * layers &&
                  (int64_t)biases.size() == 4 * layers && (int64_t)sinks.size() == layers &&
                  (int64_t)layer_layout.size() == layers && groups.size() % 3 == 0 &&
                  group_meta.size() == groups.size(),
              "decode_layers: per-layer lists disagree with the cache's layer count");
  TORCH_CHECK(qkv.size(0) == T && qkv.size(1) == qs + 2 * kvs && qkv.is_contiguous(), "decode_layers: bad qkv");
  TORCH_CHECK(rope.is_complex() && rope.size(0) == T && rope.size(1) == heads + kv_heads, "decode_layers: rope");
  pybind11::gil_scoped_release no_gil;
  auto many = [&](int64_t n) { if (toggle) omp_set_num_threads((int)n); };
  auto q = qkv.slice(1, 0, qs);
  auto qk_c = torch::view_as_complex(qkv.slice(1, 0, qs + kvs).view({T, heads + kv_heads, head_dim / 2, 2}));
  auto kv_new = qkv.slice(1, qs).view({T, 2 * kv_heads, head_dim}).transpose(0, 1);
  const int64_t n_groups = (int64_t)groups.size() / 3;
  std::vector<int64_t> decode_rows(64, 0);  // per layout: its decode rows (the end of its last group)
  for (int64_t g = 0; g < n_groups; ++g) {
    const int64_t layout = group_meta[3 * g];
    TORCH_CHECK(layout >= 0 && layout < 64, "decode_layers: layout index");
    decode_rows[layout] = std::max(decode_rows[layout], group_meta[3 * g + 2]);
  }
  auto attend = [&](int64_t layout, const torch::Tensor& kvc, const torch::Tensor& sink) -> torch::Tensor {
    std::vector<int64_t> mine;
    for (int64_t g = 0; g < n_groups; ++g)
      if (group_meta[3 * g] == layout) mine.push_back(g);
    TORCH_CHECK(!mine.empty(), "decode_layers: a layer reads a layout with no decode group");
    if (mine.size() == 1) {
      const int64_t g = mine[0];
      const int64_t start = group_meta[3 * g + 1], end = group_meta[3 * g + 2];
      const auto& rows = groups[3 * g];
      if (rows.numel() == 0 && start == 0 && end == decode_rows[layout])
        return decode_attention(q.slice(0, start, end), kvc, groups[3 * g + 1], groups[3 * g + 2], sink, kv_heads);
    }
    auto out = torch::empty({decode_rows[layout], qs}, q.options());
    for (int64_t g : mine) {
      const int64_t start = group_meta[3 * g + 1], end = group_meta[3 * g + 2];
      const auto& rows = groups[3 * g];
      auto qr = rows.numel() == 0 ? q.slice(0, start, end) : q.index_select(0, rows);
      auto og = decode_attention(qr, kvc, groups[3 * g + 1], groups[3 * g + 2], sink, kv_heads);
      if (rows.numel() == 0) out.slice(0, start, end).copy_(og);
      else out.index_copy_(0, rows, og);
    }
    return out;
  };
  for (int64_t l = 0; l < layers; ++l) {
    const int64_t* mt = meta.data() + 8 * l;
    const int64_t w0 = 4 * PARTS * l;
    auto kvc = kv_cache.select(0, l);
    many(threads);
    qkv.copy_(fused_gemm(h, weights, w0, mt[0], mt[4], biases[4 * l], use_simd));
    many(1);
    qk_c.mul_(rope);
    kvc.index_copy_(1, slots, kv_new);
    auto attn = attend(layer_layout[l], kvc, sinks[l]);
    many(threads);
    auto o = fused_gemm(attn, weights, w0 + PARTS, mt[1], mt[5], biases[4 * l + 1], use_simd);
    many(1);
    h = add_rms_rows_(residual, o, eps);
    many(threads);
    auto gu = fused_gemm(h, weights, w0 + 2 * PARTS, mt[2], mt[6], biases[4 * l + 2], use_simd);
    many(1);
    auto act = swiglu_rows(gu, inter);
    many(threads);
    auto mlp = fused_gemm(act, weights, w0 + 3 * PARTS, mt[3], mt[7], biases[4 * l + 3], use_simd);
    many(1);
    if (l == layers - 1) residual.add_(mlp);
    else h = add_rms_rows_(residual, mlp, eps);
  }
  return residual;
}
"""

FUNCTIONS = ["decode_layers"]
