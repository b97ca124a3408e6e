// The experts of a mixture-of-experts layer for a few tokens (a decode step), given the router's
// choice (math: ssmcc/ops/moe_experts.py). For token t with chosen experts e_j and weights w_j:
//
//   a_j   = act(G_j x_t) * (U_j x_t)     gated:  [G_j; U_j] = up[e_j]  (2i x d)
//   a_j   = act(up[e_j] x_t)             not gated (up[e_j]: i x d)
//   out_t = sum_j w_j * down[e_j] a_j    down[e_j]: d x i
//
// Decode reads only the chosen experts' weights, once each: the (token, slot) pairs are grouped
// by expert, each used expert's rows of x gathered side by side, and its two products are
// matrix-vector products over those rows (gemv.h / gemv_quantized.h through MixerWeight, so the
// experts may be float32 or stored small). Work is split in two phases, each one parallel loop
// over (used expert, block of output rows): up (with the activation, a gate row and its up row in
// the same task), then down; the weighted sum over slots is serial (t x k x d additions).
// Indices outside [0, E) add nothing (expert parallelism's sentinel, as in the reference).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "activations.h"
#include "mixer_weight.h"

namespace ssmcc {

// ACTIVATIONS of ssmcc/ops/moe_experts.py, in that order (the node's codes, an order of their
// own: the math is activations.h's).
enum class ExpertActivation : int { kSilu = 0, kGelu = 1, kGeluTanh = 2, kRelu = 3, kRelu2 = 4 };

// "" when ``activation`` names one of ExpertActivation, else why not (``op`` leads the message).
inline std::string check_expert_activation(const std::string& op, int64_t activation) {
  if (activation >= 0 && activation <= static_cast<int64_t>(ExpertActivation::kRelu2)) return "";
  return op + ": activation must be 0 (silu), 1 (gelu), 2 (gelu_tanh), 3 (relu) or 4 (relu2), "
              "got " + std::to_string(activation);
}

// The form (activations.h) of an ExpertActivation code.
inline Activation expert_activation_form(int activation) {
  static constexpr Activation kForms[] = {Activation::kSilu, Activation::kGelu,
                                          Activation::kGeluTanh, Activation::kRelu,
                                          Activation::kRelu2};
  return kForms[activation];
}

inline float expert_activation(float x, int activation) {
  return activate(x, expert_activation_form(activation));
}

// Expert ``e``'s (rows, cols) matrix of an (E, rows, cols) weight.
inline MixerWeight expert_matrix(const MixerWeight& w, int64_t e, int64_t rows, int64_t cols) {
  static constexpr int64_t kBytes[] = {1, 2, 2};  // int8, bfloat16, float16
  const int64_t bytes = w.storage == kFloat32Storage ? 4 : kBytes[w.storage];
  return {static_cast<const char*>(w.data) + e * rows * cols * bytes,
          w.scale ? w.scale + e * rows * w.groups : nullptr, w.storage, w.groups};
}

struct MoeArgs {
  const float* hidden;         // (t, d)
  const int64_t* index;        // (t, k)
  const float* weights;        // (t, k)
  MixerWeight up, down;        // (E, u, d), (E, d, i)
  float* out;                  // (t, d)
  int64_t tokens, k, experts, d, width;  // width = i
  bool gated;
  int activation;
};

// The pairs of one call grouped by expert, and the buffers of both phases.
struct MoePlan {
  std::vector<int64_t> used;    // experts chosen at least once, ascending
  std::vector<int64_t> start;   // used.size() + 1 offsets into pairs
  std::vector<int64_t> pairs;   // t * k + j, grouped by expert
  std::vector<float> x;         // (pairs, d): the tokens' rows
  std::vector<float> h;         // (pairs, u): up products
  std::vector<float> a;         // (pairs, i): activations
  std::vector<float> y;         // (pairs, d): down products

  MoePlan(const MoeArgs& m) {
    std::vector<int64_t> count(m.experts + 1, 0);
    for (int64_t p = 0; p < m.tokens * m.k; ++p) {
      const int64_t e = m.index[p];
      if (e >= 0 && e < m.experts) ++count[e + 1];
    }
    std::vector<int64_t> offset(m.experts + 1, 0);
    for (int64_t e = 0; e < m.experts; ++e) {
      offset[e + 1] = offset[e] + count[e + 1];
      if (count[e + 1]) used.push_back(e);
    }
    pairs.resize(offset[m.experts]);
    std::vector<int64_t> fill(offset.begin(), offset.end() - 1);
    for (int64_t p = 0; p < m.tokens * m.k; ++p) {
      const int64_t e = m.index[p];
      if (e >= 0 && e < m.experts) pairs[fill[e]++] = p;
    }
    for (int64_t e : used) start.push_back(offset[e]);
    start.push_back(static_cast<int64_t>(pairs.size()));
    const int64_t n = static_cast<int64_t>(pairs.size());
    const int64_t u = m.gated ? 2 * m.width : m.width;
    x.resize(n * m.d);
    h.resize(n * u);
    a.resize(n * m.width);
    y.resize(n * m.d);
    for (int64_t r = 0; r < n; ++r)
      std::copy_n(m.hidden + (pairs[r] / m.k) * m.d, m.d, x.data() + r * m.d);
  }
};

// Tasks of a phase: each used expert's output rows in blocks of ``block``.
struct MoePhase {
  const MoeArgs* m;
  MoePlan* plan;
  int64_t block, per_expert;
};

constexpr int64_t kMoeUpBlock = 32;    // hidden units per task: 32 gate + 32 up rows of d
constexpr int64_t kMoeDownBlock = 64;  // output rows per task: 64 rows of i

inline void moe_up_tasks(const MoePhase& ph, int64_t begin, int64_t end) {
  const MoeArgs& m = *ph.m;
  MoePlan& plan = *ph.plan;
  const int64_t u = m.gated ? 2 * m.width : m.width;
  for (int64_t task = begin; task < end; ++task) {
    const int64_t j = task / ph.per_expert;
    const int64_t r0 = (task % ph.per_expert) * ph.block;
    const int64_t r1 = std::min(r0 + ph.block, m.width);
    const int64_t first = plan.start[j], rows = plan.start[j + 1] - first;
    const MixerWeight w = expert_matrix(m.up, plan.used[j], u, m.d);
    const float* x = plan.x.data() + first * m.d;
    float* h = plan.h.data() + first * u;
    mixer_weight_gemv_rows(w, x, h, rows, u, m.d, r0, r1);
    if (m.gated) mixer_weight_gemv_rows(w, x, h, rows, u, m.d, m.width + r0, m.width + r1);
    for (int64_t r = 0; r < rows; ++r) {
      const float* hr = h + r * u;
      float* ar = plan.a.data() + (first + r) * m.width;
      for (int64_t c = r0; c < r1; ++c)
        ar[c] = expert_activation(hr[c], m.activation) * (m.gated ? hr[m.width + c] : 1.f);
    }
  }
}

inline void moe_down_tasks(const MoePhase& ph, int64_t begin, int64_t end) {
  const MoeArgs& m = *ph.m;
  MoePlan& plan = *ph.plan;
  for (int64_t task = begin; task < end; ++task) {
    const int64_t j = task / ph.per_expert;
    const int64_t r0 = (task % ph.per_expert) * ph.block;
    const int64_t r1 = std::min(r0 + ph.block, m.d);
    const int64_t first = plan.start[j], rows = plan.start[j + 1] - first;
    const MixerWeight w = expert_matrix(m.down, plan.used[j], m.d, m.width);
    mixer_weight_gemv_rows(w, plan.a.data() + first * m.width, plan.y.data() + first * m.d, rows,
                           m.d, m.width, r0, r1);
  }
}

// out = sum over each token's pairs of w * y, pairs added in expert order (the reference's).
inline void moe_combine(const MoeArgs& m, const MoePlan& plan) {
  std::fill_n(m.out, m.tokens * m.d, 0.f);
  for (size_t r = 0; r < plan.pairs.size(); ++r) {
    const int64_t p = plan.pairs[r];
    const float w = m.weights[p];
    float* out = m.out + (p / m.k) * m.d;
    const float* y = plan.y.data() + r * m.d;
    for (int64_t c = 0; c < m.d; ++c) out[c] += w * y[c];
  }
}

// The two phases' task lists over ``plan`` (tasks: used experts x blocks of output rows).
inline MoePhase moe_up_phase(const MoeArgs& m, MoePlan& plan) {
  return {&m, &plan, kMoeUpBlock, (m.width + kMoeUpBlock - 1) / kMoeUpBlock};
}

inline MoePhase moe_down_phase(const MoeArgs& m, MoePlan& plan) {
  return {&m, &plan, kMoeDownBlock, (m.d + kMoeDownBlock - 1) / kMoeDownBlock};
}

inline int64_t moe_tasks(const MoePhase& phase) {
  return static_cast<int64_t>(phase.plan->used.size()) * phase.per_expert;
}

}  // namespace ssmcc
