// ONNX Runtime kernels that read weights where they are stored (schemas and portable bodies:
// lowering/onnx/weights_in_place.py, lowering/onnx/quantized.py):
//
//   Linear(x[..., k] float, weight[n, k] float) -> y[..., n] = x W^T
//   Widen(weight[n, k] int8 | bfloat16 | float16, scale[n, G] float) -> W[n, k] float
//       W = weight * scale per group of k / G columns, computed on every call
//
// W is the initializer itself, laid out as PyTorch stores it, so the sessions of one model (and
// the file's memory map behind them) share a single copy: nothing is transposed or pre-packed at
// session creation. The product is gemv.h's matrix-vector kernel (every weight read once per
// call, all rows of x against each block of weight rows while it sits in L1), which is what a
// decode step needs; any number of rows is computed correctly.
#include <algorithm>
#include <string>

#include "gemv.h"
#include "gemv_quantized.h"
#include "ort_common.h"

namespace {

using namespace ssmcc::ort;  // NOLINT: Inputs, Shape, kAny, parallel_rows, FloatOp

void block_rows(const ssmcc::GemvArgs& args, int64_t begin, int64_t end) {
  ssmcc::gemv_rows(args, begin * ssmcc::kGemvBlock,
                   std::min(end * ssmcc::kGemvBlock, args.out_features));
}

struct LinearKernel {
  LinearKernel(const OrtApi&, const OrtKernelInfo*) {}

  void Compute(OrtKernelContext* raw) {
    Ort::KernelContext ctx(raw);
    const Inputs in(ctx, "Linear", 2);
    const Shape x = in.expect_rank_at_least(0, "x", 1, "(..., k)");
    const Shape w = in.expect(1, "weight", {kAny, kAny}, "(n, k)");
    const int64_t n = w[0], k = w[1];
    if (x.back() != k)
      in.fail("x must be (..., " + std::to_string(k) + ") for a weight " + shape_text(w) +
              ", got " + shape_text(x));
    int64_t rows = 1;
    for (size_t axis = 0; axis + 1 < x.size(); ++axis) rows *= x[axis];
    Shape y_shape = x;
    y_shape.back() = n;
    auto y = ctx.GetOutput(0, y_shape);
    const ssmcc::GemvArgs args{in.data(0), in.data(1), nullptr,
                               y.GetTensorMutableData<float>(), rows, n, k};
    const int64_t blocks = (n + ssmcc::kGemvBlock - 1) / ssmcc::kGemvBlock;
    // tasks of 128 weight rows: enough per task to amortise the pool, many tasks per thread
    parallel_rows<ssmcc::GemvArgs, block_rows>(raw, args, blocks, 128 / ssmcc::kGemvBlock);
  }
};

const FloatOp<Checked<LinearKernel>, 2, 1> kLinear("Linear");

// Widen: the float32 weight a prefill GEMM reads, made from the stored small weight on every
// call (ONNX Runtime would otherwise fold the widening into a float32 copy held by every session:
// 5x the bfloat16 weights of mamba-130m resident). Rows are split over the pool.
template <typename W>
struct WidenArgs {
  const W* weight;
  const float* scale;
  float* out;
  int64_t k, groups;
};

template <typename W>
void widen_rows(const WidenArgs<W>& a, int64_t begin, int64_t end) {
  ssmcc::dequantize_rows(a.weight, a.scale, a.out, a.k, a.groups, begin, end);
}

template <typename W>
void widen_weight(OrtKernelContext* raw, const void* weight, const float* scale, float* out,
                  int64_t n, int64_t k, int64_t groups) {
  const WidenArgs<W> args{static_cast<const W*>(weight), scale, out, k, groups};
  parallel_rows<WidenArgs<W>, widen_rows<W>>(raw, args, n, 64);
}

struct WidenKernel {
  WidenKernel(const OrtApi&, const OrtKernelInfo*) {}

  void Compute(OrtKernelContext* raw) {
    Ort::KernelContext ctx(raw);
    const Inputs in(ctx, "Widen", 2);
    const Shape w = in.expect(0, "weight", {kAny, kAny}, "(n, k)");
    const int64_t n = w[0], k = w[1];
    const int64_t groups = in.expect(1, "scale", {n, kAny}, "(n, G)")[1];
    if (groups < 1 || k % groups != 0)
      in.fail("scale's " + std::to_string(groups) + " groups must divide k = " +
              std::to_string(k));
    auto out = ctx.GetOutput(0, w);
    float* data = out.GetTensorMutableData<float>();
    const auto weight = ctx.GetInput(0);
    const void* stored = weight.GetTensorRawData();
    switch (weight.GetTensorTypeAndShapeInfo().GetElementType()) {
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8:
        return widen_weight<int8_t>(raw, stored, in.data(1), data, n, k, groups);
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16:
        return widen_weight<uint16_t>(raw, stored, in.data(1), data, n, k, groups);
      case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
        return widen_weight<_Float16>(raw, stored, in.data(1), data, n, k, groups);
      default:
        in.fail("weight must be int8, bfloat16 or float16");
    }
  }
};

// the weight's storage is checked at run time
ONNXTensorElementDataType widen_input_type(size_t i) {
  return i == 0 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}

const FloatOp<Checked<WidenKernel>, 2, 1> kWiden("Widen", widen_input_type);

}  // namespace

void ssmcc::ort::add_linear_ops(Ort::CustomOpDomain& domain) {
  domain.Add(&kLinear);
  domain.Add(&kWiden);
}
