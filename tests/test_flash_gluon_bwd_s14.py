"""Issue 18, session 14: dQ's staging order (`GluonBwdConfig.dq_perm`), the consumers'
turns at all of dQ (`alt_dq`). Nsight Compute put
two excess shared-memory wavefronts on every 64-bit store of the fp32 dQ staging tile
under the 128-byte swizzle; with the columns permuted within each 32 the stores are
conflict-free, the workspace keeps the permuted order and dQ's cast reads it back. The
configs, the permutation against its inverse in the cast, and, on the GPU, the gradients
of the permuted roles against the float64 reference under fa_bench.run.accuracy's rule
(causal both, GQA, odd lengths, Sq ≠ Sk), fp16 and the deterministic backward's too."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from gluon_bwd_helpers import check_fp16_and_det, check_role, needs_cuda
from test_flash_gluon_bwd_s6 import ROLE_SHAPES

from fa_bench.kernels.flash_gluon_bwd import GluonBwdConfig, candidate_bwd_configs

# (head_dim, the permuted role, the role it is built on)
PERM_ROLES = [(128, "ws-dss-sdq-s2-perm", "ws-dss-sdq-s2"),
              (64, "ws-pss-early-perm", "ws-pss-early"),
              (128, "ws-dss-sdq-perm", "ws-dss-sdq")]  # fmt: skip


@pytest.mark.parametrize(("head_dim", "role", "base"), PERM_ROLES)
def test_perm_roles_change_only_the_staging_order(head_dim, role, base):
    cands = candidate_bwd_configs(head_dim)
    assert cands[role].dq_perm and not cands[base].dq_perm
    assert dataclasses.replace(cands[role], dq_perm=False) == cands[base]
    assert cands[role].label() != cands[base].label() and "-perm" in cands[role].label()
    assert cands[role].smem_bytes(head_dim) == cands[base].smem_bytes(head_dim)


# (head_dim, role): the consumers' turns at all of dQ
NEW_ROLES = [(128, "ws-dss-sdq-s2-alt-perm"), (64, "ws-dss-sdq-s2-alt-perm")]


@pytest.mark.parametrize("head_dim", [64, 128])
def test_alt_dq_is_mode_8_with_every_column_per_add(head_dim):
    cfg = candidate_bwd_configs(head_dim)["ws-dss-sdq-s2-alt-perm"]
    assert (cfg.dq_mode, cfg.dq_cols(head_dim)) == (8, head_dim)
    assert (cfg.shared_dq, cfg.ops_smem) == (False, 1)
    # a staging tile of all columns per consumer: twice the shared dQ's
    sdq = candidate_bwd_configs(head_dim)["ws-dss-sdq-s2"]
    assert cfg.smem_bytes(head_dim) - sdq.smem_bytes(head_dim) == cfg.block_m * head_dim * 4
    assert "-alt" in cfg.label()


def test_alt_dq_takes_dss_only_and_no_other_schedule():
    with pytest.raises(ValueError, match=r"alt_dq=True, ops_smem=2"):
        GluonBwdConfig(alt_dq=True, ops_smem=2)
    with pytest.raises(ValueError, match="one dQ schedule"):
        GluonBwdConfig(alt_dq=True, ops_smem=1, shared_dq=True)


@pytest.mark.parametrize("bad", [1, 0, None, "yes"])
def test_dq_perm_takes_a_bool(bad):
    with pytest.raises(ValueError, match=r"GluonBwdConfig.dq_perm=.*expected a bool"):
        GluonBwdConfig(dq_perm=bad)


def _staged_columns(n: int) -> torch.Tensor:
    """The real column at each staging position: flash_gluon_bwd_dq._staged's reshape and
    permute on a row of column indices."""
    cols = torch.arange(n).reshape(1, n // 32, 2, 2, 2, 2, 2)
    return cols.permute(0, 1, 4, 2, 3, 5, 6).reshape(n)


def _cast_sources(n: int) -> torch.Tensor:
    """The staging position the cast reads for each real column (its DQ_PERM formula)."""
    d = torch.arange(n)
    return (d & ~31) | (((d >> 2) & 1) << 4) | (((d >> 3) & 3) << 2) | (d & 3)


@pytest.mark.parametrize("n", [32, 64, 128, 256])
def test_the_cast_reads_back_what_the_kernel_stages(n):
    staged, src = _staged_columns(n), _cast_sources(n)
    assert sorted(src.tolist()) == list(range(n))  # a permutation
    assert torch.equal(staged[src], torch.arange(n))  # column c is where the cast looks
    assert not torch.equal(staged, torch.arange(n))


def test_a_half_warps_staging_stores_hit_every_chunk_once():
    """The bank argument of `_staged`: lanes 0-15 of a warp store rows 0-3 (lane // 4),
    columns 8j + 2·(lane % 4) + {0, 1}; under the 128-byte swizzle a 32-column fp32 row's
    16-byte chunk k sits at chunk k ^ (row % 8). Permuted, the 16 lanes cover the 8 chunks
    of one 128-byte bank line twice (8 bytes each: 128 bytes, one wavefront); natural, two
    rows share each chunk pair (two wavefronts)."""
    where = _cast_sources(32)  # real column -> staging position
    for j in range(4):
        for permuted, expect in ((True, 8), (False, 4)):
            chunks = []
            for lane in range(16):
                row, col = lane // 4, 8 * j + 2 * (lane % 4)
                pos = int(where[col]) if permuted else col
                chunks.append((pos // 4) ^ (row % 8))
            assert len(set(chunks)) == expect


@pytest.mark.parametrize("head_dim", [64, 128])
def test_the_cast_kernel_unpermutes_the_workspace(head_dim):
    """dQ's cast (DQ_PERM) on a workspace staged in the permuted order gives dQ back, in
    the interpreter on a CPU (on the GPU where there is one); without DQ_PERM it copies."""
    import importlib

    fa = importlib.import_module("fa_bench.kernels.flash_attention")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(0)
    batch, heads, seq = 2, 3, 70  # odd rows: the cast's row mask
    dq_true = torch.randn(batch, heads, seq, head_dim, generator=gen).to(device)
    ws = dq_true[..., _staged_columns(head_dim).to(device)].contiguous()
    scale = 0.125
    for perm, source in ((True, ws), (False, dq_true.contiguous())):
        out = torch.empty(batch, heads, seq, head_dim, device=device, dtype=torch.float16)
        rows = fa._PREPROCESS_ROWS
        fa._kernels().dq_post[(-(-seq // rows), batch * heads)](
            source, out, *out.stride()[:3], heads, seq, scale,
            HEAD_DIM=head_dim, HEAD_DIM_PAD=head_dim, BLOCK_M=rows, DQ_PERM=perm,
        )  # fmt: skip
        torch.testing.assert_close(out.float(), (dq_true * scale).half().float())


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", ROLE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize(("head_dim", "role"), [r[:2] for r in PERM_ROLES] + NEW_ROLES, ids=str)
def test_gpu_perm_roles_within_the_accuracy_rule(head_dim, role, shape, causal):
    check_role(head_dim, role, shape, causal)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("head_dim", "role"), [r[:2] for r in PERM_ROLES[:2]] + NEW_ROLES[:2],
                         ids=str)  # fmt: skip
def test_gpu_perm_fp16_and_against_the_deterministic_backward(head_dim, role, causal):
    check_fp16_and_det(head_dim, role, causal, ROLE_SHAPES[0])  # GQA 4:1 at 4097


def _wait_parities() -> dict[str, str]:
    """The phase-parity expressions of DQ_MODE 8's three mbarrier waits, read from the
    kernel's source (so the emulation below checks what the GPU runs)."""
    import ast
    import inspect

    from fa_bench.kernels import flash_gluon_bwd_dq as dq
    from fa_bench.kernels import flash_gluon_bwd_kernels as kern

    found: dict[str, str] = {}
    for name, fn in (("before", dq._dq_alt_handoff), ("ready", dq._dq_alternate),
                     ("end", kern._bwd_consumer)):  # fmt: skip
        for node in ast.walk(ast.parse(inspect.getsource(fn.fn))):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("mbarrier.wait"):
                parity = ast.unparse(node.args[1])
                if name != "end" or "last" in parity:
                    found[name] = parity
    return found


def _emulate_turns(steps: int, seed: int, parity: dict[str, str]) -> None:
    """Two consumers run DQ_MODE 8's hand-off (`_dq_alt_handoff`, `_dq_alternate`, the
    end of `_bwd_consumer`) for `steps` steps in a random interleaving, on mbarriers of
    one arrival per phase whose wait(P) passes once the phase of parity P is complete
    (a fresh barrier counts phase -1 complete). Fails on a deadlock, on a turn's owner
    reading the other's dSᵀ of another step, on a dSᵀ tile overwritten before its owner
    read it, and on a K tile overwritten by dK while the other may still read it."""
    import random

    rng = random.Random(seed)
    phases = {(kind, c): 0 for kind in ("ready", "free") for c in (0, 1)}
    tile = [None, None]  # the step whose dSᵀ each consumer's tile holds
    unread: set[tuple[int, int]] = set()  # (tile, step) the turn's owner has yet to read
    dq_done = [0, 0]  # dQ turns each consumer finished (each reads both K tiles)

    def program(me: int):
        for t in range(steps):
            if t % 2 == me:  # BEFORE the store: the other read dSᵀ(t - 1) of our tile
                yield ("wait", ("free", me), eval(parity["before"], {"t": t, "ME": me}))
            assert (me, t - 1) not in unread, f"tile {me} overwritten before step {t - 1} read"
            tile[me] = t
            if t % 2 != me:
                unread.add((me, t))
                phases[("ready", me)] += 1
            else:
                yield ("wait", ("ready", 1 - me), eval(parity["ready"], {"t": t, "ME": me}))
                assert tile[1 - me] == t, f"step {t}: read the other's dSᵀ of {tile[1 - me]}"
                unread.discard((1 - me, t))
                dq_done[me] += 1
                phases[("free", 1 - me)] += 1
            yield ("step", None, None)
        last = steps - 1
        if last >= 0 and last % 2 != me:
            yield ("wait", ("free", me), eval(parity["end"], {"last": last, "ME": me}))
        turns = (steps - (1 - me) + 1) // 2  # the other's turns: steps ≡ 1 - me (mod 2)
        assert dq_done[1 - me] == turns, "dK stored over a K tile the other may still read"

    progs = {0: program(0), 1: program(1)}
    pending: dict[int, tuple] = {}
    while progs:
        ready = [me for me in progs if me not in pending
                 or phases[pending[me][1]] & 1 != pending[me][2]]  # fmt: skip
        assert ready, f"deadlock at {pending} (phases {phases})"
        me = rng.choice(ready)
        pending.pop(me, None)
        try:
            op = next(progs[me])
        except StopIteration:
            del progs[me]
            continue
        if op[0] == "wait":
            pending[me] = op


@pytest.mark.parametrize("steps", [0, 1, 2, 3, 4, 7, 8, 13])
def test_the_consumers_turns_hand_the_ds_tiles_over_safely(steps):
    parity = _wait_parities()
    assert set(parity) == {"before", "ready", "end"}
    for seed in range(200):
        _emulate_turns(steps, seed, parity)
