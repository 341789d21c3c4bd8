// The rank-order sum's element loops on the CPU (zipccl_fsdp/_reduce.py owns
// the reduction and says when these run; its torch ops are the reference
// these must match bit for bit):
//   zipccl_sum_add:     acc[i] = widen(src[i]) (first) or acc[i] + widen(src[i]),
//                       and whether any acc[i] is now NaN, in the same pass;
//   zipccl_sum_to_bf16: out[i] = acc[i] rounded to bf16 (nearest, ties to even),
//                       every NaN written as the canonical 0x7FC0.
// Why here: torch widens bf16 into a temporary before it adds, and a NaN
// test of its own would be one more pass over the fp32 sum once it has left
// the cache; one pass that widens, adds and tests reads each element once.
// Plain IEEE fp32 adds (no fast-math, no FMA: nothing to contract), so each
// result is the one torch's add_ returns; a NaN's payload may differ, and the
// reduction makes every NaN canonical afterwards anyway.
// Built into the same library as codec.cpp (codec_cpp.py); the AVX2 loops
// carry their own target attribute and run when the caller passes isa >= 1.

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define ZIPCCL_REDUCE_AVX2 1
#endif

namespace zipccl_reduce {

constexpr int64_t kBlock = 1 << 16;  // elements a thread takes at a time

static inline float widen_bf16(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

static inline uint16_t bf16_of(float f) {
  if (f != f) return 0x7FC0;
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

template <bool BF16>
static bool add_generic(float* acc, const void* src, int64_t n, bool first) {
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    float x = BF16 ? widen_bf16(static_cast<const uint16_t*>(src)[i])
                   : static_cast<const float*>(src)[i];
    float s = first ? x : acc[i] + x;
    acc[i] = s;
    nan |= s != s;
  }
  return nan;
}

static void to_bf16_generic(uint16_t* out, const float* acc, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_of(acc[i]);
}

#ifdef ZIPCCL_REDUCE_AVX2
template <bool BF16>
__attribute__((target("avx2"))) static bool add_avx2(float* acc, const void* src, int64_t n,
                                                     bool first) {
  __m256 seen = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x;
    if (BF16) {
      __m128i h = _mm_loadu_si128(
          reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(src) + i));
      x = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
      x = _mm256_loadu_ps(static_cast<const float*>(src) + i);
    }
    __m256 s = first ? x : _mm256_add_ps(_mm256_loadu_ps(acc + i), x);
    _mm256_storeu_ps(acc + i, s);
    seen = _mm256_or_ps(seen, _mm256_cmp_ps(s, s, _CMP_UNORD_Q));
  }
  bool nan = _mm256_movemask_ps(seen) != 0;
  const void* tail = BF16 ? static_cast<const void*>(static_cast<const uint16_t*>(src) + i)
                          : static_cast<const void*>(static_cast<const float*>(src) + i);
  return add_generic<BF16>(acc + i, tail, n - i, first) || nan;
}

__attribute__((target("avx2"))) static void to_bf16_avx2(uint16_t* out, const float* acc,
                                                         int64_t n) {
  const __m256i bias = _mm256_set1_epi32(0x7FFF), one = _mm256_set1_epi32(1);
  const __m256i qnan = _mm256_set1_epi32(0x7FC0);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 f = _mm256_loadu_ps(acc + i);
    __m256i u = _mm256_castps_si256(f);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, bias), odd), 16);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
    r = _mm256_blendv_epi8(r, qnan, nan);
    __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), packed);
  }
  to_bf16_generic(out + i, acc + i, n - i);
}
#endif

static bool add_block(float* acc, const void* src, bool bf16, int64_t n, bool first,
                      int64_t isa) {
#ifdef ZIPCCL_REDUCE_AVX2
  if (isa >= 1)
    return bf16 ? add_avx2<true>(acc, src, n, first) : add_avx2<false>(acc, src, n, first);
#endif
  (void)isa;
  return bf16 ? add_generic<true>(acc, src, n, first) : add_generic<false>(acc, src, n, first);
}

static void to_bf16_block(uint16_t* out, const float* acc, int64_t n, int64_t isa) {
#ifdef ZIPCCL_REDUCE_AVX2
  if (isa >= 1) return to_bf16_avx2(out, acc, n);
#endif
  (void)isa;
  to_bf16_generic(out, acc, n);
}

static const void* at(const void* src, bool bf16, int64_t i) {
  return bf16 ? static_cast<const void*>(static_cast<const uint16_t*>(src) + i)
                       : static_cast<const void*>(static_cast<const float*>(src) + i);
}

}  // namespace zipccl_reduce

extern "C" {

// acc[i] = widen(src[i]) when first, else acc[i] + widen(src[i]), for i < n;
// src is bf16 (src_bf16 = 1) or fp32 (0). Returns 1 when some acc[i] is NaN after
// the call, 0 when none is, -1 on bad arguments.
int64_t zipccl_sum_add(float* acc, const void* src, int64_t src_bf16, int64_t n, int64_t first,
                       int64_t nthreads, int64_t isa) {
  using namespace zipccl_reduce;
  if (n < 0 || nthreads < 1 || isa < 0 || (src_bf16 != 0 && src_bf16 != 1)) return -1;
  const bool bf16 = src_bf16 == 1;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  int nan = 0;
#pragma omp parallel for schedule(static) num_threads(nthreads) reduction(| : nan) if (blocks > 1 && nthreads > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t lo = b * kBlock, len = (n - lo < kBlock) ? n - lo : kBlock;
    nan |= add_block(acc + lo, at(src, bf16, lo), bf16, len, first != 0, isa) ? 1 : 0;
  }
  return nan;
}

// out[i] = acc[i] rounded to bf16, nearest with ties to even, every NaN 0x7FC0.
// Returns 0, -1 on bad arguments.
int64_t zipccl_sum_to_bf16(uint16_t* out, const float* acc, int64_t n, int64_t nthreads,
                           int64_t isa) {
  using namespace zipccl_reduce;
  if (n < 0 || nthreads < 1 || isa < 0) return -1;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (blocks > 1 && nthreads > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t lo = b * kBlock, len = (n - lo < kBlock) ? n - lo : kBlock;
    to_bf16_block(out + lo, acc + lo, len, isa);
  }
  return 0;
}

}  // extern "C"
