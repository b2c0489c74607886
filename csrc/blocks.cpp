// CPU block ops: scatter rows into blocks, gather a request's rows, copy whole blocks.
// All three are parallel memcpy over byte ranges; a block may sit anywhere (block stride is
// free) but its rows must be contiguous.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstring>
#include <vector>

#include "stream_copy.h"

namespace ditmem {
namespace {

constexpr int64_t kChunkBytes = 1 << 20;      // copy granularity for big blocks
constexpr int64_t kStreamBytes = 16ll << 20;  // copies bigger than this bypass the caches

// Bytes of one block and whether each block's inside [block_size, *row] is contiguous.
static int64_t block_bytes(const at::Tensor& t, const char* name) {
  int64_t expected = 1;
  for (int64_t d = t.dim() - 1; d >= 1; --d) {
    TORCH_CHECK(t.size(d) == 1 || t.stride(d) == expected, name,
                ": each block must be contiguous (only the block stride may be free)");
    expected *= t.size(d);
  }
  return expected * (int64_t)t.element_size();
}

static char* block_ptr(const at::Tensor& t, int64_t block) {
  return static_cast<char*>(t.data_ptr()) + block * t.stride(0) * (int64_t)t.element_size();
}

void write_blocks_cpu(const at::Tensor& x_in, const at::Tensor& cache,
                      const at::Tensor& slot_mapping) {
  TORCH_CHECK(cache.dim() == x_in.dim() + 1, "cache must be [num_blocks, block_size, *row]");
  const at::Tensor x = x_in.to(cache.scalar_type()).contiguous();
  const at::Tensor slots = slot_mapping.to(at::kLong).contiguous();
  const int64_t block_size = cache.size(1);
  const int64_t row_bytes = block_bytes(cache, "cache") / std::max<int64_t>(block_size, 1);
  const int64_t x_row_bytes = x.numel() ? x.nbytes() / x.size(0) : 0;
  TORCH_CHECK(x.numel() == 0 || x_row_bytes == row_bytes, "x rows must match cache rows");
  const int64_t* s = slots.data_ptr<int64_t>();
  const char* src = static_cast<const char*>(x.data_ptr());
  const int64_t grain = std::max<int64_t>(1, (64 << 10) / std::max<int64_t>(row_bytes, 1));
  at::parallel_for(0, x.size(0), grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (s[t] < 0) continue;
      char* dst = block_ptr(cache, s[t] / block_size) + (s[t] % block_size) * row_bytes;
      std::memcpy(dst, src + t * row_bytes, row_bytes);
    }
  });
}

at::Tensor gather_blocks_cpu(const at::Tensor& cache, const at::Tensor& block_table,
                             const at::Tensor& lens_in) {
  TORCH_CHECK(cache.dim() >= 2, "cache must be [num_blocks, block_size, *row]");
  const int64_t cache_block_bytes = block_bytes(cache, "cache");
  const at::Tensor table = block_table.to(at::kLong).contiguous();
  const at::Tensor lens = lens_in.to(at::kLong).contiguous();
  const int64_t* lp = lens.data_ptr<int64_t>();
  const int64_t* tp = table.data_ptr<int64_t>();
  const int64_t block_size = cache.size(1), max_blocks = table.size(1);
  const int64_t row_bytes = cache_block_bytes / std::max<int64_t>(block_size, 1);
  struct Piece { int64_t block, out_row, rows; };
  std::vector<Piece> pieces;
  int64_t total = 0;
  for (int64_t b = 0; b < lens.size(0); ++b) {
    for (int64_t r = 0; r < lp[b]; r += block_size)
      pieces.push_back({tp[b * max_blocks + r / block_size], total + r,
                        std::min(block_size, lp[b] - r)});
    total += lp[b];
  }
  std::vector<int64_t> shape = cache.sizes().vec();
  shape.erase(shape.begin());
  shape[0] = total;
  at::Tensor out = at::empty(shape, cache.options());
  char* dst = static_cast<char*>(out.data_ptr());
  at::parallel_for(0, (int64_t)pieces.size(), 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      std::memcpy(dst + pieces[i].out_row * row_bytes, block_ptr(cache, pieces[i].block),
                  pieces[i].rows * row_bytes);
  });
  return out;
}

void copy_blocks_cpu(const at::Tensor& src, const at::Tensor& dst, const at::Tensor& mapping) {
  TORCH_CHECK(src.device().is_cpu() && dst.device().is_cpu(),
              "ditmem::copy_blocks (CPU kernel) needs src and dst on the CPU");
  TORCH_CHECK(src.scalar_type() == dst.scalar_type(), "src and dst must share a dtype");
  const int64_t bytes = block_bytes(src, "src");
  TORCH_CHECK(block_bytes(dst, "dst") == bytes, "src and dst blocks must have the same size");
  const at::Tensor m = mapping.to(at::kLong).contiguous();
  const int64_t* mp = m.data_ptr<int64_t>();
  const int64_t n = m.size(0);
  const int64_t chunks = std::max<int64_t>(1, (bytes + kChunkBytes - 1) / kChunkBytes);
  const int64_t chunk = (bytes + chunks - 1) / chunks;
  const int64_t grain = std::max<int64_t>(1, kChunkBytes / std::max<int64_t>(chunk, 1));
  const bool stream = n * bytes >= kStreamBytes;
  at::parallel_for(0, n * chunks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t u = begin; u < end; ++u) {
      const int64_t i = u / chunks, off = (u % chunks) * chunk;
      const int64_t len = std::min(chunk, bytes - off);
      char* to = block_ptr(dst, mp[2 * i + 1]) + off;
      const char* from = block_ptr(src, mp[2 * i]) + off;
      if (stream)
        stream_copy(to, from, len);
      else
        std::memcpy(to, from, len);
    }
  });
}

}  // namespace
}  // namespace ditmem

TORCH_LIBRARY_IMPL(ditmem, CPU, m) {
  m.impl("write_blocks", &ditmem::write_blocks_cpu);
  m.impl("gather_blocks", &ditmem::gather_blocks_cpu);
  m.impl("copy_blocks", &ditmem::copy_blocks_cpu);
}
