// Helpers shared by the CPU kernels (multihead_spmm.cpp, gat_attention.cpp):
// the graph checks that make malformed CSR / CSC inputs raise instead of
// reading out of bounds.
#pragma once

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>

namespace pyg_multihead_agg {
namespace cpu {

// Row i's pointer range must be non-decreasing and inside [0, num_edges].
template <typename index_t>
void check_range(index_t begin, index_t end, int64_t num_edges, const char* ptr_name, int64_t i) {
  TORCH_CHECK(0 <= begin && begin <= end && end <= num_edges, ptr_name,
              " must be non-decreasing with values in [0, ", num_edges, "], got ", ptr_name, "[", i,
              "] = ", begin, " and ", ptr_name, "[", i + 1, "] = ", end);
}

// The first and last pointer must frame all `num_edges` entries, so that every
// edge belongs to a row and no output is left unwritten.
template <typename index_t>
void check_ends(const index_t* ptr, int64_t num_rows, int64_t num_edges, const char* ptr_name,
                const char* idx_name) {
  TORCH_CHECK(ptr[0] == 0 && ptr[num_rows] == num_edges, ptr_name, " must start at 0 and end at ",
              idx_name, ".numel() (", num_edges, "), got ", ptr_name, "[0] = ", ptr[0], " and ",
              ptr_name, "[-1] = ", ptr[num_rows]);
}

template <typename index_t>
void check_index_value(index_t v, int64_t bound, const char* name, int64_t e) {
  TORCH_CHECK(0 <= v && v < bound, name, "[", e, "] = ", v, " is out of range [0, ", bound, ")");
}

}  // namespace cpu
}  // namespace pyg_multihead_agg
