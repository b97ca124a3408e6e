// ONNX Runtime custom-op library for the ssmcc domain: the kernels of ssm_kernels.h bound as
// ORT kernels (schemas: lowering/onnx/schemas.py). Rows are split over ORT's own intra-op thread
// pool (KernelContext_ParallelFor), so no second thread pool competes with ORT's.
// Build: -std=c++17 -fPIC -shared -fvisibility=hidden -DORT_API_MANUAL_INIT; the only exported
// symbol is RegisterCustomOps.
#include <memory>
#include <mutex>
#include <vector>

#include "onnxruntime_cxx_api.h"
#include "ssm_kernels.h"

namespace {

using ssmcc::tuning::kRowsPerTask;

template <typename Args, void (*Rows)(const Args&, int64_t, int64_t)>
struct RowTask {
  const Args* args;
  int64_t rows;
  static void run(void* self, size_t task) {
    auto* t = static_cast<RowTask*>(self);
    const int64_t begin = static_cast<int64_t>(task) * kRowsPerTask;
    const int64_t end = std::min(begin + kRowsPerTask, t->rows);
    Rows(*t->args, begin, end);
  }
};

template <typename Args, void (*Rows)(const Args&, int64_t, int64_t)>
void parallel_rows(OrtKernelContext* context, const Args& args, int64_t rows) {
  RowTask<Args, Rows> task{&args, rows};
  const size_t tasks = static_cast<size_t>((rows + kRowsPerTask - 1) / kRowsPerTask);
  if (tasks == 0) return;
  Ort::ThrowOnError(Ort::GetApi().KernelContext_ParallelFor(
      context, &RowTask<Args, Rows>::run, tasks, 0, &task));
}

struct SelectiveScanKernel {
  int64_t softplus, has_z;
  SelectiveScanKernel(const OrtApi&, const OrtKernelInfo* info) {
    Ort::ConstKernelInfo kernel_info(info);
    softplus = kernel_info.GetAttribute<int64_t>("delta_softplus");
    has_z = kernel_info.GetAttribute<int64_t>("has_z");
  }
  void Compute(OrtKernelContext* raw) {
    Ort::KernelContext ctx(raw);
    auto u = ctx.GetInput(0);
    const auto shape = u.GetTensorTypeAndShapeInfo().GetShape();  // (b, d, l)
    auto B = ctx.GetInput(3);
    const auto b_shape = B.GetTensorTypeAndShapeInfo().GetShape();  // (b, g, n, l)
    const int64_t batch = shape[0], dim = shape[1], length = shape[2];
    const int64_t groups = b_shape[1], dstate = b_shape[2];
    auto out = ctx.GetOutput(0, shape);
    auto last = ctx.GetOutput(1, {batch, dim, dstate});
    std::vector<float> Bt(batch * groups * dstate * length), Ct(Bt.size());
    ssmcc::transpose_state_length(B.GetTensorData<float>(), Bt.data(), batch * groups, dstate,
                                  length);
    ssmcc::transpose_state_length(ctx.GetInput(4).GetTensorData<float>(), Ct.data(),
                                  batch * groups, dstate, length);
    ssmcc::ScanArgs args{u.GetTensorData<float>(),
                         ctx.GetInput(1).GetTensorData<float>(),
                         ctx.GetInput(2).GetTensorData<float>(),
                         Bt.data(),
                         Ct.data(),
                         ctx.GetInput(5).GetTensorData<float>(),
                         has_z ? ctx.GetInput(6).GetTensorData<float>() : nullptr,
                         ctx.GetInput(7).GetTensorData<float>(),
                         ctx.GetInput(8).GetTensorData<float>(),
                         out.GetTensorMutableData<float>(),
                         last.GetTensorMutableData<float>(),
                         batch, dim, length, groups, dstate, softplus != 0};
    parallel_rows<ssmcc::ScanArgs, ssmcc::selective_scan_rows>(raw, args, batch * dim);
  }
};

struct CausalConv1dKernel {
  int64_t activation;
  CausalConv1dKernel(const OrtApi&, const OrtKernelInfo* info) {
    activation = Ort::ConstKernelInfo(info).GetAttribute<int64_t>("activation");
  }
  void Compute(OrtKernelContext* raw) {
    Ort::KernelContext ctx(raw);
    auto x = ctx.GetInput(0);
    const auto shape = x.GetTensorTypeAndShapeInfo().GetShape();  // (b, d, l)
    auto weight = ctx.GetInput(1);
    const int64_t width = weight.GetTensorTypeAndShapeInfo().GetShape()[1];
    auto out = ctx.GetOutput(0, shape);
    auto final_state = ctx.GetOutput(1, {shape[0], shape[1], width - 1});
    ssmcc::ConvArgs args{x.GetTensorData<float>(),
                         weight.GetTensorData<float>(),
                         ctx.GetInput(2).GetTensorData<float>(),
                         ctx.GetInput(3).GetTensorData<float>(),
                         out.GetTensorMutableData<float>(),
                         final_state.GetTensorMutableData<float>(),
                         shape[0], shape[1], shape[2], width, activation == 1};
    parallel_rows<ssmcc::ConvArgs, ssmcc::causal_conv1d_rows>(raw, args, shape[0] * shape[1]);
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
    auto state = ctx.GetInput(0);
    const auto shape = state.GetTensorTypeAndShapeInfo().GetShape();  // (b, d, n)
    auto B = ctx.GetInput(4);
    const int64_t groups = B.GetTensorTypeAndShapeInfo().GetShape()[1];
    auto out = ctx.GetOutput(0, {shape[0], shape[1]});
    auto new_state = ctx.GetOutput(1, shape);
    ssmcc::StepArgs args{state.GetTensorData<float>(),
                         ctx.GetInput(1).GetTensorData<float>(),
                         ctx.GetInput(2).GetTensorData<float>(),
                         ctx.GetInput(3).GetTensorData<float>(),
                         B.GetTensorData<float>(),
                         ctx.GetInput(5).GetTensorData<float>(),
                         ctx.GetInput(6).GetTensorData<float>(),
                         has_z ? ctx.GetInput(7).GetTensorData<float>() : nullptr,
                         ctx.GetInput(8).GetTensorData<float>(),
                         out.GetTensorMutableData<float>(),
                         new_state.GetTensorMutableData<float>(),
                         shape[0], shape[1], groups, shape[2], softplus != 0};
    parallel_rows<ssmcc::StepArgs, ssmcc::selective_state_update_rows>(raw, args,
                                                                       shape[0] * shape[1]);
  }
};

struct CausalConv1dUpdateKernel {
  int64_t activation;
  CausalConv1dUpdateKernel(const OrtApi&, const OrtKernelInfo* info) {
    activation = Ort::ConstKernelInfo(info).GetAttribute<int64_t>("activation");
  }
  void Compute(OrtKernelContext* raw) {
    Ort::KernelContext ctx(raw);
    auto x = ctx.GetInput(0);
    const auto shape = x.GetTensorTypeAndShapeInfo().GetShape();  // (b, d)
    auto conv_state = ctx.GetInput(1);
    const auto state_shape = conv_state.GetTensorTypeAndShapeInfo().GetShape();
    auto out = ctx.GetOutput(0, shape);
    auto new_state = ctx.GetOutput(1, state_shape);
    ssmcc::ConvStepArgs args{x.GetTensorData<float>(),
                             conv_state.GetTensorData<float>(),
                             ctx.GetInput(2).GetTensorData<float>(),
                             ctx.GetInput(3).GetTensorData<float>(),
                             out.GetTensorMutableData<float>(),
                             new_state.GetTensorMutableData<float>(),
                             shape[0], shape[1], state_shape[2] + 1, activation == 1};
    parallel_rows<ssmcc::ConvStepArgs, ssmcc::causal_conv1d_update_rows>(raw, args,
                                                                         shape[0] * shape[1]);
  }
};

template <typename Kernel, int Inputs, int Outputs>
struct FloatOp : Ort::CustomOpBase<FloatOp<Kernel, Inputs, Outputs>, Kernel> {
  const char* name;
  explicit FloatOp(const char* op_name) : name(op_name) {}
  void* CreateKernel(const OrtApi& api, const OrtKernelInfo* info) const {
    return new Kernel(api, info);
  }
  const char* GetName() const { return name; }
  const char* GetExecutionProviderType() const { return "CPUExecutionProvider"; }
  size_t GetInputTypeCount() const { return Inputs; }
  ONNXTensorElementDataType GetInputType(size_t) const {
    return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
  size_t GetOutputTypeCount() const { return Outputs; }
  ONNXTensorElementDataType GetOutputType(size_t) const {
    return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
};

const FloatOp<SelectiveScanKernel, 9, 2> kSelectiveScan("SelectiveScan");
const FloatOp<CausalConv1dKernel, 4, 2> kCausalConv1d("CausalConv1d");
const FloatOp<SelectiveStateUpdateKernel, 9, 2> kSelectiveStateUpdate("SelectiveStateUpdate");
const FloatOp<CausalConv1dUpdateKernel, 4, 2> kCausalConv1dUpdate("CausalConv1dUpdate");

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
    Ort::UnownedSessionOptions(options).Add(*domain);
    domains().push_back(std::move(domain));
  } catch (const Ort::Exception& error) {
    return Ort::GetApi().CreateStatus(ORT_FAIL, error.what());
  }
  return nullptr;
}
