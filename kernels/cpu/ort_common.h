// Shared pieces of the ssmcc ONNX Runtime kernels (ort_ops.cpp: Mamba-1 ops and registration,
// ort_ssd_ops.cpp: Mamba-2 ops, ort_mixer_ops.cpp, ort_mamba_mixer_ops.cpp: the fused mixers,
// ort_quantized_ops.cpp: linear layers with small weights, ort_linear_ops.cpp: the float32
// linear layer reading its weight in place, ort_moe_ops.cpp: a MoE layer's experts): rows split
// over ORT's intra-op thread pool, inputs
// read with their shapes checked against the node's contract (Inputs: ORT checks only element
// types), and a float op type whose kernel errors become ORT statuses, never exceptions across
// ORT's C API.
#pragma once

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "activations.h"
#include "denormals.h"
#include "gemv_quantized.h"
#include "onnxruntime_cxx_api.h"
#include "tuning.h"

namespace ssmcc::ort {

using ssmcc::tuning::kRowsPerTask;
using Shape = std::vector<int64_t>;
constexpr int64_t kAny = -1;

template <typename Args, void (*Rows)(const Args&, int64_t, int64_t)>
struct RowTask {
  const Args* args;
  int64_t rows, per_task;
  static void run(void* self, size_t task) {
    const FlushDenormals flush;  // per worker thread
    auto* t = static_cast<RowTask*>(self);
    const int64_t begin = static_cast<int64_t>(task) * t->per_task;
    const int64_t end = std::min(begin + t->per_task, t->rows);
    Rows(*t->args, begin, end);
  }
};

// Rows [0, rows) in tasks of ``per_task`` rows on ORT's intra-op pool (which groups the tasks
// into about one batch per thread).
template <typename Args, void (*Rows)(const Args&, int64_t, int64_t)>
void parallel_rows(OrtKernelContext* context, const Args& args, int64_t rows,
                   int64_t per_task = kRowsPerTask) {
  RowTask<Args, Rows> task{&args, rows, per_task};
  const size_t tasks = static_cast<size_t>((rows + per_task - 1) / per_task);
  if (tasks == 0) return;
  Ort::ThrowOnError(Ort::GetApi().KernelContext_ParallelFor(
      context, &RowTask<Args, Rows>::run, tasks, 0, &task));
}

inline std::string shape_text(const Shape& shape) {
  std::string text = "(";
  for (size_t i = 0; i < shape.size(); ++i)
    text += (i ? ", " : "") + (shape[i] == kAny ? std::string("*") : std::to_string(shape[i]));
  return text + (shape.size() == 1 ? ",)" : ")");
}

// The inputs of one node, read with their shapes checked (std::invalid_argument otherwise).
class Inputs {
 public:
  Inputs(Ort::KernelContext& ctx, const char* op, size_t count) : ctx_(ctx), op_(op) {
    if (ctx.GetInputCount() != count)
      fail("expects " + std::to_string(count) + " inputs, got " +
           std::to_string(ctx.GetInputCount()));
  }

  // The shape of input ``i`` after checking it against ``want`` (kAny: any size).
  Shape expect(size_t i, const char* name, const Shape& want, const char* layout) const {
    const Shape have = value(i, name).GetTensorTypeAndShapeInfo().GetShape();
    bool fits = have.size() == want.size();
    for (size_t axis = 0; fits && axis < want.size(); ++axis)
      fits = want[axis] == kAny || want[axis] == have[axis];
    if (!fits)
      fail(std::string(name) + " must have shape " + layout + " = " + shape_text(want) + ", got " +
           shape_text(have));
    return have;
  }

  // The shape of input ``i`` after checking that it has at least ``rank`` axes.
  Shape expect_rank_at_least(size_t i, const char* name, size_t rank, const char* layout) const {
    const Shape have = value(i, name).GetTensorTypeAndShapeInfo().GetShape();
    if (have.size() < rank) fail(std::string(name) + " must have shape " + layout + ", got " +
                                 shape_text(have));
    return have;
  }

  const float* data(size_t i) const { return ctx_.GetInput(i).GetTensorData<float>(); }

  [[noreturn]] void fail(const std::string& message) const {
    throw std::invalid_argument(std::string("ssmcc.") + op_ + ": " + message);
  }

  void require(const std::string& contract) const {
    if (!contract.empty()) throw std::invalid_argument(contract);
  }

 private:
  Ort::ConstValue value(size_t i, const char* name) const {
    auto v = ctx_.GetInput(i);
    if (!v) fail(std::string("input ") + name + " is missing");
    return v;
  }

  Ort::KernelContext& ctx_;
  const char* op_;
};

// The element type an op declares for input ``i``.
using InputType = ONNXTensorElementDataType (*)(size_t i);

inline ONNXTensorElementDataType all_float(size_t) { return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }

// An op with float outputs whose kernel errors (bad shapes, allocation failures) become ORT
// statuses: nothing is thrown across ORT's C API. Its inputs are float unless ``input_type``
// says otherwise (UNDEFINED: a stored weight whose storage the kernel checks at run time).
template <typename Kernel, int Inputs, int Outputs>
struct FloatOp : Ort::CustomOpBase<FloatOp<Kernel, Inputs, Outputs>, Kernel, true> {
  const char* name;
  InputType input_type;
  explicit FloatOp(const char* op_name, InputType types = all_float)
      : name(op_name), input_type(types) {}
  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const {
    try {
      *kernel = new Kernel(api, info);
      return nullptr;
    } catch (const std::exception& error) {
      return api.CreateStatus(ORT_INVALID_ARGUMENT, error.what());
    }
  }
  const char* GetName() const { return name; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return Inputs; }
  ONNXTensorElementDataType GetInputType(size_t i) const { return input_type(i); }
  size_t GetOutputTypeCount() const { return Outputs; }
  ONNXTensorElementDataType GetOutputType(size_t) const {
    return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
};

// The ssmcc::Storage of a weight stored small (int8, bfloat16, float16), or -1 for any other
// element type.
inline int storage_of(ONNXTensorElementDataType type) {
  switch (type) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8:
      return static_cast<int>(Storage::kInt8);
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16:
      return static_cast<int>(Storage::kBFloat16);
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
      return static_cast<int>(Storage::kFloat16);
    default:
      return -1;
  }
}

// A node's ``activation`` attribute (activations.h's codes); thrown when it names none, which
// the kernel's constructor reports as the node's error when the session is created.
inline void require_activation(const std::string& op, int64_t code) {
  const std::string invalid = check_activation(op, code);
  if (!invalid.empty()) throw std::invalid_argument(invalid);
}

// Kernel::Compute behind ComputeV2: an exception becomes an ORT_INVALID_ARGUMENT status.
template <typename Kernel>
struct Checked : Kernel {
  using Kernel::Kernel;
  OrtStatusPtr ComputeV2(OrtKernelContext* context) {
    try {
      const FlushDenormals flush;  // the calling thread, for this node
      Kernel::Compute(context);
      return nullptr;
    } catch (const std::exception& error) {
      return Ort::GetApi().CreateStatus(ORT_INVALID_ARGUMENT, error.what());
    }
  }
};

// Registers the Mamba-2 ops (ort_ssd_ops.cpp) in the ssmcc domain.
void add_ssd_ops(Ort::CustomOpDomain& domain);

// Registers the fused Mamba-2 mixer ops (ort_mixer_ops.cpp) in the ssmcc domain.
void add_mixer_ops(Ort::CustomOpDomain& domain);

// Registers the fused Mamba-1 mixer ops (ort_mamba_mixer_ops.cpp) in the ssmcc domain.
void add_mamba_mixer_ops(Ort::CustomOpDomain& domain);

// Registers the linear layers with small weights (ort_quantized_ops.cpp) in the ssmcc domain.
void add_quantized_ops(Ort::CustomOpDomain& domain);

// Registers the ops that read weights in place, Linear and Widen (ort_linear_ops.cpp).
void add_linear_ops(Ort::CustomOpDomain& domain);

// Registers a MoE layer's experts for few tokens, MoeExperts and QuantizedMoeExperts
// (ort_moe_ops.cpp).
void add_moe_ops(Ort::CustomOpDomain& domain);

}  // namespace ssmcc::ort
