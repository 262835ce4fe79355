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

Threads: one OpenMP parallel region per step. The calling thread runs everything between GEMMs (and quantises
each GEMM's input) while the others wait at a spinning barrier; then every thread takes an equal share of the
GEMM's 16-row tiles. Why not a parallel region per GEMM, as `group_gemm` alone does: libgomp puts its waiting
threads to sleep at once (its "throttled" spin) when the process holds more OpenMP threads than there are
cores, which is the case as soon as two threads have each run a parallel region (the engine thread, and the
main thread that loaded the model), and each of the ~120 wake-ups a step then cost tens of microseconds.
Measured on a 2-core AMD EPYC (AVX2), SmolLM2-135M q4 with an 8-bit head, batch 1, from the engine thread:
2 threads 60 tok/s with a region per GEMM (slower than 1 thread's 110, so the engine chose 1), 163 tok/s with
one region per step (llama-bench tg at 2 threads on the same file: 156).
"""

SOURCE = r"""
#include <omp.h>
#include <sched.h>
#include <atomic>
#include <exception>
#include <pybind11/pybind11.h>

namespace {

constexpr int64_t PARTS = 4;  // a GEMM's tensors: packed weights, scales, minimums, column scales

// A barrier that spins (then yields): a step's ~240 waits of a few microseconds each. OpenMP's own barrier
// sleeps in the kernel at once whenever the process has more OpenMP threads than cores (libgomp's throttled
// spin: the server's main thread owns a team too), and each wake-up then costs tens of microseconds.
struct SpinBarrier {
  alignas(64) std::atomic<int> arrived{0};
  alignas(64) std::atomic<int> generation{0};
  void wait(int n) {
    if (n <= 1) return;
    const int gen = generation.load(std::memory_order_acquire);
    if (arrived.fetch_add(1, std::memory_order_acq_rel) == n - 1) {
      arrived.store(0, std::memory_order_relaxed);
      generation.fetch_add(1, std::memory_order_release);
      return;
    }
    for (int64_t spins = 0; generation.load(std::memory_order_acquire) == gen; ++spins) {
      // Only a wait far longer than any phase (the other thread was descheduled) yields: CFS hands a yielding
      // thread's core to any runnable task, a niced one included, for a whole time slice (milliseconds), so a
      // yield per short wait made a 2-thread step 5x slower beside one busy nice-19 process.
      if (spins < (1 << 16)) _mm_pause();
      else sched_yield();
    }
  }
};

// One layer matrix: its packed tiles, the output width, the bias (or empty) and the step's output buffer.
struct Matrix {
  Packed w;
  int64_t out_features;
  torch::Tensor bias;
  torch::Tensor out;  // [T, 16 tiles], written tile by tile
  float* out_ptr;
};

// The GEMM's result as the Python path has it: the first out_features columns, contiguous, bias added.
torch::Tensor finished(const Matrix& mx) {
  auto out = mx.out;
  if (out.size(1) != mx.out_features) out = out.slice(1, 0, mx.out_features).contiguous();
  if (mx.bias.numel() > 0) out = out.add_(mx.bias);
  return out;
}

}  // namespace

// residual [T, hidden] (the embedded tokens; updated in place and returned: the last layer's output, before the
// final norm); h [T, hidden] its first norm; qkv [T, H*D + 2*KVH*D] the step's buffer; rope [T, H + KVH, D/2]
// complex64, this step's rotation table; slots [T] int64; kv_cache [layers, 2*KVH, S, D].
// Per layer l: weights[16 l ...] = (qkv, o, gate_up, down) x (qs, d, m, col_scale); meta[8 l ...] = their bits
// and out_features; biases[4 l ...] (empty: none); sinks[l] (empty: none); layer_layout[l] the layout it reads.
// Decode groups: groups[3 g ...] = (rows (empty: the range), gather [B, L], mask [B, L] or empty),
// group_meta[3 g ...] = (layout, start, end). With `head` (the LM head's 4 tensors, 8- or 4-bit) and the final
// norm's weight, returns [hidden state, logits of every row [T, vocab]], else [hidden state]. `threads`: the
// GEMMs' thread count (one parallel region for the step; everything between GEMMs runs on the calling thread
// while the others wait at a spinning barrier).
std::vector<torch::Tensor> decode_layers(torch::Tensor residual, torch::Tensor h, torch::Tensor qkv, torch::Tensor rope,
                            torch::Tensor slots, torch::Tensor kv_cache, std::vector<torch::Tensor> weights,
                            std::vector<int64_t> meta, std::vector<torch::Tensor> biases,
                            std::vector<torch::Tensor> sinks, std::vector<int64_t> layer_layout,
                            std::vector<torch::Tensor> groups, std::vector<int64_t> group_meta, int64_t heads,
                            int64_t kv_heads, int64_t head_dim, int64_t inter, double eps, int64_t threads,
                            bool use_simd, std::vector<torch::Tensor> head, int64_t head_bits, int64_t vocab,
                            torch::Tensor norm_weight) {
  const int64_t layers = kv_cache.size(0);
  const int64_t T = residual.size(0), hidden = residual.size(1);
  const int64_t qs = heads * head_dim, kvs = kv_heads * head_dim;
  TORCH_CHECK((int64_t)weights.size() == 4 * PARTS * layers && (int64_t)meta.size() == 8 * layers &&
                  (int64_t)biases.size() == 4 * layers && (int64_t)sinks.size() == layers &&
                  (int64_t)layer_layout.size() == layers && groups.size() % 3 == 0 &&
                  group_meta.size() == groups.size(),
              "decode_layers: per-layer lists disagree with the cache's layer count");
  TORCH_CHECK(residual.is_contiguous() && residual.scalar_type() == at::kFloat && h.is_contiguous() &&
                  h.sizes() == residual.sizes(),
              "decode_layers: residual and h must be contiguous [T, hidden] float32");
  TORCH_CHECK(qkv.size(0) == T && qkv.size(1) == qs + 2 * kvs && qkv.is_contiguous(), "decode_layers: bad qkv");
  TORCH_CHECK(rope.is_complex() && rope.size(0) == T && rope.size(1) == heads + kv_heads, "decode_layers: rope");
  // every matrix checked and its output buffer made before any work: nothing below throws on bad arguments
  std::vector<Matrix> mats;
  mats.reserve(4 * layers);
  const int64_t widths[4] = {hidden, qs, hidden, inter};  // the input width of qkv, o, gate_up, down
  for (int64_t l = 0; l < layers; ++l)
    for (int64_t j = 0; j < 4; ++j) {
      const int64_t at = 4 * PARTS * l + PARTS * j;
      Packed w = packed_of(weights[at], weights[at + 1], weights[at + 2], weights[at + 3], meta[8 * l + j],
                           widths[j]);
      auto out = torch::empty({T, w.T * TILE}, residual.options());
      TORCH_CHECK(w.T * TILE >= meta[8 * l + 4 + j], "decode_layers: out_features exceed the packed tiles");
      mats.push_back(Matrix{w, meta[8 * l + 4 + j], biases[4 * l + j], out, out.data_ptr<float>()});
    }
  const bool with_head = !head.empty();
  if (with_head) {
    TORCH_CHECK(head.size() == PARTS && norm_weight.numel() == hidden, "decode_layers: head and final norm");
    Packed w = packed_of(head[0], head[1], head[2], head[3], head_bits, hidden);
    TORCH_CHECK(w.T * TILE >= vocab, "decode_layers: the head's vocabulary exceeds its packed tiles");
    auto out = torch::empty({T, w.T * TILE}, residual.options());
    mats.push_back(Matrix{w, vocab, torch::Tensor(), out, out.data_ptr<float>()});
  }
  TORCH_CHECK(mats[2].out_features == 2 * inter && mats[0].out_features == qs + 2 * kvs &&
                  mats[1].out_features == hidden && mats[3].out_features == hidden,
              "decode_layers: matrix shapes disagree with the model's");
  const int64_t n_groups = (int64_t)groups.size() / 3;
  std::vector<int64_t> decode_rows(64, 0);  // per layout: its decode rows (the end of its last group)
  for (int64_t g = 0; g < n_groups; ++g) {
    const int64_t layout = group_meta[3 * g];
    TORCH_CHECK(layout >= 0 && layout < 64, "decode_layers: layout index");
    decode_rows[layout] = std::max(decode_rows[layout], group_meta[3 * g + 2]);
  }
  for (int64_t l = 0; l < layers; ++l) {
    bool found = false;
    for (int64_t g = 0; g < n_groups; ++g) found = found || group_meta[3 * g] == layer_layout[l];
    TORCH_CHECK(found, "decode_layers: a layer reads a layout with no decode group");
  }
  const bool simd = use_simd && simd_ok();
  auto q = qkv.slice(1, 0, qs);
  auto qk_c = torch::view_as_complex(qkv.slice(1, 0, qs + kvs).view({T, heads + kv_heads, head_dim / 2, 2}));
  auto kv_new = qkv.slice(1, qs).view({T, 2 * kv_heads, head_dim}).transpose(0, 1);
  // A layer's attention: per decode group of its layout, that group's rows of q (a view, or gathered) and a
  // zeroed output; its tasks (row, KV head) are shared out across the team; the groups' outputs then go to
  // their rows (`attention_plan`'s `grouped`, the same copies).
  struct Job {
    torch::Tensor qr, out, rows;
    int64_t start, end;
    Attention a;
  };
  std::vector<Job> jobs;
  auto prepare_attention = [&](int64_t layout, const torch::Tensor& kvc, const torch::Tensor& sink) {
    jobs.clear();
    for (int64_t g = 0; g < n_groups; ++g) {
      if (group_meta[3 * g] != layout) continue;
      const int64_t start = group_meta[3 * g + 1], end = group_meta[3 * g + 2];
      const auto& rows = groups[3 * g];
      auto qr = rows.numel() == 0 ? q.slice(0, start, end) : q.index_select(0, rows);
      auto out = torch::zeros({qr.size(0), qs}, q.options().memory_format(at::MemoryFormat::Contiguous));
      Attention a = attention_of(qr, kvc, groups[3 * g + 1], groups[3 * g + 2], sink, kv_heads, out);
      jobs.push_back(Job{qr, out, rows, start, end, a});
    }
  };
  auto attention_output = [&](int64_t layout) -> torch::Tensor {
    if (jobs.size() == 1 && jobs[0].rows.numel() == 0 && jobs[0].start == 0 && jobs[0].end == decode_rows[layout])
      return jobs[0].out;
    auto out = torch::empty({decode_rows[layout], qs}, q.options());
    for (const Job& job : jobs) {
      if (job.rows.numel() == 0) out.slice(0, job.start, job.end).copy_(job.out);
      else out.index_copy_(0, job.rows, job.out);
    }
    return out;
  };
  const bool attention_avx2 = attention_simd();
  RowScratch scratch;  // the step's quantised activations, shared by the team
  SpinBarrier barrier;
  std::atomic<bool> failed{false};
  std::exception_ptr error;

  pybind11::gil_scoped_release no_gil;
  const int entry_threads = omp_get_max_threads();  // the caller's own count, given back at the end
  omp_set_num_threads((int)std::max<int64_t>(1, threads));
  // Phases alternate: the calling thread (0) runs the ops between GEMMs and quantises the next GEMM's input;
  // then every thread takes its share of that GEMM's tiles. A barrier closes each phase.
#pragma omp parallel
  {
    const int tid = omp_get_thread_num(), team = omp_get_num_threads();
    Rows rows{};
    auto serial = [&](auto&& work) {  // thread 0 only; an exception stops the whole team at the next barrier
      if (tid == 0 && !failed.load()) {
        try {
          work();
        } catch (...) {
          error = std::current_exception();
          failed.store(true);
        }
      }
      barrier.wait(team);
    };
    auto gemm = [&](const Matrix& mx, const torch::Tensor& x) {  // x is quantised by thread 0, then tiles split
      serial([&] {
        rows = scratch.reserve(T, mx.w.K);
        TORCH_CHECK(x.is_contiguous() && x.size(1) == mx.w.K, "decode_layers: a GEMM's input");
        quantize_rows(simd, x.data_ptr<float>(), mx.w.cs, rows, 0, T);
      });
      if (tid != 0) rows = scratch.reserve(0, mx.w.K);  // the same buffers (reserve never shrinks)
      if (!failed.load()) {
        const int64_t chunk = (mx.w.T + team - 1) / team;
        const int64_t t0 = std::min<int64_t>(mx.w.T, tid * chunk), t1 = std::min<int64_t>(mx.w.T, t0 + chunk);
        gemm_tiles(mx.w, simd, rows, T, t0, t1, mx.out_ptr);
      }
      barrier.wait(team);
    };
    torch::Tensor attn, act, normed;
    std::vector<float> probs;  // this thread's attention scratch
    for (int64_t l = 0; l < layers && !failed.load(); ++l) {
      const Matrix* mx = mats.data() + 4 * l;
      gemm(mx[0], h);
      serial([&] {
        auto kvc = kv_cache.select(0, l);
        qkv.copy_(finished(mx[0]));
        qk_c.mul_(rope);
        kvc.index_copy_(1, slots, kv_new);
        prepare_attention(layer_layout[l], kvc, sinks[l]);
      });
      if (!failed.load()) {  // the tasks of every group, numbered in a row, split evenly across the team
        int64_t total = 0;
        for (const Job& job : jobs) total += job.a.B * job.a.KVH;
        const int64_t chunk = (total + team - 1) / team;
        const int64_t t0 = std::min<int64_t>(total, tid * chunk), t1 = std::min<int64_t>(total, t0 + chunk);
        int64_t base = 0;
        for (const Job& job : jobs) {
          const int64_t n = job.a.B * job.a.KVH;
          const int64_t lo = std::max<int64_t>(t0, base), hi = std::min<int64_t>(t1, base + n);
          if ((int64_t)probs.size() < job.a.G * job.a.L) probs.resize(job.a.G * job.a.L);
          for (int64_t task = lo; task < hi; ++task) attention_task(job.a, task - base, probs.data(), attention_avx2);
          base += n;
        }
      }
      barrier.wait(team);
      serial([&] { attn = attention_output(layer_layout[l]); });
      gemm(mx[1], attn);
      serial([&] { h = add_rms_rows_(residual, finished(mx[1]), eps); });
      gemm(mx[2], h);
      serial([&] { act = swiglu_rows(finished(mx[2]), inter); });
      gemm(mx[3], act);
      serial([&] {
        if (l == layers - 1) residual.add_(finished(mx[3]));
        else h = add_rms_rows_(residual, finished(mx[3]), eps);
      });
    }
    if (with_head && !failed.load()) {  // the logits of every row, as `compute_logits` makes them
      serial([&] { normed = torch::rms_norm(residual, {hidden}, norm_weight, eps); });
      gemm(mats.back(), normed);
    }
  }
  omp_set_num_threads(entry_threads);
  if (error) std::rethrow_exception(error);
  if (with_head) return {residual, finished(mats.back())};
  return {residual};
}
"""

FUNCTIONS = ["decode_layers"]
