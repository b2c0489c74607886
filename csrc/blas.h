// Row-major float GEMM helpers on top of the BLAS that libtorch_cpu exports (MKL's sgemm_
// on x86 wheels). The symbol is weak: where torch exports no sgemm_, a plain loop runs.
#pragma once
#include <cstdint>

extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n,
                       const int* k, const float* alpha, const float* a, const int* lda,
                       const float* b, const int* ldb, const float* beta, float* c,
                       const int* ldc) __attribute__((weak));

namespace ditmem {

inline bool have_blas() { return sgemm_ != nullptr; }

// C[M, N] (ldc) = A[M, K] (lda) @ B[N, K]^T (ldb)   -- all row-major.
inline void gemm_abt(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                     const float* B, int64_t ldb, float* C, int64_t ldc) {
  if (sgemm_) {
    // Column-major view: C^T[N, M] = B[N, K] (B^T stored) * A^T
    const int m = (int)N, n = (int)M, k = (int)K, la = (int)ldb, lb = (int)lda, lc = (int)ldc;
    const float one = 1.f, zero = 0.f;
    sgemm_("T", "N", &m, &n, &k, &one, B, &la, A, &lb, &zero, C, &lc);
    return;
  }
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      float acc = 0.f;
      for (int64_t p = 0; p < K; ++p) acc += A[i * lda + p] * B[j * ldb + p];
      C[i * ldc + j] = acc;
    }
}

// C[M, N] (ldc) += A[M, K] (lda) @ B[K, N] (ldb)   -- all row-major.
inline void gemm_ab_acc(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                        const float* B, int64_t ldb, float* C, int64_t ldc) {
  if (sgemm_) {
    const int m = (int)N, n = (int)M, k = (int)K, la = (int)ldb, lb = (int)lda, lc = (int)ldc;
    const float one = 1.f;
    sgemm_("N", "N", &m, &n, &k, &one, B, &la, A, &lb, &one, C, &lc);
    return;
  }
  for (int64_t i = 0; i < M; ++i)
    for (int64_t p = 0; p < K; ++p) {
      const float a = A[i * lda + p];
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] += a * B[p * ldb + j];
    }
}

}  // namespace ditmem
