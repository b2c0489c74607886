// CPU paged attention: ragged, non-causal, GQA, K/V read through a block table.
//
// Work item = (request, kv head, tile of query tokens). The item's queries for all heads
// of the kv head's group form an [M = tokens * group, D] fp32 matrix (pre-scaled). Keys are
// visited in tiles of whole blocks (~512 rows); per tile: S = Q K^T with BLAS (one call per
// block, straight from the cache: a block's rows for one kv head are a strided matrix),
// an online-softmax update in fp32, then O += P V. fp16/bf16 blocks are converted into a
// small fp32 scratch first. Items run on all threads from a shared queue, largest first.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "blas.h"

namespace ditmem {
namespace {

constexpr int64_t kTargetRows = 256;  // query rows (tokens x group heads) per item
constexpr int64_t kTargetCols = 512;  // key rows per softmax tile

// exp(x) for x <= 0 (softmax arguments); ~1e-7 relative error; vectorizes under omp simd.
#pragma omp declare simd
static inline float exp_nonpos(float x) {
  x = std::max(x, -87.0f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = (x - n * 0.693145751953125f) - n * 1.42860682030941723212e-6f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t bits = ((int32_t)n + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

struct Item {
  int64_t b, kvh, q0, tokens;
  double cost;
};

struct Geometry {
  int64_t heads, kv_heads, group, dim, block_size, blocks_per_tile, max_blocks;
  int64_t k_block_stride, v_block_stride;  // elements between consecutive blocks
  double scale;
};

struct Scratch {
  std::vector<float> q, o, s, m, l, kv;
  Scratch(int64_t rows, int64_t cols, int64_t dim, bool convert)
      : q(rows * dim), o(rows * dim), s(rows * cols), m(rows), l(rows),
        kv(convert ? 2 * cols * dim : 0) {}
};

// Online-softmax update of rows [0, M) with n new scores each (row stride ld).
static void softmax_update(Scratch& w, int64_t M, int64_t n, int64_t ld, int64_t dim) {
  for (int64_t r = 0; r < M; ++r) {
    float* s = w.s.data() + r * ld;
    float mx = w.m[r];
    for (int64_t j = 0; j < n; ++j) mx = std::max(mx, s[j]);
    float sum = 0.f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < n; ++j) {
      s[j] = exp_nonpos(s[j] - mx);
      sum += s[j];
    }
    const float alpha = (w.m[r] == -std::numeric_limits<float>::infinity())
                            ? 0.f
                            : exp_nonpos(w.m[r] - mx);
    w.l[r] = w.l[r] * alpha + sum;
    w.m[r] = mx;
    if (alpha != 1.f) {
      float* o = w.o.data() + r * dim;
#pragma omp simd
      for (int64_t d = 0; d < dim; ++d) o[d] *= alpha;
    }
  }
}

template <typename T>
static void run_item(const Item& it, const Geometry& g, const T* q, const T* k, const T* v,
                     const int64_t* cu, const int64_t* table, const int64_t* lens, T* out,
                     Scratch& w) {
  const int64_t D = g.dim, M = it.tokens * g.group, kv_len = lens[it.b];
  const int64_t cols = g.blocks_per_tile * g.block_size;
  const int64_t row_stride = g.kv_heads * D;  // between rows of one block, one kv head
  auto q_row = [&](int64_t t, int64_t gi) {
    return (cu[it.b] + it.q0 + t) * g.heads * D + (it.kvh * g.group + gi) * D;
  };
  if (kv_len == 0) {
    for (int64_t t = 0; t < it.tokens; ++t)
      for (int64_t gi = 0; gi < g.group; ++gi) std::fill_n(out + q_row(t, gi), D, T(0));
    return;
  }
  const float scale = (float)g.scale;
  for (int64_t t = 0; t < it.tokens; ++t)
    for (int64_t gi = 0; gi < g.group; ++gi) {
      const T* src = q + q_row(t, gi);
      float* dst = w.q.data() + (t * g.group + gi) * D;
      for (int64_t d = 0; d < D; ++d) dst[d] = (float)src[d] * scale;
    }
  std::fill_n(w.o.data(), M * D, 0.f);
  std::fill_n(w.m.data(), M, -std::numeric_limits<float>::infinity());
  std::fill_n(w.l.data(), M, 0.f);
  const int64_t* row_table = table + it.b * g.max_blocks;
  constexpr bool direct = std::is_same_v<T, float>;
  for (int64_t c0 = 0; c0 < kv_len; c0 += cols) {
    const int64_t n = std::min(cols, kv_len - c0);
    const int64_t first = c0 / g.block_size, nblk = (n + g.block_size - 1) / g.block_size;
    // S[:, j-th block columns] = Q K_j^T
    for (int64_t j = 0; j < nblk; ++j) {
      const int64_t rows = std::min(g.block_size, n - j * g.block_size);
      const T* kb = k + row_table[first + j] * g.k_block_stride + it.kvh * D;
      const float* kp;
      int64_t ld;
      if constexpr (direct) {
        kp = kb, ld = row_stride;
      } else {
        float* buf = w.kv.data() + j * g.block_size * D;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t d = 0; d < D; ++d) buf[r * D + d] = (float)kb[r * row_stride + d];
        kp = buf, ld = D;
      }
      gemm_abt(M, rows, D, w.q.data(), D, kp, ld, w.s.data() + j * g.block_size, cols);
    }
    softmax_update(w, M, n, cols, D);
    // O += P[:, j-th block columns] V_j
    for (int64_t j = 0; j < nblk; ++j) {
      const int64_t rows = std::min(g.block_size, n - j * g.block_size);
      const T* vb = v + row_table[first + j] * g.v_block_stride + it.kvh * D;
      const float* vp;
      int64_t ld;
      if constexpr (direct) {
        vp = vb, ld = row_stride;
      } else {
        float* buf = w.kv.data() + (cols + j * g.block_size) * D;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t d = 0; d < D; ++d) buf[r * D + d] = (float)vb[r * row_stride + d];
        vp = buf, ld = D;
      }
      gemm_ab_acc(M, D, rows, w.s.data() + j * g.block_size, cols, vp, ld, w.o.data(), D);
    }
  }
  for (int64_t t = 0; t < it.tokens; ++t)
    for (int64_t gi = 0; gi < g.group; ++gi) {
      const int64_t r = t * g.group + gi;
      const float inv = 1.f / w.l[r];
      const float* src = w.o.data() + r * D;
      T* dst = out + q_row(t, gi);
      for (int64_t d = 0; d < D; ++d) dst[d] = (T)(src[d] * inv);
    }
}

static void check_cache(const at::Tensor& c, const char* name) {
  TORCH_CHECK(c.dim() == 4 && c.stride(3) == 1 && c.stride(2) == c.size(3) &&
                  c.stride(1) == c.size(2) * c.size(3),
              name, " must be [num_blocks, block_size, kv_heads, head_dim] with contiguous "
              "blocks (any block stride)");
}

at::Tensor paged_attention_cpu(const at::Tensor& q_in, const at::Tensor& k_in,
                               const at::Tensor& v_in, const at::Tensor& cu_seqlens_q,
                               const at::Tensor& block_table, const at::Tensor& kv_lens,
                               double scale) {
  TORCH_CHECK(q_in.dim() == 3, "q must be [total_q, heads, head_dim]");
  TORCH_CHECK(k_in.scalar_type() == q_in.scalar_type() && v_in.scalar_type() == q_in.scalar_type(),
              "q, k_cache and v_cache must share a dtype");
  const at::Tensor q = q_in.contiguous();
  check_cache(k_in, "k_cache");
  check_cache(v_in, "v_cache");
  const at::Tensor cu = cu_seqlens_q.to(at::kLong).contiguous();
  const at::Tensor table = block_table.to(at::kLong).contiguous();
  const at::Tensor lens = kv_lens.to(at::kLong).contiguous();
  at::Tensor out = at::empty_like(q);

  Geometry g;
  g.heads = q.size(1);
  g.dim = q.size(2);
  g.kv_heads = k_in.size(2);
  TORCH_CHECK(g.heads % g.kv_heads == 0, "num_heads must be a multiple of num_kv_heads");
  g.group = g.heads / g.kv_heads;
  g.block_size = k_in.size(1);
  g.blocks_per_tile = std::max<int64_t>(1, kTargetCols / g.block_size);
  g.max_blocks = table.size(1);
  g.k_block_stride = k_in.stride(0);
  g.v_block_stride = v_in.stride(0);
  g.scale = scale;

  const int64_t batch = lens.size(0);
  const int64_t* cu_p = cu.data_ptr<int64_t>();
  const int64_t* lens_p = lens.data_ptr<int64_t>();
  const int64_t tile_tokens = std::max<int64_t>(1, kTargetRows / g.group);
  std::vector<Item> items;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t nq = cu_p[b + 1] - cu_p[b];
    for (int64_t kvh = 0; kvh < g.kv_heads; ++kvh)
      for (int64_t q0 = 0; q0 < nq; q0 += tile_tokens) {
        const int64_t tokens = std::min(tile_tokens, nq - q0);
        items.push_back({b, kvh, q0, tokens, (double)tokens * (double)(lens_p[b] + 16)});
      }
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.cost > b.cost; });
  const int64_t rows = tile_tokens * g.group;
  const int64_t cols = g.blocks_per_tile * g.block_size;
  std::atomic<int64_t> next{0};
  const int64_t n_items = (int64_t)items.size();
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), n_items));

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "paged_attention",
                                  [&] {
    const scalar_t* qp = q.data_ptr<scalar_t>();
    const scalar_t* kp = k_in.data_ptr<scalar_t>();
    const scalar_t* vp = v_in.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
      Scratch w(rows, cols, g.dim, !std::is_same_v<scalar_t, float>);
      for (int64_t i = next++; i < n_items; i = next++)
        run_item<scalar_t>(items[i], g, qp, kp, vp, cu_p, table.data_ptr<int64_t>(), lens_p,
                           op, w);
    });
  });
  return out;
}

}  // namespace
}  // namespace ditmem

TORCH_LIBRARY_IMPL(ditmem, CPU, m) { m.impl("paged_attention", &ditmem::paged_attention_cpu); }
