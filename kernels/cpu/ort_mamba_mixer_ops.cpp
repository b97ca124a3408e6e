// ONNX Runtime kernels of the fused Mamba-1 mixer (mamba_mixer.h; schemas: lowering/onnx/schemas.py):
//
//   MambaMixer(zx[b,l,w], conv_weight[d,k], conv_bias[d], x_proj_weight[E,d], dt_proj_weight[d,R],
//              A[d,n], D[d], dt_bias[d], conv_state[b,d,k-1], ssm_state[b,d,n]; x_offset,
//              z_offset, has_z, activation, delta_softplus, has_rms, rms_eps)
//       -> y[b,l,d], conv_state, ssm_state
//   MambaMixerStep: the same with zx[b,w] -> y[b,d], conv_state, ssm_state
//   QuantizedMambaMixer(Step): the same with x_proj_weight / dt_proj_weight stored small (int8,
//       bfloat16 or float16) and two more inputs, x_proj_scale[E,Gx] and dt_proj_scale[d,Gd]:
//       W = weight * scale per group (mixer_weight.h)
//
// with E = R + 2n. Every input's shape is checked before anything is read.
#include <string>
#include <vector>

#include "contracts.h"
#include "mamba_mixer.h"
#include "ort_common.h"

namespace {

using namespace ssmcc::ort;  // NOLINT: Inputs, Shape, kAny, parallel_rows, FloatOp, Checked

// Rows per task of the step's two parallel phases: x_proj outputs (each a row of d weights) and
// (sequence, channel) rows (a dt_proj row of R weights and n states each).
constexpr int64_t kStepProjectRows = 16, kStepChannelRows = 256;

// A projection weight input (``at``, ``name``) and, when quantized, its scale (``scale_at``).
ssmcc::MixerWeight mixer_weight(const Inputs& in, Ort::KernelContext& ctx, size_t at,
                                size_t scale_at, bool quantized, const char* name,
                                const char* scale_name, int64_t rows) {
  if (!quantized) return {in.data(at), nullptr, ssmcc::kFloat32Storage, 1};
  const auto value = ctx.GetInput(at);
  const int storage = storage_of(value.GetTensorTypeAndShapeInfo().GetElementType());
  if (storage < 0)
    in.fail(std::string(name) + " must be int8, bfloat16 or float16 (a float32 projection goes "
            "to MambaMixer / MambaMixerStep, widened by Widen when the other one is stored small)");
  const int64_t groups = in.expect(scale_at, scale_name, {rows, kAny}, "(rows, G)")[1];
  return {value.GetTensorRawData(), in.data(scale_at), storage, groups};
}

template <bool kStep, bool kQuantized>
struct MambaMixerKernel {
  int64_t x_offset, z_offset, has_z, activation, softplus, has_rms;
  float rms_eps;

  MambaMixerKernel(const OrtApi&, const OrtKernelInfo* info) {
    Ort::ConstKernelInfo k(info);
    x_offset = k.GetAttribute<int64_t>("x_offset");
    z_offset = k.GetAttribute<int64_t>("z_offset");
    has_z = k.GetAttribute<int64_t>("has_z");
    activation = k.GetAttribute<int64_t>("activation");
    softplus = k.GetAttribute<int64_t>("delta_softplus");
    has_rms = k.GetAttribute<int64_t>("has_rms");
    rms_eps = k.GetAttribute<float>("rms_eps");
    require_activation(std::string("ssmcc.") + name(), activation);
  }

  static const char* name() {
    return kQuantized ? (kStep ? "QuantizedMambaMixerStep" : "QuantizedMambaMixer")
                      : (kStep ? "MambaMixerStep" : "MambaMixer");
  }

  void Compute(OrtKernelContext* raw) {
    const char* op = name();
    Ort::KernelContext ctx(raw);
    const Inputs in(ctx, op, kQuantized ? 12 : 10);
    const Shape proj = kStep ? in.expect(0, "zx", {kAny, kAny}, "(b, w)")
                             : in.expect(0, "zx", {kAny, kAny, kAny}, "(b, l, w)");
    const int64_t batch = proj[0], length = kStep ? 1 : proj[1], width = proj.back();
    const Shape weight = in.expect(1, "conv_weight", {kAny, kAny}, "(d, k)");
    const int64_t d = weight[0], kernel = weight[1];
    in.expect(2, "conv_bias", {d}, "(d,)");
    const int64_t E = in.expect(3, "x_proj_weight", {kAny, d}, "(R + 2n, d)")[0];
    const int64_t rank = in.expect(4, "dt_proj_weight", {d, kAny}, "(d, R)")[1];
    const int64_t n = in.expect(5, "A", {d, kAny}, "(d, n)")[1];
    if (E != rank + 2 * n)
      in.fail("x_proj_weight has " + std::to_string(E) + " rows, expected R + 2n = " +
              std::to_string(rank + 2 * n));
    in.expect(6, "D", {d}, "(d,)");
    in.expect(7, "dt_bias", {d}, "(d,)");
    in.expect(8, "conv_state", {batch, d, kernel - 1}, "(b, d, k-1)");
    in.expect(9, "ssm_state", {batch, d, n}, "(b, d, n)");
    const int64_t z_at = has_z ? z_offset : -1;
    in.require(ssmcc::check_mamba_mixer(op, batch, length, width, x_offset, z_at, d, kernel,
                                        rank, n));
    const auto x_proj =
        mixer_weight(in, ctx, 3, 10, kQuantized, "x_proj_weight", "x_proj_scale", E);
    const auto dt_proj =
        mixer_weight(in, ctx, 4, 11, kQuantized, "dt_proj_weight", "dt_proj_scale", d);
    in.require(ssmcc::check_mixer_weight(op, "x_proj", x_proj, d));
    in.require(ssmcc::check_mixer_weight(op, "dt_proj", dt_proj, rank));
    auto y = ctx.GetOutput(0, kStep ? Shape{batch, d} : Shape{batch, length, d});
    auto conv_out = ctx.GetOutput(1, {batch, d, kernel - 1});
    auto ssm_out = ctx.GetOutput(2, {batch, d, n});
    const int64_t tokens = batch * length;
    std::vector<float> conv_t(kStep ? 0 : kernel * d);
    ssmcc::transpose_conv_weight(in.data(1), conv_t.data(), d, kernel, kStep);
    const auto x_proj_t = ssmcc::mixer_weight_dense_t(x_proj, E, d, kStep);
    const auto dt_proj_t = ssmcc::mixer_weight_dense_t(dt_proj, d, rank, kStep);
    const auto A_t = ssmcc::transposed(in.data(5), d, n, kStep);
    std::vector<float> xc(tokens * d), dbc(tokens * E), dt(tokens * d);
    const ssmcc::MambaMixerArgs a{
        in.data(0), in.data(1), conv_t.data(), in.data(2), x_proj, x_proj_t.data(),
        dt_proj, dt_proj_t.data(), in.data(5), A_t.data(), in.data(6), in.data(7),
        in.data(8), in.data(9), y.GetTensorMutableData<float>(),
        conv_out.GetTensorMutableData<float>(), ssm_out.GetTensorMutableData<float>(),
        xc.data(), dbc.data(), dt.data(), batch, length, width, x_offset, z_at, d, kernel, rank,
        n, static_cast<ssmcc::Activation>(activation), softplus != 0, has_rms != 0, rms_eps};
    const ssmcc::ConvChannelsLast conv = ssmcc::mamba_mixer_conv(a);
    if (kStep) {
      ssmcc::conv_channels_last_step_rows(conv, 0, batch);
      std::vector<float> B(batch * n), C(batch * n), z(batch * d);
      const ssmcc::MambaStep step{&a, B.data(), C.data(), z.data()};
      parallel_rows<ssmcc::MambaStep, ssmcc::mamba_step_project_rows>(raw, step, E,
                                                                      kStepProjectRows);
      ssmcc::mamba_step_split(step);
      parallel_rows<ssmcc::MambaStep, ssmcc::mamba_step_channel_rows>(raw, step, batch * d,
                                                                      kStepChannelRows);
      return;
    }
    parallel_rows<ssmcc::ConvChannelsLast, ssmcc::conv_channels_last_rows>(
        raw, conv, batch * ssmcc::conv_blocks(length), 1);
    ssmcc::conv_channels_last_state_out(conv);
    const int64_t block = ssmcc::tuning::kMixerConvBlock;
    parallel_rows<ssmcc::MambaMixerArgs, ssmcc::mamba_projection_rows>(
        raw, a, (tokens + block - 1) / block, 1);
    parallel_rows<ssmcc::MambaMixerArgs, ssmcc::mamba_scan_rows>(
        raw, a, batch * ssmcc::mamba_scan_groups(a), 1);
  }
};

const FloatOp<Checked<MambaMixerKernel<false, false>>, 10, 3> kMambaMixer("MambaMixer");
const FloatOp<Checked<MambaMixerKernel<true, false>>, 10, 3> kMambaMixerStep("MambaMixerStep");

// The quantized forms: inputs 3 and 4 (the projection weights) of any storage, checked at run
// time; every other input float32.
ONNXTensorElementDataType quantized_mixer_input_type(size_t i) {
  return i == 3 || i == 4 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED
                          : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}

const FloatOp<Checked<MambaMixerKernel<false, true>>, 12, 3> kQuantizedMambaMixer(
    "QuantizedMambaMixer", quantized_mixer_input_type);
const FloatOp<Checked<MambaMixerKernel<true, true>>, 12, 3> kQuantizedMambaMixerStep(
    "QuantizedMambaMixerStep", quantized_mixer_input_type);

}  // namespace

void ssmcc::ort::add_mamba_mixer_ops(Ort::CustomOpDomain& domain) {
  domain.Add(&kMambaMixer);
  domain.Add(&kMambaMixerStep);
  domain.Add(&kQuantizedMambaMixer);
  domain.Add(&kQuantizedMambaMixerStep);
}
