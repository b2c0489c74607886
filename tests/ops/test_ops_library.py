"""The C++ ops are proper torch.library ops: opcheck passes, torch.compile traces them."""

from __future__ import annotations

import pytest
import torch
from ops_factories import make_case, sdpa_reference

import ditmem.ops as ops
import ditmem.ops.cpu  # noqa: F401  (fake kernels)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_opcheck_paged_attention(dtype):
    c = make_case([3, 0, 5], [6, 2, 9], heads=4, kv_heads=2, dim=8, block_size=4, dtype=dtype)
    torch.library.opcheck(torch.ops.ditmem.paged_attention, (*c.args(), 0.25))


def test_opcheck_block_ops():
    cache = torch.randn(4, 2, 3)
    torch.library.opcheck(torch.ops.ditmem.write_blocks,
                          (torch.randn(3, 3), cache, torch.tensor([0, -1, 5])))
    torch.library.opcheck(torch.ops.ditmem.copy_blocks,
                          (cache, torch.zeros(5, 2, 3), torch.tensor([[0, 4], [3, 1]])))
    torch.library.opcheck(
        torch.ops.ditmem.gather_blocks,
        (cache, torch.tensor([[2, 0], [1, 3]], dtype=torch.int32),
         torch.tensor([3, 2], dtype=torch.int32)))


def test_opcheck_triton_op_under_interpreter():
    if ops.available_backends()["triton"] is not None:
        pytest.skip(ops.available_backends()["triton"])
    from ditmem.ops.triton.launch import _paged_attention_op

    c = make_case([3, 5], [6, 9], heads=2, kv_heads=1, dim=8, block_size=4)
    torch.library.opcheck(_paged_attention_op, (*c.args(), 0.3, 5),
                          test_utils=("test_schema", "test_faketensor"))


def test_torch_compile_traces_paged_attention():
    c = make_case([4, 7], [9, 5], heads=2, kv_heads=2, dim=8, block_size=4)

    def f(q, k, v, cu, bt, kl):
        return torch.ops.ditmem.paged_attention(q * 2, k, v, cu, bt, kl, 0.5) + 1

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    out = compiled(*c.args())
    c.q = c.q * 2
    torch.testing.assert_close(out - 1, sdpa_reference(c, scale=0.5), atol=1e-5, rtol=1e-5)


def test_torch_compile_of_the_public_op():
    c = make_case([4, 7], [9, 5], heads=4, kv_heads=2, dim=8, block_size=4, seed=4)
    compiled = torch.compile(lambda *a: ops.paged_attention(*a) * 1.0, backend="aot_eager")
    torch.testing.assert_close(compiled(*c.args()), sdpa_reference(c), atol=1e-5, rtol=1e-5)
