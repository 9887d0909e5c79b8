// The softmax arithmetic of the fused attention: leaky_relu, the running
// (maximum, sum of exp) statistics of a row, lse, and the one-pass forward's
// base-2 units.
#pragma once

#include <cmath>
#include <limits>

namespace pyg_multihead_agg {

template <typename T>
__device__ __forceinline__ T exp_(T v) {
  return exp(v);
}
template <>
__device__ __forceinline__ float exp_(float v) {
  return expf(v);
}
template <typename T>
__device__ __forceinline__ T log_(T v) {
  return log(v);
}
template <>
__device__ __forceinline__ float log_(float v) {
  return logf(v);
}

// a * b + c rounded once, whatever the compiler would contract: a sum that
// two passes (or two copies of one) must give bitwise equal, where only one
// of them also needs the product apart.
template <typename T>
__device__ __forceinline__ T fma_(T a, T b, T c) {
  return fma(a, b, c);
}
template <>
__device__ __forceinline__ float fma_(float a, float b, float c) {
  return fmaf(a, b, c);
}

template <typename acc_t>
__device__ __forceinline__ acc_t leaky(acc_t z, acc_t slope) {
  return z > acc_t(0) ? z : z * slope;
}

// exp(a - m) for a running maximum m, with exp(-inf - -inf) taken as 0.
template <typename acc_t>
__device__ __forceinline__ acc_t exp_shift(acc_t a, acc_t m) {
  return a == -std::numeric_limits<acc_t>::infinity() ? acc_t(0) : exp_(a - m);
}

// Merges the softmax statistics (max, sum of exp) of two edge sets.
template <typename acc_t>
__device__ __forceinline__ void merge_stats(acc_t& mx, acc_t& sum, acc_t omx, acc_t osum) {
  const acc_t nm = mx > omx ? mx : omx;
  sum = sum * exp_shift(mx, nm) + osum * exp_shift(omx, nm);
  mx = nm;
}

template <typename acc_t>
__device__ __forceinline__ acc_t stats_lse(acc_t mx, acc_t sum, bool nonempty) {
  // As in the reference (and the CPU kernel): -inf for a row without edges;
  // NaN when every score is -inf (0 / 0) or a score is NaN or +inf (a NaN sum).
  if (!nonempty) return -std::numeric_limits<acc_t>::infinity();
  return sum == acc_t(0) ? std::numeric_limits<acc_t>::quiet_NaN() : mx + log_(sum);
}

template <typename acc_t>
__device__ __forceinline__ void group_merge_stats(acc_t& mx, acc_t& sum, int G, unsigned mask) {
  for (int off = G >> 1; off > 0; off >>= 1) {
    const acc_t omx = __shfl_xor_sync(mask, mx, off), osum = __shfl_xor_sync(mask, sum, off);
    merge_stats(mx, sum, omx, osum);
  }
}

// Softmax arithmetic of the one-pass forward: float32 in base 2 (logits
// scaled by log2 e, exp2f), float64 in base e.
template <typename acc_t>
struct OnlineUnits {
  static __device__ __forceinline__ acc_t scale() { return acc_t(1); }
  static __device__ __forceinline__ acc_t exp(acc_t v) { return ::exp(v); }
  static __device__ __forceinline__ acc_t lse(acc_t mx, acc_t sum) { return mx + ::log(sum); }
};
template <>
struct OnlineUnits<float> {
  static __device__ __forceinline__ float scale() { return 1.4426950408889634f; }
  static __device__ __forceinline__ float exp(float v) { return exp2f(v); }
  static __device__ __forceinline__ float lse(float mx, float sum) {
    return (mx + log2f(sum)) * 0.6931471805599453f;
  }
};

// exp(a - m) in the units above, with exp(-inf - -inf) taken as 0.
template <typename acc_t>
__device__ __forceinline__ acc_t online_shift(acc_t a, acc_t m) {
  return a == -std::numeric_limits<acc_t>::infinity() ? acc_t(0)
                                                      : OnlineUnits<acc_t>::exp(a - m);
}

// lse of the one-pass state (mx, sum), with stats_lse's conventions.
template <typename acc_t>
__device__ __forceinline__ acc_t online_lse(acc_t mx, acc_t sum, bool nonempty) {
  if (!nonempty) return -std::numeric_limits<acc_t>::infinity();
  return sum == acc_t(0) ? std::numeric_limits<acc_t>::quiet_NaN()
                         : OnlineUnits<acc_t>::lse(mx, sum);
}

}  // namespace pyg_multihead_agg
