// ONNX Runtime custom-op library for the ssmcc domain: the kernels of ssm_kernels.h bound as
// ORT kernels (schemas: lowering/onnx/schemas.py), plus the Mamba-2 kernels of ort_ssd_ops.cpp
// and the fused mixers of ort_mixer_ops.cpp and ort_mamba_mixer_ops.cpp.
// Rows are split over ORT's own intra-op thread pool (KernelContext_ParallelFor), so no second
// thread pool competes with ORT's. ORT checks only element types, so each kernel checks every
// input's shape against its node's contract (schemas.py; the size relations of contracts.h)
// before it reads anything; a violation fails the Run with an error naming the node type, the
// input and both shapes.
// Build: -std=c++17 -fPIC -shared -fvisibility=hidden -DORT_API_MANUAL_INIT; the only exported
// symbol is RegisterCustomOps.
#include <memory>
#include <mutex>
#include <vector>

#include "contracts.h"
#include "ort_common.h"
#include "ssm_kernels.h"

namespace {

using namespace ssmcc::ort;  // NOLINT: Inputs, Shape, kAny, parallel_rows, FloatOp, Checked

struct SelectiveScanKernel {
  int64_t softplus, has_z;
  SelectiveScanKernel(const OrtApi&, const OrtKernelInfo* info) {
    Ort::ConstKernelInfo kernel_info(info);
    softplus = kernel_info.GetAttribute<int64_t>("delta_softplus");
    has_z = kernel_info.GetAttribute<int64_t>("has_z");
  }
  void Compute(OrtKernelContext* raw) {
    Ort::KernelContext ctx(raw);
    const Inputs in(ctx, "SelectiveScan", 9);
    const Shape u = in.expect(0, "u", {kAny, kAny, kAny}, "(b, d, l)");
    const int64_t batch = u[0], dim = u[1], length = u[2];
    const int64_t dstate = in.expect(2, "A", {dim, kAny}, "(d, n)")[1];
    const int64_t groups = in.expect(3, "B", {batch, kAny, dstate, length}, "(b, g, n, l)")[1];
    in.expect(4, "C", {batch, groups, dstate, length}, "(b, g, n, l) with B's g");
    in.expect(1, "delta", u, "(b, d, l)");
    in.expect(5, "D", {dim}, "(d,)");
    if (has_z) in.expect(6, "z", u, "(b, d, l)");
    in.expect(7, "delta_bias", {dim}, "(d,)");
    in.expect(8, "initial_state", {batch, dim, dstate}, "(b, d, n)");
    in.require(
        ssmcc::check_scan("ssmcc.SelectiveScan", batch, dim, length, groups, groups, dstate));
    auto out = ctx.GetOutput(0, u);
    auto last = ctx.GetOutput(1, {batch, dim, dstate});
    std::vector<float> Bt(batch * groups * dstate * length), Ct(Bt.size());
    ssmcc::transpose_state_length(in.data(3), Bt.data(), batch * groups, dstate, length);
    ssmcc::transpose_state_length(in.data(4), Ct.data(), batch * groups, dstate, length);
    ssmcc::ScanArgs args{};
    args.u = in.data(0), args.delta = in.data(1), args.A = in.data(2), args.D = in.data(5);
    args.z = has_z ? in.data(6) : nullptr, args.delta_bias = in.data(7);
    args.h0 = in.data(8), args.Bt = Bt.data(), args.Ct = Ct.data();
    args.out = out.GetTensorMutableData<float>(), args.last = last.GetTensorMutableData<float>();
    args.batch = batch, args.dim = dim, args.length = length, args.groups_b = groups;
    args.groups_c = groups, args.dstate = dstate, args.softplus = softplus != 0;
    parallel_rows<ssmcc::ScanArgs, ssmcc::selective_scan_rows>(raw, args, batch * dim);
  }
};

struct CausalConv1dKernel {
  int64_t activation;
  CausalConv1dKernel(const OrtApi&, const OrtKernelInfo* info) {
    activation = Ort::ConstKernelInfo(info).GetAttribute<int64_t>("activation");
    require_activation("ssmcc.CausalConv1d", activation);
  }
  void Compute(OrtKernelContext* raw) {
    Ort::KernelContext ctx(raw);
    const Inputs in(ctx, "CausalConv1d", 4);
    const Shape x = in.expect(0, "x", {kAny, kAny, kAny}, "(b, d, l)");
    const int64_t width = in.expect(1, "weight", {x[1], kAny}, "(d, k)")[1];
    in.require(ssmcc::check_conv("ssmcc.CausalConv1d", x[0], x[1], x[2], width));
    in.expect(2, "bias", {x[1]}, "(d,)");
    in.expect(3, "initial_state", {x[0], x[1], width - 1}, "(b, d, k-1)");
    auto out = ctx.GetOutput(0, x);
    auto final_state = ctx.GetOutput(1, {x[0], x[1], width - 1});
    ssmcc::ConvArgs args{in.data(0), in.data(1), in.data(2), in.data(3),
                         out.GetTensorMutableData<float>(),
                         final_state.GetTensorMutableData<float>(),
                         x[0], x[1], x[2], width,
                         static_cast<ssmcc::Activation>(activation)};
    parallel_rows<ssmcc::ConvArgs, ssmcc::causal_conv1d_rows>(raw, args, x[0] * x[1]);
  }
};

struct SelectiveStateUpdateKernel {
  int64_t softplus, has_z;
  SelectiveStateUpdateKernel(const OrtApi&, const OrtKernelInfo* info) {
    Ort::ConstKernelInfo kernel_info(info);
    softplus = kernel_info.GetAttribute<int64_t>("dt_softplus");
    has_z = kernel_info.GetAttribute<int64_t>("has_z");
  }
  void Compute(OrtKernelContext* raw) {
    Ort::KernelContext ctx(raw);
    const Inputs in(ctx, "SelectiveStateUpdate", 9);
    const Shape state = in.expect(0, "state", {kAny, kAny, kAny}, "(b, d, n)");
    const int64_t batch = state[0], dim = state[1], dstate = state[2];
    in.expect(1, "x", {batch, dim}, "(b, d)");
    in.expect(2, "dt", {batch, dim}, "(b, d)");
    in.expect(3, "A", {dim, dstate}, "(d, n)");
    const int64_t groups = in.expect(4, "B", {batch, kAny, dstate}, "(b, g, n)")[1];
    in.expect(5, "C", {batch, groups, dstate}, "(b, g, n) with B's g");
    in.expect(6, "D", {dim}, "(d,)");
    if (has_z) in.expect(7, "z", {batch, dim}, "(b, d)");
    in.expect(8, "dt_bias", {dim}, "(d,)");
    in.require(
        ssmcc::check_scan("ssmcc.SelectiveStateUpdate", batch, dim, 1, groups, groups, dstate));
    auto out = ctx.GetOutput(0, {batch, dim});
    auto new_state = ctx.GetOutput(1, state);
    ssmcc::StepArgs args{};
    args.state = in.data(0), args.x = in.data(1), args.dt = in.data(2), args.A = in.data(3);
    args.B = in.data(4), args.C = in.data(5), args.D = in.data(6);
    args.z = has_z ? in.data(7) : nullptr, args.dt_bias = in.data(8);
    args.out = out.GetTensorMutableData<float>();
    args.new_state = new_state.GetTensorMutableData<float>();
    args.batch = batch, args.dim = dim, args.groups_b = groups, args.groups_c = groups;
    args.dstate = dstate, args.softplus = softplus != 0;
    parallel_rows<ssmcc::StepArgs, ssmcc::selective_state_update_rows>(raw, args, batch * dim);
  }
};

struct CausalConv1dUpdateKernel {
  int64_t activation;
  CausalConv1dUpdateKernel(const OrtApi&, const OrtKernelInfo* info) {
    activation = Ort::ConstKernelInfo(info).GetAttribute<int64_t>("activation");
    require_activation("ssmcc.CausalConv1dUpdate", activation);
  }
  void Compute(OrtKernelContext* raw) {
    Ort::KernelContext ctx(raw);
    const Inputs in(ctx, "CausalConv1dUpdate", 4);
    const Shape x = in.expect(0, "x", {kAny, kAny}, "(b, d)");
    const int64_t width = in.expect(2, "weight", {x[1], kAny}, "(d, k)")[1];
    in.require(ssmcc::check_conv("ssmcc.CausalConv1dUpdate", x[0], x[1], 1, width));
    const Shape state = in.expect(1, "conv_state", {x[0], x[1], width - 1}, "(b, d, k-1)");
    in.expect(3, "bias", {x[1]}, "(d,)");
    auto out = ctx.GetOutput(0, x);
    auto new_state = ctx.GetOutput(1, state);
    ssmcc::ConvStepArgs args{in.data(0), in.data(1), in.data(2), in.data(3),
                             out.GetTensorMutableData<float>(),
                             new_state.GetTensorMutableData<float>(),
                             x[0], x[1], width,
                             static_cast<ssmcc::Activation>(activation)};
    parallel_rows<ssmcc::ConvStepArgs, ssmcc::causal_conv1d_update_rows>(raw, args, x[0] * x[1]);
  }
};

const FloatOp<Checked<SelectiveScanKernel>, 9, 2> kSelectiveScan("SelectiveScan");
const FloatOp<Checked<CausalConv1dKernel>, 4, 2> kCausalConv1d("CausalConv1d");
const FloatOp<Checked<SelectiveStateUpdateKernel>, 9, 2> kSelectiveStateUpdate(
    "SelectiveStateUpdate");
const FloatOp<Checked<CausalConv1dUpdateKernel>, 4, 2> kCausalConv1dUpdate("CausalConv1dUpdate");

std::mutex registry_mutex;
std::vector<std::unique_ptr<Ort::CustomOpDomain>>& domains() {
  static std::vector<std::unique_ptr<Ort::CustomOpDomain>> kept;  // alive as long as sessions
  return kept;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  Ort::InitApi(api_base->GetApi(ORT_API_VERSION));
  try {
    std::lock_guard<std::mutex> lock(registry_mutex);
    auto domain = std::make_unique<Ort::CustomOpDomain>("ssmcc");
    domain->Add(&kSelectiveScan);
    domain->Add(&kCausalConv1d);
    domain->Add(&kSelectiveStateUpdate);
    domain->Add(&kCausalConv1dUpdate);
    ssmcc::ort::add_ssd_ops(*domain);
    ssmcc::ort::add_mixer_ops(*domain);
    ssmcc::ort::add_mamba_mixer_ops(*domain);
    ssmcc::ort::add_quantized_ops(*domain);
    ssmcc::ort::add_linear_ops(*domain);
    ssmcc::ort::add_moe_ops(*domain);
    Ort::UnownedSessionOptions(options).Add(*domain);
    domains().push_back(std::move(domain));
  } catch (const Ort::Exception& error) {
    return Ort::GetApi().CreateStatus(ORT_FAIL, error.what());
  }
  return nullptr;
}
