// ONNX Runtime kernels of a mixture-of-experts layer's experts for a few tokens (moe_experts.h;
// schemas and portable bodies: lowering/onnx/moe.py):
//
//   MoeExperts(hidden[t, d], top_k_index[t, k] int64, top_k_weights[t, k], up[E, u, d],
//              down[E, d, i]; activation, gated) -> out[t, d]
//   QuantizedMoeExperts(hidden, top_k_index, top_k_weights, up[E, u, d] int8 | bfloat16 |
//              float16, up_scale[E, u, G], down[E, d, i] (same storages), down_scale[E, d, G'];
//              activation, gated) -> out[t, d]
//
// u = 2i when gated, else i. The emitter uses these nodes where the tokens are few (a decode
// step: one per sequence), so only the chosen experts' weights are read, once each; any number
// of tokens is computed correctly. Every input's shape is checked before anything is read.
#include <string>

#include "moe_experts.h"
#include "ort_common.h"

namespace {

using namespace ssmcc::ort;  // NOLINT: Inputs, Shape, kAny, parallel_rows, Checked

// An (E, rows, cols) expert weight and, when quantized, its (E, rows, G) scale.
ssmcc::MixerWeight expert_weight(const Inputs& in, Ort::KernelContext& ctx, size_t at,
                                 size_t scale_at, bool quantized, const char* name,
                                 const char* scale_name, int64_t experts, int64_t rows,
                                 int64_t cols, const char* op) {
  if (!quantized) return {in.data(at), nullptr, ssmcc::kFloat32Storage, 1};
  const auto value = ctx.GetInput(at);
  const int storage = storage_of(value.GetTensorTypeAndShapeInfo().GetElementType());
  if (storage < 0)
    in.fail(std::string(name) + " must be int8, bfloat16 or float16 (float32 experts go to "
            "MoeExperts)");
  const int64_t groups =
      in.expect(scale_at, scale_name, {experts, rows, kAny}, "(experts, rows, G)")[2];
  const ssmcc::MixerWeight w{value.GetTensorRawData(), in.data(scale_at), storage, groups};
  in.require(ssmcc::check_mixer_weight(op, name, w, cols));
  return w;
}

template <bool kQuantized>
struct MoeExpertsKernel {
  int64_t activation, gated;

  MoeExpertsKernel(const OrtApi&, const OrtKernelInfo* info) {
    Ort::ConstKernelInfo k(info);
    activation = k.GetAttribute<int64_t>("activation");
    gated = k.GetAttribute<int64_t>("gated");
    const std::string invalid =
        ssmcc::check_expert_activation("ssmcc." + std::string(name()), activation);
    if (!invalid.empty()) throw std::invalid_argument(invalid);
  }

  static const char* name() { return kQuantized ? "QuantizedMoeExperts" : "MoeExperts"; }

  void Compute(OrtKernelContext* raw) {
    Ort::KernelContext ctx(raw);
    const Inputs in(ctx, name(), kQuantized ? 7 : 5);
    const size_t down_at = kQuantized ? 5 : 4;
    const Shape hidden = in.expect(0, "hidden", {kAny, kAny}, "(tokens, hidden)");
    const int64_t tokens = hidden[0], d = hidden[1];
    const int64_t k = in.expect(1, "top_k_index", {tokens, kAny}, "(tokens, k)")[1];
    in.expect(2, "top_k_weights", {tokens, k}, "(tokens, k)");
    const Shape down = in.expect(down_at, "down", {kAny, d, kAny}, "(experts, hidden, width)");
    const int64_t experts = down[0], width = down[2];
    const int64_t u = gated ? 2 * width : width;
    in.expect(3, "up", {experts, u, d},
              gated ? "(experts, 2 * width, hidden)" : "(experts, width, hidden)");
    const ssmcc::MoeArgs args{
        in.data(0),
        ctx.GetInput(1).GetTensorData<int64_t>(),
        in.data(2),
        expert_weight(in, ctx, 3, 4, kQuantized, "up", "up_scale", experts, u, d, name()),
        expert_weight(in, ctx, down_at, 6, kQuantized, "down", "down_scale", experts, d, width,
                      name()),
        ctx.GetOutput(0, hidden).GetTensorMutableData<float>(),
        tokens,
        k,
        experts,
        d,
        width,
        gated != 0,
        static_cast<int>(activation)};
    ssmcc::MoePlan plan(args);
    const ssmcc::MoePhase up = ssmcc::moe_up_phase(args, plan);
    parallel_rows<ssmcc::MoePhase, ssmcc::moe_up_tasks>(raw, up, ssmcc::moe_tasks(up), 1);
    const ssmcc::MoePhase down_phase = ssmcc::moe_down_phase(args, plan);
    parallel_rows<ssmcc::MoePhase, ssmcc::moe_down_tasks>(raw, down_phase,
                                                          ssmcc::moe_tasks(down_phase), 1);
    ssmcc::moe_combine(args, plan);
  }
};

template <bool kQuantized>
ONNXTensorElementDataType moe_input_type(size_t i) {
  if (i == 1) return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
  // stored experts: either storage, checked at run time
  if (kQuantized && (i == 3 || i == 5)) return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}

const FloatOp<Checked<MoeExpertsKernel<false>>, 5, 1> kMoeExperts("MoeExperts",
                                                                  moe_input_type<false>);
const FloatOp<Checked<MoeExpertsKernel<true>>, 7, 1> kQuantizedMoeExperts(
    "QuantizedMoeExperts", moe_input_type<true>);

}  // namespace

void ssmcc::ort::add_moe_ops(Ort::CustomOpDomain& domain) {
  domain.Add(&kMoeExperts);
  domain.Add(&kQuantizedMoeExperts);
}
