// The registry behind path_overrides.h and its private operator
// _set_kernel_path(str name, int value) -> int (the value it replaces).
#include "path_overrides.h"

#include <c10/util/Exception.h>
#include <c10/util/string_view.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

namespace pyg_multihead_agg {
namespace {

struct PathInfo {
  const char* name;
  int64_t min_value, max_value;  // allowed forced values (-1, the heuristic, always is)
};

constexpr int64_t kNoLimit = INT64_MAX;

// In the order of KernelPath.
constexpr std::array<PathInfo, static_cast<size_t>(KernelPath::kCount)> kPaths{{
    {"tensor_cores", 0, 1},
    {"tc_staged", 0, 1},
    {"split_rows", 0, 1},
    {"transposed", 0, 1},
    {"sort_fetch", 0, 1},
    {"onepass_min", 0, kNoLimit},
    {"slice_len", 1, kNoLimit},
    {"cpu_avx2", 0, 1},
    {"fetch_rounds", 1, 8},
}};

std::atomic<int64_t>* values() {
  static std::atomic<int64_t> forced[kPaths.size()];
  static const bool init = [] {
    for (auto& v : forced) v.store(-1);
    return true;
  }();
  (void)init;
  return forced;
}

int64_t set_kernel_path(c10::string_view name, int64_t value) {
  for (size_t i = 0; i < kPaths.size(); ++i) {
    const PathInfo& info = kPaths[i];
    if (name != info.name) continue;
    const bool ok = value == -1 || (value >= info.min_value && value <= info.max_value);
    if (info.max_value == kNoLimit) {
      TORCH_CHECK(ok, "_set_kernel_path: ", info.name,
                  " takes -1 (the heuristic) or an integer >= ", info.min_value, ", got ", value);
    } else {
      TORCH_CHECK(ok, "_set_kernel_path: ", info.name, " takes -1 (the heuristic) or ",
                  info.min_value, "..", info.max_value, ", got ", value);
    }
    return values()[i].exchange(value);
  }
  std::string known;
  for (const PathInfo& info : kPaths) known += std::string(known.empty() ? "" : ", ") + info.name;
  TORCH_CHECK(false, "_set_kernel_path: unknown kernel path '", std::string(name), "' (known: ",
              known, ")");
}

}  // namespace

int64_t path_override(KernelPath path) {
  return values()[static_cast<size_t>(path)].load(std::memory_order_relaxed);
}

TORCH_LIBRARY_IMPL(pyg_multihead_agg, CatchAll, m) {
  m.impl("_set_kernel_path", &set_kernel_path);
}

}  // namespace pyg_multihead_agg
