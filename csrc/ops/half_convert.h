// float32 <-> float16 conversion for EPL's fp16 wire format.
//
// Uses the F16C instructions (8 values per instruction) when the CPU has them,
// checked at run time, and Eigen's scalar half type otherwise. Both round to
// nearest even, so results do not depend on which path ran.
#ifndef EPL_CSRC_OPS_HALF_CONVERT_H_
#define EPL_CSRC_OPS_HALF_CONVERT_H_

#include <cstdint>
#include <cstring>

// Eigen/Core, not TF's third_party/eigen3 wrapper: TF 2.21 no longer ships the wrapper.
#include "Eigen/Core"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace epl {
namespace half_convert {

inline uint16_t Bits(Eigen::half h) {
  uint16_t bits;
  std::memcpy(&bits, &h, sizeof(bits));
  return bits;
}

inline float Value(uint16_t bits) {
  Eigen::half h;
  std::memcpy(&h, &bits, sizeof(bits));
  return static_cast<float>(h);
}

#if defined(__x86_64__)
inline bool HasF16C() {
  static const bool has = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return has;
}

__attribute__((target("avx,f16c"))) inline int64_t ToHalfF16C(const float* src, uint16_t* dst,
                                                              int64_t n, float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(src + i), s), 0);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  return i;
}

__attribute__((target("avx,f16c"))) inline int64_t FromHalfF16C(const uint16_t* src, float* dst,
                                                                int64_t n, float scale,
                                                                bool add) {
  const __m256 s = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_mul_ps(
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))), s);
    if (add) v = _mm256_add_ps(v, _mm256_loadu_ps(dst + i));
    _mm256_storeu_ps(dst + i, v);
  }
  return i;
}
#endif

// dst[i] = half(src[i] * scale)
inline void ToHalf(const float* src, uint16_t* dst, int64_t n, float scale) {
  int64_t i = 0;
#if defined(__x86_64__)
  if (HasF16C()) i = ToHalfF16C(src, dst, n, scale);
#endif
  for (; i < n; ++i) dst[i] = Bits(Eigen::half(src[i] * scale));
}

inline void FromHalfImpl(const uint16_t* src, float* dst, int64_t n, float scale, bool add) {
  int64_t i = 0;
#if defined(__x86_64__)
  if (HasF16C()) i = FromHalfF16C(src, dst, n, scale, add);
#endif
  for (; i < n; ++i) dst[i] = (add ? dst[i] : 0.0f) + Value(src[i]) * scale;
}

// dst[i] = float(src[i]) * scale
inline void FromHalf(const uint16_t* src, float* dst, int64_t n, float scale) {
  FromHalfImpl(src, dst, n, scale, false);
}

// dst[i] += float(src[i]) * scale
inline void AddFromHalf(const uint16_t* src, float* dst, int64_t n, float scale) {
  FromHalfImpl(src, dst, n, scale, true);
}

}  // namespace half_convert
}  // namespace epl

#endif  // EPL_CSRC_OPS_HALF_CONVERT_H_
