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
#include "softmax_vec.h"

namespace ditmem {
namespace {

constexpr int64_t kTargetRows = 256;     // query rows (tokens x group heads) per item
constexpr int64_t kTargetCols = 512;     // key rows per softmax tile
constexpr int64_t kMinDirectBlock = 64;  // smaller float blocks are staged, see segments()

struct Item {
  int64_t b, kvh, q0, tokens;
  double cost;
};

struct Geometry {
  int64_t heads, kv_heads, group, dim, block_size, blocks_per_tile, max_blocks;
  int64_t k_block_stride, v_block_stride;  // elements between consecutive blocks
  double scale;
  bool direct;  // read float blocks in place (else stage each tile as dense fp32)
};

struct Segment {
  const float* p;
  int64_t ld, rows, col;  // row stride, rows, first column in the score tile
};

struct Scratch {
  std::vector<float> q, o, s, m, l, kv;
  std::vector<Segment> seg;
  Scratch(const Geometry& g, int64_t rows)
      : q(rows * g.dim), o(rows * g.dim), s(rows * g.blocks_per_tile * g.block_size), m(rows),
        l(rows), kv(g.direct ? 0 : 2 * g.blocks_per_tile * g.block_size * g.dim),
        seg(g.blocks_per_tile) {}
};

// Online-softmax update of rows [0, M) with n new scores each (row stride ld), one body
// compiled per instruction set (softmax_vec.h); softmax_update picks it at run time.
#define DITMEM_SOFTMAX_UPDATE(NS, TARGET)                                                 \
  TARGET static void softmax_update_##NS(Scratch& w, int64_t M, int64_t n, int64_t ld,    \
                                         int64_t dim) {                                   \
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();                    \
    for (int64_t r = 0; r < M; ++r) {                                                     \
      float* s = w.s.data() + r * ld;                                                     \
      const float mx = NS::row_max(s, n, w.m[r]);                                         \
      const float sum = NS::exp_sub_sum(s, n, mx);                                        \
      const float alpha = w.m[r] == kNegInf ? 0.f : exp_scalar(w.m[r] - mx);              \
      w.l[r] = w.l[r] * alpha + sum;                                                      \
      w.m[r] = mx;                                                                        \
      if (alpha != 1.f) NS::scale_row(w.o.data() + r * dim, dim, alpha);                 \
    }                                                                                     \
  }

DITMEM_SOFTMAX_UPDATE(scalar, )
#if defined(DITMEM_X86)
DITMEM_SOFTMAX_UPDATE(avx2, DITMEM_AVX2)
DITMEM_SOFTMAX_UPDATE(avx512, DITMEM_AVX512)
#endif

static void softmax_update(Scratch& w, int64_t M, int64_t n, int64_t ld, int64_t dim) {
#if defined(DITMEM_X86)
  switch (cpu_isa()) {
    case Isa::kAvx512: return softmax_update_avx512(w, M, n, ld, dim);
    case Isa::kAvx2: return softmax_update_avx2(w, M, n, ld, dim);
    case Isa::kScalar: break;
  }
#endif
  softmax_update_scalar(w, M, n, ld, dim);
}

// The n key (or value) rows of one tile for kv head kvh, as fp32 matrices for BLAS: one
// segment per block read straight from a float cache (row stride kv_heads * dim), or, for
// other dtypes and small blocks, the whole tile staged into buf as one dense segment.
template <typename T>
static int64_t segments(const Geometry& g, const T* cache, int64_t block_stride,
                        const int64_t* blocks, int64_t kvh, int64_t n, float* buf,
                        Segment* seg) {
  const int64_t D = g.dim, row_stride = g.kv_heads * D;
  const int64_t nblk = (n + g.block_size - 1) / g.block_size;
  if constexpr (std::is_same_v<T, float>) {
    if (g.direct) {
      for (int64_t j = 0; j < nblk; ++j)
        seg[j] = {cache + blocks[j] * block_stride + kvh * D, row_stride,
                  std::min(g.block_size, n - j * g.block_size), j * g.block_size};
      return nblk;
    }
  }
  for (int64_t j = 0; j < nblk; ++j) {
    const T* src = cache + blocks[j] * block_stride + kvh * D;
    float* dst = buf + j * g.block_size * D;
    const int64_t rows = std::min(g.block_size, n - j * g.block_size);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t d = 0; d < D; ++d) dst[r * D + d] = (float)src[r * row_stride + d];
  }
  seg[0] = {buf, D, n, 0};
  return 1;
}

template <typename T>
static void run_item(const Item& it, const Geometry& g, const T* q, const T* k, const T* v,
                     const int64_t* cu, const int64_t* table, const int64_t* lens, T* out,
                     Scratch& w) {
  const int64_t D = g.dim, M = it.tokens * g.group, kv_len = lens[it.b];
  const int64_t cols = g.blocks_per_tile * g.block_size;
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
  for (int64_t c0 = 0; c0 < kv_len; c0 += cols) {
    const int64_t n = std::min(cols, kv_len - c0), first = c0 / g.block_size;
    const int64_t nk = segments(g, k, g.k_block_stride, row_table + first, it.kvh, n,
                                w.kv.data(), w.seg.data());
    for (int64_t j = 0; j < nk; ++j) {  // S[:, segment columns] = Q K_seg^T
      const Segment& sg = w.seg[j];
      gemm_abt(M, sg.rows, D, w.q.data(), D, sg.p, sg.ld, w.s.data() + sg.col, cols);
    }
    softmax_update(w, M, n, cols, D);
    const int64_t nv = segments(g, v, g.v_block_stride, row_table + first, it.kvh, n,
                                w.kv.data() + cols * D, w.seg.data());
    for (int64_t j = 0; j < nv; ++j) {  // O += P[:, segment columns] V_seg
      const Segment& sg = w.seg[j];
      gemm_ab_acc(M, D, sg.rows, w.s.data() + sg.col, cols, sg.p, sg.ld, w.o.data(), D);
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
  g.direct = q.scalar_type() == at::kFloat && g.block_size >= kMinDirectBlock;

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
      Scratch w(g, rows);
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
