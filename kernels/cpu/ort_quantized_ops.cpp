// ONNX Runtime kernels of the linear layers with weights stored small (gemv_quantized.h;
// schemas and portable bodies: lowering/onnx/quantized.py):
//
//   QuantizedLinear(x[..., k] float, weight[n, k] int8, scale[n, G], bias[n]) -> y[..., n]
//   HalfLinear(x[..., k] float, weight[n, k] bfloat16 | float16, scale[n, G], bias[n]) -> y
//
// W = weight * scale per group of k / G columns; y = x W^T + bias. The emitter uses these nodes
// where x has few rows (decode), so the kernel is the matrix-vector product that streams the
// small weights once; any number of rows is computed correctly. Every input's shape is checked
// before anything is read.
#include <algorithm>
#include <string>

#include "gemv_quantized.h"
#include "ort_common.h"

namespace {

using namespace ssmcc::ort;  // NOLINT: Inputs, Shape, kAny, parallel_rows, Checked

template <typename W>
struct Blocks {
  ssmcc::QuantizedGemvArgs<W> args;
};

template <typename W>
void block_rows(const Blocks<W>& b, int64_t begin, int64_t end) {
  ssmcc::quantized_gemv_rows(b.args, begin * ssmcc::kQuantizedBlock,
                             std::min(end * ssmcc::kQuantizedBlock, b.args.out_features));
}

template <typename W>
void run(OrtKernelContext* raw, const Inputs& in, Ort::KernelContext& ctx, const void* weight,
         int64_t rows, int64_t n, int64_t k, int64_t groups, const Shape& x_shape) {
  Shape y_shape = x_shape;
  y_shape.back() = n;
  auto y = ctx.GetOutput(0, y_shape);
  const Blocks<W> blocks{{in.data(0), static_cast<const W*>(weight), in.data(2), in.data(3),
                          y.GetTensorMutableData<float>(), rows, n, k, groups}};
  const int64_t count = (n + ssmcc::kQuantizedBlock - 1) / ssmcc::kQuantizedBlock;
  // tasks of 128 weight rows: enough per task to amortise the pool, many tasks per thread
  parallel_rows<Blocks<W>, block_rows<W>>(raw, blocks, count, 16);
}

template <bool kHalf>
struct LinearKernel {
  LinearKernel(const OrtApi&, const OrtKernelInfo*) {}

  void Compute(OrtKernelContext* raw) {
    const char* op = kHalf ? "HalfLinear" : "QuantizedLinear";
    Ort::KernelContext ctx(raw);
    const Inputs in(ctx, op, 4);
    const Shape x = in.expect_rank_at_least(0, "x", 1, "(..., k)");
    const Shape w = in.expect(1, "weight", {kAny, kAny}, "(n, k)");
    const int64_t n = w[0], k = w[1];
    if (x.back() != k)
      in.fail("x must be (..., " + std::to_string(k) + ") for a weight " + shape_text(w) +
              ", got " + shape_text(x));
    const int64_t groups = in.expect(2, "scale", {n, kAny}, "(n, G)")[1];
    if (groups < 1 || k % groups != 0)
      in.fail("scale's " + std::to_string(groups) + " groups must divide k = " +
              std::to_string(k));
    in.expect(3, "bias", {n}, "(n,)");
    int64_t rows = 1;
    for (size_t axis = 0; axis + 1 < x.size(); ++axis) rows *= x[axis];
    const auto weight = ctx.GetInput(1);
    const auto type = weight.GetTensorTypeAndShapeInfo().GetElementType();
    const void* data = weight.GetTensorRawData();
    if (!kHalf)
      run<int8_t>(raw, in, ctx, data, rows, n, k, groups, x);
    else if (type == ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16)
      run<uint16_t>(raw, in, ctx, data, rows, n, k, groups, x);
    else if (type == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16)
      run<_Float16>(raw, in, ctx, data, rows, n, k, groups, x);
    else
      in.fail("weight must be bfloat16 or float16");
  }
};

// input 1 (the weight): int8, or either 16-bit storage (checked at run time); the rest float32
template <bool kHalf>
ONNXTensorElementDataType linear_input_type(size_t i) {
  if (i != 1) return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  return kHalf ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED : ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8;
}

const FloatOp<Checked<LinearKernel<false>>, 4, 1> kQuantizedLinear("QuantizedLinear",
                                                                   linear_input_type<false>);
const FloatOp<Checked<LinearKernel<true>>, 4, 1> kHalfLinear("HalfLinear",
                                                             linear_input_type<true>);

}  // namespace

void ssmcc::ort::add_quantized_ops(Ort::CustomOpDomain& domain) {
  domain.Add(&kQuantizedLinear);
  domain.Add(&kHalfLinear);
}
