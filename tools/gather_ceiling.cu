// The random-row gather ceiling of one GPU, for the access pattern of the
// spmm backward over the CSC: sum, for every chunk of an index list, the
// table rows it names (out[c] = sum of table[idx[k]], k in chunk c). No
// weights, no dots: only the loads, so that its best time bounds what a
// kernel with more work per entry can reach. Two ways to keep loads in
// flight:
//   ldg: U 16-byte loads per lane per step, in registers (as the package's
//        kernels do), a warp per chunk, grid-stride;
//   tma: bulk copies (cp.async.bulk, sm_90) of whole rows into a per-warp
//        ring of S shared-memory stages, completed on mbarriers; no register
//        holds a row in flight. Each warp takes a contiguous run of chunks.
// Built by gather_ceiling.py (nvcc -arch=sm_90), called through ctypes.
#include <cuda_runtime.h>

#include <cstdint>

namespace {

__device__ __forceinline__ void add4(float4& a, const float4& b) {
  a.x += b.x;
  a.y += b.y;
  a.z += b.z;
  a.w += b.w;
}

// Predicated loads as one instruction each (asm volatile keeps them in
// order and unconverted), so that a step's U loads are all in flight before
// the first is used, as in the package's kernels.
__device__ __forceinline__ int ld_idx(bool pred, const int* p) {
  int v;
  asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %2, 0;\n mov.b32 %0, 0;\n"
               " @q ld.global.nc.u32 %0, [%1];\n}\n"
               : "=r"(v)
               : "l"(p), "r"(static_cast<int>(pred)));
  return v;
}

__device__ __forceinline__ float4 ld_row(bool pred, const float4* p) {
  float4 v;
  asm volatile("{\n .reg .pred q;\n setp.ne.b32 q, %5, 0;\n"
               " mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n mov.b32 %3, 0;\n"
               " @q ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];\n}\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "l"(p), "r"(static_cast<int>(pred)));
  return v;
}

// R = 16-byte vectors per row: 32 (512 B, float32 H x D = 128) or 16 (256 B,
// 2-byte types). With R = 16 a warp takes two entries of its chunk per slot.
// MINB = blocks of 128 threads per SM: without it ptxas keeps 32 registers
// and uses each row before the next is loaded (U = 16: about 4 in flight).
template <int U, int R, int MINB>
__global__ void __launch_bounds__(128, MINB) ldg_kernel(const int* __restrict__ cptr,
                                                  const int* __restrict__ idx,
                                                  const float4* __restrict__ table,
                                                  float4* __restrict__ out, int num_chunks) {
  constexpr int P = 32 / R;
  const int lane = threadIdx.x & 31, sub = lane / R, v = lane % R;
  const int W = gridDim.x * (blockDim.x >> 5);
  for (int c = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); c < num_chunks; c += W) {
    const int lo = cptr[c], hi = cptr[c + 1];
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int e = lo; e < hi; e += U * P) {
      int s[U];
#pragma unroll
      for (int u = 0; u < U; ++u) s[u] = ld_idx(e + u * P + sub < hi, idx + e + u * P + sub);
      float4 g[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        g[u] = ld_row(e + u * P + sub < hi, table + static_cast<int64_t>(s[u]) * R + v);
#pragma unroll
      for (int u = 0; u < U; ++u) add4(acc, g[u]);
    }
    if (P == 2) {
      acc.x += __shfl_xor_sync(0xffffffffu, acc.x, 16);
      acc.y += __shfl_xor_sync(0xffffffffu, acc.y, 16);
      acc.z += __shfl_xor_sync(0xffffffffu, acc.z, 16);
      acc.w += __shfl_xor_sync(0xffffffffu, acc.w, 16);
    }
    if (sub == 0) out[static_cast<int64_t>(c) * R + v] = acc;
  }
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bar)) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}

__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, uint32_t bytes,
                                         uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}

// S stages of one 512-byte row per warp, refilled in batches of B = S / 2:
// lane b < B issues the copy of the batch's entry b (its index loaded one
// batch ahead), so that the index load's latency is not paid per entry.
template <int S>
__global__ void __launch_bounds__(128) tma_kernel(const int* __restrict__ cptr,
                                                  const int* __restrict__ idx,
                                                  const int* __restrict__ wptr,
                                                  const float4* __restrict__ table,
                                                  float4* __restrict__ out) {
  constexpr int R = 32, B = S / 2, kRowBytes = R * 16;
  static_assert(B >= 1 && B <= 32, "batch within a warp");
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5, wpb = blockDim.x >> 5;
  float4* buf = reinterpret_cast<float4*>(smem) + static_cast<size_t>(wib) * S * R;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + static_cast<size_t>(wpb) * S * kRowBytes) +
                   wib * S;
  if (lane < S) mbar_init(bars + lane);
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncwarp();
  const int w = blockIdx.x * wpb + wib;
  const int c_lo = wptr[w], c_hi = wptr[w + 1];
  if (c_lo >= c_hi) return;
  const int e_lo = cptr[c_lo], e_hi = cptr[c_hi];
  int p = e_lo;  // first entry of the next batch to issue
  int nxt = ld_idx(lane < B && p + lane < e_hi, idx + p + lane);
  auto issue_batch = [&](int first) {
    const int s = nxt;
    const bool mine = lane < B && p + lane < e_hi;
    nxt = ld_idx(lane < B && p + B + lane < e_hi, idx + p + B + lane);
    if (mine) {
      uint64_t* bar = bars + first + lane;
      mbar_expect_tx(bar, kRowBytes);
      bulk_g2s(buf + (first + lane) * R, table + static_cast<int64_t>(s) * R, kRowBytes, bar);
    }
    p += B;
  };
#pragma unroll
  for (int b = 0; b < S / B; ++b) issue_batch(b * B);
  int c = c_lo, c_end = cptr[c + 1];
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int q = e_lo, t = 0; q < e_hi; ++q, ++t) {
    const int st = t % S;
    mbar_wait(bars + st, (t / S) & 1);
    add4(acc, buf[st * R + lane]);
    if (q + 1 == c_end) {
      out[static_cast<int64_t>(c) * R + lane] = acc;
      acc = make_float4(0.f, 0.f, 0.f, 0.f);
      ++c;
      if (c < c_hi) c_end = cptr[c + 1];
    }
    if (st % B == B - 1) {  // a batch of stages read by every lane: refill it
      __syncwarp();
      issue_batch(st - (B - 1));
    }
  }
}

}  // namespace

// kind 0: ldg (param = U, R = 32 or 16, bps = blocks per SM it is built
// for); kind 1: tma (param = S, R = 32). Returns cudaGetLastError() after
// the launch, -1 for a configuration not built.
extern "C" int gather_ceiling_launch(int kind, int param, int R, int bps, int blocks,
                                     const int* cptr,
                                     const int* idx, const int* wptr, const void* table,
                                     void* out, int num_chunks, void* stream) {
  const auto st = static_cast<cudaStream_t>(stream);
  const auto* t = static_cast<const float4*>(table);
  auto* o = static_cast<float4*>(out);
  if (kind == 0) {
#define PMA_LDG(U_, R_, B_)                                                      \
  if (param == U_ && R == R_ && bps == B_) {                                     \
    ldg_kernel<U_, R_, B_><<<blocks, 128, 0, st>>>(cptr, idx, t, o, num_chunks); \
    return static_cast<int>(cudaGetLastError());                                 \
  }
    PMA_LDG(4, 32, 4) PMA_LDG(4, 32, 8) PMA_LDG(4, 32, 16) PMA_LDG(8, 32, 4) PMA_LDG(8, 32, 8)
    PMA_LDG(16, 32, 4) PMA_LDG(4, 16, 8) PMA_LDG(4, 16, 16) PMA_LDG(8, 16, 4) PMA_LDG(8, 16, 8)
    PMA_LDG(16, 16, 4)
#undef PMA_LDG
  } else if (kind == 1 && R == 32) {
#define PMA_TMA(S_)                                                                          \
  if (param == S_) {                                                                         \
    const int smem = 4 * (S_ * 512 + S_ * 8);                                                \
    cudaFuncSetAttribute(tma_kernel<S_>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem); \
    tma_kernel<S_><<<blocks, 128, smem, st>>>(cptr, idx, wptr, t, o);                        \
    return static_cast<int>(cudaGetLastError());                                             \
  }
    PMA_TMA(8) PMA_TMA(16) PMA_TMA(32)
#undef PMA_TMA
  }
  return -1;
}
