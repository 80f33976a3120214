"""Our decode kernel (fa_bench.kernels.decode_attention) against a float64 reference built
here from the gathered pages, independent of the benchmark's own reference.

CPU tests run the kernels in the Triton interpreter (fp32). Cache positions past each
sequence's length, and pages no sequence uses, hold NaN: one of them reaching a sum
would make the output NaN. GPU tests (`-m gpu`) run the compiled kernels in bf16/fp16
and hold them to twice plain PyTorch's error in the same dtype plus the rounding floor.

`triton.jit` reads TRITON_INTERPRET when a kernel is defined, so the flag is set here,
before the kernel module is first imported, on machines without CUDA.
"""

from __future__ import annotations

import math
import os
import random
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

pytest.importorskip("triton")

from fa_bench.kernels import decode_attention
from fa_bench.kernels.decode_attention import (
    MAX_SPLITS,
    block_n_for,
    choose_num_splits,
    row_tiles,
)
from fa_bench.kernels.decode_config import Tile

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
cpu_only = pytest.mark.skipif(not INTERPRETED, reason="needs TRITON_INTERPRET=1 (CPU runs)")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED, reason="needs CUDA")

FP32_TOL = {"atol": 2e-5, "rtol": 2e-5}


# ---------------------------------------------------------------------------------------
# Inputs and the reference


def make_inputs(
    lengths, sq, hq, hkv, d, *, page_size=0, capacity=None, dtype=torch.float32,
    device="cpu", seed=0,
):  # fmt: skip
    """q (B, Sq, Hq, D), the caches, cache_seqlens and (paged) a shuffled block table.

    Dense per-sequence keys/values are drawn for every position up to `capacity`; those
    past each length are NaN. Paged: each sequence gets ceil(L / page_size) pages, all
    pages are dealt out in a shuffled order (so a sequence's pages are out of order and
    interleaved with the others'), spare pages are NaN and unused table entries are -1.
    """
    g = torch.Generator().manual_seed(seed)
    batch = len(lengths)
    capacity = capacity or max(lengths)
    q = torch.randn(batch, sq, hq, d, generator=g)
    k = torch.randn(batch, capacity, hkv, d, generator=g)
    v = torch.randn(batch, capacity, hkv, d, generator=g)
    for b, n in enumerate(lengths):
        k[b, n:] = v[b, n:] = float("nan")
    seqlens = torch.tensor(lengths, dtype=torch.int32)
    table = None
    if page_size:
        max_pages = math.ceil(capacity / page_size)
        need = [math.ceil(n / page_size) for n in lengths]
        num_pages = sum(need) + 2  # two spare pages nobody uses
        order = list(range(num_pages))
        random.Random(seed).shuffle(order)
        k_pages = torch.full((num_pages, page_size, hkv, d), float("nan"))
        v_pages = torch.full_like(k_pages, float("nan"))
        table = torch.full((batch, max_pages), -1, dtype=torch.int32)
        for b in range(batch):
            for i in range(need[b]):
                page = order.pop()
                table[b, i] = page
                lo, hi = i * page_size, min((i + 1) * page_size, capacity)
                k_pages[page, : hi - lo] = k[b, lo:hi]
                v_pages[page, : hi - lo] = v[b, lo:hi]
        k, v = k_pages, v_pages
    moved = [t.to(device=device, dtype=dtype) for t in (q, k, v)]
    seqlens = seqlens.to(device)
    table = None if table is None else table.to(device)
    return (*moved, seqlens, table)


def gather(cache, table, b, n):
    """Sequence b's first n cache positions, (n, Hkv, D): from its pages when paged."""
    if table is None:
        return cache[b, :n]
    page_size = cache.shape[1]
    pages = [cache[int(p)] for p in table[b, : math.ceil(n / page_size)]]
    return torch.cat(pages)[:n]


def reference(q, k, v, seqlens, table, scale=None):
    """float64 (o (B, Sq, Hq, D), lse (B, Hq, Sq)) with the bottom-right causal mask."""
    batch, sq, hq, d = q.shape
    hkv = k.shape[2]
    scale = scale or 1 / math.sqrt(d)
    o = torch.empty(batch, sq, hq, d, dtype=torch.float64)
    lse = torch.empty(batch, hq, sq, dtype=torch.float64)
    for b in range(batch):
        n = int(seqlens[b])
        kb = gather(k, table, b, n).double().cpu()
        vb = gather(v, table, b, n).double().cpu()
        # query head h = kv head h // group: (Sq, Hkv, group, D) against (n, Hkv, D)
        qb = q[b].double().cpu().reshape(sq, hkv, hq // hkv, d)
        s = torch.einsum("tkgd,nkd->kgtn", qb, kb) * scale
        keep = torch.arange(n)[None, :] <= (n - sq + torch.arange(sq))[:, None]
        s = s.masked_fill(~keep, float("-inf"))
        lse[b] = torch.logsumexp(s, dim=-1).reshape(hq, sq)
        o[b] = torch.einsum("kgtn,nkd->tkgd", torch.softmax(s, dim=-1), vb).reshape(sq, hq, d)
    return o, lse


def check(lengths, sq, hq, hkv, d, *, page_size=0, num_splits=None, capacity=None, seed=0):
    q, k, v, seqlens, table = make_inputs(
        lengths, sq, hq, hkv, d, page_size=page_size, capacity=capacity, seed=seed
    )
    o, lse = decode_attention(
        q, k, v, cache_seqlens=seqlens, block_table=table, num_splits=num_splits,
        return_lse=True,
    )  # fmt: skip
    want_o, want_lse = reference(q, k, v, seqlens, table)
    assert o.shape == q.shape and o.dtype == q.dtype
    assert lse.shape == (len(lengths), hq, sq) and lse.dtype == torch.float32
    torch.testing.assert_close(o.double(), want_o, **FP32_TOL)
    torch.testing.assert_close(lse.double(), want_lse, **FP32_TOL)


# ---------------------------------------------------------------------------------------
# CPU: the interpreter, fp32


@cpu_only
@pytest.mark.parametrize(
    ("lengths", "page_size", "num_splits"),
    [
        # length 1 and exactly one page (16); 45 is not a multiple of 16
        ([1, 16, 45], 16, 1),
        ([1, 16, 45], 16, 3),
        # page 48 (a 16-key block per page): 45 ends inside the first page, 96 on a boundary
        ([45, 96], 48, 3),
        # more splits than any sequence has blocks: most splits are empty
        ([33, 7], 32, 12),
    ],
    ids=["p16-s1", "p16-s3", "p48-s3", "p32-s12-empty"],
)
def test_paged_ragged_matches_float64(lengths, page_size, num_splits):
    check(lengths, 1, 4, 1, 32, page_size=page_size, num_splits=num_splits)


@cpu_only
@pytest.mark.parametrize(
    ("lengths", "sq", "group", "num_splits"),
    [
        ([130, 3], 3, 1, 3),  # Sq > 1 with L == Sq; the capacity (130) ends mid-block
        ([70, 64], 4, 8, None),  # GQA 8; 64 is exactly one block
        ([129], 1, 4, 40),  # 3 blocks, 40 splits
    ],
    ids=["sq3-g1-s3", "sq4-g8-auto", "g4-s40"],
)
def test_contiguous_matches_float64(lengths, sq, group, num_splits):
    check(lengths, sq, 2 * group, 2, 40, num_splits=num_splits)


@cpu_only
def test_speculative_paged_sq_equals_length():
    # Sq = 5 = the first sequence's length: its token t sees keys 0..t only
    check([5, 50], 5, 4, 2, 16, page_size=16, num_splits=2)


@cpu_only
def test_several_row_blocks():
    # GROUP 8 × Sq 16 = 128 rows: two row blocks of 64, each reading the keys
    assert row_tiles(8, 16) == (64, 2)
    check([40, 17], 16, 8, 1, 16, num_splits=2)


@cpu_only
def test_noncontiguous_q_and_capacity_beyond_lengths():
    q, k, v, seqlens, _ = make_inputs([20, 9], 2, 4, 2, 24, capacity=50)
    q_view = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, Sq, Hq, D) strides permuted
    assert not q_view.is_contiguous()
    o = decode_attention(q_view, k, v, cache_seqlens=seqlens, num_splits=2)
    torch.testing.assert_close(o.double(), reference(q, k, v, seqlens, None)[0], **FP32_TOL)


@cpu_only
def test_fp16_in_the_interpreter():
    # fp16 operands (bf16 dots are wrong in the interpreter): o comes back in fp16
    q, k, v, seqlens, table = make_inputs([37, 80], 2, 4, 2, 32, page_size=16)
    q16, k16, v16 = (t.half() for t in (q, k, v))
    o = decode_attention(q16, k16, v16, cache_seqlens=seqlens, block_table=table, num_splits=3)
    assert o.dtype == torch.float16
    want = reference(q16, k16, v16, seqlens, table)[0]
    torch.testing.assert_close(o.double(), want, atol=4e-3, rtol=4e-3)


@cpu_only
def test_scale_and_splits_agree():
    q, k, v, seqlens, table = make_inputs([90, 31], 1, 2, 2, 16, page_size=32)
    outs = [
        decode_attention(q, k, v, cache_seqlens=seqlens, block_table=table, scale=0.3,
                         num_splits=n)
        for n in (1, 2, 7)
    ]  # fmt: skip
    want = reference(q, k, v, seqlens, table, scale=0.3)[0]
    for o in outs:
        torch.testing.assert_close(o.double(), want, **FP32_TOL)


@cpu_only
def test_heuristic_splits_when_left_to_it(monkeypatch):
    # the heuristic lives in decode_config (decode_attention re-exports it)
    module = sys.modules["fa_bench.kernels.decode_config"]
    choose = module.choose_num_splits
    picked = []

    def spy(*args):
        picked.append(choose(*args))
        return picked[-1]

    monkeypatch.setattr(module, "choose_num_splits", spy)
    # the model alone (session 11's deeper pipeline would then take 64-key blocks and 2
    # splits here: tests/test_decode_s11.py)
    monkeypatch.setenv("FA_BENCH_DECODE_DEEP", "0")
    # two (sequence, KV head) programs on the interpreter's 4 SMs read far below the
    # bandwidth: as many splits as a 576-key capacity (18 blocks of 32) allows at 4 blocks
    # each
    check([520, 300], 1, 2, 1, 16, page_size=64)
    assert picked == [4]


def test_split_heuristic():
    # the H200 (132 SMs), d128 bf16, 16 rows: see test_decode_kernel_config for the model
    contig = Tile(16, 128, 2, False)
    # one sequence, 8 KV heads: two programs per SM (contiguous, 3 stages)
    assert choose_num_splits(8, 131072, 64, 132, contig, 3) == 33
    # the programs alone fill the GPU: no split
    assert choose_num_splits(256 * 8, 131072, 64, 132, contig, 2) == 1
    # a short context caps the splits at one per 4 blocks
    assert choose_num_splits(8, 512, 64, 132, contig, 3) == 2
    assert choose_num_splits(8, 16, 64, 132, contig, 3) == 1
    assert choose_num_splits(1, 10**7, 16, 10_000, contig, 2) == MAX_SPLITS


def test_key_block_fits_pages():
    assert block_n_for(None) == 64
    pages = (16, 32, 48, 64, 80, 96, 128, 256)
    assert [block_n_for(p) for p in pages] == [32, 32, 16, 32, 16, 32, 32, 32]
    assert [block_n_for(p, 65536) for p in pages] == [64, 64, 16, 64, 16, 32, 64, 64]
    assert block_n_for(16, many=True) == 64
    assert row_tiles(1, 1) == (16, 1) and row_tiles(8, 4) == (32, 1) and row_tiles(4, 5) == (32, 1)


# ---------------------------------------------------------------------------------------
# Bad arguments: ValueError naming the argument


def _good():
    return make_inputs([20, 9], 2, 4, 2, 16, page_size=16, capacity=32)


def _bad_cases():
    def q_3d(q, k, v, s, t):
        return (q[0], k, v), {"cache_seqlens": s, "block_table": t}

    def q_sq(q, k, v, s, t):
        return (torch.zeros(2, 17, 4, 16), k, v), {"cache_seqlens": s, "block_table": t}

    def k_dtype(q, k, v, s, t):
        return (q, k.double(), v), {"cache_seqlens": s, "block_table": t}

    def q_dtype(q, k, v, s, t):
        return (q.to(torch.int32), k, v), {"cache_seqlens": s, "block_table": t}

    def v_shape(q, k, v, s, t):
        return (q, k, v[:, :, :1]), {"cache_seqlens": s, "block_table": t}

    def heads(q, k, v, s, t):
        return (q[:, :, :3], k, v), {"cache_seqlens": s, "block_table": t}

    def head_dim(q, k, v, s, t):
        return (q[..., :12], k[..., :12], v[..., :12]), {"cache_seqlens": s, "block_table": t}

    def seqlens_dtype(q, k, v, s, t):
        return (q, k, v), {"cache_seqlens": s.long(), "block_table": t}

    def seqlens_shape(q, k, v, s, t):
        return (q, k, v), {"cache_seqlens": s[:1], "block_table": t}

    def too_long(q, k, v, s, t):
        return (q, k, v), {"cache_seqlens": torch.tensor([33, 9], dtype=torch.int32),
                           "block_table": t}  # fmt: skip

    def too_short(q, k, v, s, t):
        return (q, k, v), {"cache_seqlens": torch.tensor([20, 1], dtype=torch.int32),
                           "block_table": t}  # fmt: skip

    def table_dtype(q, k, v, s, t):
        return (q, k, v), {"cache_seqlens": s, "block_table": t.long()}

    def table_rows(q, k, v, s, t):
        return (q, k, v), {"cache_seqlens": s, "block_table": t[:1]}

    def page_outside(q, k, v, s, t):
        t = t.clone()
        t[1, 0] = k.shape[0]
        return (q, k, v), {"cache_seqlens": s, "block_table": t}

    def page_size(q, k, v, s, t):
        return (q, k[:, :8], v[:, :8]), {"cache_seqlens": s, "block_table": t}

    def contiguous_batch(q, k, v, s, t):
        return (q, k, v), {"cache_seqlens": s}  # pages read as batches

    def scale(q, k, v, s, t):
        return (q, k, v), {"cache_seqlens": s, "block_table": t, "scale": -1.0}

    def splits(q, k, v, s, t):
        return (q, k, v), {"cache_seqlens": s, "block_table": t, "num_splits": 0}

    def splits_bool(q, k, v, s, t):
        return (q, k, v), {"cache_seqlens": s, "block_table": t, "num_splits": True}

    def splits_many(q, k, v, s, t):
        return (q, k, v), {"cache_seqlens": s, "block_table": t, "num_splits": MAX_SPLITS + 1}

    def q_list(q, k, v, s, t):
        return (q.tolist(), k, v), {"cache_seqlens": s, "block_table": t}

    def seqlens_list(q, k, v, s, t):
        return (q, k, v), {"cache_seqlens": s.tolist(), "block_table": t}

    def table_list(q, k, v, s, t):
        return (q, k, v), {"cache_seqlens": s, "block_table": t.tolist()}

    # the meta device stands for "another device" on a CPU-only machine
    def k_device(q, k, v, s, t):
        return (q, k.to("meta"), v), {"cache_seqlens": s, "block_table": t}

    def seqlens_device(q, k, v, s, t):
        return (q, k, v), {"cache_seqlens": s.to("meta"), "block_table": t}

    def table_device(q, k, v, s, t):
        return (q, k, v), {"cache_seqlens": s, "block_table": t.to("meta")}

    def all_on_meta(q, k, v, s, t):
        return (q.to("meta"), k.to("meta"), v.to("meta")), {
            "cache_seqlens": s.to("meta"), "block_table": t.to("meta")}  # fmt: skip

    def empty_capacity(q, k, v, s, t):
        return (q, k[:2, :0], v[:2, :0]), {"cache_seqlens": s}

    return [
        (q_3d, "q must be 4-D"), (q_sq, "q's Sq"), (k_dtype, "k_cache has dtype"),
        (q_dtype, "q has dtype"), (v_shape, "v_cache"), (heads, "multiple of k_cache's heads"),
        (head_dim, "head_dim is 12"), (seqlens_dtype, "cache_seqlens must be int32"),
        (seqlens_shape, "cache_seqlens must be int32 (2,)"), (too_long, "cache_seqlens[0] is 33"),
        (too_short, "cache_seqlens[1] is 1"), (table_dtype, "block_table must be int32"),
        (table_rows, "block_table (1, 2)"), (page_outside, "block_table[1, 0]"),
        (page_size, "page_size (k_cache's dim 1) is 8"), (contiguous_batch, "k_cache's batch"),
        (scale, "scale"), (splits, "num_splits"), (splits_bool, "num_splits"),
        (splits_many, "num_splits"), (q_list, "q must be a torch.Tensor"),
        (seqlens_list, "cache_seqlens must be a torch.Tensor"),
        (table_list, "block_table must be a torch.Tensor"), (k_device, "k_cache is on meta"),
        (seqlens_device, "cache_seqlens is on meta"), (table_device, "block_table is on meta"),
        (all_on_meta, "q is on meta"), (empty_capacity, "k_cache (2, 0, 2, 16) holds no"),
    ]  # fmt: skip


@cpu_only
@pytest.mark.parametrize(("bad", "message"), _bad_cases(), ids=lambda x: getattr(x, "__name__", ""))
def test_bad_arguments_name_themselves(bad, message):
    args, kwargs = bad(*_good())
    with pytest.raises(ValueError) as err:
        decode_attention(*args, **kwargs)
    assert message in str(err.value)


@cpu_only
def test_unused_table_entries_are_not_checked_or_read():
    q, k, v, seqlens, table = _good()
    assert int(table[1, 1]) == -1  # sequence 1 (length 9) uses one page of two
    o = decode_attention(q, k, v, cache_seqlens=seqlens, block_table=table)
    assert torch.isfinite(o).all()


# ---------------------------------------------------------------------------------------
# The broad grid (slow)


@cpu_only
@pytest.mark.slow
@pytest.mark.parametrize("page_size", [0, 16, 32, 48, 64])
@pytest.mark.parametrize("sq", [1, 2, 4])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("num_splits", [1, 3, 9, None])
def test_grid_matches_float64(page_size, sq, group, num_splits):
    lengths = [sq, 16, 64, 100, 131]  # Sq itself, a page boundary, ragged
    check(lengths, sq, 2 * group, 2, 64, page_size=page_size, num_splits=num_splits, seed=sq)


# Compiles the kernels for sm_90 without a GPU (triton's stages up to PTX run on the
# CPU), in a fresh process because this one's kernels are defined interpreted. Prints,
# per config, the asynchronous copies in the TTGIR (the key/value loads are software
# pipelined) and the PTX's local-memory accesses (register spills).
_COMPILE_SM90 = """
import os, re
os.environ.pop("TRITON_INTERPRET", None)
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from fa_bench.kernels import decode_kernels as dk
from decode_sm90 import signature

def compile_sm90(fn, consts, dtype, warps=4, stages=3):
    sig = signature(fn, consts, dtype)
    # pointers and strides divisible by 16, as triton specializes them at a real launch
    # (the loads' vectorization and pipelining depend on it)
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if name not in consts and (sig[name][0] == "*" or name.startswith("stride_"))}
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=warps, num_stages=stages))
    spills = len(re.findall(r"\\b(ld|st)\\.local", kernel.asm["ptx"]))
    copies = kernel.asm["ttgir"].count("async_copy_global_to_local")
    return f"async={copies} spills={spills}"

# the heuristic's launches (decode_config): contiguous 64 keys at 3 and 2 stages, paged
# 32 keys (two pages of 16) and 64 keys at 5 stages, 64 keys at 3 (many programs), an
# interleaved split, and the fused combine (contiguous and paged, 32 and 128 splits)
for dtype, group, sq, rows, page, split, bn, stages, inter, fused in [
    ("bf16", 4, 1, 16, 0, True, 64, 3, False, 0),
    ("fp16", 8, 4, 32, 0, False, 64, 2, False, 0),
    ("bf16", 8, 8, 64, 16, True, 32, 5, False, 0),
    ("bf16", 4, 1, 16, 64, True, 64, 5, False, 0),
    ("fp16", 4, 1, 16, 256, False, 64, 3, False, 0),
    ("bf16", 4, 1, 16, 0, True, 64, 3, True, 0),
    ("bf16", 4, 1, 16, 0, True, 64, 3, False, 32),
    ("bf16", 4, 4, 16, 64, True, 32, 5, False, 128),
]:
    consts = dict(HEAD_DIM=128, HEAD_DIM_PAD=128, GROUP=group, SEQ_Q=sq, BLOCK_ROWS=rows,
                  BLOCK_N=bn, PAGED=bool(page), PAGE_SIZE=page, SPLIT=split,
                  DOT_PREC="tf32", INTERLEAVE=inter, FUSED=bool(fused),
                  SPLITS_PAD=fused or 1, PDL=False)
    kernel = compile_sm90(dk._decode_split_kernel, consts, dtype, stages=stages)
    print("split", dtype, group, sq, page, bn, stages, fused, kernel)
consts = dict(HEAD_DIM=128, HEAD_DIM_PAD=128, SPLITS_PAD=128, PDL=False)
print("combine", compile_sm90(dk._decode_combine_kernel, consts, "bf16"))
"""


@pytest.mark.slow
def test_compiles_for_sm90_pipelined_without_spills():
    import subprocess
    import sys

    from decode_sm90 import subprocess_env

    done = subprocess.run(
        [sys.executable, "-c", _COMPILE_SM90], env=subprocess_env(), capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 9, done.stdout
    assert all(line.endswith(" spills=0") for line in lines), done.stdout
    assert all("async=0 " not in line for line in lines[:8]), done.stdout  # split kernels


# ---------------------------------------------------------------------------------------
# GPU: the compiled kernels in bf16/fp16


def _dtype_reference(q, k, v, seqlens, table):
    """Plain PyTorch attention in q's dtype (on the GPU) from the gathered pages."""
    batch, sq, hq, _ = q.shape
    group = hq // k.shape[2]
    o = torch.empty_like(q)
    for b in range(batch):
        n = int(seqlens[b])
        kb = gather(k, table, b, n).repeat_interleave(group, dim=1).transpose(0, 1)
        vb = gather(v, table, b, n).repeat_interleave(group, dim=1).transpose(0, 1)
        keep = (
            torch.arange(n, device=q.device)[None, :]
            <= (n - sq + torch.arange(sq, device=q.device))[:, None]
        )
        o[b] = torch.nn.functional.scaled_dot_product_attention(
            q[b].transpose(0, 1), kb, vb, attn_mask=keep
        ).transpose(0, 1)
    return o


def _assert_within_pytorch_error(lengths, sq, hq, hkv, d, dtype, page_size, num_splits=None):
    q, k, v, seqlens, table = make_inputs(
        lengths, sq, hq, hkv, d, page_size=page_size, dtype=dtype, device="cuda"
    )
    o = decode_attention(q, k, v, cache_seqlens=seqlens, block_table=table, num_splits=num_splits)
    want = reference(q, k, v, seqlens, table)[0]
    base = (_dtype_reference(q, k, v, seqlens, table).double().cpu() - want).abs().max().item()
    err = (o.double().cpu() - want).abs().max().item()
    floor = torch.finfo(dtype).eps * want.abs().max().item()
    assert err <= 2 * base + floor, (err, base, floor)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("page_size", [0, 16, 64, 256])
@pytest.mark.parametrize(("sq", "hq", "hkv"), [(1, 32, 8), (4, 64, 8), (1, 8, 8)])
def test_gpu_accuracy(dtype, page_size, sq, hq, hkv):
    lengths = [4097, 16, 1000, 8192, sq, 3333]
    _assert_within_pytorch_error(lengths, sq, hq, hkv, 128, dtype, page_size)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("num_splits", [1, 7, 128])
def test_gpu_long_context_splits(num_splits):
    _assert_within_pytorch_error([131072], 1, 32, 8, 128, torch.bfloat16, 64, num_splits)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("d", [64, 96, 256])
def test_gpu_head_dims(d):
    _assert_within_pytorch_error([777, 5000], 2, 16, 4, d, torch.float16, 32)
