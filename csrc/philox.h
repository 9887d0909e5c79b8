// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC'11), host and device, for the dropout masks of the fused GAT
// attention: the mask of element (e, h) is a pure function of (seed, offset,
// e, h), so the backward regenerates it instead of storing it, and the CPU and
// CUDA kernels (and the Python reference in tests/gat_reference.py) draw the
// same mask. See docs/gat_attention.md, "Dropout mask", for the exact mapping.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define PHILOX_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define PHILOX_HOST_DEVICE inline
#endif

namespace pyg_multihead_agg {

struct Philox4 {
  uint32_t v[4];
};

PHILOX_HOST_DEVICE uint32_t philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi) {
#if defined(__CUDA_ARCH__)
  hi = __umulhi(a, b);
  return a * b;
#else
  const uint64_t p = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
#endif
}

// Ten rounds, key bumped between rounds (Random123's philox4x32_R(10, ...)).
PHILOX_HOST_DEVICE Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                      uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
#pragma unroll
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    uint32_t hi0, hi1;
    const uint32_t lo0 = philox_mulhilo(kM0, c0, hi0);
    const uint32_t lo1 = philox_mulhilo(kM1, c2, hi1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// Dropout of attention element (edge e, head h):
//   counter = (lo32(e), hi32(e), lo32(offset + h / 4), hi32(offset + h / 4))
//   key     = (lo32(seed), hi32(seed))
//   r       = philox4x32_10(counter, key)[h % 4]
//   kept    = r >= threshold,   threshold = floor(p * 2^32) (2^32 when p >= 1)
// (seed and offset are the two int64 values of the op's `philox` tensor:
// copied into `seed` and `offset` from a CPU tensor, or read by the kernels
// through `key` from a tensor on the GPU, which a CUDA graph's replays
// refill; docs/gat_attention.md, "Dropout mask".)
struct DropoutRng {
  uint64_t seed = 0, offset = 0, threshold = 0;  // threshold 0: keep everything
  const int64_t* key = nullptr;                  // device [seed, offset], or null

  PHILOX_HOST_DEVICE void load_key(uint64_t& s, uint64_t& o) const {
    if (key == nullptr) {
      s = seed;
      o = offset;
      return;
    }
#if defined(__CUDA_ARCH__)
    s = static_cast<uint64_t>(__ldg(reinterpret_cast<const long long*>(key)));
    o = static_cast<uint64_t>(__ldg(reinterpret_cast<const long long*>(key) + 1));
#else
    s = static_cast<uint64_t>(key[0]);
    o = static_cast<uint64_t>(key[1]);
#endif
  }

  PHILOX_HOST_DEVICE bool keep(int64_t e, int64_t h) const {
    if (threshold == 0) return true;
    uint64_t s, o;
    load_key(s, o);
    const uint64_t ue = static_cast<uint64_t>(e);
    const uint64_t c = o + static_cast<uint64_t>(h >> 2);
    const Philox4 r = philox4x32_10(static_cast<uint32_t>(ue), static_cast<uint32_t>(ue >> 32),
                                    static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32),
                                    static_cast<uint32_t>(s), static_cast<uint32_t>(s >> 32));
    return static_cast<uint64_t>(r.v[h & 3]) >= threshold;
  }

  // keep(e, 4 * h4 + t) as bit t, t < 4, from one Philox call: a caller that
  // walks the heads of an edge in order draws once per four heads.
  PHILOX_HOST_DEVICE unsigned keep4(int64_t e, int64_t h4) const {
    if (threshold == 0) return 0xFu;
    uint64_t s, o;
    load_key(s, o);
    const uint64_t ue = static_cast<uint64_t>(e);
    const uint64_t c = o + static_cast<uint64_t>(h4);
    const Philox4 r = philox4x32_10(static_cast<uint32_t>(ue), static_cast<uint32_t>(ue >> 32),
                                    static_cast<uint32_t>(c), static_cast<uint32_t>(c >> 32),
                                    static_cast<uint32_t>(s), static_cast<uint32_t>(s >> 32));
    unsigned bits = 0;
    for (int t = 0; t < 4; ++t)
      bits |= static_cast<unsigned>(static_cast<uint64_t>(r.v[t]) >= threshold) << t;
    return bits;
  }
};

// threshold for dropout probability p in [0, 1].
inline uint64_t dropout_threshold(double p) {
  if (!(p > 0.0)) return 0;
  if (p >= 1.0) return uint64_t(1) << 32;
  return static_cast<uint64_t>(p * 4294967296.0);
}

}  // namespace pyg_multihead_agg

#undef PHILOX_HOST_DEVICE
