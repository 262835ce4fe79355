"""The C++ source of the fused decode step: every layer of a quantised decode step in one call, GIL released.

Why: once the group GEMMs and the row ops run in C++ (q4_kernel.py, row_ops_kernel.py), what is left of a
decode step of SmolLM2-135M outside them is Python: the loop over 30 layers, ~15 calls a layer through
pybind11 and the interpreter, and the thread-count toggles around each GEMM (ctypes). Measured on a 2-core
AMD EPYC (AVX2), q4 with an 8-bit head at 2 threads: ~2 ms of a 9.5 ms token (`forward_rest` in
`benchmarks/decode_profile.py`), all of it while holding the GIL that the server's event loop needs to
stream the previous token.

What it does: the operations `DecoderModel.forward` makes for a dense layer, in the same order and with the
same roundings: the qkv GEMM (written straight into the step's qkv buffer), RoPE as the same in-place complex
multiply (ATen's), the new keys and values copied to their slots, decode attention per decode group, the o
GEMM, the residual add + norm, gate/up, SwiGLU, down, the next norm, and the final norm + LM head. Copies, bias
adds and the residual add are plain loops (one float add per value, as ATen's), norms, SwiGLU and attention the
row-ops functions the Python loop calls, so the result is bitwise the Python loop's (tested), and a row's result
still depends on that row only. It is called only for the steps it covers (decode rows only, dense layers
without q/k norm, every matrix in the group layout); any other step runs the Python loop.

Threads: one OpenMP parallel region per step. The calling thread runs the ops between GEMMs and quantises the
next GEMM's input in the same phase, while the others wait at a spinning barrier; then every thread takes an
equal share of the GEMM's 16-row tiles, of the attention tasks (row, query head), or of SwiGLU and the down
GEMM's input groups. 10 barriers a layer. Why not a parallel region per GEMM, as `group_gemm` alone does:
libgomp puts its waiting threads to sleep at once (its "throttled" spin) when the process holds more OpenMP
threads than there are cores, which is the case as soon as two threads have each run a parallel region (the
engine thread, and the main thread that loaded the model), and each of the ~120 wake-ups a step then cost tens
of microseconds. Measured on a 2-core AMD EPYC (AVX2), SmolLM2-135M q4 with an 8-bit head, batch 1, from the
engine thread: 2 threads 60 tok/s with a region per GEMM (slower than 1 thread's 110, so the engine chose 1),
163 tok/s with one region per step (llama-bench tg at 2 threads on the same file: 156).

What the step's own ATen calls cost (`fused_phases`, the calling thread's time per phase): in the first version
each layer made ~15 ATen calls between GEMMs (copies, `index_copy_`, `zeros`, slices, the final `rms_norm`),
~1 ms of a 5.8 ms step at 2 threads while the other thread spun; as plain loops on buffers made once per step,
with SwiGLU split across the team and 4 barriers a layer fewer, a step of the same 2-thread decode measured
about 4.3-5.1 ms (the serial phases together ~0.3 ms; 128 tokens from a short prompt; same machine, runs apart).
"""

SOURCE = r"""
#include <omp.h>
#include <sched.h>
#include <atomic>
#include <chrono>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <pybind11/pybind11.h>

namespace {

constexpr int64_t PARTS = 4;  // a GEMM's tensors: packed weights, scales, minimums, column scales

// A barrier that spins (then yields): a step's ~300 waits of a few microseconds each. OpenMP's own barrier
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

// Where the calling thread's time in a step goes (benchmarks/decode_profile.py): off unless switched on, then
// microseconds summed per phase until read.
enum Phase { SERIAL_QKV, SERIAL_ATTN_OUT, SERIAL_O, SERIAL_SWIGLU, SERIAL_DOWN, SERIAL_HEAD, TILES, ATTENTION, SWIGLU,
             WAIT, STEPS, PHASES };
const char* const PHASE_NAMES[PHASES] = {"rope_kv_write", "attention_out", "o_add_norm", "gate_up_finish",
                                         "down_add_norm", "final_norm", "gemm_tiles", "attention", "swiglu",
                                         "barrier_wait", "steps"};
std::atomic<bool> profiling{false};
double phase_us[PHASES] = {};
inline double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
struct PhaseTimer {  // adds the time from construction to destruction to one phase, when profiling
  int phase;
  bool on;
  double start;
  explicit PhaseTimer(int p, bool active = true) : phase(p), on(active && profiling.load(std::memory_order_relaxed)),
                                                   start(on ? now_us() : 0.0) {}
  ~PhaseTimer() { if (on) phase_us[phase] += now_us() - start; }
};

// One layer matrix: its packed tiles, the output width, the bias (or empty) and the step's output buffer
// [T, 16 tiles]; `result` is where the finished output [T, out_features] is read: the buffer itself when it has
// no padding and no bias, else `compact` (or a caller's buffer), which `finish` fills.
struct Matrix {
  Packed w;
  int64_t out_features;
  const float* bias;
  float* out;
  float* result;
};

// The GEMM's result as the Python path has it (the first out_features columns, contiguous, bias added), into
// mx.result; the same single float add per value as ATen's add_.
void finish(const Matrix& mx, int64_t T) {
  if (mx.result == mx.out) return;
  const int64_t ld = mx.w.T * TILE, n = mx.out_features;
  for (int64_t r = 0; r < T; ++r) {
    const float* src = mx.out + r * ld;
    float* dst = mx.result + r * n;
    if (mx.bias)
      for (int64_t c = 0; c < n; ++c) dst[c] = src[c] + mx.bias[c];
    else
      std::memcpy(dst, src, n * sizeof(float));
  }
}

}  // namespace

// Switches the phase timers on or off; returns {phase name: microseconds} summed since the last call (and resets).
std::map<std::string, double> fused_phases(bool enable) {
  std::map<std::string, double> out;
  for (int p = 0; p < PHASES; ++p) {
    out[PHASE_NAMES[p]] = phase_us[p];
    phase_us[p] = 0.0;
  }
  profiling.store(enable);
  return out;
}

namespace {

// A model's constant arguments, checked and unpacked once (`fused_model`): a step then passes a handle, not
// ~500 tensors through pybind11 and ~120 weight checks (measured: ~0.3 ms of a ~5.3 ms step at 2 threads).
struct FusedModel {
  std::vector<torch::Tensor> weights, biases, sinks, head;  // held: the Packed pointers read them
  std::vector<int64_t> meta, layer_layout;
  std::vector<Packed> packed;  // 4 per layer (qkv, o, gate_up, down), then the head's
  torch::Tensor norm_weight;
  int64_t layers, heads, kv_heads, head_dim, inter, hidden, head_bits, vocab;
  double eps;
};
std::mutex models_lock;
std::map<int64_t, std::shared_ptr<FusedModel>> models;
int64_t next_model = 1;

}  // namespace

// Per layer l: weights[16 l ...] = (qkv, o, gate_up, down) x (qs, d, m, col_scale); meta[8 l ...] = their bits
// and out_features; biases[4 l ...] (empty: none); sinks[l] (empty: none); layer_layout[l] the layout it reads.
// With `head` (the LM head's 4 tensors, 8- or 4-bit) and the final norm's weight, a step also returns the logits.
// Returns the handle `decode_layers` takes; `fused_model_free` lets it go.
int64_t fused_model(std::vector<torch::Tensor> weights, std::vector<int64_t> meta, std::vector<torch::Tensor> biases,
                    std::vector<torch::Tensor> sinks, std::vector<int64_t> layer_layout, int64_t hidden,
                    int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t inter, double eps,
                    std::vector<torch::Tensor> head, int64_t head_bits, int64_t vocab, torch::Tensor norm_weight) {
  auto m = std::make_shared<FusedModel>();
  const int64_t layers = (int64_t)sinks.size();
  TORCH_CHECK(layers > 0 && (int64_t)weights.size() == 4 * PARTS * layers && (int64_t)meta.size() == 8 * layers &&
                  (int64_t)biases.size() == 4 * layers && (int64_t)layer_layout.size() == layers,
              "fused_model: per-layer lists disagree");
  const int64_t qs = heads * head_dim, width = qs + 2 * kv_heads * head_dim;
  const int64_t widths[4] = {hidden, qs, hidden, inter};  // the input width of qkv, o, gate_up, down
  const int64_t outs[4] = {width, hidden, 2 * inter, hidden};
  for (int64_t l = 0; l < layers; ++l) {
    TORCH_CHECK(layer_layout[l] >= 0 && layer_layout[l] < 64, "fused_model: layout index");
    TORCH_CHECK(sinks[l].numel() == 0 || (sinks[l].numel() == heads && sinks[l].scalar_type() == at::kFloat &&
                                          sinks[l].is_contiguous()),
                "fused_model: sinks must be [KVH, G] float32");
    for (int64_t j = 0; j < 4; ++j) {
      const int64_t at = 4 * PARTS * l + PARTS * j, out_features = meta[8 * l + 4 + j];
      Packed w = packed_of(weights[at], weights[at + 1], weights[at + 2], weights[at + 3], meta[8 * l + j],
                           widths[j]);
      TORCH_CHECK(out_features == outs[j] && w.T * TILE >= out_features,
                  "fused_model: matrix shapes disagree with the model's");
      const auto& bias = biases[4 * l + j];
      TORCH_CHECK(bias.numel() == 0 || (bias.numel() == out_features && bias.scalar_type() == at::kFloat &&
                                        bias.is_contiguous()),
                  "fused_model: a bias must have out_features float32 values");
      m->packed.push_back(w);
    }
  }
  if (!head.empty()) {
    TORCH_CHECK(head.size() == PARTS && norm_weight.numel() == hidden && norm_weight.is_contiguous() &&
                    norm_weight.scalar_type() == at::kFloat,
                "fused_model: head and final norm");
    Packed w = packed_of(head[0], head[1], head[2], head[3], head_bits, hidden);
    TORCH_CHECK(w.T * TILE >= vocab, "fused_model: the head's vocabulary exceeds its packed tiles");
    m->packed.push_back(w);
  }
  m->weights = std::move(weights);
  m->biases = std::move(biases);
  m->sinks = std::move(sinks);
  m->head = std::move(head);
  m->meta = std::move(meta);
  m->layer_layout = std::move(layer_layout);
  m->norm_weight = norm_weight;
  m->layers = layers;
  m->heads = heads;
  m->kv_heads = kv_heads;
  m->head_dim = head_dim;
  m->inter = inter;
  m->hidden = hidden;
  m->head_bits = head_bits;
  m->vocab = vocab;
  m->eps = eps;
  std::lock_guard<std::mutex> guard(models_lock);
  models[next_model] = m;
  return next_model++;
}

void fused_model_free(int64_t model) {
  std::lock_guard<std::mutex> guard(models_lock);
  models.erase(model);
}

// residual [T, hidden] (the embedded tokens; updated in place and returned: the last layer's output, before the
// final norm); h [T, hidden] its first norm; qkv [T, H*D + 2*KVH*D] the step's buffer; rope [T, H + KVH, D/2]
// complex64, this step's rotation table; slots [T] int64; kv_cache [layers, 2*KVH, S, D].
// Decode groups: groups[3 g ...] = (rows (empty: the range), gather [B, L], mask [B, L] or empty),
// group_meta[3 g ...] = (layout, start, end). Returns [hidden state, logits of every row [T, vocab]] when the
// model has its head, else [hidden state]. `threads`: the GEMMs' thread count (one parallel region for the step).
std::vector<torch::Tensor> decode_layers(int64_t model, torch::Tensor residual, torch::Tensor h, torch::Tensor qkv,
                                         torch::Tensor rope, torch::Tensor slots, torch::Tensor kv_cache,
                                         std::vector<torch::Tensor> groups, std::vector<int64_t> group_meta,
                                         int64_t threads, bool use_simd) {
  std::shared_ptr<FusedModel> fm;
  {
    std::lock_guard<std::mutex> guard(models_lock);
    auto found = models.find(model);
    TORCH_CHECK(found != models.end(), "decode_layers: no such fused model (freed?)");
    fm = found->second;
  }
  const auto& biases = fm->biases;
  const auto& sinks = fm->sinks;
  const auto& meta = fm->meta;
  const auto& layer_layout = fm->layer_layout;
  const auto& norm_weight = fm->norm_weight;
  const int64_t heads = fm->heads, kv_heads = fm->kv_heads, head_dim = fm->head_dim, inter = fm->inter;
  const int64_t vocab = fm->vocab;
  const double eps = fm->eps;
  const int64_t layers = kv_cache.size(0);
  const int64_t T = residual.size(0), hidden = residual.size(1);
  const int64_t qs = heads * head_dim, kvs = kv_heads * head_dim, width = qs + 2 * kvs;
  TORCH_CHECK(fm->layers == layers && hidden == fm->hidden && groups.size() % 3 == 0 &&
                  group_meta.size() == groups.size(),
              "decode_layers: the cache's layers, the hidden width or the group lists disagree with the model");
  TORCH_CHECK(residual.is_contiguous() && residual.scalar_type() == at::kFloat && h.is_contiguous() &&
                  h.sizes() == residual.sizes() && h.scalar_type() == at::kFloat,
              "decode_layers: residual and h must be contiguous [T, hidden] float32");
  TORCH_CHECK(qkv.dim() == 2 && qkv.size(0) == T && qkv.size(1) == width && qkv.is_contiguous() &&
                  qkv.scalar_type() == at::kFloat,
              "decode_layers: bad qkv");
  TORCH_CHECK(rope.is_complex() && rope.size(0) == T && rope.size(1) == heads + kv_heads, "decode_layers: rope");
  TORCH_CHECK(kv_cache.dim() == 4 && kv_cache.is_contiguous() && kv_cache.scalar_type() == at::kFloat &&
                  kv_cache.size(1) == 2 * kv_heads && kv_cache.size(3) == head_dim,
              "decode_layers: kv_cache must be contiguous [layers, 2*KVH, S, D] float32");
  TORCH_CHECK(slots.dim() == 1 && slots.numel() == T && slots.scalar_type() == at::kLong, "decode_layers: slots");
  slots = slots.contiguous();
  const int64_t S = kv_cache.size(2);
  const int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t r = 0; r < T; ++r) TORCH_CHECK(slot[r] >= 0 && slot[r] < S, "decode_layers: a slot is out of range");
  // every matrix checked and its buffers made before any work: nothing below throws on bad arguments
  auto fopts = residual.options();
  std::vector<torch::Tensor> keep;  // buffers the Matrix pointers read
  std::vector<Matrix> mats;
  mats.reserve(4 * layers + 1);
  // a role's output buffer (qkv, o, gate_up, down: one GEMM of each role runs at a time) serves every layer
  float* role_out[5] = {nullptr, nullptr, nullptr, nullptr, nullptr};
  int64_t role_width[5] = {0, 0, 0, 0, 0};
  auto matrix = [&](int role, const Packed& w, int64_t out_features, const torch::Tensor& bias, float* result) {
    const bool padded = w.T * TILE != out_features || bias.numel() > 0;
    float* out = nullptr;
    if (!padded && result != nullptr) {
      out = result;  // the GEMM writes its result in place
    } else if (role_width[role] == w.T * TILE) {
      out = role_out[role];
    } else {
      keep.push_back(torch::empty({T, w.T * TILE}, fopts));
      out = role_out[role] = keep.back().data_ptr<float>();
      role_width[role] = w.T * TILE;
    }
    if (result == nullptr && !padded) result = out;
    if (result == nullptr) {  // padded or biased: its compact result
      keep.push_back(torch::empty({T, out_features}, fopts));
      result = keep.back().data_ptr<float>();
    }
    mats.push_back(Matrix{w, out_features, bias.numel() ? bias.data_ptr<float>() : nullptr, out, result});
  };
  for (int64_t l = 0; l < layers; ++l)
    for (int64_t j = 0; j < 4; ++j)
      matrix((int)j, fm->packed[4 * l + j], meta[8 * l + 4 + j], biases[4 * l + j],
             j == 0 ? qkv.data_ptr<float>() : nullptr);
  const bool with_head = !fm->head.empty();
  torch::Tensor logits;
  if (with_head) {
    logits = torch::empty({T, vocab}, fopts);
    matrix(4, fm->packed.back(), vocab, torch::Tensor(), logits.data_ptr<float>());
  }
  // Decode groups: each has its q rows (a range of the step's rows, or gathered), its output buffer, and its
  // attention arguments for layer 0 (a layer moves the KV pointer); every layout's groups cover rows [0, T).
  const int64_t n_groups = (int64_t)groups.size() / 3;
  struct Job {
    const int64_t* rows;  // nullptr: the range [start, end)
    int64_t start, end, layout;
    float* qr;  // gathered q rows, or nullptr (read in place)
    torch::Tensor q_rows, out;  // the buffers the pointers read
    Attention a;
  };
  std::vector<Job> jobs;
  std::vector<int64_t> covered(64, 0);
  auto kv0 = kv_cache.select(0, 0);
  auto q_all = qkv.slice(1, 0, qs);
  for (int64_t g = 0; g < n_groups; ++g) {
    const int64_t layout = group_meta[3 * g], start = group_meta[3 * g + 1], end = group_meta[3 * g + 2];
    TORCH_CHECK(layout >= 0 && layout < 64 && 0 <= start && start <= end && end <= T, "decode_layers: a group");
    const auto& rows = groups[3 * g];
    torch::Tensor qr;
    if (rows.numel() == 0) {
      qr = q_all.slice(0, start, end);
    } else {
      TORCH_CHECK(rows.scalar_type() == at::kLong && rows.is_contiguous(), "decode_layers: a group's rows");
      const int64_t* rp = rows.data_ptr<int64_t>();
      for (int64_t i = 0; i < rows.numel(); ++i) TORCH_CHECK(rp[i] >= 0 && rp[i] < T, "decode_layers: a group row");
      qr = torch::empty({rows.numel(), qs}, fopts);
    }
    auto out = torch::zeros({qr.size(0), qs}, fopts);
    Attention a = attention_of(qr, kv0, groups[3 * g + 1], groups[3 * g + 2], torch::empty({0}, fopts), kv_heads,
                               out);
    covered[layout] += qr.size(0);
    jobs.push_back(Job{rows.numel() ? rows.data_ptr<int64_t>() : nullptr, start, end, layout,
                       rows.numel() ? qr.data_ptr<float>() : nullptr, qr, out, a});
  }
  for (int64_t l = 0; l < layers; ++l)
    TORCH_CHECK(covered[layer_layout[l]] == T,
                "decode_layers: a layer's layout has no decode groups covering the step's rows");
  const int64_t layer_stride = 2 * kv_heads * S * head_dim;
  float* kv_base = kv_cache.data_ptr<float>();
  float* qkv_p = qkv.data_ptr<float>();
  float* res_p = residual.data_ptr<float>();
  auto h_buf = torch::empty({T, hidden}, fopts), act_buf = torch::empty({T, inter}, fopts);
  auto attn_buf = torch::empty({T, qs}, fopts);
  float* h_p = h_buf.data_ptr<float>();  // the norms' output (the caller's h is only read)
  float* act_p = act_buf.data_ptr<float>();
  int64_t max_l = 1;
  for (const Job& job : jobs) max_l = std::max(max_l, job.a.L);
  auto qk_c = torch::view_as_complex(qkv.slice(1, 0, qs + kvs).view({T, heads + kv_heads, head_dim / 2, 2}));
  const bool attention_avx2 = attention_simd();
  const bool simd = use_simd && simd_ok();
  const float feps = (float)eps;
  RowScratch scratch;  // the step's quantised activations, shared by the team
  scratch.reserve(T, std::max(std::max(hidden, qs), inter));  // the widest input: reserve never moves it again
  SpinBarrier barrier;
  std::atomic<bool> failed{false};
  std::exception_ptr error;

  pybind11::gil_scoped_release no_gil;
  const int entry_threads = omp_get_max_threads();  // the caller's own count, given back at the end
  omp_set_num_threads((int)std::max<int64_t>(1, threads));
  // Phases alternate: the calling thread (0) runs the ops between GEMMs and quantises the next GEMM's input in
  // the same phase; then every thread takes its share of that GEMM's tiles, or of the attention tasks. A
  // barrier closes each phase: 10 a layer.
#pragma omp parallel
  {
    const int tid = omp_get_thread_num(), team = omp_get_num_threads();
    Rows rows{};
    auto wait = [&] {
      PhaseTimer t(WAIT, tid == 0);
      barrier.wait(team);
    };
    auto serial = [&](int phase, auto&& work) {  // thread 0 only; an exception stops the team at the next barrier
      if (tid == 0 && !failed.load()) {
        PhaseTimer t(phase);
        try {
          work();
        } catch (...) {
          error = std::current_exception();
          failed.store(true);
        }
      }
      wait();
    };
    auto quantize = [&](const Matrix& mx, const float* x) {  // thread 0, inside a serial phase
      rows = scratch.reserve(T, mx.w.K);
      quantize_rows(simd, x, mx.w.cs, rows, 0, T);
    };
    auto tiles = [&](const Matrix& mx) {  // every thread, its share of the tiles of x quantised just before
      if (tid != 0) rows = scratch.reserve(0, mx.w.K);  // the same buffers (reserve never shrinks)
      if (!failed.load()) {
        PhaseTimer t(TILES, tid == 0);
        const int64_t chunk = (mx.w.T + team - 1) / team;
        const int64_t t0 = std::min<int64_t>(mx.w.T, tid * chunk), t1 = std::min<int64_t>(mx.w.T, t0 + chunk);
        gemm_tiles(mx.w, simd, rows, T, t0, t1, mx.out);
      }
      wait();
    };
    std::vector<float> probs(max_l);  // this thread's attention scratch
    serial(SERIAL_DOWN, [&] { quantize(mats[0], h.data_ptr<float>()); });
    for (int64_t l = 0; l < layers && !failed.load(); ++l) {
      const Matrix* mx = mats.data() + 4 * l;
      const int64_t layout = layer_layout[l];
      float* kvl = kv_base + l * layer_stride;
      tiles(mx[0]);
      serial(SERIAL_QKV, [&] {
        finish(mx[0], T);  // into qkv
        qk_c.mul_(rope);
        for (int64_t r = 0; r < T; ++r)  // the new keys and values to their slots (`index_copy_`)
          for (int64_t j = 0; j < 2 * kv_heads; ++j)
            std::memcpy(kvl + (j * S + slot[r]) * head_dim, qkv_p + r * width + qs + j * head_dim,
                        head_dim * sizeof(float));
        for (Job& job : jobs) {
          if (job.layout != layout) continue;
          job.a.kv = kvl;
          job.a.sinks = sinks[l].numel() ? sinks[l].data_ptr<float>() : nullptr;
          std::memset(job.a.out, 0, job.a.B * qs * sizeof(float));
          if (job.rows)
            for (int64_t i = 0; i < job.a.B; ++i)
              std::memcpy(job.qr + i * qs, qkv_p + job.rows[i] * width, qs * sizeof(float));
        }
      });
      if (!failed.load()) {  // the tasks (row, query head) of every group, numbered in a row, split evenly
        PhaseTimer t(ATTENTION, tid == 0);
        int64_t total = 0;
        for (const Job& job : jobs)
          if (job.layout == layout) total += job.a.B * job.a.H;
        const int64_t chunk = (total + team - 1) / team;
        const int64_t t0 = std::min<int64_t>(total, tid * chunk), t1 = std::min<int64_t>(total, t0 + chunk);
        int64_t base = 0;
        for (const Job& job : jobs) {
          if (job.layout != layout) continue;
          const int64_t n = job.a.B * job.a.H;
          const int64_t lo = std::max<int64_t>(t0, base), hi = std::min<int64_t>(t1, base + n);
          for (int64_t task = lo; task < hi; ++task) attention_task(job.a, task - base, probs.data(), attention_avx2);
          base += n;
        }
      }
      wait();
      serial(SERIAL_ATTN_OUT, [&] {  // the groups' outputs to their rows, then the o GEMM's input quantised
        const float* attn = nullptr;
        for (const Job& job : jobs) {
          if (job.layout != layout) continue;
          if (job.rows == nullptr && job.start == 0 && job.end == T) {
            attn = job.a.out;
            continue;
          }
          float* dst = attn_buf.data_ptr<float>();
          attn = dst;
          for (int64_t i = 0; i < job.a.B; ++i)
            std::memcpy(dst + (job.rows ? job.rows[i] : job.start + i) * qs, job.a.out + i * qs, qs * sizeof(float));
        }
        quantize(mx[1], attn);
      });
      tiles(mx[1]);
      serial(SERIAL_O, [&] {
        finish(mx[1], T);
        normalize_rows(res_p, mx[1].result, h_p, T, hidden, feps);
        quantize(mx[2], h_p);
      });
      tiles(mx[2]);
      if (mx[2].result != mx[2].out) serial(SERIAL_SWIGLU, [&] { finish(mx[2], T); });
      if (!failed.load()) {  // SwiGLU and the down GEMM's input quantisation, each thread its share of the groups
        PhaseTimer t(SWIGLU, tid == 0);
        rows = scratch.reserve(T, inter);  // no reallocation: reserved for the widest input before the region
        const int64_t G = inter / GROUP, chunk = (G + team - 1) / team;
        const int64_t g0 = std::min<int64_t>(G, tid * chunk), g1 = std::min<int64_t>(G, g0 + chunk);
        for (int64_t r = 0; r < T && g0 < g1; ++r) {
          swiglu_row(mx[2].result + r * 2 * inter, act_p + r * inter, inter, g0 * GROUP, g1 * GROUP);
          quantize_groups(simd, act_p, mx[3].w.cs, rows, r, g0, g1);
        }
      }
      wait();
      tiles(mx[3]);
      serial(SERIAL_DOWN, [&] {
        finish(mx[3], T);
        if (l == layers - 1) {
          for (int64_t i = 0; i < T * hidden; ++i) res_p[i] += mx[3].result[i];
        } else {
          normalize_rows(res_p, mx[3].result, h_p, T, hidden, feps);
          quantize(mats[4 * (l + 1)], h_p);
        }
      });
    }
    if (with_head && !failed.load()) {  // the logits of every row, as `compute_logits` makes them
      serial(SERIAL_HEAD, [&] {  // `rms_weighted_rows`, as compute_logits calls it
        normalize_rows(res_p, nullptr, h_p, T, hidden, feps, norm_weight.data_ptr<float>());
        quantize(mats.back(), h_p);
      });
      tiles(mats.back());
      if (tid == 0 && !failed.load()) finish(mats.back(), T);
    }
  }
  omp_set_num_threads(entry_threads);
  if (profiling.load(std::memory_order_relaxed)) phase_us[STEPS] += 1;
  if (error) std::rethrow_exception(error);
  if (with_head) return {residual, logits};
  return {residual};
}
"""

FUNCTIONS = ["decode_layers", "fused_model", "fused_model_free", "fused_phases"]
