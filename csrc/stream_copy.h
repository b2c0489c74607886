// memcpy with non-temporal (streaming) stores for large copies: the destination lines are
// written without being read first (no read-for-ownership), so a bandwidth-bound copy moves
// 2 bytes of DRAM traffic per byte instead of 3, and does not evict the caches. Used for
// block copies whose total size exceeds the caches (offload/restore of pages).
#pragma once
#include <cstdint>
#include <cstring>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace ditmem {

inline void stream_copy(char* dst, const char* src, int64_t n) {
#if defined(__AVX512F__)
  constexpr int64_t kAlign = 64;
#elif defined(__AVX2__)
  constexpr int64_t kAlign = 32;
#else
  constexpr int64_t kAlign = 0;
#endif
  if constexpr (kAlign == 0) {
    std::memcpy(dst, src, n);
    return;
  }
#if defined(__AVX512F__) || defined(__AVX2__)
  const int64_t head = std::min<int64_t>(n, (kAlign - (int64_t)((uintptr_t)dst % kAlign)) % kAlign);
  std::memcpy(dst, src, head);
  dst += head, src += head, n -= head;
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 256 <= n; i += 256) {
    const __m512i a = _mm512_loadu_si512(src + i), b = _mm512_loadu_si512(src + i + 64);
    const __m512i c = _mm512_loadu_si512(src + i + 128), d = _mm512_loadu_si512(src + i + 192);
    _mm512_stream_si512((__m512i*)(dst + i), a);
    _mm512_stream_si512((__m512i*)(dst + i + 64), b);
    _mm512_stream_si512((__m512i*)(dst + i + 128), c);
    _mm512_stream_si512((__m512i*)(dst + i + 192), d);
  }
#else
  for (; i + 128 <= n; i += 128) {
    const __m256i a = _mm256_loadu_si256((const __m256i*)(src + i));
    const __m256i b = _mm256_loadu_si256((const __m256i*)(src + i + 32));
    const __m256i c = _mm256_loadu_si256((const __m256i*)(src + i + 64));
    const __m256i d = _mm256_loadu_si256((const __m256i*)(src + i + 96));
    _mm256_stream_si256((__m256i*)(dst + i), a);
    _mm256_stream_si256((__m256i*)(dst + i + 32), b);
    _mm256_stream_si256((__m256i*)(dst + i + 64), c);
    _mm256_stream_si256((__m256i*)(dst + i + 96), d);
  }
#endif
  std::memcpy(dst + i, src + i, n - i);
  _mm_sfence();  // order the streaming stores before anything that follows
#endif
}

}  // namespace ditmem
