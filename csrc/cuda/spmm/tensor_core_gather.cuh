// The spmm forward of 2-byte types on the tensor cores, and the mma helpers
// that the backward's kernel (tensor_core_backward.cuh) shares.
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
// lane % 4) of the warp loads the weight rows of entries k = 2c, 2c+1,
// 2c+8, 2c+9 of the chunk when they belong to tile row g (else nothing: a
// zero, so B needs no select), and B's words are byte permutes of them.
//
// Two kernels build A differently:
// - tc_gather_kernel (registers; taken for heads of 16 features): the lane
//   gathers, for those four entries and each head, the D / 8 features
//   h * D + g * D / 8 + [0, D / 8) (one 4-, 8- or 16-byte load) and builds
//   its fragments with byte permutes; fragment row g of the head's j-th
//   16-feature tile is feature h * D + g * D / 8 + 2j, row g + 8 the next
//   one. 116-128 registers (16 warps per SM; 128 at heads of 16, where it
//   is taken); the warp waits for each chunk's 4 KB of gathers before its
//   multiplies.
// - tc_gather_staged_kernel (taken for heads of 32 and 64 features): the
//   chunk's 16 rows are copied into a per-warp ring of two 4-KB stages in
//   shared memory (cp.async, 16 bytes a lane, one chunk ahead, no register
//   held in flight), and each 16-feature tile's fragments come from there
//   with one ldmatrix.x4.trans; fragment row g is feature 16t + g, row g + 8
//   feature 16t + 8 + g. 80 registers (24 warps per SM).
// On the H200 (bf16, 4 x 32, arxiv-like) the register kernels take 0.138 ms,
// the register tensor-core kernel 0.129 and the staged one 0.118: the
// register version issues half the instructions of the CUDA-core gather but
// is bound by the bytes in flight (8-, 16- and 4-byte gathers, D = 32, 64 and
// 16, run alike). At D = 16 the staged kernel's 16-byte weight rows spill
// (0.171 against 0.128 ms), hence the split by head width
// (docs/multihead_spmm.md, "Tensor-core paths").
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
// outside [0, E) or with a source out of range load nothing (zero-filled
// copies in the staged kernel), and a tile scans only the span of its own
// short rows.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <type_traits>

#include "../utils/config.cuh"
#include "../utils/index.cuh"
#include "../utils/lanes.cuh"
#include "../utils/vec.cuh"
#include "../utils/work_list.cuh"
#include "params.cuh"

namespace pyg_multihead_agg {

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
struct Mma16816 {
  static_assert(std::is_same_v<scalar_t, at::BFloat16> || std::is_same_v<scalar_t, at::Half>,
                "float16 or bfloat16");
  static __device__ __forceinline__ void run(float (&d)[4], uint32_t a0, uint32_t a1,
                                             uint32_t a2, uint32_t a3, uint32_t b0,
                                             uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (std::is_same_v<scalar_t, at::BFloat16>) {
      asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
          "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    } else {
      asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
          "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
#endif
  }
};

// Both kernels hold 8 tiles of 16 features (H * D = 128) x 8 tile rows: per
// lane, tile t's C fragment acc[t][0..3].

// The tile rows a lane stores (its C columns 2c and 2c + 1): fn(rr, r) for
// rr = 0, 1 and row r = r0 + 2c + rr, those below num_rows and not long.
template <typename Fn>
__device__ __forceinline__ void tc_for_stored_rows(int64_t r0, int64_t num_rows,
                                                   unsigned long_bits, int c, Fn&& fn) {
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int n_row = 2 * c + rr;
    const int64_t r = r0 + n_row;
    if (r >= num_rows || ((long_bits >> (4 * n_row)) & 1u)) continue;
    fn(rr, r);
  }
}
using TcAcc = float[8][4];

__device__ __forceinline__ void tc_zero(TcAcc& acc) {
#pragma unroll
  for (int t = 0; t < 8; ++t)
#pragma unroll
    for (int v = 0; v < 4; ++v) acc[t][v] = 0.f;
}

// Whether every accumulator of the lane is finite (0 * acc is NaN exactly
// for an infinite or NaN one).
__device__ __forceinline__ bool tc_finite(const TcAcc& acc) {
  float z = 0.f;
#pragma unroll
  for (int t = 0; t < 8; ++t)
#pragma unroll
    for (int v = 0; v < 4; ++v) z = fmaf(acc[t][v], 0.f, z);
  return z == 0.f;
}

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
  using scalar_type = scalar_t;
  using off_t = EntryOffset<index_t>;
  using XRaw = typename RawType<2 * kF>::type;
  using WRaw = typename RawType<kWBytes>::type;
  using Acc = TcAcc;  // head h's j-th 16-feature tile: acc[h * kWords + j]
  static_assert(kH * kWords == 8, "8 tiles of 16 features");
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
        Mma16816<scalar_t>::run(acc[h * kWords + j], __byte_perm(x0, x1, kLowHalves),
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

  // B's column 0 (held by the lanes of c = 0) into a row of features.
  static __device__ __forceinline__ void column0(const Acc& acc, float* row, int g) {
#pragma unroll
    for (int h = 0; h < kH; ++h)
#pragma unroll
      for (int j = 0; j < kWords; ++j) {
        row[h * kD + g * kF + 2 * j] = acc[h * kWords + j][0];
        row[h * kD + g * kF + 2 * j + 1] = acc[h * kWords + j][2];
      }
  }

  // Tile rows 2c and 2c + 1 (those below num_rows and not long), each
  // head's D / 8 features with one store.
  static __device__ __forceinline__ void store_rows(const Acc& acc, scalar_t* out, int64_t r0,
                                                    int64_t num_rows, unsigned long_bits, int g,
                                                    int c) {
    tc_for_stored_rows(r0, num_rows, long_bits, c, [&](int rr, int64_t r) {
      scalar_t* o = out + r * kHD + g * kF;
#pragma unroll
      for (int h = 0; h < kH; ++h) {
        float v[kF];
#pragma unroll
        for (int j = 0; j < kWords; ++j) {
          v[2 * j] = acc[h * kWords + j][rr];
          v[2 * j + 1] = acc[h * kWords + j][2 + rr];
        }
        store_vec<scalar_t, kF>(o + h * kD, v);
      }
    });
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

// tc_run's phase 2 (also the sliced backward's, tensor_core_backward.cuh):
// tiles of 8 rows, one a warp, from the atomic `counter`; rows of more than
// long_threshold entries are skipped (summed elsewhere).
template <typename T, typename P, typename Scan>
__device__ __forceinline__ void tc_tiles(const P& p, unsigned long long* counter,
                                         int64_t long_threshold, Scan&& scan) {
  using off_t = typename T::off_t;
  constexpr unsigned kFull = 0xffffffffu;
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  auto no_skip = [](off_t e) { return e; };
  const int64_t num_tiles = (p.num_rows + 7) / 8;
  for (;;) {
    unsigned long long base = 0;
    if (lane == 0) base = atomicAdd(counter, 1ull);
    base = __shfl_sync(kFull, base, 0);
    if (base >= static_cast<unsigned long long>(num_tiles)) break;  // warp-uniform
    const int64_t r0 = static_cast<int64_t>(base) * 8, rg = r0 + g;
    int64_t lo = 0, hi = 0;
    bool is_long = false;
    if (rg < p.num_rows) {
      row_range(p.ptr, rg, p.num_edges, lo, hi);
      is_long = hi - lo > long_threshold;
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
    tc_zero(acc);
    if (span_lo < span_hi) {  // warp-uniform
      const off_t n = static_cast<off_t>(span_hi - span_lo);
      const int64_t xrow = rg < p.num_rows ? rg : int64_t{-1};
      const off_t rlo = scanned ? static_cast<off_t>(lo - span_lo) : off_t{0};
      const off_t rhi = scanned ? static_cast<off_t>(hi - span_lo) : off_t{0};
      if (long_bits == 0) {
        scan(acc, span_lo, n, rlo, rhi, xrow, no_skip);
      } else {
        // Long rows inside the span are jumped over (summed elsewhere).
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
        scan(acc, span_lo, n, rlo, rhi, xrow, skip);
      }
    }
    if (__all_sync(kFull, tc_finite(acc))) {
      T::store_rows(acc, p.out, r0, p.num_rows, long_bits, g, c);
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

// The persistent loop of the tensor-core kernels (T = TcGather, TcStaged or
// TcDotStaged, P their parameters: ptr, num_rows, num_edges and the output
// `out` of TcGatherParams), with scan(acc, first, n, rlo, rhi, xrow, skip)
// the kernel's walk over the entries [first, first + n) (see TcGather::scan);
// xrow is the row of tile row g (phase 2; -1 past the last row) or the long
// row (phase 1, every lane), which only the backward's dots use.
// Phase 1: the long rows, one at a time per block; warp w sums slice w in
// B's column 0 (tile row 0: the lanes of g = 0 load the weights), which the
// lanes of c = 0 hold, and the slices are added in warp order through `red`.
// Phase 2: tiles of 8 rows, one a warp, from an atomic counter (tc_tiles).
template <typename T, typename P, typename Scan>
__device__ __forceinline__ void tc_run(const P& p, const WorkList& wl, float (*red)[128],
                                       Scan&& scan) {
  using scalar_t = typename T::scalar_type;
  using off_t = typename T::off_t;
  constexpr int kWarps = kThreads / 32, kHD = 128;
  __shared__ unsigned long long s_item;
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, c = threadIdx.x & 3;
  auto no_skip = [](off_t e) { return e; };

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
    tc_zero(acc);
    const off_t n = static_cast<off_t>(shi - slo);
    scan(acc, slo, n, off_t{0}, g == 0 ? n : off_t{0}, r, no_skip);
    if (c == 0) T::column0(acc, red[warp], g);
    __syncthreads();
    for (int q = threadIdx.x; q < kHD; q += kThreads) {
      float sum = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum += red[w][q];
      p.out[r * kHD + q] = static_cast<scalar_t>(sum);
    }
    __syncthreads();
  }
  tc_tiles<T>(p, &wl.counters[2], wl.long_threshold, scan);
}

namespace {  // internal linkage: each instance is launched by one .cu
template <typename scalar_t, typename index_t, int kH>
__global__ void __launch_bounds__(kThreads, kTcMinBlocks)
    tc_gather_kernel(const TcGatherParams<scalar_t, index_t> p, const WorkList wl) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using T = TcGather<scalar_t, index_t, kH>;
  __shared__ float red[kThreads / 32][128];
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  tc_run<T>(p, wl, red,
            [&](typename T::Acc& acc, int64_t first, typename T::off_t n, typename T::off_t rlo,
                typename T::off_t rhi, int64_t /*xrow*/, auto&& skip) {
              T::scan(acc, p, first, n, rlo, rhi, g, c, skip);
            });
#else
  __trap();  // launched only when built for sm_80 or newer (tc_kernel_built)
#endif
}
}  // namespace

// ---------------------------------------------------------------------------
// The staged variant: a chunk's 16 gathered rows are copied into a per-warp
// ring of shared memory (cp.async, 16 bytes a lane, no register held while
// in flight) one chunk ahead, and the A fragments come from there with
// ldmatrix.trans (one x4 load per 16 features). Rows are stored at 256 bytes
// a row with their 16-byte pieces swizzled (piece ^ (entry & 7)), so that the
// 8 rows of an 8x8 matrix sit in distinct banks.
// ---------------------------------------------------------------------------

static_assert(kTcStages == 2, "the staged scan alternates two stages");
constexpr int kTcStageBytes = 16 * 256;  // 16 rows of 128 2-byte features

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool pred) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(pred ? 16 : 0)
               : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}
// Four 8x8 matrices of 2-byte values from shared memory, lane l giving the
// address of row l & 7 of matrix l >> 3; register j holds matrix j (kTrans:
// transposed), lane (g, c) its row g, columns 2c and 2c + 1.
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& a0, uint32_t& a1,
                                            uint32_t& a2, uint32_t& a3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kTrans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3)
                 : "r"(addr)
                 : "memory");
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3)
                 : "r"(addr)
                 : "memory");
  }
#endif
}

template <typename scalar_t, typename index_t, int kH>
struct TcStaged {
  using Base = TcGather<scalar_t, index_t, kH>;
  using scalar_type = scalar_t;
  using off_t = typename Base::off_t;
  using WRaw = typename Base::WRaw;
  static constexpr int kHD = 128, kD = Base::kD, kChunk = 16;
  using Acc = TcAcc;  // tile t: features 16t + g (c0, c1), 16t + 8 + g (c2, c3)

  // The chunk's weights of the lane's entries that belong to tile row g.
  static __device__ __forceinline__ void load_weights(WRaw (&wr)[4], const scalar_t* weight,
                                                      off_t e, off_t rlo, off_t rhi, int c) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const off_t k = e + Base::kpos(i, c);
      wr[i] = RawLoad<Base::kWBytes>::load(k >= rlo && k < rhi, row_at(weight, k, kH));
    }
  }

  // The copies of the chunk at e (its indices: lane l holds entry e + (l & 15)'s).
  static __device__ __forceinline__ void issue(uint32_t stage, index_t sl, off_t e, off_t n,
                                               const scalar_t* x,
                                               const IndexBound<index_t>& src_ok, int lane) {
    copy_rows(stage, sl, e, n, x, src_ok, lane);
    cp_async_commit();
  }
  // The same copies, not committed.
  static __device__ __forceinline__ void copy_rows(uint32_t stage, index_t sl, off_t e, off_t n,
                                                   const scalar_t* x,
                                                   const IndexBound<index_t>& src_ok, int lane) {
    const int piece = lane & 15;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int k = 2 * i + (lane >> 4);
      const index_t s = __shfl_sync(0xffffffffu, sl, k);
      const bool ok = e + k < n && src_ok(s);
      // (row 0 when not ok: the copy reads nothing, and a select of the
      // index costs one instruction where one of the pointer cost four)
      cp_async_16(stage + k * 256 + ((piece ^ (k & 7)) << 4),
                  row_at(x, ok ? s : index_t{0}, kHD) + piece * 8, ok);
    }
  }

  template <typename Skip>
  static __device__ __forceinline__ void scan(Acc& acc, const TcGatherParams<scalar_t, index_t>& p,
                                              int64_t first, off_t n, off_t rlo, off_t rhi,
                                              uint32_t ring, int lane, Skip&& skip) {
    const int c = lane & 3;
    const IndexBound<index_t> src_ok(p.num_src);
    const index_t* idx = p.idx + first;
    const scalar_t* weight = p.weight + first * kH;
    // ldmatrix: lane l gives row l & 7 of matrix l >> 3, i.e. entry
    // (l >> 4) * 8 + (l & 7) and piece 2t + ((l >> 3) & 1) of tile t.
    const int r = lane & 7, q1 = (lane >> 3) & 1;
    const uint32_t lm_off = static_cast<uint32_t>((((lane >> 4) * 8 + r) * 256) + ((q1 ^ r) << 4));
    auto idx_of = [&](off_t e) {
      return load_index_if(e + (lane & 15) < n, idx + e + (lane & 15));
    };
    off_t e = skip(off_t{0});
    if (e >= n) return;
    uint32_t stage = ring;
    issue(stage, idx_of(e), e, n, p.x, src_ok, lane);
    off_t en = skip(n - e > kChunk ? e + kChunk : n);
    index_t sl_next = idx_of(en);
    WRaw wr[4];
    load_weights(wr, weight, e, rlo, rhi, c);
    for (;;) {
      const uint32_t other = stage == ring ? ring + kTcStageBytes : ring;
      if (en < n) {
        issue(other, sl_next, en, n, p.x, src_ok, lane);
      } else {
        cp_async_commit();
      }
      const off_t enn = en < n ? skip(n - en > kChunk ? en + kChunk : n) : n;
      sl_next = idx_of(enn);
      WRaw wn[4];
      load_weights(wn, weight, en, rlo, rhi, c);
      cp_async_wait<1>();
      __syncwarp();
#pragma unroll
      for (int h = 0; h < kH; ++h) {
        const uint32_t sel = (h & 1) ? kHighHalves : kLowHalves;
        const uint32_t b0 = __byte_perm(raw_word(wr[0], h >> 1), raw_word(wr[1], h >> 1), sel);
        const uint32_t b1 = __byte_perm(raw_word(wr[2], h >> 1), raw_word(wr[3], h >> 1), sel);
#pragma unroll
        for (int tt = 0; tt < kD / 16; ++tt) {
          const int t = h * (kD / 16) + tt;
          uint32_t a0, a1, a2, a3;
          ldmatrix_x4<true>(stage + (lm_off ^ (32u * t)), a0, a1, a2, a3);
          Mma16816<scalar_t>::run(acc[t], a0, a1, a2, a3, b0, b1);
        }
      }
      __syncwarp();  // this stage is read before the next iteration refills it
#pragma unroll
      for (int i = 0; i < 4; ++i) wr[i] = wn[i];
      if (en >= n) break;
      stage = other;
      e = en;
      en = enn;
    }
    cp_async_wait<0>();
  }

  static __device__ __forceinline__ void column0(const Acc& acc, float* row, int g) {
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      row[16 * t + g] = acc[t][0];
      row[16 * t + 8 + g] = acc[t][2];
    }
  }

  static __device__ void exact_row(const TcGatherParams<scalar_t, index_t>& p, int64_t r,
                                   int64_t lo, int64_t hi, int lane) {
    Base::exact_row(p, r, lo, hi, lane);
  }

  // Tile rows 2c and 2c + 1 (features 16t + g and 16t + 8 + g of each tile t).
  static __device__ __forceinline__ void store_rows(const Acc& acc, scalar_t* out, int64_t r0,
                                                    int64_t num_rows, unsigned long_bits, int g,
                                                    int c) {
    tc_for_stored_rows(r0, num_rows, long_bits, c, [&](int rr, int64_t r) {
      scalar_t* o = out + r * kHD + g;
#pragma unroll
      for (int t = 0; t < 8; ++t) {
        o[16 * t] = static_cast<scalar_t>(acc[t][rr]);
        o[16 * t + 8] = static_cast<scalar_t>(acc[t][2 + rr]);
      }
    });
  }
};

namespace {  // internal linkage: each instance is launched by one .cu
template <typename scalar_t, typename index_t, int kH>
__global__ void __launch_bounds__(kThreads, kTcStagedMinBlocks)
    tc_gather_staged_kernel(const TcGatherParams<scalar_t, index_t> p, const WorkList wl) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using T = TcStaged<scalar_t, index_t, kH>;
  extern __shared__ __align__(128) unsigned char tc_ring[];
  __shared__ float red[kThreads / 32][128];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint32_t ring = static_cast<uint32_t>(__cvta_generic_to_shared(tc_ring)) +
                        warp * kTcStages * kTcStageBytes;
  tc_run<T>(p, wl, red,
            [&](typename T::Acc& acc, int64_t first, typename T::off_t n, typename T::off_t rlo,
                typename T::off_t rhi, int64_t /*xrow*/, auto&& skip) {
              T::scan(acc, p, first, n, rlo, rhi, ring, lane, skip);
            });
#else
  __trap();  // launched only when built for sm_80 or newer (tc_kernel_built)
#endif
}
}  // namespace

}  // namespace pyg_multihead_agg
