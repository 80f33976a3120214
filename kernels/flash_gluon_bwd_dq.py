"""The dQ side of the Gluon backward (kernels/flash_gluon_bwd_kernels.py): each consumer's
dQ share dS K out of shared memory, through fp32 staging tiles, into the fp32 workspace
(B, Hq, Sq, D) with TMA reduce-adds.

`_tma_reduce_add` is `cp.reduce.async.bulk.tensor` (triton 3.6's `ttng.async_tma_reduce`,
which Gluon 3.6's builder creates but its language does not wrap; a bulk async group
like a TMA store, so `tma.store_wait` waits for its read of the staging tile).
"""

# Gluon constexpr annotations inside the (untyped) jit functions are for triton, not mypy.
# mypy: disable-error-code="annotation-unchecked"

from __future__ import annotations

from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language import _core
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from fa_bench.kernels.flash_gluon_kernels import _acc_layout


@_core.builtin
def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """Add the shared-memory tile `src` into the descriptor's box at `coord` (TMA
    reduce-add, one bulk async group: tma.store_wait waits for it like a store)."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(
        ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle
    )


@gluon.jit
def _staged(dq, PERM: gl.constexpr):
    """dQ_share in the staging tile's column order. PERM: within each 32 columns (one
    128-byte row of the 128-byte swizzle), column 8j + 4a + 2b + e goes to 16a + 4j + 2b + e,
    so that a half-warp's 64-bit stores from the wgmma accumulator (four rows, columns
    8j + 2·(lane % 4) + {0, 1}) land in eight different 16-byte chunks: with the natural
    order rows r and r ^ 1 share chunks under the swizzle (Nsight Compute, session 14: two
    excess wavefronts on every store). The workspace keeps the permuted order and dQ's
    cast reads it back (flash_kernels_bwd1._bwd1_dq_postprocess_kernel, DQ_PERM). Only
    register labels move: no data does."""
    if PERM:
        M: gl.constexpr = dq.shape[0]
        N: gl.constexpr = dq.shape[1]
        # column c = [g | j1 j0 | a | b e] (bits, g the 32-column group) → [g | a | j1 j0 | b e]
        dq = dq.reshape([M, N // 32, 2, 2, 2, 2, 2]).permute((0, 1, 4, 2, 3, 5, 6))
        dq = dq.reshape([M, N])
    return dq


@gluon.jit
def _dq_issue(ds_me, k_me, c: gl.constexpr, CHUNK: gl.constexpr):
    """dQ_share's head_dim columns [c·CHUNK, +CHUNK) = dS K, issued asynchronously (a
    64 × 64 fp32 accumulator: the whole 64 × 128 one next to dK and dV spilled)."""
    BLOCK_M: gl.constexpr = ds_me.shape[1]
    layout: gl.constexpr = _acc_layout(CHUNK, 4, k_me.dtype.primitive_bitwidth)
    zero = gl.zeros([BLOCK_M, CHUNK], gl.float32, layout=layout)
    k_c = k_me.slice(c * CHUNK, CHUNK, dim=1)
    return warpgroup_mma(ds_me.permute((1, 0)), k_c, zero, use_acc=False, is_async=True)


@gluon.jit
def _dq_finish(dq, c: gl.constexpr, dq_bufs, ME: gl.constexpr, dq_desc, b, hq, m0,
               REDUCE: gl.constexpr, PENDING: gl.constexpr = 0,
               PERM: gl.constexpr = False):  # fmt: skip
    """Chunk c of dQ_share into its staging tile and reduce-added into the workspace
    (REDUCE False: a timing probe, no add). PENDING: wgmmas issued after this chunk's
    that may still run (the next chunk's, when all were queued at once). PERM as
    `_staged`'s."""
    BLOCK_M: gl.constexpr = dq_bufs.shape[3]
    CHUNK: gl.constexpr = dq_bufs.shape[4]
    CHUNKS: gl.constexpr = dq_bufs.shape[0] // 2
    tma.store_wait(CHUNKS - 1)  # the add issued from this tile one step ago has read it
    dq = warpgroup_mma_wait(PENDING, deps=[dq])
    tile = dq_bufs.index(ME * CHUNKS + c)
    tile.reshape([BLOCK_M, CHUNK]).store(_staged(dq, PERM))
    fence_async_shared()
    if REDUCE:
        _tma_reduce_add(dq_desc, [b, hq, m0, c * CHUNK], tile)


@gluon.jit
def _dq_out(ds_me, k_me, dq_bufs, ME: gl.constexpr, dq_desc, b, hq, m0, REDUCE: gl.constexpr,
            FIRST: gl.constexpr, PERM: gl.constexpr = False):  # fmt: skip
    """Each consumer's own dQ share, 64 head_dim columns at a time, from chunk FIRST on
    (chunk 0 may have been issued early)."""
    CHUNK: gl.constexpr = dq_bufs.shape[4]
    CHUNKS: gl.constexpr = dq_bufs.shape[0] // 2
    for c in gl.static_range(FIRST, CHUNKS):
        dq = _dq_issue(ds_me, k_me, c, CHUNK)
        _dq_finish(dq, c, dq_bufs, ME, dq_desc, b, hq, m0, REDUCE, 0, PERM)


@gluon.jit
def _dq_sum(dq, c: gl.constexpr, dq_bufs, ME: gl.constexpr, sync, dq_desc, where,
            PENDING: gl.constexpr, PERM: gl.constexpr = False):  # fmt: skip
    """OPS_SMEM 3: chunk c of dQ_share summed over both consumers before one reduce-add
    (half the workspace traffic of `_dq_finish`'s, without `_dq_shared`'s lockstep on
    the dSᵀ tiles). Consumer 1 stores its share into its staging tile and signals
    `ready`; consumer 0 adds it to its own, frees the tile (`free`), stages the sum and
    reduce-adds it. Consumer 1 runs at most one step ahead (it waits for `free` of the
    step before); both count steps t alike. PENDING as `_dq_finish`."""
    ready_bars, free_bars, t = sync
    b, hq, m0 = where
    BLOCK_M: gl.constexpr = dq_bufs.shape[3]
    CHUNK: gl.constexpr = dq_bufs.shape[4]
    CHUNKS: gl.constexpr = dq_bufs.shape[0] // 2
    other = dq_bufs.index(CHUNKS + c).reshape([BLOCK_M, CHUNK])
    dq = warpgroup_mma_wait(PENDING, deps=[dq])
    if ME == 1:
        mbarrier.wait(free_bars.index(c), (t & 1) ^ 1)  # consumer 0 read the last one
        other.store(dq)
        gl.thread_barrier()  # every thread's part stored before the one arrival
        mbarrier.arrive(ready_bars.index(c), count=1)
    else:
        mbarrier.wait(ready_bars.index(c), t & 1)
        dq = dq + other.load(dq.type.layout)
        gl.thread_barrier()  # every thread's part read before consumer 1 may overwrite
        mbarrier.arrive(free_bars.index(c), count=1)
        tma.store_wait(CHUNKS - 1)  # the add issued from this tile one step ago has read it
        tile = dq_bufs.index(c)
        tile.reshape([BLOCK_M, CHUNK]).store(_staged(dq, PERM))
        fence_async_shared()
        _tma_reduce_add(dq_desc, [b, hq, m0, c * CHUNK], tile)


@gluon.jit
def _dq_shared(t, ME: gl.constexpr, ds_bufs, k_tiles, dq_bufs, bars, dq_desc, b, hq, m0,
               PERM: gl.constexpr = False):  # fmt: skip
    """FA3's dQ: once the other consumer's dSᵀ tile is in shared memory too, this one
    computes dQ_share = dS K over all 2·KEYS keys for its half of the head_dim columns
    and reduce-adds it: one 64 × (D/2) add per consumer, half the workspace traffic of
    `_dq_out`'s. ds_ready/ds_free hand the dSᵀ tiles between the two consumers."""
    ds_ready, ds_free = bars[5], bars[6]
    KEYS: gl.constexpr = ds_bufs.shape[1]
    BLOCK_M: gl.constexpr = ds_bufs.shape[2]
    HEAD_DIM: gl.constexpr = k_tiles.shape[4]
    HALF: gl.constexpr = dq_bufs.shape[4]
    layout: gl.constexpr = _acc_layout(HALF, 4, k_tiles.dtype.primitive_bitwidth)
    mbarrier.wait(ds_ready.index(1 - ME), t & 1)
    dq = gl.zeros([BLOCK_M, HALF], gl.float32, layout=layout)
    for c in gl.static_range(2):
        k_c = k_tiles.index(c).reshape([KEYS, HEAD_DIM]).slice(ME * HALF, HALF, dim=1)
        dq = warpgroup_mma(ds_bufs.index(c).permute((1, 0)), k_c, dq, use_acc=c > 0,
                           is_async=True)  # fmt: skip
    tma.store_wait(0)  # the previous step's reduce-add has read the staging tile
    dq = warpgroup_mma_wait(0, deps=[dq])
    mbarrier.arrive(ds_free.index(1 - ME), count=1)  # done reading the other's dSᵀ
    tile = dq_bufs.index(ME)
    tile.reshape([BLOCK_M, HALF]).store(_staged(dq, PERM))
    fence_async_shared()
    _tma_reduce_add(dq_desc, [b, hq, m0, ME * HALF], tile)


@gluon.jit
def _dq_alternate(t, ME: gl.constexpr, ds_bufs, k_tiles, dq_bufs, bars, dq_desc, b, hq, m0,
                  PERM: gl.constexpr = False):  # fmt: skip
    """cuDNN's and FlashAttention-3's dQ on sm_90 (DQ_MODE 8): the consumers take turns,
    consumer t % 2 computing all of step t's dQ = dS K over both consumers' dSᵀ tiles
    (N = head_dim: the A operand read once, against twice for the halves of
    `_dq_shared`) and reduce-adding it, while the other goes on to its next step (the
    turns keep the two out of phase, so one's exponentials meet the other's matmuls).
    ds_ready[c] / ds_free[c] hand consumer c's tile to the turn's owner once per two
    steps (arrival k at step 2k + 1 - c): `_dq_alt_handoff` is the other half."""
    ds_ready, ds_free = bars[5], bars[6]
    KEYS: gl.constexpr = ds_bufs.shape[1]
    BLOCK_M: gl.constexpr = ds_bufs.shape[2]
    HEAD_DIM: gl.constexpr = k_tiles.shape[4]
    layout: gl.constexpr = _acc_layout(HEAD_DIM, 4, k_tiles.dtype.primitive_bitwidth)
    if t % 2 == ME:
        mbarrier.wait(ds_ready.index(1 - ME), (t // 2) & 1)
        dq = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=layout)
        for c in gl.static_range(2):
            k_c = k_tiles.index(c).reshape([KEYS, HEAD_DIM])
            dq = warpgroup_mma(ds_bufs.index(c).permute((1, 0)), k_c, dq, use_acc=c > 0,
                               is_async=True)  # fmt: skip
        tma.store_wait(0)  # this consumer's add two steps ago has read the staging tile
        dq = warpgroup_mma_wait(0, deps=[dq])
        mbarrier.arrive(ds_free.index(1 - ME), count=1)  # done reading the other's dSᵀ
        tile = dq_bufs.index(ME)
        tile.reshape([BLOCK_M, HEAD_DIM]).store(_staged(dq, PERM))
        fence_async_shared()
        _tma_reduce_add(dq_desc, [b, hq, m0, 0], tile)


@gluon.jit
def _dq_alt_handoff(t, ME: gl.constexpr, bars, BEFORE: gl.constexpr):
    """DQ_MODE 8 around the store of this consumer's dSᵀ(t) (`_dq_alternate`). BEFORE: on
    its own turn it waits until the other consumer, owner of step t - 1, has read the
    tile's dSᵀ(t - 1) (arrival (t // 2) - 1 + ME; a fresh barrier passes the first one).
    After: on the other's turn it hands dSᵀ(t) over (arrival t // 2)."""
    if BEFORE:
        if t % 2 == ME:
            mbarrier.wait(bars[6].index(ME), ((t // 2) + ME + 1) & 1)
    elif t % 2 != ME:
        mbarrier.arrive(bars[5].index(ME), count=1)


@gluon.jit
def _tail_dq_first(ds_t, ds_op, p_op, q_t, dk, dv, ds_me, k_me, dq_bufs, ME: gl.constexpr,
                   dq_desc, where, ring, ALL: gl.constexpr,
                   PERM: gl.constexpr = False):  # fmt: skip
    """DQ_MODE 5 (ALL) and 6, the end of a step after dV was issued: dSᵀ to shared
    memory, dQ's chunks (6: only the first) issued, then dK; once dV and those chunks are
    done (dK may still run) the dO slot goes back and they are staged and reduce-added
    while dK's matmul runs (FA3's dV, dQ, dK order); 6 then issues the second chunk
    behind dK. Mode 5 keeps both 64 × 64 fp32 chunks live beside dK and dV, which ptxas
    (12.8) answers by serialising the wgmmas (C7512); 6 keeps one, as DQ_MODE 3 does."""
    b, hq, m0 = where
    q_empty, do_empty, slot = ring
    CHUNK: gl.constexpr = dq_bufs.shape[4]
    CHUNKS: gl.constexpr = dq_bufs.shape[0] // 2
    ds_me.store(ds_t)
    fence_async_shared()
    dq0 = _dq_issue(ds_me, k_me, 0, CHUNK)
    if ALL and CHUNKS == 2:
        dq1 = _dq_issue(ds_me, k_me, 1, CHUNK)
    dk = warpgroup_mma(ds_op, q_t, dk, is_async=True)
    # in order: dV, the dQ chunks issued, dK; all but dK done
    dv, _p = warpgroup_mma_wait(1, deps=[dv, p_op])
    mbarrier.arrive(do_empty.index(slot), count=1)
    _dq_finish(dq0, 0, dq_bufs, ME, dq_desc, b, hq, m0, True, 1, PERM)
    if CHUNKS == 2:
        if ALL:
            _dq_finish(dq1, 1, dq_bufs, ME, dq_desc, b, hq, m0, True, 1, PERM)
        else:  # queued behind dK; waited with it
            dq1 = _dq_issue(ds_me, k_me, 1, CHUNK)
            _dq_finish(dq1, 1, dq_bufs, ME, dq_desc, b, hq, m0, True, 0, PERM)
    dk, _ds = warpgroup_mma_wait(0, deps=[dk, ds_op])
    mbarrier.arrive(q_empty.index(slot), count=1)
    return dk, dv
