// C entry points of the ssmcc kernels for the torch target (called through ctypes with tensor
// data pointers; see kernels/cpu/torch_binding.py). Rows are split over OpenMP threads.
#include <omp.h>

#include "ssm_kernels.h"

#define SSMCC_EXPORT extern "C" __attribute__((visibility("default")))

namespace {
using ssmcc::tuning::kParallelWork;

template <typename Fn>
void parallel_rows(int64_t rows, int64_t work_per_row, int threads, Fn fn) {
  if (threads <= 1 || rows < 2 || rows * work_per_row < kParallelWork) {
    fn(0, rows);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int64_t count = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t begin = rows * id / count, end = rows * (id + 1) / count;
    fn(begin, end);
  }
}
}  // namespace

SSMCC_EXPORT int ssmcc_selective_scan_f32(const float* u, const float* delta, const float* A,
                                          const float* B, const float* C, const float* D,
                                          const float* z, const float* delta_bias,
                                          const float* h0, float* out, float* last, int64_t batch,
                                          int64_t dim, int64_t length, int64_t groups,
                                          int64_t dstate, int32_t softplus, int32_t threads) {
  const int64_t bc_size = batch * groups * dstate * length;
  std::vector<float> Bt(bc_size), Ct(bc_size);
  ssmcc::transpose_state_length(B, Bt.data(), batch * groups, dstate, length);
  ssmcc::transpose_state_length(C, Ct.data(), batch * groups, dstate, length);
  ssmcc::ScanArgs args{u,   delta, A,     Bt.data(), Ct.data(), D,      z,      delta_bias, h0,
                       out, last,  batch, dim,       length,    groups, dstate, softplus != 0};
  parallel_rows(batch * dim, length * dstate, threads,
                [&](int64_t b, int64_t e) { ssmcc::selective_scan_rows(args, b, e); });
  return 0;
}

SSMCC_EXPORT int ssmcc_causal_conv1d_f32(const float* x, const float* weight, const float* bias,
                                         const float* state0, float* out, float* final_state,
                                         int64_t batch, int64_t dim, int64_t length,
                                         int64_t width, int32_t silu, int32_t threads) {
  ssmcc::ConvArgs args{x, weight, bias, state0, out, final_state, batch, dim, length, width,
                       silu != 0};
  parallel_rows(batch * dim, length * width, threads,
                [&](int64_t b, int64_t e) { ssmcc::causal_conv1d_rows(args, b, e); });
  return 0;
}

SSMCC_EXPORT int ssmcc_selective_state_update_f32(const float* state, const float* x,
                                                  const float* dt, const float* A, const float* B,
                                                  const float* C, const float* D, const float* z,
                                                  const float* dt_bias, float* out,
                                                  float* new_state, int64_t batch, int64_t dim,
                                                  int64_t groups, int64_t dstate,
                                                  int32_t softplus, int32_t threads) {
  ssmcc::StepArgs args{state, x,         dt,    A,   B,      C,      D,           z,
                       dt_bias, out,     new_state, batch, dim, groups, dstate, softplus != 0};
  parallel_rows(batch * dim, dstate, threads,
                [&](int64_t b, int64_t e) { ssmcc::selective_state_update_rows(args, b, e); });
  return 0;
}

SSMCC_EXPORT int ssmcc_causal_conv1d_update_f32(const float* x, const float* state,
                                                const float* weight, const float* bias,
                                                float* out, float* new_state, int64_t batch,
                                                int64_t dim, int64_t width, int32_t silu,
                                                int32_t threads) {
  ssmcc::ConvStepArgs args{x, state, weight, bias, out, new_state, batch, dim, width, silu != 0};
  parallel_rows(batch * dim, width, threads,
                [&](int64_t b, int64_t e) { ssmcc::causal_conv1d_update_rows(args, b, e); });
  return 0;
}
