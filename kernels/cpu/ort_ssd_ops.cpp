// ONNX Runtime kernels of the Mamba-2 ssmcc ops (ssd_kernels.h; schemas: lowering/onnx/schemas.py):
//
//   SsdScan(x[b,l,h,p], dt[b,l,h], A[h], B[b,l,g,n], C[b,l,g,n], D[h,p], z[b,l,h,p], dt_bias[h],
//           initial_state[b,h,p,n]; dt_softplus, has_z, dt_min, dt_max) -> out, final_state
//   SsdStateUpdate(state[b,h,p,n], x[b,h,p], dt[b,h], A[h], B[b,g,n], C[b,g,n], D[h,p],
//                  z[b,h,p], dt_bias[h]; dt_softplus, has_z, dt_min, dt_max) -> out, new_state
//   RmsNormGated(x[...,d], z[...,d], weight[d]; group_size, eps, norm_before_gate, has_z) -> out
//
// Every input's shape is checked before anything is read (Inputs, ort_common.h).
#include <vector>

#include "contracts.h"
#include "ort_common.h"
#include "ssd_chunked.h"
#include "ssd_kernels.h"

namespace {

using namespace ssmcc::ort;  // NOLINT: Inputs, Shape, kAny, parallel_rows, FloatOp, Checked

struct ScanAttributes {
  int64_t softplus, has_z;
  float dt_min, dt_max;
  explicit ScanAttributes(const OrtKernelInfo* info) {
    Ort::ConstKernelInfo kernel_info(info);
    softplus = kernel_info.GetAttribute<int64_t>("dt_softplus");
    has_z = kernel_info.GetAttribute<int64_t>("has_z");
    dt_min = kernel_info.GetAttribute<float>("dt_min");
    dt_max = kernel_info.GetAttribute<float>("dt_max");
  }
};

struct SsdScanKernel : ScanAttributes {
  SsdScanKernel(const OrtApi&, const OrtKernelInfo* info) : ScanAttributes(info) {}
  void Compute(OrtKernelContext* raw) {
    Ort::KernelContext ctx(raw);
    const Inputs in(ctx, "SsdScan", 9);
    const Shape x = in.expect(0, "x", {kAny, kAny, kAny, kAny}, "(b, l, h, p)");
    const int64_t batch = x[0], length = x[1], heads = x[2], head_dim = x[3];
    in.expect(1, "dt", {batch, length, heads}, "(b, l, h)");
    in.expect(2, "A", {heads}, "(h,)");
    const Shape B = in.expect(3, "B", {batch, length, kAny, kAny}, "(b, l, g, n)");
    const int64_t groups = B[2], dstate = B[3];
    in.expect(4, "C", B, "(b, l, g, n), B's shape");
    in.expect(5, "D", {heads, head_dim}, "(h, p)");
    if (has_z) in.expect(6, "z", x, "(b, l, h, p)");
    in.expect(7, "dt_bias", {heads}, "(h,)");
    in.expect(8, "initial_state", {batch, heads, head_dim, dstate}, "(b, h, p, n)");
    in.require(ssmcc::check_ssd("ssmcc.SsdScan", batch, length, heads, head_dim, groups, dstate));
    auto out = ctx.GetOutput(0, x);
    auto last = ctx.GetOutput(1, {batch, heads, head_dim, dstate});
    ssmcc::SsdArgs args{in.data(0), in.data(1), in.data(2), in.data(3), in.data(4), in.data(5),
                        has_z ? in.data(6) : nullptr, in.data(7), in.data(8),
                        out.GetTensorMutableData<float>(), last.GetTensorMutableData<float>(),
                        batch, length, heads, head_dim, groups, dstate, softplus != 0, dt_min,
                        dt_max};
    args = ssmcc::with_strides(args);
    if (!ssmcc::ssd_use_chunked(args)) {
      parallel_rows<ssmcc::SsdArgs, ssmcc::ssd_scan_rows>(raw, args, batch * heads, 1);
      return;
    }
    std::vector<float> gram(ssmcc::ssd_gram_floats(args));
    const ssmcc::SsdChunked chunked{args, gram.data()};
    parallel_rows<ssmcc::SsdChunked, ssmcc::ssd_gram_rows>(
        raw, chunked, batch * groups * ssmcc::ssd_chunks(args), 1);
    parallel_rows<ssmcc::SsdChunked, ssmcc::ssd_chunked_rows>(raw, chunked, batch * heads, 1);
  }
};

struct SsdStateUpdateKernel : ScanAttributes {
  SsdStateUpdateKernel(const OrtApi&, const OrtKernelInfo* info) : ScanAttributes(info) {}
  void Compute(OrtKernelContext* raw) {
    Ort::KernelContext ctx(raw);
    const Inputs in(ctx, "SsdStateUpdate", 9);
    const Shape state = in.expect(0, "state", {kAny, kAny, kAny, kAny}, "(b, h, p, n)");
    const int64_t batch = state[0], heads = state[1], head_dim = state[2], dstate = state[3];
    in.expect(1, "x", {batch, heads, head_dim}, "(b, h, p)");
    in.expect(2, "dt", {batch, heads}, "(b, h)");
    in.expect(3, "A", {heads}, "(h,)");
    const int64_t groups = in.expect(4, "B", {batch, kAny, dstate}, "(b, g, n)")[1];
    in.expect(5, "C", {batch, groups, dstate}, "(b, g, n), B's shape");
    in.expect(6, "D", {heads, head_dim}, "(h, p)");
    if (has_z) in.expect(7, "z", {batch, heads, head_dim}, "(b, h, p)");
    in.expect(8, "dt_bias", {heads}, "(h,)");
    in.require(
        ssmcc::check_ssd("ssmcc.SsdStateUpdate", batch, 1, heads, head_dim, groups, dstate));
    auto out = ctx.GetOutput(0, {batch, heads, head_dim});
    auto new_state = ctx.GetOutput(1, state);
    ssmcc::SsdArgs args{in.data(1), in.data(2), in.data(3), in.data(4), in.data(5), in.data(6),
                        has_z ? in.data(7) : nullptr, in.data(8), in.data(0),
                        out.GetTensorMutableData<float>(), new_state.GetTensorMutableData<float>(),
                        batch, 1, heads, head_dim, groups, dstate, softplus != 0, dt_min, dt_max};
    args = ssmcc::with_strides(args);
    parallel_rows<ssmcc::SsdArgs, ssmcc::ssd_state_update_rows>(raw, args, batch * heads);
  }
};

struct RmsNormGatedKernel {
  int64_t group_size, norm_before_gate, has_z;
  float eps;
  RmsNormGatedKernel(const OrtApi&, const OrtKernelInfo* info) {
    Ort::ConstKernelInfo kernel_info(info);
    group_size = kernel_info.GetAttribute<int64_t>("group_size");
    norm_before_gate = kernel_info.GetAttribute<int64_t>("norm_before_gate");
    has_z = kernel_info.GetAttribute<int64_t>("has_z");
    eps = kernel_info.GetAttribute<float>("eps");
  }
  void Compute(OrtKernelContext* raw) {
    Ort::KernelContext ctx(raw);
    const Inputs in(ctx, "RmsNormGated", 3);
    const Shape x = in.expect_rank_at_least(0, "x", 1, "(..., d)");
    const int64_t dim = x.back();
    int64_t rows = 1;
    for (size_t axis = 0; axis + 1 < x.size(); ++axis) rows *= x[axis];
    if (has_z) in.expect(1, "z", x, "x's shape");
    in.expect(2, "weight", {dim}, "(d,)");
    in.require(ssmcc::check_norm("ssmcc.RmsNormGated", rows, dim, group_size));
    auto out = ctx.GetOutput(0, x);
    ssmcc::NormArgs args{in.data(0), has_z ? in.data(1) : nullptr, in.data(2),
                         out.GetTensorMutableData<float>(), rows, dim, group_size, eps,
                         norm_before_gate != 0};
    parallel_rows<ssmcc::NormArgs, ssmcc::rmsnorm_gated_rows>(raw, args, rows);
  }
};

const FloatOp<Checked<SsdScanKernel>, 9, 2> kSsdScan("SsdScan");
const FloatOp<Checked<SsdStateUpdateKernel>, 9, 2> kSsdStateUpdate("SsdStateUpdate");
const FloatOp<Checked<RmsNormGatedKernel>, 3, 1> kRmsNormGated("RmsNormGated");

}  // namespace

void ssmcc::ort::add_ssd_ops(Ort::CustomOpDomain& domain) {
  domain.Add(&kSsdScan);
  domain.Add(&kSsdStateUpdate);
  domain.Add(&kRmsNormGated);
}
