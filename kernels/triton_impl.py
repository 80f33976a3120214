"""Registers our Triton FlashAttention (`fa_bench.kernels.flash_attention`) as `triton`
(the library's default backward: the Gluon one-pass kernel on sm_90 where it runs, else
the two-kernel one), `triton-deterministic` (the two-kernel backward always, bitwise
reproducible) and `triton-onepass` (a one-pass backward always, `deterministic=False`);
the same forward, configs and tuning cache.

This adapter is where the application meets the kernel library: it picks the config a
case runs with (a sweep's explicit fields, else the tuning cache of fa_bench.sweep.tuning
over the kernel's heuristic) and passes it to `flash_attention` explicitly, so the
library itself never reads the cache.

The kernel module is imported inside the builder, not here: `triton.jit` reads
TRITON_INTERPRET when the kernels are defined, and the runner sets it for CPU workers
before it builds a case, so importing the registry must not define the kernels first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from fa_bench.case import Case, DType, Mode, alibi_slopes
from fa_bench.kernels import decode_impl
from fa_bench.kernels.flash_config import (
    HEAD_DIM_MULTIPLE,
    MAX_HEAD_DIM,
    FlashConfig,
    heuristic_config,
)
from fa_bench.registry import Prepared, register
from fa_bench.run.variant_inputs import cu_seqlens
from fa_bench.sweep import tuning

if TYPE_CHECKING:
    from fa_bench.kernels.flash_validate import Variant


def _variants(case: Case) -> list[str]:
    """The issue 19 variants of `case` (its window, ALiBi, softcap, packed batch)."""
    window = case.window_left >= 0 or case.window_right >= 0
    on = (window, case.alibi, case.softcap > 0, bool(case.varlen))
    names = ("sliding window", "ALiBi", "softcap", "packed varlen batches")
    return [name for name, flag in zip(names, on, strict=True) if flag]


def _check_onepass(case: Case, device: object) -> str | None:
    """`_check`, and the one-pass backward has no variants (its forward is triton's)."""
    variants = _variants(case)
    if variants and case.mode is not Mode.FWD:
        return (
            f"triton-onepass times no {' or '.join(variants)} backward (issue 19): "
            "`triton` runs windows, ALiBi and softcap in the Gluon one-pass backward where "
            "it can and the rest in the two-kernel one, and this forward is the same"
        )
    return _check(case, device)


def _check(case: Case, device: object) -> str | None:
    """Why `triton` cannot run this case on `device`, or None."""
    if case.head_dim % HEAD_DIM_MULTIPLE or case.head_dim > MAX_HEAD_DIM:
        return (
            f"head_dim must be a multiple of {HEAD_DIM_MULTIPLE} and <= {MAX_HEAD_DIM}, "
            f"got {case.head_dim}"
        )
    return decode_impl.interpreter_reason(case, device)


def case_config(
    case: Case, device: torch.device, fields: dict | None = None
) -> tuple[FlashConfig, str]:
    """The config `case` runs with on `device` (a torch.device), and its source:
    `fields` (a sweep's) over the heuristic ("sweep"), else the tuning cache at
    $FA_BENCH_TUNING_CACHE / the default location over the heuristic."""
    seqlen = case.max_seqlen
    base = heuristic_config(case.head_dim, case.dtype.torch(), case.causal, device, seqlen)
    if fields:
        from fa_bench.sweep.vocab import fields_kernel, fields_mode

        # a forward sweep times the kernel whose launch it varies: the `tl` kernel's tiles
        # (Gluon's dispatch would ignore them), or a Gluon launch (forced: one that cannot
        # run is an error row, never a silent `tl` run)
        if fields_mode(fields) == "fwd":
            base = replace(base, forward=fields_kernel(fields))
        return replace(base, **fields), "sweep"
    is_cuda = getattr(device, "type", str(device)) == "cuda"
    # a variant case: the dense config of its shape (a packed batch: of its longest
    # document, case.max_seqlen), cache included
    return tuning.select(
        base,
        gpu=torch.cuda.get_device_name(device) if is_cuda else "cpu",
        dtype=case.dtype.value,
        head_dim=case.head_dim,
        causal=case.causal,
        seqlen=seqlen,
        path=tuning.resolve_path(),
    )


def _prepare(
    case: Case,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    options: dict | None,
    *,
    deterministic: bool | None,
    name: str,
) -> Prepared:
    """The builder of the registered names: they differ only in the backward they run
    (flash_attention's `deterministic`)."""
    from fa_bench.kernels.flash_attention import flash_attention
    from fa_bench.sweep.vocab import config_label

    config, source = case_config(case, q.device, (options or {}).get("config"))
    if deterministic is False and config.backward == "tl":
        # triton-onepass: the warp-specialised Gluon one-pass backward where it runs
        # (sm_90, fp16/bf16, head_dim 64/128); it beat the `tl` one-pass kernel in every
        # shape measured on the H200 (docs/kernel.md, "The Gluon backward")
        config = replace(config, backward="auto")
    if case.dtype is DType.FP8_E4M3:  # forward only (Case): our fp8 kernel
        from fa_bench.kernels import flash_fp8_impl

        return flash_fp8_impl.build(case, q, k, v, options, config, f"{name}-fp8", source)
    causal = case.causal
    if case.is_variant:
        fn = _variant_fn(case, q.device, config, deterministic)
    else:

        def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return flash_attention(
                q, k, v, causal=causal, config=config, deterministic=deterministic
            )

    if q.device.type == "cuda":
        # Compile the forward (and backward) kernels here, outside the timed span.
        grad = case.mode.value != "fwd"
        args = [t.detach().requires_grad_(grad) for t in (q, k, v)]
        out = fn(*args)
        if grad:
            out.backward(torch.ones_like(out))
        torch.cuda.synchronize(q.device)
    label = _forward_named(config_label(config, case.mode.value), case, config, q, k, v)
    label = _backward_named(label, case, config, q, k, v, deterministic)
    return Prepared(fn=fn, backend=f"{name}:{label} ({source})")


def _backward_named(label: str, case: Case, config: FlashConfig, q, k, v,
                    deterministic: bool | None) -> str:  # fmt: skip
    """`label` with its backward part naming the Gluon backward where the backward takes it
    (`deterministic` None or False; FlashConfig.backward, kernels/flash_gluon_bwd.py; o
    and dO are laid out as q; a variant case by its kernels' Variant: a window, softcap
    and ALiBi run there, a packed batch does not)."""
    if deterministic or case.mode.value == "fwd" or case.varlen:
        return label
    from fa_bench.kernels import flash_gluon_bwd
    from fa_bench.sweep.vocab import label as tile_label
    from fa_bench.sweep.vocab import mode_fields

    variant = _case_variant(case, q, k) if case.is_variant else None
    gluon = flash_gluon_bwd.backward_choice(
        q, k, v, q, q, case.causal, config, default=deterministic is None, variant=variant
    )
    if gluon is None:
        return label
    return label.replace("bwd-" + tile_label(mode_fields(config, "bwd")), gluon.label(), 1)


def _forward_named(label: str, case: Case, config: FlashConfig, q, k, v) -> str:
    """`label` with its forward part naming the Gluon kernel where the dispatch takes it
    (kernels/flash_dispatch.py): which kernel ran is in every record's backend."""
    from fa_bench.kernels import flash_dispatch
    from fa_bench.sweep.vocab import label as tile_label
    from fa_bench.sweep.vocab import mode_fields

    if case.mode.value == "bwd":
        return label
    variant = _case_variant(case, q, k) if case.is_variant else None
    gluon = flash_dispatch.gluon_choice(q, k, v, case.causal, config, variant)
    tl_fwd = tile_label(mode_fields(config, "fwd"))
    return label.replace(tl_fwd, flash_dispatch.forward_label(gluon, tl_fwd), 1)


def _case_variant(case: Case, q: torch.Tensor, k: torch.Tensor) -> Variant | None:
    """The kernels' Variant of a variant case, as flash_attention(_varlen) builds it from
    _variant_fn's arguments: what the dispatch decides a variant's kernel by."""
    from fa_bench.kernels.flash_validate import Varlen, make_variant

    slopes = None
    if case.alibi:
        slopes = torch.tensor(alibi_slopes(case.heads_q), dtype=torch.float32, device=q.device)
    batch, seq_q, seq_k, varlen = q.shape[0], q.shape[2], k.shape[2], None
    if case.varlen:  # the packed (1, H, T, D) case: its documents
        cu, longest = cu_seqlens(case, q.device), max(case.sequence_lengths())
        varlen = Varlen(cu, cu, longest, longest)
        batch, seq_q, seq_k = varlen.batch, longest, longest
    window = (case.window_left, case.window_right)
    return make_variant(q, causal=case.causal, window=window, alibi_slopes=slopes,
                        softcap=case.softcap, batch=batch, seq_q=seq_q, seq_k=seq_k,
                        varlen=varlen)  # fmt: skip


def _variant_fn(
    case: Case, device: torch.device, config: FlashConfig, deterministic: bool | None
) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """The timed call of a variant case (issue 19). The ALiBi slopes and a packed
    batch's cumulative lengths are built (and checked) here, outside the timed span; a
    packed batch's (1, H, T, D) inputs go to flash_attention_varlen as (T, H, D) views
    and its output comes back as a (1, H, T, D) view: no copy, and the gradients reach
    the runner's tensors."""
    from fa_bench.kernels.flash_attention import flash_attention
    from fa_bench.kernels.flash_varlen import check_cu_seqlens, flash_attention_varlen

    kw: dict = dict(
        causal=case.causal, window=(case.window_left, case.window_right),
        softcap=case.softcap, config=config, deterministic=deterministic,
    )  # fmt: skip
    if case.alibi:
        kw["alibi_slopes"] = torch.tensor(
            alibi_slopes(case.heads_q), dtype=torch.float32, device=device
        )
    if not case.varlen:
        return lambda q, k, v: flash_attention(q, k, v, **kw)
    cu = cu_seqlens(case, device)
    check_cu_seqlens("cu_seqlens", cu, case.total_tokens, cu.device)
    longest = max(case.sequence_lengths())

    def packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k, v = (t[0].transpose(0, 1) for t in (q, k, v))
        o = flash_attention_varlen(q, k, v, cu, cu, longest, longest, check_values=False, **kw)
        assert isinstance(o, torch.Tensor)  # no return_lse: the output alone
        return o.transpose(0, 1).unsqueeze(0)

    return packed


_SUPPORT: dict = dict(
    modes=(Mode.FWD, Mode.BWD, Mode.FWD_BWD),
    dtypes=(DType.FP32, DType.FP16, DType.BF16, DType.FP8_E4M3),
    devices=("cuda", "cpu"),
    check=_check,
)


@register(
    "triton",
    description=(
        "our Triton FlashAttention-2 (fa_bench.kernels.flash_attention): online softmax in "
        "exp2, GQA, bottom-right causal; on sm_90 a warp-specialised Gluon forward where it "
        "measured faster (the backend names it); sliding windows (blocks outside skipped), ALiBi, "
        "softcap, packed varlen batches (flash_attention_varlen); backward: on sm_90 "
        "(fp16/bf16, head_dim 64/128; windows, ALiBi and softcap too, not packed batches) "
        "the warp-specialised Gluon one-pass "
        "backward (five matmuls per tile pair, dQ summed by fp32 reduce-adds: not bitwise "
        "reproducible; H200, session 16: 1.00-1.11x cuDNN, level with it at bf16 d128 4k "
        "causal; docs/results-h200.md), elsewhere the two-kernel backward "
        "(`triton-deterministic`); "
        "fp8_e4m3 forward cases: our e4m3 kernel (flash_attention_fp8); "
        "decode cases: our split-KV decode kernel "
        "(fa_bench.kernels.decode_attention), contiguous or paged cache"
    ),
    **decode_impl.with_decode(_SUPPORT),
)
def triton_flash(
    case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, options: dict | None = None
) -> Prepared:
    """`options={"config": {field: value}}` (from `fa-bench sweep`) overrides fields of the
    heuristic's config and bypasses the tuning cache; otherwise the tuning cache is used
    when it has this case's key. The backend label says which config ran and why. A
    decode case runs our decode kernel (kernels/decode_impl.py). A sweep's config times
    the two-kernel backward: its bwd tile fields are that kernel's (the Gluon backward
    has its own launches, kernels/flash_gluon_bwd.py)."""
    if case.mode is Mode.DECODE:
        return decode_impl.build(case, q, k, v, options)
    swept = options is not None and "config" in options  # every sweep point, default too
    return _prepare(case, q, k, v, options, deterministic=True if swept else None, name="triton")


@register(
    "triton-deterministic",
    description=(
        "`triton` with deterministic=True: the two-kernel backward always (a separate dQ "
        "kernel, seven matmuls per tile pair, no atomics: bitwise identical gradients on "
        "repeated calls; `triton`'s backward before session 15, and `triton`'s wherever "
        "the Gluon one-pass backward cannot run); same forward"
    ),
    **_SUPPORT,
)
def triton_flash_deterministic(
    case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, options: dict | None = None
) -> Prepared:
    """As `triton_flash` (the same configs, tuning cache and sweep fields), with the
    two-kernel backward whatever the device."""
    return _prepare(case, q, k, v, options, deterministic=True, name="triton-deterministic")


@register(
    "triton-onepass",
    description=(
        "`triton` with deterministic=False: a one-pass backward always (five matmuls per "
        "tile pair, dQ summed by fp32 adds: not bitwise reproducible); on sm_90 "
        "(fp16/bf16, head_dim 64/128) the warp-specialised Gluon backward (`triton`'s "
        "there; the backend names it), elsewhere the `tl` one-pass kernel (slower than "
        "the two-kernel backward on the H200); same forward; variant cases forward only"
    ),
    **dict(_SUPPORT, check=_check_onepass),
)
def triton_flash_onepass(
    case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, options: dict | None = None
) -> Prepared:
    """As `triton_flash` (the same configs, tuning cache and sweep fields), with a one-pass
    backward on every device: the `tl` kernel (and its TMA reduce-add) measurable where
    the default takes the two-kernel backward."""
    return _prepare(case, q, k, v, options, deterministic=False, name="triton-onepass")
