// Operator schemas of the ditmem namespace. Kernels register per dispatch key in the
// other files (TORCH_LIBRARY_IMPL); fake (meta) kernels live in Python (ditmem.ops.cpu).
#include <torch/library.h>

TORCH_LIBRARY(ditmem, m) {
  m.def(
      "paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cu_seqlens_q, "
      "Tensor block_table, Tensor kv_lens, float scale) -> Tensor");
  m.def("write_blocks(Tensor x, Tensor(a!) cache, Tensor slot_mapping) -> ()");
  m.def("gather_blocks(Tensor cache, Tensor block_table, Tensor lens) -> Tensor");
  m.def("copy_blocks(Tensor src, Tensor(a!) dst, Tensor mapping) -> ()");
}
