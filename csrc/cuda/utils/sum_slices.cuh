// The second kernel of every sliced pass (SliceList in work_list.cuh): adds
// the slices' partial sums of each sliced row in slice order.
#pragma once

#include <cstdint>

#include "work_list.cuh"

namespace pyg_multihead_agg {

// For every sliced row r of `sl`: out_a[r, f] = the sum of part_a[slot, f]
// over r's slots, f < width_a, and the same for b (width_b may be 0), in a
// fixed order, so deterministic. On the current stream. Built for every value
// dtype and both index types, with acc_t = at::opmath_type<scalar_t>.
template <typename scalar_t, typename index_t, typename acc_t>
void launch_sum_slices(const index_t* ptr, int64_t num_edges, const SliceList& sl,
                       const acc_t* part_a, scalar_t* out_a, int width_a, const acc_t* part_b,
                       scalar_t* out_b, int width_b);

}  // namespace pyg_multihead_agg
