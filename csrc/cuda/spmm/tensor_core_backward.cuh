// The spmm backward of 2-byte types on the tensor cores: both gradients from
// one pass over the CSC, for H * D = 128 (H = 2, 4 or 8).
//
// Over the CSC (a row r is a source node j, its entries k the edges into the
// destinations i = idx[k], edge ids perm[k]):
//     grad_x[j, h, :]   = sum_k weight[perm[k], h] * grad_out[idx[k], h, :]
//     dots[k, h]        = <x[j, h, :], grad_out[idx[k], h, :]>
// grad_x is the forward's segmented SpMM (tensor_core_gather.cuh) with the
// weights read through perm; the dots are an mma too. A warp takes a tile of
// 8 consecutive CSC rows and walks their entries in chunks of 16; the
// chunk's 16 grad_out rows G (16 entries x 128 features) are staged in
// shared memory as in TcStaged, together with the 16 entries' weight rows
// (copied through perm, so no weight load waits on a perm load). Per head h
// and chunk:
//     grad_x:  C[f, n] += sum_k G[k, f] * B[k, n]    (ldmatrix.trans, as the forward)
//     dots:    D[k, n]  = sum_f G[k, f] * X[f, n]    (ldmatrix, same addresses)
// with X[f, n] = x[tile row n, h, f], held in registers for the whole tile
// (16 words a lane), and entry k's dot is D[k, row of k] (a select: lane
// (g, c) holds columns 2c and 2c + 1 of entries g and g + 8). Each D element
// is one entry's dot with one row's x, so a non-finite value reaches only
// the dots it belongs to; grad_x takes tc_tiles' per-tile fallback.
//
// The dots are stored as the CSC entries are walked: by entry (dot_by_entry,
// then gathered into edge order through perm_inv by the launcher) or at
// perm[k]. Without them (kDots = false: grad_x alone, for weights that need
// no gradient) the kernel is the staged SpMM over the CSC with the weights
// read through perm, its long rows in slices; it holds no x fragments.
//
// Long rows (a CSC's hubs: the most popular source of products-like has
// ~460K entries) are cut into slices of a SliceList, any warp taking any
// slice, whose partial grad_x rows (B's column 0, float32) go to scratch
// slots, summed in slot order by sum_slices_kernel (deterministic). Summed
// block-wide, as the forward's tc_run does, a hub bounds the kernel by one
// block's latency-bound walk over it (arxiv-like 0.39 ms against the
// dot-gather kernel's 0.28, reddit-like 7.1 against 4.3).
#pragma once

#include "tensor_core_gather.cuh"

namespace pyg_multihead_agg {

template <typename scalar_t, typename index_t>
struct TcDotParams : TcGatherParams<scalar_t, index_t> {
  // Inherited: ptr = colptr, idx = row, weight [E, H] by edge id, x = grad_out
  // (the gathered rows), out = grad_x, num_rows = sources, num_src = the
  // gathered rows, num_edges.
  const index_t* perm;      // [E] edge id per CSC entry
  const scalar_t* rowval;   // x [num_rows, H, D]
  scalar_t* dot_out;        // [E, H]: by CSC entry (by_entry) or by edge id
  float* part;              // [slots, 128]: the slices' partial grad_x rows
  bool by_entry;
};

// 16 grad_out rows (4 KB) and 16 weight rows (at most 16 bytes each) a
// stage, kTcDotStages (params.cuh) stages a warp.
static_assert(kTcDotStages == 2 || kTcDotStages == 3, "2 or 3 stages");
constexpr int kTcRowBytes = 16 * 256;
constexpr int kTcDotStageBytes = kTcRowBytes + 16 * 16;

template <int kBytes>
__device__ __forceinline__ void cp_async_small(uint32_t dst, const void* src, bool pred) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kBytes == 16) {
    cp_async_16(dst, src, pred);
  } else {
    static_assert(kBytes == 4 || kBytes == 8, "4, 8 or 16 bytes");
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src),
                 "n"(kBytes), "r"(pred ? kBytes : 0)
                 : "memory");
  }
#endif
}

template <int kBytes>
__device__ __forceinline__ typename RawType<kBytes>::type lds_raw(uint32_t addr) {
  typename RawType<kBytes>::type v{};
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kBytes == 16) {
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(addr)
                 : "memory");
  } else if constexpr (kBytes == 8) {
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr) : "memory");
  } else {
    static_assert(kBytes == 4, "4, 8 or 16 bytes");
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  }
#endif
  return v;
}

// Two floats as one word of two 2-byte values (lo in the low half), rounded
// as static_cast<scalar_t> rounds.
template <typename scalar_t>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  const scalar_t a = static_cast<scalar_t>(lo), b = static_cast<scalar_t>(hi);
  return static_cast<uint32_t>(a.x) | (static_cast<uint32_t>(b.x) << 16);
}

template <typename scalar_t, typename index_t, int kH, bool kDots>
struct TcDotStaged {
  using Base = TcGather<scalar_t, index_t, kH>;
  using Params = TcDotParams<scalar_t, index_t>;
  using scalar_type = scalar_t;
  using off_t = typename Base::off_t;
  static constexpr int kHD = 128, kD = Base::kD, kChunk = 16, kWBytes = Base::kWBytes;
  static constexpr int kTilesPerHead = kD / 16;
  using WRaw = typename Base::WRaw;
  using DotRaw = typename RawType<2 * kH>::type;  // one entry's H dots
  using Acc = TcAcc;  // grad_x, as TcStaged: tile t holds features 16t + g, 16t + 8 + g

  // The chunk at e: its 16 grad_out rows (TcStaged's layout) and, by lanes
  // 0-15, its weight rows through perm (lane l holds entry e + (l & 15)'s
  // gathered row sl and edge id pl); zeros for entries past n or out of range.
  static __device__ __forceinline__ void issue(uint32_t stage, index_t sl, index_t pl, off_t e,
                                               off_t n, const Params& p,
                                               const IndexBound<index_t>& src_ok,
                                               const IndexBound<index_t>& edge_ok, int lane) {
    TcStaged<scalar_t, index_t, kH>::copy_rows(stage, sl, e, n, p.x, src_ok, lane);
    if (lane < kChunk) {
      const bool ok = e + lane < n && edge_ok(pl);
      cp_async_small<kWBytes>(stage + kTcRowBytes + lane * kWBytes,
                              row_at(p.weight, ok ? pl : index_t{0}, kH), ok);
    }
    cp_async_commit();
  }

  // Entries [0, n) from `first` (see TcGather::scan); rlo, rhi: tile row g's
  // entries; xrow: the x row of B column g (tile row g), or -1.
  template <typename Skip>
  static __device__ __forceinline__ void scan(Acc& acc, const Params& p, int64_t first, off_t n,
                                              off_t rlo, off_t rhi, int64_t xrow, uint32_t ring,
                                              int lane, Skip&& skip) {
    constexpr unsigned kFull = 0xffffffffu;
    const int g = lane >> 2, c = lane & 3;
    const IndexBound<index_t> src_ok(p.num_src), edge_ok(p.num_edges);
    const index_t* idx = p.idx + first;
    const index_t* perm = p.perm + first;
    // Tile rows 2c and 2c + 1 (the D columns this lane holds).
    off_t lo_a = 0, hi_a = 0, lo_b = 0, hi_b = 0;
    // X's B fragments: features 16t + 2c, +1 and 16t + 8 + 2c, +1 of x[xrow].
    uint32_t xb[8][2];
    if constexpr (kDots) {
      lo_a = __shfl_sync(kFull, rlo, 8 * c);
      hi_a = __shfl_sync(kFull, rhi, 8 * c);
      lo_b = __shfl_sync(kFull, rlo, 8 * c + 4);
      hi_b = __shfl_sync(kFull, rhi, 8 * c + 4);
      const bool ok = xrow >= 0;
      const uint32_t* xw =
          reinterpret_cast<const uint32_t*>(p.rowval + (ok ? xrow : int64_t{0}) * kHD) + c;
#pragma unroll
      for (int t = 0; t < 8; ++t) {
        xb[t][0] = RawLoad<4>::load(ok, xw + 8 * t);
        xb[t][1] = RawLoad<4>::load(ok, xw + 8 * t + 4);
      }
    }
    const int r = lane & 7, q1 = (lane >> 3) & 1;
    const uint32_t lm_off = static_cast<uint32_t>((((lane >> 4) * 8 + r) * 256) + ((q1 ^ r) << 4));
    auto idx_of = [&](off_t e) {
      return load_index_if(e + (lane & 15) < n, idx + e + (lane & 15));
    };
    auto perm_of = [&](off_t e) {
      return load_index_if(e + (lane & 15) < n, perm + e + (lane & 15));
    };
    // The chunk after the one at e (n past the last).
    auto next = [&](off_t e) { return e < n ? skip(n - e > kChunk ? e + kChunk : n) : n; };
    // A ring of S stages: chunk es[0] is multiplied while es[1 .. S-1] are
    // in flight (es[S-1] issued at the top of the iteration); ps[s]: the edge
    // ids of chunk es[s] (lane l: entry es[s] + (l & 15)'s).
    constexpr int S = kTcDotStages;
    off_t es[S];
    index_t ps[S];
    es[0] = skip(off_t{0});
    if (es[0] >= n) return;
#pragma unroll
    for (int s = 0; s + 1 < S; ++s) {
      if (s > 0) es[s] = next(es[s - 1]);
      ps[s] = perm_of(es[s]);
      if (es[s] < n) {
        issue(ring + s * kTcDotStageBytes, idx_of(es[s]), ps[s], es[s], n, p, src_ok, edge_ok,
              lane);
      } else {
        cp_async_commit();
      }
    }
    es[S - 1] = next(es[S - 2]);
    index_t sl_last = idx_of(es[S - 1]);
    ps[S - 1] = perm_of(es[S - 1]);
    int slot = 0;  // the stage of chunk es[0]
    for (;;) {
      const int last = slot == 0 ? S - 1 : slot - 1;  // (slot + S - 1) % S
      if (es[S - 1] < n) {
        issue(ring + last * kTcDotStageBytes, sl_last, ps[S - 1], es[S - 1], n, p, src_ok,
              edge_ok, lane);
      } else {
        cp_async_commit();
      }
      const off_t e_new = next(es[S - 1]);
      sl_last = idx_of(e_new);
      const index_t p_new = perm_of(e_new);
      cp_async_wait<S - 1>();
      __syncwarp();
      const off_t e = es[0];
      const index_t pl = ps[0];
      const uint32_t stage = ring + slot * kTcDotStageBytes;
      // B of grad_x: the weights of the lane's entries 2c, 2c+1, 2c+8, 2c+9
      // that belong to tile row g.
      WRaw wr[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int k = Base::kpos(i, c);
        const WRaw w = lds_raw<kWBytes>(stage + kTcRowBytes + k * kWBytes);
        wr[i] = e + k >= rlo && e + k < rhi ? w : WRaw{};
      }
      // Entries g and g + 8 of the chunk: in tile row 2c (a) or 2c + 1 (b)?
      const off_t k1 = e + g, k2 = e + g + 8;
      const bool a1 = k1 >= lo_a && k1 < hi_a, b1 = k1 >= lo_b && k1 < hi_b;
      const bool a2 = k2 >= lo_a && k2 < hi_a, b2 = k2 >= lo_b && k2 < hi_b;
      uint32_t dw1[kH / 2], dw2[kH / 2];
      float dlo1 = 0.f, dlo2 = 0.f;
#pragma unroll
      for (int h = 0; h < kH; ++h) {
        const uint32_t sel = (h & 1) ? kHighHalves : kLowHalves;
        const uint32_t b0 = __byte_perm(raw_word(wr[0], h >> 1), raw_word(wr[1], h >> 1), sel);
        const uint32_t b1w = __byte_perm(raw_word(wr[2], h >> 1), raw_word(wr[3], h >> 1), sel);
        float d[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int tt = 0; tt < kTilesPerHead; ++tt) {
          const int t = h * kTilesPerHead + tt;
          const uint32_t addr = stage + (lm_off ^ (32u * t));
          uint32_t a0, a1r, a2r, a3;
          ldmatrix_x4<true>(addr, a0, a1r, a2r, a3);
          Mma16816<scalar_t>::run(acc[t], a0, a1r, a2r, a3, b0, b1w);
          if constexpr (kDots) {
            uint32_t g0, g1, g2, g3;
            ldmatrix_x4<false>(addr, g0, g1, g2, g3);
            // matrices: 0 = entries 0-7 / features 16t..+7, 1 = entries 0-7 /
            // 16t+8.., 2 = entries 8-15 / 16t.., 3 = entries 8-15 / 16t+8..
            Mma16816<scalar_t>::run(d, g0, g2, g1, g3, xb[t][0], xb[t][1]);
          }
        }
        if constexpr (kDots) {
          const float v1 = a1 ? d[0] : d[1], v2 = a2 ? d[2] : d[3];
          if (h & 1) {
            dw1[h >> 1] = pack2<scalar_t>(dlo1, v1);
            dw2[h >> 1] = pack2<scalar_t>(dlo2, v2);
          } else {
            dlo1 = v1;
            dlo2 = v2;
          }
        }
      }
      __syncwarp();  // this stage is read before the next iteration refills it
      if constexpr (kDots) {
        int64_t at1 = first + k1, at2 = first + k2;
        bool ok1 = a1 || b1, ok2 = a2 || b2;
        if (!p.by_entry) {  // uniform
          const index_t e1 = __shfl_sync(kFull, pl, g), e2 = __shfl_sync(kFull, pl, g + 8);
          at1 = static_cast<int64_t>(e1);
          at2 = static_cast<int64_t>(e2);
          ok1 = ok1 && edge_ok(e1);
          ok2 = ok2 && edge_ok(e2);
        }
        if (ok1) store_once(reinterpret_cast<DotRaw*>(p.dot_out + at1 * kH), as_raw(dw1));
        if (ok2) store_once(reinterpret_cast<DotRaw*>(p.dot_out + at2 * kH), as_raw(dw2));
      }
      if (es[1] >= n) break;
#pragma unroll
      for (int s = 0; s + 1 < S; ++s) {
        es[s] = es[s + 1];
        ps[s] = ps[s + 1];
      }
      es[S - 1] = e_new;
      ps[S - 1] = p_new;
      slot = slot + 1 == S ? 0 : slot + 1;
    }
    cp_async_wait<0>();
  }

  static __device__ __forceinline__ DotRaw as_raw(const uint32_t (&w)[kH / 2]) {
    DotRaw v;
    memcpy(&v, w, sizeof(DotRaw));
    return v;
  }

  static __device__ __forceinline__ void column0(const Acc& acc, float* row, int g) {
    TcStaged<scalar_t, index_t, kH>::column0(acc, row, g);
  }

  static __device__ __forceinline__ void store_rows(const Acc& acc, scalar_t* out, int64_t r0,
                                                    int64_t num_rows, unsigned long_bits, int g,
                                                    int c) {
    TcStaged<scalar_t, index_t, kH>::store_rows(acc, out, r0, num_rows, long_bits, g, c);
  }

  // grad_x row r one entry at a time (the tile's fallback for non-finite
  // values): lane l sums features 4l .. 4l + 3 in entry order.
  static __device__ void exact_row(const Params& p, int64_t r, int64_t lo, int64_t hi, int lane) {
    const IndexBound<index_t> src_ok(p.num_src), edge_ok(p.num_edges);
    const int f = 4 * lane, h = f / kD;
    float a[4] = {0.f, 0.f, 0.f, 0.f};
    for (int64_t e = lo; e < hi; ++e) {
      const index_t s = p.idx[e], pe = p.perm[e];
      if (!src_ok(s) || !edge_ok(pe)) continue;
      const float w = static_cast<float>(p.weight[static_cast<int64_t>(pe) * kH + h]);
      const scalar_t* gr = p.x + static_cast<int64_t>(s) * kHD + f;
#pragma unroll
      for (int v = 0; v < 4; ++v) a[v] += w * static_cast<float>(gr[v]);
    }
    store_vec<scalar_t, 4>(p.out + r * kHD + f, a);
  }
};

namespace {  // internal linkage: each instance is launched by one .cu
// Phase 1: the slices of the long rows, one a warp, from sl.counters[2]:
// slot `item`'s entries in B's column 0 (tile row 0: the lanes of g = 0 load
// the weights), written by the lanes of c = 0 to part[item]. Phase 2: tiles
// (tc_tiles), from sl.counters[3].
template <typename scalar_t, typename index_t, int kH, bool kDots>
__global__ void __launch_bounds__(kThreads, kDots ? kTcDotMinBlocks : kTcGradXMinBlocks)
    tc_dot_gather_kernel(const TcDotParams<scalar_t, index_t> p, const SliceList sl) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using T = TcDotStaged<scalar_t, index_t, kH, kDots>;
  using off_t = typename T::off_t;
  extern __shared__ __align__(128) unsigned char tc_ring[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const uint32_t ring = static_cast<uint32_t>(__cvta_generic_to_shared(tc_ring)) +
                        warp * kTcDotStages * kTcDotStageBytes;
  auto scan = [&](typename T::Acc& acc, int64_t first, off_t n, off_t rlo, off_t rhi,
                  int64_t xrow, auto&& skip) {
    T::scan(acc, p, first, n, rlo, rhi, xrow, ring, lane, skip);
  };
  const int64_t slots = num_slots(sl);
  for (;;) {
    unsigned long long item = 0;
    if (lane == 0) item = atomicAdd(&sl.counters[2], 1ull);
    item = __shfl_sync(0xffffffffu, item, 0);
    if (item >= static_cast<unsigned long long>(slots)) break;  // warp-uniform
    const int64_t li = sl.slot_owner[item], r = sl.long_rows[li];
    int64_t lo, hi;
    row_range(p.ptr, r, p.num_edges, lo, hi);
    const int64_t slo = lo + (static_cast<int64_t>(item) - sl.long_base[li]) * sl.slice_len;
    const int64_t shi = min(hi, slo + sl.slice_len);
    const off_t n = shi > slo ? static_cast<off_t>(shi - slo) : off_t{0};
    typename T::Acc acc;
    tc_zero(acc);
    scan(acc, slo, n, off_t{0}, g == 0 ? n : off_t{0}, r, [](off_t e) { return e; });
    if (c == 0) T::column0(acc, p.part + static_cast<int64_t>(item) * 128, g);
  }
  tc_tiles<T>(p, &sl.counters[3], sl.long_threshold, scan);
#else
  __trap();  // launched only when built for sm_80 or newer (tc_kernel_built)
#endif
}
}  // namespace

}  // namespace pyg_multihead_agg
