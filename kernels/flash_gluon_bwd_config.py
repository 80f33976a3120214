"""The launch parameters of the Gluon backward for sm_90 (issue 18): `GluonBwdConfig`
(kernels/flash_gluon_bwd.py re-exports it, with the heuristic and the roles). Imports
neither triton nor torch."""

from __future__ import annotations

from dataclasses import dataclass

from fa_bench.kernels import flash_gluon

# head_dim columns per dQ reduce-add (the kernel's 64 × 64 fp32 dQ chunks)
DQ_CHUNK = 64


@dataclass(frozen=True)
class GluonBwdConfig:
    """Launch parameters of the Gluon backward.

    block_m: query rows per step, 64 or 128 (the N of Sᵀ's wgmma; FA3 takes 128 at
      head_dim 64, where 64-row steps leave little matmul per barrier);
    keys: keys per consumer warpgroup (64; a CTA holds 2 · keys);
    stages: depth of the Q/dO ring in shared memory;
    producer_regs / consumer_regs: per-thread registers of the producer's warpgroup and
      of consumer 1 (consumer 0, the default partition, gets what is left of the 64K);
    shared_dq: FA3's dQ: the two consumers' dSᵀ tiles meet in shared memory
      and each consumer computes and reduce-adds half of dQ's columns over all 128 keys,
      instead of each adding its own 64 keys' share of every column (half the reduce-add
      traffic, half the staging memory: a third ring stage fits; the consumers sync per
      step);
    rotate: non-causal, each key block of a head starts its loop at another query block
      (block kb at kb mod the count), so the CTAs' dQ reduce-adds do not all land on the
      same workspace rows at once (causal CTAs start at their diagonal anyway);
    early_dq: the first dQ chunk's matmul is queued before dV and dK are waited for;
    early_dq_all: both dQ chunks (head_dim 128) are queued before dV and dK are waited for,
      so no chunk's issue waits on the previous chunk's staging store and reduce-add
      (two 64 × 64 fp32 accumulators live at once next to dK and dV);
    dq_first: FlashAttention-3's order, how many of dQ's chunks are issued between dV's
      and dK's matmuls and staged and reduce-added while dK's runs: 0 none, 1 the first
      (the second then queued behind dK), 2 all (at head_dim 128 ptxas serialises the
      wgmmas: two fp32 chunks live beside dK and dV; at 64, one chunk, 1 is 2);
    kb_major: the grid runs every head's first key blocks first (the first causal order)
      instead of one head's key blocks together: on the H200 (session 5, call B) it left
      the causal backward bound by its dQ reduce-adds at 4k (the workspaces of all heads
      at once do not fit L2: 331 TFLOP/s, 498 without the adds, bf16 d128); the kernel
      runs it as one group of all heads (`head_groups`' mapping);
    pingpong: the two consumers take turns to issue their matmul groups (mbarriers), so
      one's exponentials overlap the other's matmuls (the Gluon forward's ping-pong);
    ops_smem: wgmma A operands from shared memory instead of registers (fewer registers
      live while dV and dK run, session 7): 1 dSᵀ for dK (the tile dQ reads anyway,
      stored before dK is issued), 2 also Pᵀ for dV (a tile of its own), 3 as 2 and the
      two consumers' dQ shares summed before one reduce-add (consumer 1 hands its share
      to consumer 0 through its staging tile: half the adds); not with dq_first; 1 and 2
      also with shared_dq (session 12: FA3's dQ with Pᵀ and dSᵀ through shared memory);
    dq_perm: dQ's columns permuted within each 32 in the staging tile and the fp32
      workspace, so that the staging stores have no bank conflicts under the 128-byte
      swizzle (flash_gluon_bwd_dq._staged; dQ's cast puts them back). Nsight Compute
      (session 14) counted two excess wavefronts on every staging store without it;
    alt_dq: the consumers take turns at all of a step's dQ (cuDNN's sm_90 kernel in Nsight
      Compute, session 14, and FlashAttention-3): over both dSᵀ tiles at N = head_dim,
      one staging tile of all columns per consumer (DQ_MODE 8; ops_smem 1 only);
    head_groups: causal, the grid interleaves the key blocks of a few heads (key block 0
      of each, then key block 1 of each, ...) instead of running a head's key blocks
      together, so that the grid's last wave holds light CTAs: how many heads, by a model
      of the CTAs' dispatch (kernels/flash_gluon_bwd_order.py); not with kb_major;
    """

    block_m: int = 64
    keys: int = 64
    stages: int = 2
    producer_regs: int = 24
    consumer_regs: int = 240
    shared_dq: bool = False
    rotate: bool = False
    early_dq: bool = False
    early_dq_all: bool = False
    dq_first: int = 0
    kb_major: bool = False
    pingpong: bool = False
    ops_smem: int = 0
    dq_perm: bool = False
    alt_dq: bool = False
    head_groups: bool = False

    def __post_init__(self) -> None:
        for name, valid in (("block_m", (64, 128)), ("keys", (64,)), ("stages", (1, 2, 3, 4)),
                            ("dq_first", (0, 1, 2)), ("ops_smem", (0, 1, 2, 3))):  # fmt: skip
            value = getattr(self, name)
            if isinstance(value, bool) or value not in valid:
                raise ValueError(f"GluonBwdConfig.{name}={value!r}: expected one of {valid}")
        flags = ("shared_dq", "rotate", "early_dq", "early_dq_all", "kb_major", "pingpong",
                 "dq_perm", "alt_dq", "head_groups")  # fmt: skip
        for name in flags:
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"GluonBwdConfig.{name}={getattr(self, name)!r}: expected a bool")
        if self.alt_dq and self.ops_smem != 1:
            raise ValueError(
                f"GluonBwdConfig(alt_dq=True, ops_smem={self.ops_smem}): the alternating dQ "
                "reads dSᵀ from shared memory (ops_smem 1)"
            )
        if self.head_groups and self.kb_major:
            raise ValueError("GluonBwdConfig(head_groups=True, kb_major=True): one grid order")
        schedules = (self.shared_dq, self.early_dq, self.early_dq_all, self.dq_first > 0,
                     self.alt_dq)  # fmt: skip
        if sum(schedules) > 1:
            raise ValueError(
                f"GluonBwdConfig(shared_dq={self.shared_dq}, early_dq={self.early_dq}, "
                f"early_dq_all={self.early_dq_all}, alt_dq={self.alt_dq}, "
                f"dq_first={self.dq_first}): one dQ schedule"
            )
        if self.ops_smem and (self.dq_first or (self.shared_dq and self.ops_smem == 3)):
            raise ValueError(
                f"GluonBwdConfig(ops_smem={self.ops_smem}, shared_dq={self.shared_dq}, "
                f"dq_first={self.dq_first}): ops_smem takes no dq_first, and 3 (the shares "
                "summed) no shared_dq"
            )
        flash_gluon.check_regs(self)

    @property
    def dq_mode(self) -> int:
        """The kernel's DQ_MODE: 1 shared dQ, 3 the early first chunk, 4 both chunks
        early, 5 all of dQ before dK, 6 its first chunk before dK, 8 the consumers'
        turns at all of dQ, 0 none of them."""
        if self.dq_first:
            return 5 if self.dq_first == 2 else 6
        if self.early_dq_all:
            return 4
        if self.alt_dq:
            return 8
        return 1 if self.shared_dq else 3 if self.early_dq else 0

    def dq_cols(self, head_dim: int) -> int:
        """Columns per dQ reduce-add: half of head_dim under shared_dq (one half per
        consumer), all of them under alt_dq, else DQ_CHUNK."""
        if self.alt_dq:
            return head_dim
        return head_dim // 2 if self.shared_dq else DQ_CHUNK

    @property
    def block_n(self) -> int:
        """Keys per CTA."""
        return 2 * self.keys

    def smem_bytes(self, head_dim: int, elem_bytes: int = 2) -> int:
        """K and V of the CTA, the Q/dO ring (with its fp32 lse2/delta rows), each
        consumer's dSᵀ tile (keys × block_m) and fp32 dQ staging tile (block_m × head_dim)."""
        kv = 2 * self.block_n * head_dim * elem_bytes
        ring = 2 * self.stages * self.block_m * (head_dim * elem_bytes + 4)
        ds = 2 * self.keys * self.block_m * elem_bytes
        dq = 2 * self.block_m * head_dim * 4 // (2 if self.shared_dq else 1)
        p = ds if self.ops_smem >= 2 else 0  # each consumer's Pᵀ tile
        return kv + ring + ds + dq + p

    def label(self) -> str:
        text = f"gluon-bwd-m{self.block_m}-n{self.block_n}-s{self.stages}"
        text = f"{text}-sdq" if self.shared_dq else text
        text = f"{text}-rot" if self.rotate else text
        text = f"{text}-kbmajor" if self.kb_major else text
        text = f"{text}-pp" if self.pingpong else text
        text = f"{text}-{('', 'dss', 'pss', 'sum')[self.ops_smem]}" if self.ops_smem else text
        text = f"{text}-alt" if self.alt_dq else text
        text = f"{text}-perm" if self.dq_perm else text
        text = f"{text}-grp" if self.head_groups else text
        text = f"{text}-early2" if self.early_dq_all else text
        text = f"{text}-dqfirst{'' if self.dq_first == 2 else 1}" if self.dq_first else text
        return f"{text}-early" if self.early_dq else text
