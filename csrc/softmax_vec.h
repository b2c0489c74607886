// Vectorized pieces of the online softmax: row max, in-place exp(x - max) with its sum,
// and row scaling. AVX-512 and AVX2 (+FMA) paths, a scalar path otherwise. exp uses a
// degree-6 polynomial after range reduction (relative error ~1e-7 for the x <= 0 softmax
// arguments).
//
// The build is portable (no -march): each path lives in its own namespace (avx512, avx2,
// scalar) compiled for its instruction set with target attributes, and the caller picks
// one at run time from the CPU it runs on (cpu_isa()).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#if defined(__x86_64__) || defined(__i386__)
#define DITMEM_X86 1
#include <immintrin.h>
#define DITMEM_AVX512 __attribute__((target("avx512f")))
#define DITMEM_AVX2 __attribute__((target("avx2,fma")))
#endif

namespace ditmem {

constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693145751953125f,
                kLn2Lo = 1.42860682030941723212e-6f, kExpMin = -87.0f;

inline float exp_scalar(float x) {
  x = std::max(x, kExpMin);
  const float n = std::nearbyint(x * kLog2e);
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return std::ldexp(p, (int)n);
}

enum class Isa { kScalar, kAvx2, kAvx512 };

// The widest softmax path this CPU runs, decided once; DITMEM_CPU_ISA=scalar|avx2 caps it
// (tests run every path the machine has).
inline Isa cpu_isa() {
#if defined(DITMEM_X86)
  static const Isa isa = [] {
    __builtin_cpu_init();
    Isa best = Isa::kScalar;
    if (__builtin_cpu_supports("avx512f")) best = Isa::kAvx512;
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = Isa::kAvx2;
    const char* cap = std::getenv("DITMEM_CPU_ISA");
    if (cap != nullptr && std::strcmp(cap, "scalar") == 0) return Isa::kScalar;
    if (cap != nullptr && std::strcmp(cap, "avx2") == 0 && best == Isa::kAvx512)
      return Isa::kAvx2;
    return best;
  }();
  return isa;
#else
  return Isa::kScalar;
#endif
}

#if defined(DITMEM_X86)
namespace avx512 {
DITMEM_AVX512 inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(kExpMin));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

DITMEM_AVX512 inline float row_max(const float* s, int64_t n, float init) {
  __m512 m = _mm512_set1_ps(init);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(s + j));
  if (j < n) m = _mm512_mask_max_ps(m, (__mmask16)((1u << (n - j)) - 1), m,
                                    _mm512_maskz_loadu_ps((__mmask16)((1u << (n - j)) - 1), s + j));
  return _mm512_reduce_max_ps(m);
}

DITMEM_AVX512 inline float exp_sub_sum(float* s, int64_t n, float mx) {
  const __m512 vm = _mm512_set1_ps(mx);
  __m512 acc = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + j), vm));
    _mm512_storeu_ps(s + j, e);
    acc = _mm512_add_ps(acc, e);
  }
  if (j < n) {
    const __mmask16 k = (__mmask16)((1u << (n - j)) - 1);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), vm));
    _mm512_mask_storeu_ps(s + j, k, e);
    acc = _mm512_mask_add_ps(acc, k, acc, e);
  }
  return _mm512_reduce_add_ps(acc);
}

DITMEM_AVX512 inline void scale_row(float* o, int64_t n, float a) {
  const __m512 va = _mm512_set1_ps(a);
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) _mm512_storeu_ps(o + j, _mm512_mul_ps(_mm512_loadu_ps(o + j), va));
  for (; j < n; ++j) o[j] *= a;
}
}  // namespace avx512

namespace avx2 {
DITMEM_AVX2 inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(kExpMin));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(
      _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

DITMEM_AVX2 inline float row_max(const float* s, int64_t n, float init) {
  __m256 m = _mm256_set1_ps(init);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(s + j));
  float lanes[8];
  _mm256_storeu_ps(lanes, m);
  float r = *std::max_element(lanes, lanes + 8);
  for (; j < n; ++j) r = std::max(r, s[j]);
  return r;
}

DITMEM_AVX2 inline float exp_sub_sum(float* s, int64_t n, float mx) {
  const __m256 vm = _mm256_set1_ps(mx);
  __m256 acc = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
    _mm256_storeu_ps(s + j, e);
    acc = _mm256_add_ps(acc, e);
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, acc);
  float sum = 0.f;
  for (float x : lanes) sum += x;
  for (; j < n; ++j) sum += (s[j] = exp_scalar(s[j] - mx));
  return sum;
}

DITMEM_AVX2 inline void scale_row(float* o, int64_t n, float a) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(o + j, _mm256_mul_ps(_mm256_loadu_ps(o + j), va));
  for (; j < n; ++j) o[j] *= a;
}
}  // namespace avx2
#endif  // DITMEM_X86

namespace scalar {
inline float row_max(const float* s, int64_t n, float init) {
  for (int64_t j = 0; j < n; ++j) init = std::max(init, s[j]);
  return init;
}

inline float exp_sub_sum(float* s, int64_t n, float mx) {
  float sum = 0.f;
  for (int64_t j = 0; j < n; ++j) sum += (s[j] = exp_scalar(s[j] - mx));
  return sum;
}

inline void scale_row(float* o, int64_t n, float a) {
  for (int64_t j = 0; j < n; ++j) o[j] *= a;
}
}  // namespace scalar

}  // namespace ditmem
