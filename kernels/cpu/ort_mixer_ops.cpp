// ONNX Runtime kernels of the fused Mamba-2 mixer (ssd_mixer.h; schemas: lowering/onnx/schemas.py):
//
//   SsdMixer(zxbcdt[b,l,w], conv_weight[c,k], conv_bias[c], A[h], D[h,p], dt_bias[h],
//            norm_weight[d], conv_state[b,c,k-1], ssm_state[b,h,p,n]; groups, z_offset, has_z,
//            xbc_offset, dt_offset, norm_group_size, eps, norm_before_gate, activation,
//            dt_softplus, dt_min, dt_max) -> y[b,l,d], conv_state, ssm_state
//   SsdMixerStep: the same with zxbcdt[b,w] -> y[b,d], conv_state, ssm_state
//
// with d = h p and c = d + 2 g n. Every input's shape is checked before anything is read.
#include <vector>

#include "contracts.h"
#include "ort_common.h"
#include "ssd_chunked.h"
#include "ssd_mixer.h"

namespace {

using namespace ssmcc::ort;  // NOLINT: Inputs, Shape, kAny, parallel_rows, FloatOp, Checked

template <bool kStep>
struct SsdMixerKernel {
  int64_t groups, z_offset, has_z, xbc_offset, dt_offset, norm_group_size, norm_before_gate;
  int64_t activation, softplus;
  float eps, dt_min, dt_max;

  SsdMixerKernel(const OrtApi&, const OrtKernelInfo* info) {
    Ort::ConstKernelInfo k(info);
    groups = k.GetAttribute<int64_t>("groups");
    z_offset = k.GetAttribute<int64_t>("z_offset");
    has_z = k.GetAttribute<int64_t>("has_z");
    xbc_offset = k.GetAttribute<int64_t>("xbc_offset");
    dt_offset = k.GetAttribute<int64_t>("dt_offset");
    norm_group_size = k.GetAttribute<int64_t>("norm_group_size");
    norm_before_gate = k.GetAttribute<int64_t>("norm_before_gate");
    activation = k.GetAttribute<int64_t>("activation");
    softplus = k.GetAttribute<int64_t>("dt_softplus");
    eps = k.GetAttribute<float>("eps");
    dt_min = k.GetAttribute<float>("dt_min");
    dt_max = k.GetAttribute<float>("dt_max");
    require_activation(std::string("ssmcc.") + (kStep ? "SsdMixerStep" : "SsdMixer"), activation);
  }

  void Compute(OrtKernelContext* raw) {
    const char* op = kStep ? "SsdMixerStep" : "SsdMixer";
    Ort::KernelContext ctx(raw);
    const Inputs in(ctx, op, 9);
    const Shape proj = kStep ? in.expect(0, "zxbcdt", {kAny, kAny}, "(b, w)")
                             : in.expect(0, "zxbcdt", {kAny, kAny, kAny}, "(b, l, w)");
    const int64_t batch = proj[0], length = kStep ? 1 : proj[1], width = proj.back();
    const Shape weight = in.expect(1, "conv_weight", {kAny, kAny}, "(c, k)");
    const int64_t channels = weight[0], kernel = weight[1];
    in.expect(2, "conv_bias", {channels}, "(c,)");
    const int64_t heads = in.expect(3, "A", {kAny}, "(h,)")[0];
    const int64_t inner = in.expect(6, "norm_weight", {kAny}, "(d,)")[0];
    if (heads < 1 || inner % heads != 0)
      in.fail("norm_weight has " + std::to_string(inner) + " entries, not a multiple of heads=" +
              std::to_string(heads));
    const int64_t head_dim = inner / heads;
    if (groups < 1 || channels <= inner || (channels - inner) % (2 * groups) != 0)
      in.fail("conv_weight has " + std::to_string(channels) + " channels; expected d + 2 g n");
    const int64_t dstate = (channels - inner) / (2 * groups);
    in.expect(4, "D", {heads, head_dim}, "(h, p)");
    in.expect(5, "dt_bias", {heads}, "(h,)");
    in.expect(7, "conv_state", {batch, channels, kernel - 1}, "(b, c, k-1)");
    in.expect(8, "ssm_state", {batch, heads, head_dim, dstate}, "(b, h, p, n)");
    const int64_t z_at = has_z ? z_offset : -1;
    in.require(ssmcc::check_ssd_mixer(op, batch, length, width, heads, head_dim, groups, dstate,
                                      kernel, z_at, xbc_offset, dt_offset, norm_group_size));
    const Shape y_shape = kStep ? Shape{batch, inner} : Shape{batch, length, inner};
    auto y = ctx.GetOutput(0, y_shape);
    auto conv_out = ctx.GetOutput(1, {batch, channels, kernel - 1});
    auto ssm_out = ctx.GetOutput(2, {batch, heads, head_dim, dstate});
    std::vector<float> weight_t(kStep ? 0 : kernel * channels), xbc(batch * length * channels);
    ssmcc::transpose_conv_weight(in.data(1), weight_t.data(), channels, kernel, kStep);
    const ssmcc::MixerArgs a{in.data(0), in.data(1), in.data(2), weight_t.data(), in.data(3),
                             in.data(4), in.data(5), in.data(6), in.data(7), in.data(8),
                             y.GetTensorMutableData<float>(), conv_out.GetTensorMutableData<float>(),
                             ssm_out.GetTensorMutableData<float>(), xbc.data(), batch, length,
                             width, heads, head_dim, groups, dstate, kernel, z_at, xbc_offset,
                             dt_offset, norm_group_size, static_cast<ssmcc::Activation>(activation),
                             softplus != 0,
                             norm_before_gate != 0, dt_min, dt_max, eps};
    if (kStep) {
      ssmcc::conv_channels_last_step_rows(ssmcc::mixer_conv(a), 0, batch);
      const ssmcc::SsdArgs scan = ssmcc::mixer_scan_args(a);
      parallel_rows<ssmcc::SsdArgs, ssmcc::ssd_state_update_rows>(raw, scan, batch * heads, 1);
      ssmcc::mixer_norm_rows(a, 0, batch);
      return;
    }
    const ssmcc::ConvChannelsLast conv = ssmcc::mixer_conv(a);
    parallel_rows<ssmcc::ConvChannelsLast, ssmcc::conv_channels_last_rows>(
        raw, conv, batch * ssmcc::conv_blocks(length), 1);
    ssmcc::conv_channels_last_state_out(ssmcc::mixer_conv(a));
    const ssmcc::SsdArgs scan = ssmcc::mixer_scan_args(a);
    if (ssmcc::ssd_use_chunked(scan)) {
      std::vector<float> gram(ssmcc::ssd_gram_floats(scan));
      const ssmcc::SsdChunked chunked{scan, gram.data()};
      parallel_rows<ssmcc::SsdChunked, ssmcc::ssd_gram_rows>(
          raw, chunked, batch * groups * ssmcc::ssd_chunks(scan), 1);
      parallel_rows<ssmcc::SsdChunked, ssmcc::ssd_chunked_rows>(raw, chunked, batch * heads, 1);
    } else {
      parallel_rows<ssmcc::SsdArgs, ssmcc::ssd_scan_rows>(raw, scan, batch * heads, 1);
    }
    parallel_rows<ssmcc::MixerArgs, ssmcc::mixer_norm_rows>(raw, a, batch * length);
  }
};

const FloatOp<Checked<SsdMixerKernel<false>>, 9, 3> kSsdMixer("SsdMixer");
const FloatOp<Checked<SsdMixerKernel<true>>, 9, 3> kSsdMixerStep("SsdMixerStep");

}  // namespace

void ssmcc::ort::add_mixer_ops(Ort::CustomOpDomain& domain) {
  domain.Add(&kSsdMixer);
  domain.Add(&kSsdMixerStep);
}
