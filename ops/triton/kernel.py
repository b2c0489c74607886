"""Triton kernel: ragged, non-causal FlashAttention-2-style forward over paged K/V.

One program = one tile of BLOCK_M queries of one request and one head. It walks the
request's keys in tiles of BLOCK_N rows, finding each row's page through the block table
(so any page size works; pages holding a multiple of BLOCK_N rows read contiguous memory),
with an online softmax in fp32 (exp2 with log2(e) folded into the scale). Importing this
module imports triton: do it lazily, and with TRITON_INTERPRET=1 already set when the
kernel must run on CPU tensors.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def paged_attention_fwd(
    Q, K, V, Out, CU, BT, LENS,
    qk_scale,  # softmax scale * log2(e)
    num_heads,
    stride_qt, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ot, stride_oh,
    stride_bt,
    GROUP: tl.constexpr,
    PAGE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_FP32: tl.constexpr,  # math on fp32 operands (fp32 inputs, or the interpreter)
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    q_start = tl.load(CU + b).to(tl.int64)
    q_len = tl.load(CU + b + 1) - q_start
    if pid_m * BLOCK_M >= q_len:
        return
    kv_len = tl.load(LENS + b)
    kvh = h // GROUP

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_mask = offs_m < q_len
    d_mask = offs_d < HEAD_DIM
    q_ptrs = Q + (q_start + offs_m)[:, None] * stride_qt + h * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=m_mask[:, None] & d_mask[None, :], other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(0, kv_len, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_mask = offs_n < kv_len
        page = tl.load(BT + b * stride_bt + offs_n // PAGE, mask=n_mask, other=0).to(tl.int64)
        row = offs_n % PAGE
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k_ptrs = K + page[:, None] * stride_kb + row[:, None] * stride_ks + kvh * stride_kh
        k = tl.load(k_ptrs + offs_d[None, :], mask=kv_mask, other=0.0)
        if DOT_FP32:
            k = k.to(tl.float32)
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(n_mask[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v_ptrs = V + page[:, None] * stride_vb + row[:, None] * stride_vs + kvh * stride_vh
        v = tl.load(v_ptrs + offs_d[None, :], mask=kv_mask, other=0.0)
        if DOT_FP32:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    denom = tl.where(l_i > 0.0, l_i, 1.0)  # kv_len == 0: acc is 0, the output is zeros
    out = acc / denom[:, None]
    o_ptrs = Out + (q_start + offs_m)[:, None] * stride_ot + h * stride_oh + offs_d[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])
