// The spmm backward over the CSC (grad_x and grad_weight in one pass) with
// its gathered rows brought in by bulk copies (sm_90: cp.async.bulk, the TMA
// unit) into a ring of shared-memory stages per warp, instead of loads into
// registers. Included by multihead_spmm.cu inside its anonymous namespace.
//
// Why. The register kernel (dot_gather_kernel) keeps 8 rows in flight per
// warp at 16 warps per SM, and has none in flight while it computes a step:
// products-like float32 ran 12.1 ms against 7.3 ms for a plain gather of the
// same rows at the memory's speed (benchmarks/gather_ceiling.py, session
// 13). A ring of S stages refilled a batch at a time keeps S - 8 to S rows in
// flight through the compute, without registers.
//
// Layout. Rows of H * D = 128 elements, 4 per lane (16 bytes in float32, 8
// in 2-byte types), heads of D = 32 (8 lanes) or 16 (4 lanes). A warp
// fetches kBulkRuns work items at a time (long rows' slices first, then
// short rows: SliceList, as the register kernel) and streams all their
// entries through its ring:
//   producer (lanes u < 8, a batch of 8 positions at a time): finds its
//     entry's run by a binary search over the runs' starts (shuffles), loads
//     its row and edge id (one batch ahead), then copies the gathered row
//     (cp.async.bulk) and the edge's weights (cp.async) into the stage and
//     stores the edge id next to them; both copies complete on the stage's
//     mbarrier. A position is refilled once the one S before it is read.
//   consumer (all lanes, run by run, steps of 8 entries): waits on the
//     stages' mbarriers, reads the rows from shared memory, and does the
//     register kernel's step: the dots reduced by transposing butterflies,
//     lane q of a head storing entry q's grad_weight, and grad_x accumulated
//     in float32. The pipe drains at the end of each fetch.
// Same sums in the same order as dot_entries_transposed for float32, so the
// results are bitwise those of the register kernel there; 2-byte types split
// a head's dot over 8 lanes of 4 elements instead of 4 lanes of 8.
//
// Bad input: an out-of-range gathered row is not copied; its stage is zeroed
// (and the barrier arrived on without bytes), so the entry adds nothing, as
// in the register kernel. An out-of-range edge id copies no weight and
// stores no grad_weight.
#pragma once

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PMA_HAS_BULK 1
#else
#define PMA_HAS_BULK 0
#endif

#ifndef PMA_BULK_STAGES
#define PMA_BULK_STAGES 16
#endif

// Runs (slices or short rows) per fetch: lane t < kBulkRuns holds run t.
constexpr int kBulkRuns = 16;
// Entries per consumer step and positions per producer batch.
constexpr int kBulkBatch = 8;
// Stages per warp (a power of two, <= 32, a multiple of kBulkBatch).
constexpr int kBulkStages = PMA_BULK_STAGES;
static_assert(kBulkStages % kBulkBatch == 0 && kBulkStages <= 32 &&
                  (kBulkStages & (kBulkStages - 1)) == 0,
              "stages: a power of two, whole batches, one barrier per lane");
// Per stage besides the row: the edge id (8 bytes, -1 when out of range),
// 8 bytes of padding and the edge's H weights (at most 8 floats).
constexpr int kBulkMeta = 48;

template <typename scalar_t>
constexpr int bulk_smem_per_warp() {
  return kBulkStages * (128 * static_cast<int>(sizeof(scalar_t)) + kBulkMeta + 8);
}

namespace bulk {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

#if PMA_HAS_BULK
__device__ __forceinline__ void init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count)
               : "memory");
}

__device__ __forceinline__ void fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// One arrival, and `bytes` more to come from copies before the phase ends.
__device__ __forceinline__ void arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

// One arrival once this thread's earlier cp.async copies have landed.
__device__ __forceinline__ void arrive_on_copies(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_u32(bar))
               : "memory");
}

__device__ __forceinline__ void wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}

// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to
// shared memory through the TMA unit, completing on `bar`.
__device__ __forceinline__ void copy_row(void* dst, const void* src, uint32_t bytes,
                                         uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}

// 8 or 16 bytes from global to shared memory (cp.async).
template <int kBytes>
__device__ __forceinline__ void copy_small(void* dst, const void* src) {
  static_assert(kBytes == 8 || kBytes == 16, "cp.async of 8 or 16 bytes");
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(smem_u32(dst)), "l"(src),
               "n"(kBytes)
               : "memory");
}
#endif

}  // namespace bulk

template <typename scalar_t, typename index_t, int kS>
__global__ void __launch_bounds__(kDotThreads, 4)
    dot_bulk_kernel(const DotParams<scalar_t, index_t> p, const SliceList sl) {
#if PMA_HAS_BULK
  using acc_t = at::opmath_type<scalar_t>;
  using vec_t = Vec<scalar_t, 4>;
  static_assert(kS == 4 || kS == 8, "heads of 16 or 32 elements");
  constexpr int U = kBulkBatch, S = kBulkStages, kSlots = U / kS, kWarps = kDotThreads / 32;
  constexpr int kRowBytes = 128 * static_cast<int>(sizeof(scalar_t));
  constexpr int H = 32 / kS, kWeightBytes = H * static_cast<int>(sizeof(scalar_t));
  static_assert(kWeightBytes == 8 || kWeightBytes % 16 == 0, "weights by cp.async");
  static_assert(kWeightBytes <= kBulkMeta - 16, "weights fit the stage's metadata");
  constexpr unsigned kFull = 0xffffffffu;
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5;
  unsigned char* rows = smem + wib * S * kRowBytes;
  unsigned char* meta = smem + kWarps * S * kRowBytes + wib * S * kBulkMeta;
  uint64_t* bars =
      reinterpret_cast<uint64_t*>(smem + kWarps * S * (kRowBytes + kBulkMeta)) + wib * S;
  // Two arrivals a phase: the producer lane's (with the row's bytes), and its
  // cp.async of the weights.
  if (lane < S) bulk::init(bars + lane, 2);
  bulk::fence_init();
  __syncwarp();

  const int q = lane & (kS - 1), h = lane / kS, head_base = lane & ~(kS - 1);
  const IndexBound<index_t> gathered_ok(p.num_gathered), edge_ok(p.num_edges);
  const int64_t num_slots = static_cast<int64_t>(sl.counters[1]);
  uint32_t ring = 0;  // ring position of the fetch's first entry (stage = position % S)

  for (int phase = 0; phase < 2; ++phase) {
    const int64_t num_items = phase == 0 ? num_slots : sl.num_rows;
    unsigned long long* counter = &sl.counters[2 + phase];
    for (;;) {
      unsigned long long fetched = 0;
      if (lane == 0) fetched = atomicAdd(counter, static_cast<unsigned long long>(kBulkRuns));
      const int64_t base = static_cast<int64_t>(__shfl_sync(kFull, fetched, 0));
      if (base >= num_items) break;  // warp-uniform
      // Run `lane`: entries [lo, lo + len) of row r, into slot (phase 0) or row r.
      const int64_t item = base + lane;
      bool valid = lane < kBulkRuns && item < num_items;
      int64_t r = 0, lo = 0, hi = 0;
      if (valid) {
        if (phase == 0) {
          const int64_t li = sl.slot_owner[item];
          r = sl.long_rows[li];
          row_range(p.ptr, r, p.num_edges, lo, hi);
          lo += (item - sl.long_base[li]) * sl.slice_len;
          hi = min(hi, lo + sl.slice_len);
        } else {
          r = item;
          row_range(p.ptr, r, p.num_edges, lo, hi);
          valid = hi - lo <= sl.long_threshold;
        }
      }
      const int len = valid ? static_cast<int>(hi - lo) : 0;  // <= long_threshold < 2^31
      int start = len;  // inclusive scan, then exclusive
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const int v = __shfl_up_sync(kFull, start, off);
        if (lane >= off) start += v;
      }
      const int total = __shfl_sync(kFull, start, 31);
      start -= len;

      // Producer: lane u < U loads, one batch ahead, the row and edge id of
      // position `next + u` of the fetch (binary search over the runs).
      int issued = 0;
      index_t pi = 0, pe = 0;
      bool pin = false;
      auto locate = [&](int pos) {
        int t = 0;
#pragma unroll
        for (int step = 16; step > 0; step >>= 1) {
          const int s = __shfl_sync(kFull, start, t + step);
          if (s <= pos) t += step;
        }
        const int64_t k = __shfl_sync(kFull, lo, t) + (pos - __shfl_sync(kFull, start, t));
        pin = lane < U && pos < total;
        pi = load_index_if(pin, p.idx + k);
        pe = load_index_if(pin, p.perm + k);
      };
      auto issue_batch = [&]() {
        if (pin) {
          const uint32_t st = (ring + issued + lane) % S;
          unsigned char* row_dst = rows + st * kRowBytes;
          unsigned char* m = meta + st * kBulkMeta;
          uint64_t* bar = bars + st;
          const bool eok = edge_ok(pe), rok = gathered_ok(pi);
          *reinterpret_cast<int64_t*>(m) = eok ? static_cast<int64_t>(pe) : -1;
          if (eok) {
            const scalar_t* w = row_at(p.weight, pe, H);
            if constexpr (kWeightBytes == 8) {
              bulk::copy_small<8>(m + 16, w);
            } else {
#pragma unroll
              for (int b = 0; b < kWeightBytes; b += 16)
                bulk::copy_small<16>(m + 16 + b, reinterpret_cast<const unsigned char*>(w) + b);
            }
          }
          if (rok) {
            bulk::arrive_expect_tx(bar, kRowBytes);
            bulk::copy_row(row_dst, row_at(p.gathered, pi, 128), kRowBytes, bar);
          } else {
#pragma unroll
            for (int b = 0; b < kRowBytes; b += 16)
              *reinterpret_cast<uint4*>(row_dst + b) = make_uint4(0, 0, 0, 0);
            bulk::arrive(bar);
          }
          bulk::arrive_on_copies(bar);
        }
        issued += U;
        locate(issued + lane);
      };
      locate(lane);
      // Positions whose stage is free: the one S before has been read.
      auto refill = [&](int consumed) {
        while (issued < total && issued + U <= consumed + S) issue_batch();
      };
      refill(0);

      // Consumer: the runs in order, each in steps of U entries.
      int pos = 0;
      vec_t xr_next{};
      auto rowval_of = [&](int t) {
        const bool ok = t < kBulkRuns && __shfl_sync(kFull, valid, t);
        const int64_t rt = __shfl_sync(kFull, r, t);
        return load_vec_if<scalar_t, 4>(ok, p.rowval + rt * 128 + lane * 4);
      };
      xr_next = rowval_of(0);
      for (int t = 0; t < kBulkRuns; ++t) {
        const bool valid_t = __shfl_sync(kFull, valid, t);
        const int len_t = __shfl_sync(kFull, len, t);
        const int64_t r_t = __shfl_sync(kFull, r, t);
        acc_t xr[4];
        widen(xr_next, xr);
        xr_next = rowval_of(t + 1);
        if (!valid_t) continue;  // warp-uniform
        acc_t acc[4] = {0, 0, 0, 0};
        for (int k0 = 0; k0 < len_t; k0 += U) {
          const int left = len_t - k0;
          const uint32_t first = ring + pos + k0;
          vec_t g[U];
#pragma unroll
          for (int u = 0; u < U; ++u) {
            if (u < left) {
              const uint32_t at = first + u;
              bulk::wait(bars + at % S, (at / S) & 1);
              g[u] = *reinterpret_cast<const vec_t*>(rows + (at % S) * kRowBytes + lane * 4 *
                                                                   sizeof(scalar_t));
            } else {
              g[u] = zero_vec<scalar_t, 4>();
            }
          }
          int64_t eq[kSlots];
          acc_t wq[kSlots];
#pragma unroll
          for (int s = 0; s < kSlots; ++s) {
            const int u = s * kS + q;
            eq[s] = -1;
            wq[s] = 0;
            if (u < left) {
              const unsigned char* m = meta + ((first + u) % S) * kBulkMeta;
              eq[s] = *reinterpret_cast<const int64_t*>(m);
              if (eq[s] >= 0)
                wq[s] = static_cast<acc_t>(reinterpret_cast<const scalar_t*>(m + 16)[h]);
            }
          }
          acc_t d[U];
#pragma unroll
          for (int u = 0; u < U; ++u) {
            acc_t gw[4];
            widen(g[u], gw);
            d[u] = 0;
#pragma unroll
            for (int v = 0; v < 4; ++v) d[u] += gw[v] * xr[v];
          }
#pragma unroll
          for (int u = 0; u < U; ++u) {
            const acc_t w = __shfl_sync(kFull, wq[u / kS], head_base + (u % kS));
            axpy_vec(acc, w, g[u]);
          }
          // Every lane has used its rows of these stages: refill them.
          __syncwarp();
          refill(pos + k0 + min(left, U));
          if constexpr (kS == 8) transpose_round<4, kS>(d, q, kFull);
          transpose_round<2, kS>(d, q, kFull);
          transpose_round<1, kS>(d, q, kFull);
#pragma unroll
          for (int s = 0; s < kSlots; ++s)
            if (eq[s] >= 0) p.dot_out[eq[s] * H + h] = static_cast<scalar_t>(d[s * kS]);
        }
        pos += len_t;
        if (phase == 0) {
          const int64_t slot = base + t;
          store_vec<acc_t, 4>(p.part + slot * 128 + lane * 4, acc);
        } else {
          store_vec<scalar_t, 4>(p.acc_out + r_t * 128 + lane * 4, acc);
        }
      }
      ring += static_cast<uint32_t>(total);
    }
  }
#else
  __trap();  // never launched: the host checks the kernel's binary version
#endif
}

// Whether the bulk-copy kernel runs the fused backward (grad_x and
// grad_weight): PYG_MULTIHEAD_AGG_BULK=1 (default) or 0, for benchmarks and
// tests of both kernels. Used where it applies: an sm_90 device or newer,
// H * D = 128 with D = 32 or 16, 16-byte aligned tensors, 4- or 2-byte types.
inline bool bulk_enabled() { return env_int("PYG_MULTIHEAD_AGG_BULK", 1, {0, 1}) == 1; }

// Blocks of 128 threads per SM (PYG_MULTIHEAD_AGG_BULK_BLOCKS, default 4):
// gather_ceiling.py's bulk copies ran best at 16 warps per SM, and the
// kernel's 110-122 registers fit no more.
inline int bulk_blocks_per_sm() {
  return static_cast<int>(env_int("PYG_MULTIHEAD_AGG_BULK_BLOCKS", 4, {2, 3, 4}));
}

// Runs the fused backward (grad_x and grad_weight) with dot_bulk_kernel when
// it applies (see bulk_enabled) and returns whether it did.
template <typename scalar_t, typename index_t>
bool try_launch_dot_bulk(DotParams<scalar_t, index_t> p, const at::TensorOptions& options) {
  if constexpr (sizeof(scalar_t) > 4) {
    return false;
  } else {
    if (p.weight == nullptr || p.dot_out == nullptr || p.acc_out == nullptr ||
        p.perm == nullptr || p.HD != 128 || (p.D != 32 && p.D != 16))
      return false;
    if (!is_aligned(p.gathered, 16) || !is_aligned(p.rowval, 16) || !is_aligned(p.weight, 16) ||
        !is_aligned(p.acc_out, 16) || !bulk_enabled())
      return false;
    auto kernel = p.D == 32 ? dot_bulk_kernel<scalar_t, index_t, 8>
                            : dot_bulk_kernel<scalar_t, index_t, 4>;
    // Only where the kernel was compiled for sm_90 or newer (its body is
    // empty below that), which also means the device is one.
    cudaFuncAttributes attr{};
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    if (attr.binaryVersion < 90) return false;
    using acc_t = at::opmath_type<scalar_t>;
    at::Tensor storage;
    int64_t max_slots = 0;
    const SliceList sl =
        make_slice_list(p.ptr, p.num_rows, p.num_edges, storage, options, max_slots);
    const at::Tensor part =
        at::empty({max_slots * p.HD}, options.dtype(c10::CppTypeToScalarType<acc_t>::value));
    p.part = part.data_ptr<acc_t>();
    const int smem = (kDotThreads / 32) * bulk_smem_per_warp<scalar_t>();
    C10_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const int64_t per_block = (kDotThreads / 32) * kBulkRuns;
    const int64_t items = p.num_rows + max_slots;
    const int grid = static_cast<int>(std::max<int64_t>(
        1, std::min<int64_t>(static_cast<int64_t>(bulk_blocks_per_sm()) * num_sms(),
                             (items + per_block - 1) / per_block)));
    kernel<<<grid, kDotThreads, smem, c10::cuda::getCurrentCUDAStream()>>>(p, sl);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    launch_sum_slices<scalar_t, index_t, acc_t>(p.ptr, p.num_edges, sl, p.part, p.acc_out, p.HD,
                                                nullptr, nullptr, 0);
    return true;
  }
}
