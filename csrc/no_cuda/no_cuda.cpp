// Compiled only into CPU-only builds: a CUDA tensor reaching an op gets an
// error that says how to rebuild, instead of the dispatcher's generic
// "could not run ... with arguments from the 'CUDA' backend".
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

namespace pyg_multihead_agg {
namespace {

void no_cuda_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack*) {
  TORCH_CHECK(false, op.schema().name(),
              ": pyg_multihead_agg was built without CUDA support, but got CUDA tensors. "
              "Rebuild it where torch has CUDA and nvcc is found, for example: "
              "FORCE_CUDA=1 pip install --no-build-isolation --no-cache-dir --force-reinstall "
              "pyg_multihead_agg (or `pip install --no-build-isolation -e .` in a checkout).");
}

}  // namespace

TORCH_LIBRARY_IMPL(pyg_multihead_agg, CUDA, m) {
  for (const char* name : {"multihead_spmm", "multihead_spmm_backward_csc",
                           "multihead_spmm_backward_x_scatter", "multihead_sddmm", "gat_attention",
                           "gat_attention_backward", "gatv2_attention",
                           "gatv2_attention_backward", "transformer_attention",
                           "transformer_attention_backward",
                           "_transformer_attention_backward_into",
                           "_gatv2_attention_backward_into", "_gat_scores",
                           "_gat_scores_backward"}) {
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&no_cuda_kernel>());
  }
}

}  // namespace pyg_multihead_agg
