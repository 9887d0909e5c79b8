// The spmm forward of 2-byte types on the tensor cores (session 16).
//
// out[r] = sum_{e in row r} weight[e, h] * x[col[e], h, :] for H * D = 128
// features (H = 2, 4 or 8 heads of D = 64, 32 or 16), float16 or bfloat16
// in, float32 accumulation, as one `mma.m16n8k16` per 16 features of a head
// and 16 consecutive CSR entries.
//
// A warp takes a tile of 8 consecutive rows and walks their entries, which
// are consecutive in the CSR, in chunks of 16, whatever row each entry
// belongs to (no entry slot is left empty by a short row, unlike the
// register kernels' 8-entry steps per row). For head h and a chunk:
//     C[f, n] += sum_k A[f, k] * B[k, n]
//     A[f, k] = x[col[k], h, f]            (16 features x 16 entries)
//     B[k, n] = weight[k, h] if entry k belongs to tile row n, else 0
// so C[:, n] is row n's sum for those features. Lane (g, c) = (lane / 4,
// lane % 4) of the warp:
// - loads entries k = 2c, 2c+1, 2c+8, 2c+9 of the chunk: for each head, the
//   D / 8 features h * D + g * D / 8 + [0, D / 8) (one 4-, 8- or 16-byte
//   load), and the weight row of an entry when the entry belongs to tile row
//   g (else nothing: a zero, so B needs no select);
// - builds its A fragments from those words with byte permutes: fragment
//   row g of the head's j-th 16-feature tile is feature h * D + g * D / 8 +
//   2j, row g + 8 the next one, so every tile stays inside one head and each
//   32-bit word pairs two entries of one feature (the mma's K pairs);
// - holds C[f, n] for tile rows n = 2c, 2c+1, and stores each row's D / 8
//   features of a head with one store.
// Per chunk and lane (H = 4): 4 index loads, 16 8-byte gathers, 4 weight
// loads, 40 byte permutes and 8 mma, against the bf16 register kernel's
// 275-instruction step for 16 entry slots (about 13 of them filled).
//
// Rows longer than the work list's threshold are skipped by their tile and
// summed first, block-wide: each warp takes a contiguous slice of the row
// (B's column 0 only) and the 8 partial rows are added in warp order
// through shared memory. Every sum has a fixed order, so results are
// deterministic; they round differently from the register kernels (each
// mma adds its products in its own order, in float32).
//
// Non-finite values. A zero in B times an infinite x is NaN, so an inf or
// NaN gathered for one row would reach the other rows of its chunks. After
// a tile, the warp tests its accumulators (sum of 0 * acc, NaN iff any is
// not finite) and, if any is, recomputes the tile's rows one entry at a
// time, so a row's output is non-finite exactly when its own sum is.
//
// Malformed graphs never fault: row ranges are clamped (row_range), entries
// outside [0, E) or with a source out of range load nothing, and a tile
// scans only the span of its own short rows.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

#include "common.cuh"

#ifndef PMA_TC_MIN_BLOCKS
#define PMA_TC_MIN_BLOCKS 2
#endif

namespace pyg_multihead_agg {
namespace {

template <typename scalar_t, typename index_t>
struct TcGatherParams {
  const index_t* ptr;       // [num_rows + 1]
  const index_t* idx;       // [E]
  const scalar_t* weight;   // [E, H]
  const scalar_t* x;        // [num_src, H, D], H * D = 128
  scalar_t* out;            // [num_rows, H, D]
  int64_t num_rows, num_src, num_edges;
};

// D (16 x 8, float32) += A (16 x 16) * B (16 x 8), A and B of 2-byte type.
template <typename scalar_t>
struct Mma16816;
template <>
struct Mma16816<at::BFloat16> {
  static __device__ __forceinline__ void run(float (&d)[4], uint32_t a0, uint32_t a1,
                                             uint32_t a2, uint32_t a3, uint32_t b0,
                                             uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
  }
};
template <>
struct Mma16816<at::Half> {
  static __device__ __forceinline__ void run(float (&d)[4], uint32_t a0, uint32_t a1,
                                             uint32_t a2, uint32_t a3, uint32_t b0,
                                             uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
  }
};

// The i-th 32-bit word of a raw load.
template <typename R>
__device__ __forceinline__ uint32_t raw_word(const R& r, int i) {
  if constexpr (sizeof(R) == 4) {
    return static_cast<uint32_t>(r);
  } else {
    return reinterpret_cast<const uint32_t*>(&r)[i];
  }
}

// Byte-permute selectors: the low (high) halves of two words, first word's
// in the low half of the result.
constexpr uint32_t kLowHalves = 0x5410, kHighHalves = 0x7632;

template <typename scalar_t, typename index_t, int kH>
struct TcGather {
  static constexpr int kHD = 128, kD = kHD / kH;
  static constexpr int kF = kD / 8;       // features a lane loads per head and entry
  static constexpr int kWords = kF / 2;   // 16-feature tiles per head (words per load)
  static constexpr int kWBytes = 2 * kH;  // a weight row
  static_assert(kH == 2 || kH == 4 || kH == 8, "H * D = 128 with D = 64, 32 or 16");
  static_assert(sizeof(scalar_t) == 2, "2-byte types");
  using off_t = EntryOffset<index_t>;
  using XRaw = typename RawType<2 * kF>::type;
  using WRaw = typename RawType<kWBytes>::type;
  using Acc = float[kH][kWords][4];
  static constexpr int kChunk = 16;

  // Offset within the chunk of the lane's i-th entry: 2c, 2c+1, 2c+8, 2c+9.
  static __device__ __forceinline__ int kpos(int i, int c) { return 2 * c + (i & 1) + (i >> 1) * 8; }

  static __device__ __forceinline__ void load_src(index_t (&src)[4], const index_t* idx, off_t e,
                                                  off_t n, int c) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const off_t k = e + kpos(i, c);
      src[i] = load_index_if(k < n, idx + k);
    }
  }

  // Entries e .. e + 15 of [0, n) (positions from the scan's first entry;
  // idx, weight and the member range [rlo, rhi) of tile row g are relative to
  // it).
  static __device__ __forceinline__ void chunk(Acc& acc, const index_t (&src)[4], off_t e, off_t n,
                                               off_t rlo, off_t rhi, const scalar_t* xg,
                                               const scalar_t* weight,
                                               const IndexBound<index_t>& src_ok, int c) {
    XRaw xr[4][kH];
    WRaw wr[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const off_t k = e + kpos(i, c);
      const bool in = k < n && src_ok(src[i]);
      const scalar_t* row = row_at(xg, src[i], kHD);
#pragma unroll
      for (int h = 0; h < kH; ++h) xr[i][h] = RawLoad<2 * kF>::load(in, row + h * kD);
      const bool member = k >= rlo && k < rhi;
      wr[i] = RawLoad<kWBytes>::load(member, row_at(weight, k, kH));
    }
#pragma unroll
    for (int h = 0; h < kH; ++h) {
      const uint32_t sel = (h & 1) ? kHighHalves : kLowHalves;
      const uint32_t b0 = __byte_perm(raw_word(wr[0], h >> 1), raw_word(wr[1], h >> 1), sel);
      const uint32_t b1 = __byte_perm(raw_word(wr[2], h >> 1), raw_word(wr[3], h >> 1), sel);
#pragma unroll
      for (int j = 0; j < kWords; ++j) {
        const uint32_t x0 = raw_word(xr[0][h], j), x1 = raw_word(xr[1][h], j);
        const uint32_t x2 = raw_word(xr[2][h], j), x3 = raw_word(xr[3][h], j);
        Mma16816<scalar_t>::run(acc[h][j], __byte_perm(x0, x1, kLowHalves),
                                __byte_perm(x0, x1, kHighHalves), __byte_perm(x2, x3, kLowHalves),
                                __byte_perm(x2, x3, kHighHalves), b0, b1);
      }
    }
  }

  // Entries [0, n) from `first` (positions relative to it), chunk by chunk,
  // the next chunk's indices loaded before this chunk's gathers. `skip(e)`
  // returns the first position at or after e that is not inside a long row.
  template <typename Skip>
  static __device__ __forceinline__ void scan(Acc& acc, const TcGatherParams<scalar_t, index_t>& p,
                                              int64_t first, off_t n, off_t rlo, off_t rhi, int g,
                                              int c, Skip&& skip) {
    const IndexBound<index_t> src_ok(p.num_src);
    const index_t* idx = p.idx + first;
    const scalar_t* weight = p.weight + first * kH;
    const scalar_t* xg = p.x + g * kF;
    off_t e = skip(off_t{0});
    index_t src[4];
    load_src(src, idx, e, n, c);
    while (e < n) {
      const off_t en = skip(n - e > kChunk ? e + kChunk : n);
      index_t next[4];
      load_src(next, idx, en, n, c);
      chunk(acc, src, e, n, rlo, rhi, xg, weight, src_ok, c);
#pragma unroll
      for (int i = 0; i < 4; ++i) src[i] = next[i];
      e = en;
    }
  }

  static __device__ __forceinline__ void zero(Acc& acc) {
#pragma unroll
    for (int h = 0; h < kH; ++h)
#pragma unroll
      for (int j = 0; j < kWords; ++j)
#pragma unroll
        for (int v = 0; v < 4; ++v) acc[h][j][v] = 0.f;
  }

  // Row r one entry at a time (the tile's fallback for non-finite values):
  // lane l sums features 4l .. 4l + 3 in entry order.
  static __device__ void exact_row(const TcGatherParams<scalar_t, index_t>& p, int64_t r,
                                   int64_t lo, int64_t hi, int lane) {
    const IndexBound<index_t> src_ok(p.num_src);
    const int f = 4 * lane, h = f / kD;
    float a[4] = {0.f, 0.f, 0.f, 0.f};
    for (int64_t e = lo; e < hi; ++e) {
      const index_t s = p.idx[e];
      if (!src_ok(s)) continue;
      const float w = static_cast<float>(p.weight[e * kH + h]);
      const scalar_t* xr = p.x + static_cast<int64_t>(s) * kHD + f;
#pragma unroll
      for (int v = 0; v < 4; ++v) a[v] += w * static_cast<float>(xr[v]);
    }
    store_vec<scalar_t, 4>(p.out + r * kHD + f, a);
  }
};

// Tiles of 8 rows a warp takes per atomic.
constexpr int kTcFetch = 1;

template <typename scalar_t, typename index_t, int kH>
__global__ void __launch_bounds__(kThreads, PMA_TC_MIN_BLOCKS)
    tc_gather_kernel(const TcGatherParams<scalar_t, index_t> p, const WorkList wl) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using T = TcGather<scalar_t, index_t, kH>;
  using off_t = typename T::off_t;
  constexpr int kWarps = kThreads / 32, kD = T::kD, kF = T::kF, kHD = T::kHD;
  constexpr unsigned kFull = 0xffffffffu;
  __shared__ float red[kWarps][kHD];
  __shared__ unsigned long long s_item;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  auto no_skip = [](off_t e) { return e; };

  // Phase 1: the long rows, one at a time per block; warp w sums slice w in
  // B's column 0 (tile row 0: the lanes of g = 0 load the weights), which
  // the lanes of c = 0 hold.
  const int64_t num_long = static_cast<int64_t>(wl.counters[0]);
  for (;;) {
    if (threadIdx.x == 0) s_item = atomicAdd(&wl.counters[1], 1ull);
    __syncthreads();
    const int64_t item = static_cast<int64_t>(s_item);
    __syncthreads();
    if (item >= num_long) break;
    const int64_t r = wl.long_rows[item];
    int64_t lo, hi, slo, shi;
    row_range(p.ptr, r, p.num_edges, lo, hi);
    group_slice(lo, hi, warp, kWarps, slo, shi);
    typename T::Acc acc;
    T::zero(acc);
    const off_t n = static_cast<off_t>(shi - slo);
    T::scan(acc, p, slo, n, off_t{0}, g == 0 ? n : off_t{0}, g, c, no_skip);
    if (c == 0) {
#pragma unroll
      for (int h = 0; h < kH; ++h)
#pragma unroll
        for (int j = 0; j < T::kWords; ++j) {
          red[warp][h * kD + g * kF + 2 * j] = acc[h][j][0];
          red[warp][h * kD + g * kF + 2 * j + 1] = acc[h][j][2];
        }
    }
    __syncthreads();
    for (int q = threadIdx.x; q < kHD; q += kThreads) {
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) s += red[w][q];
      p.out[r * kHD + q] = static_cast<scalar_t>(s);
    }
    __syncthreads();
  }

  // Phase 2: tiles of 8 rows, one a warp, from an atomic counter.
  const int64_t num_tiles = (p.num_rows + 7) / 8;
  for (;;) {
    unsigned long long base = 0;
    if (lane == 0) base = atomicAdd(&wl.counters[2], static_cast<unsigned long long>(kTcFetch));
    base = __shfl_sync(kFull, base, 0);
    if (base >= static_cast<unsigned long long>(num_tiles)) break;  // warp-uniform
    for (int t = 0; t < kTcFetch; ++t) {
      const int64_t tile = static_cast<int64_t>(base) + t;
      if (tile >= num_tiles) break;
      const int64_t r0 = tile * 8, rg = r0 + g;
      int64_t lo = 0, hi = 0;
      bool is_long = false;
      if (rg < p.num_rows) {
        row_range(p.ptr, rg, p.num_edges, lo, hi);
        is_long = hi - lo > wl.long_threshold;
      }
      // The span of the tile's non-empty short rows.
      const bool scanned = !is_long && hi > lo;
      int64_t span_lo = scanned ? lo : INT64_MAX, span_hi = scanned ? hi : 0;
#pragma unroll
      for (int off = 4; off < 32; off <<= 1) {
        span_lo = min(span_lo, __shfl_xor_sync(kFull, span_lo, off));
        span_hi = max(span_hi, __shfl_xor_sync(kFull, span_hi, off));
      }
      const unsigned long_bits = __ballot_sync(kFull, is_long);
      typename T::Acc acc;
      T::zero(acc);
      if (span_lo < span_hi) {  // warp-uniform
        const off_t n = static_cast<off_t>(span_hi - span_lo);
        const off_t rlo = scanned ? static_cast<off_t>(lo - span_lo) : off_t{0};
        const off_t rhi = scanned ? static_cast<off_t>(hi - span_lo) : off_t{0};
        if (long_bits == 0) {
          T::scan(acc, p, span_lo, n, rlo, rhi, g, c, no_skip);
        } else {
          // Long rows inside the span are jumped over (their block sums them).
          const int64_t llo = max(lo, span_lo), lhi = min(hi, span_hi);
          const off_t long_lo = is_long && llo < lhi ? static_cast<off_t>(llo - span_lo) : off_t{0};
          const off_t long_hi = is_long && llo < lhi ? static_cast<off_t>(lhi - span_lo) : off_t{0};
          auto skip = [&](off_t e) {
            for (;;) {
              const unsigned b = __ballot_sync(kFull, long_lo <= e && e < long_hi);
              if (b == 0) return e;
              e = __shfl_sync(kFull, long_hi, __ffs(b) - 1);
            }
          };
          T::scan(acc, p, span_lo, n, rlo, rhi, g, c, skip);
        }
      }
      // 0 * acc is NaN exactly for an infinite or NaN accumulator.
      float z = 0.f;
#pragma unroll
      for (int h = 0; h < kH; ++h)
#pragma unroll
        for (int j = 0; j < T::kWords; ++j)
#pragma unroll
          for (int v = 0; v < 4; ++v) z = fmaf(acc[h][j][v], 0.f, z);
      if (!__any_sync(kFull, z != 0.f)) {
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
          const int n_row = 2 * c + rr;
          const int64_t r = r0 + n_row;
          if (r >= p.num_rows || ((long_bits >> (4 * n_row)) & 1u)) continue;
          scalar_t* o = p.out + r * kHD + g * kF;
#pragma unroll
          for (int h = 0; h < kH; ++h) {
            float v[kF];
#pragma unroll
            for (int j = 0; j < T::kWords; ++j) {
              v[2 * j] = acc[h][j][rr];
              v[2 * j + 1] = acc[h][j][2 + rr];
            }
            store_vec<scalar_t, kF>(o + h * kD, v);
          }
        }
      } else {
        for (int n_row = 0; n_row < 8; ++n_row) {
          const int64_t r = r0 + n_row;
          const int64_t rlo_n = __shfl_sync(kFull, lo, 4 * n_row);
          const int64_t rhi_n = __shfl_sync(kFull, hi, 4 * n_row);
          if (r >= p.num_rows || ((long_bits >> (4 * n_row)) & 1u)) continue;
          T::exact_row(p, r, rlo_n, rhi_n, lane);
        }
      }
    }
  }
#else
  __trap();  // launched only when built for sm_80 or newer (tc_gather_available)
#endif
}

// Whether tc_gather_kernel<...> was compiled for sm_80 or newer (mma of
// 2-byte types): the host never launches it otherwise.
template <typename Kernel>
bool tc_kernel_built(Kernel kernel) {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.binaryVersion >= 80;
}

}  // namespace
}  // namespace pyg_multihead_agg
