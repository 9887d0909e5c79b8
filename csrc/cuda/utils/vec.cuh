// 16-byte vector loads and stores of one lane, predicated loads without
// branches (inline PTX), and the widening arithmetic of half types, shared by
// every kernel.
#pragma once

#include <ATen/OpMathType.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace pyg_multihead_agg {

template <int kBytes>
struct RawType;
template <>
struct RawType<16> { using type = uint4; };
template <>
struct RawType<8> { using type = uint2; };
template <>
struct RawType<4> { using type = unsigned int; };
template <>
struct RawType<2> { using type = unsigned short; };

template <typename scalar_t, int V>
struct alignas(sizeof(scalar_t) * V) Vec {
  scalar_t val[V];
};

// The V elements of a vector in the accumulation type. bfloat16 pairs are
// widened from their 32-bit word: the low element is the word shifted left by
// 16, the high one the word with its low half cleared (one instruction each,
// exact). Element-wise static_cast<float> of c10::BFloat16 first moves the
// high half down (PRMT) and then shifts it back: 32 more instructions per
// 8-entry step of a bf16 gather in the SASS.
template <typename scalar_t, int V>
__device__ __forceinline__ void widen(const Vec<scalar_t, V>& x,
                                      at::opmath_type<scalar_t> (&out)[V]) {
  if constexpr (std::is_same_v<scalar_t, c10::BFloat16> && V % 2 == 0) {
#pragma unroll
    for (int i = 0; i < V / 2; ++i) {
      uint32_t word;
      memcpy(&word, &x.val[2 * i], sizeof(word));
      out[2 * i] = __uint_as_float(word << 16);
      out[2 * i + 1] = __uint_as_float(word & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int v = 0; v < V; ++v) out[v] = static_cast<at::opmath_type<scalar_t>>(x.val[v]);
  }
}

// acc[v] += w * x[v] in the accumulation type, element order.
template <typename scalar_t, int V>
__device__ __forceinline__ void axpy_vec(at::opmath_type<scalar_t> (&acc)[V],
                                         at::opmath_type<scalar_t> w, const Vec<scalar_t, V>& x) {
  at::opmath_type<scalar_t> xw[V];
  widen(x, xw);
#pragma unroll
  for (int v = 0; v < V; ++v) acc[v] += w * xw[v];
}

// d += <a, b - c> over one lane's vector, element by element in the
// accumulation type (the difference too); <a, b> without c. b - 0 = b
// exactly, so with c all zeros this is <a, b> bit for bit.
template <typename scalar_t, int V>
__device__ __forceinline__ void dot_acc(at::opmath_type<scalar_t>& d, const Vec<scalar_t, V>& a,
                                        const Vec<scalar_t, V>& b,
                                        const Vec<scalar_t, V>* c = nullptr) {
  using acc_t = at::opmath_type<scalar_t>;
  acc_t aw[V], bw[V];
  widen(a, aw);
  widen(b, bw);
  if (c != nullptr) {
    acc_t cw[V];
    widen(*c, cw);
#pragma unroll
    for (int v = 0; v < V; ++v) bw[v] -= cw[v];
  }
#pragma unroll
  for (int v = 0; v < V; ++v) d += aw[v] * bw[v];
}

// <a, b - c> (or <a, b>) of one lane's vector, from 0 (dot_acc).
template <typename scalar_t, int V>
__device__ __forceinline__ at::opmath_type<scalar_t> vec_dot(const Vec<scalar_t, V>& a,
                                                             const Vec<scalar_t, V>& b,
                                                             const Vec<scalar_t, V>* c = nullptr) {
  at::opmath_type<scalar_t> d = 0;
  dot_acc(d, a, b, c);
  return d;
}

// One V-element vector through the read-only path (ld.global.nc).
template <typename scalar_t, int V>
__device__ __forceinline__ Vec<scalar_t, V> load_vec(const scalar_t* p) {
  using raw_t = typename RawType<sizeof(scalar_t) * V>::type;
  Vec<scalar_t, V> v;
  *reinterpret_cast<raw_t*>(&v) = __ldg(reinterpret_cast<const raw_t*>(p));
  return v;
}

template <typename scalar_t, int V>
__device__ __forceinline__ Vec<scalar_t, V> zero_vec() {
  using raw_t = typename RawType<sizeof(scalar_t) * V>::type;
  Vec<scalar_t, V> v;
  *reinterpret_cast<raw_t*>(&v) = raw_t{};
  return v;
}

template <typename scalar_t>
__device__ __forceinline__ at::opmath_type<scalar_t> load_value(const scalar_t* p) {
  return static_cast<at::opmath_type<scalar_t>>(load_vec<scalar_t, 1>(p).val[0]);
}

// Predicated loads: `pred ? *p : 0` as one predicated ld.global.nc (inline
// PTX), with no branch. Written as `pred ? load_vec(p) : zero_vec()`, nvcc
// turns each load of an unrolled step into a branch of its own and, for half
// types, moves the bf16/fp16 -> float unpacking of the loaded vector into
// that branch, right behind the load: the step's U gathers then wait for one
// another (in the bf16 gather's SASS: one 16-byte load in flight per lane
// instead of 8, a third of the float32 kernel's bandwidth). `p` need not
// point to valid memory when `pred` is false.
template <int kBytes>
struct RawLoad;
template <>
struct RawLoad<16> {
  static __device__ __forceinline__ uint4 load(bool pred, const void* p) {
    uint4 v;
    asm volatile(
        "{\n .reg .pred q;\n setp.ne.b32 q, %5, 0;\n"
        " mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n"
        " @q ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p), "r"(static_cast<int>(pred)));
    return v;
  }
};
template <>
struct RawLoad<8> {
  static __device__ __forceinline__ uint2 load(bool pred, const void* p) {
    uint2 v;
    asm volatile(
        "{\n .reg .pred q;\n setp.ne.b32 q, %3, 0;\n"
        " mov.b32 %0, 0;\n mov.b32 %1, 0;\n"
        " @q ld.global.nc.v2.u32 {%0, %1}, [%2];\n}\n"
        : "=r"(v.x), "=r"(v.y)
        : "l"(p), "r"(static_cast<int>(pred)));
    return v;
  }
};
template <>
struct RawLoad<4> {
  static __device__ __forceinline__ unsigned int load(bool pred, const void* p) {
    unsigned int v;
    asm volatile(
        "{\n .reg .pred q;\n setp.ne.b32 q, %2, 0;\n"
        " mov.b32 %0, 0;\n"
        " @q ld.global.nc.u32 %0, [%1];\n}\n"
        : "=r"(v)
        : "l"(p), "r"(static_cast<int>(pred)));
    return v;
  }
};
template <>
struct RawLoad<2> {
  static __device__ __forceinline__ unsigned short load(bool pred, const void* p) {
    unsigned short v;
    asm volatile(
        "{\n .reg .pred q;\n setp.ne.b32 q, %2, 0;\n"
        " mov.b16 %0, 0;\n"
        " @q ld.global.nc.u16 %0, [%1];\n}\n"
        : "=h"(v)
        : "l"(p), "r"(static_cast<int>(pred)));
    return v;
  }
};

template <typename scalar_t, int V>
__device__ __forceinline__ Vec<scalar_t, V> load_vec_if(bool pred, const scalar_t* p) {
  using raw_t = typename RawType<sizeof(scalar_t) * V>::type;
  Vec<scalar_t, V> v;
  *reinterpret_cast<raw_t*>(&v) = RawLoad<sizeof(scalar_t) * V>::load(pred, p);
  return v;
}

template <typename scalar_t>
__device__ __forceinline__ at::opmath_type<scalar_t> load_value_if(bool pred, const scalar_t* p) {
  return static_cast<at::opmath_type<scalar_t>>(load_vec_if<scalar_t, 1>(pred, p).val[0]);
}

// A store of an output the kernel writes once and never reads back: through
// L2 evict-first (st.global.cs), leaving more of it to the gathered rows:
// about 1% off the float32 spmm forward and backward on the H200, no loss
// elsewhere (docs/performance.md, "Evict-first stores"). The outputs of every
// forward and backward kernel, the slices' partial rows and the dots by CSC
// entry go through here.
template <typename T>
__device__ __forceinline__ void store_once(T* p, const T& v) {
  if constexpr (sizeof(T) == 16 && alignof(T) == 16) {
    __stcs(reinterpret_cast<uint4*>(p), *reinterpret_cast<const uint4*>(&v));
  } else if constexpr (sizeof(T) == 8 && alignof(T) == 8) {
    __stcs(reinterpret_cast<uint2*>(p), *reinterpret_cast<const uint2*>(&v));
  } else if constexpr (sizeof(T) == 4 && alignof(T) == 4) {
    __stcs(reinterpret_cast<unsigned int*>(p), *reinterpret_cast<const unsigned int*>(&v));
  } else if constexpr (sizeof(T) == 2 && alignof(T) == 2) {
    __stcs(reinterpret_cast<unsigned short*>(p), *reinterpret_cast<const unsigned short*>(&v));
  } else {
    *p = v;
  }
}

// `if (pred) *p = v` for a 1-, 4- or 8-byte value as one predicated
// st.global.cs (inline PTX), with no branch: written as an `if`, nvcc makes
// a divergent branch of each of the GATv2 record's per-entry stores (each
// written by one lane of several).
template <typename T>
__device__ __forceinline__ void store_if(bool pred, T* p, T v) {
  static_assert(sizeof(T) == 1 || sizeof(T) == 4 || sizeof(T) == 8, "1-, 4- or 8-byte values");
  if constexpr (sizeof(T) == 1) {
    asm volatile(
        "{\n .reg .pred q;\n setp.ne.b32 q, %2, 0;\n @q st.global.cs.u8 [%0], %1;\n}\n"
        :
        : "l"(p), "h"(static_cast<unsigned short>(*reinterpret_cast<const uint8_t*>(&v))),
          "r"(static_cast<int>(pred)));
  } else if constexpr (sizeof(T) == 4) {
    asm volatile(
        "{\n .reg .pred q;\n setp.ne.b32 q, %2, 0;\n @q st.global.cs.b32 [%0], %1;\n}\n"
        :
        : "l"(p), "r"(*reinterpret_cast<const uint32_t*>(&v)), "r"(static_cast<int>(pred)));
  } else {
    asm volatile(
        "{\n .reg .pred q;\n setp.ne.b32 q, %2, 0;\n @q st.global.cs.b64 [%0], %1;\n}\n"
        :
        : "l"(p), "l"(*reinterpret_cast<const uint64_t*>(&v)), "r"(static_cast<int>(pred)));
  }
}

template <typename scalar_t, int V, typename acc_t>
__device__ __forceinline__ void store_vec(scalar_t* p, const acc_t (&a)[V]) {
  Vec<scalar_t, V> v;
#pragma unroll
  for (int i = 0; i < V; ++i) v.val[i] = static_cast<scalar_t>(a[i]);
  store_once(reinterpret_cast<Vec<scalar_t, V>*>(p), v);
}

}  // namespace pyg_multihead_agg
