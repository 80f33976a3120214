"""Reference implementations: naive attention, the SDPA backends and FlexAttention.

All compute the same function as `fa_bench.run.accuracy.reference_attention`: scale
1/sqrt(head_dim), GQA (q head h uses kv head h // group), causal bottom-right aligned when
Sq != Sk (query i attends keys j <= i + Sk - Sq), rows with no key give 0.

Decode cases (Mode.DECODE: naive, sdpa, sdpa-math, flex) are built in reference_decode.py;
naive's and SDPA's variant cases (issue 19: window, ALiBi, softcap, packed) in
reference_variants.py.

Nothing here touches a device or compiles at import: availability checks run when asked,
compilation and backend probing happen in the builders, outside the timed span.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import torch

from fa_bench.case import PREFILL_MODES, Case, DType, Mode
from fa_bench.kernels import reference_decode, reference_variants, sdpa_probe
from fa_bench.registry import Prepared, Unsupported, register

if TYPE_CHECKING:
    from torch.nn.attention import SDPBackend
    from torch.nn.attention.bias import CausalBias

AttnFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
_R = TypeVar("_R")

_HALF = (DType.FP16, DType.BF16)
# The implementations that also run decode cases (kernels/reference_decode.py). Not
# sdpa-flash: its kernel takes no mask, so every decode case would be unsupported.
_WITH_DECODE = (*PREFILL_MODES, Mode.DECODE)


# ---------------------------------------------------------------------------------------
# Availability: cheap, lazy, phrased for a person reading "why was this skipped".


def _cuda_reason() -> str | None:
    return None if torch.cuda.is_available() else "CUDA not available"


def _sm80_reason(what: str) -> str | None:
    reason = _cuda_reason()
    if reason is None and torch.cuda.get_device_capability() < (8, 0):
        major, minor = torch.cuda.get_device_capability()
        reason = f"{what} needs compute capability >= 8.0 (this GPU is {major}.{minor})"
    return reason


def _flash_availability() -> str | None:
    return _sm80_reason("SDPA flash (FlashAttention-2)")


def _cudnn_availability() -> str | None:
    reason = _cuda_reason()
    if reason is None and not torch.backends.cudnn.is_available():
        return "cuDNN not available in this torch build"
    return reason or _sm80_reason("cuDNN SDPA")


def _flex_availability() -> str | None:
    if not torch.cuda.is_available():
        return (
            "CUDA not available (FlexAttention is benchmarked on CUDA only: torch.compile "
            "for CPU is too slow on this machine to be useful)"
        )
    if importlib.util.find_spec("triton") is None:
        return "FlexAttention needs triton, which is not installed"
    return _sm80_reason("FlexAttention")


# ---------------------------------------------------------------------------------------
# naive: the "standard attention" of the FlashAttention papers.


@register(
    "naive",
    description="eager matmul + softmax + matmul, materialising the N×N scores in the case dtype",
    modes=_WITH_DECODE,
)
def naive(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> AttnFn | Prepared:
    # A builder's signature (fa_bench.registry): k and v are not needed to prepare.
    if case.mode is Mode.DECODE:
        return reference_decode.naive_decode(case, q, k, v)
    if case.is_variant:
        return reference_variants.naive_variant(case, q, k, v)
    group = case.heads_q // case.heads_kv
    scale = 1.0 / math.sqrt(case.head_dim)
    sq, sk = case.seqlen_q, case.seqlen_k
    masked = None
    empty_rows = None
    if case.causal:
        # True above the bottom-right diagonal: key j > query i + (Sk - Sq).
        masked = torch.ones(sq, sk, dtype=torch.bool, device=q.device).triu(sk - sq + 1)
        if sq > sk:
            # The first Sq - Sk queries see no key: softmax of an all -inf row is NaN. Zero
            # exactly those rows (not nan_to_num, which would also hide NaNs from the inputs);
            # masked_fill's backward then zeroes their grads too.
            empty_rows = (torch.arange(sq, device=q.device) < sq - sk)[:, None]

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if group > 1:
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        s = (q @ k.transpose(-2, -1)) * scale
        if masked is not None:
            s = s.masked_fill(masked, float("-inf"))
        p = torch.softmax(s, dim=-1)
        if empty_rows is not None:
            p = p.masked_fill(empty_rows, 0.0)
        return p @ v

    return fn


# ---------------------------------------------------------------------------------------
# SDPA: default dispatch and each backend pinned.


def _pinned(
    backend: SDPBackend, call: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], _R]
) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], _R]:
    """`call` with only `backend` enabled, as `sdpa_kernel(backend)` would do.

    `sdpa_kernel` costs ~10 µs per entry on a slow CPU (a generator context manager and
    15 flag calls through Python); this sets the same global flags with cached C setters
    (~1 µs). Falls back to `sdpa_kernel` where torch lacks the private name table.
    """
    from torch.nn import attention

    names = getattr(attention, "_backend_names", None)
    try:
        flags = [
            (
                getattr(torch._C, f"_get_{flag}_sdp_enabled"),
                getattr(torch._C, f"_set_sdp_use_{flag}"),
                getattr(attention.SDPBackend, member) == backend,
            )
            for flag, member in (names or {}).items()
        ]
    except AttributeError:
        names = None
    if not names:

        def fallback(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> _R:
            with attention.sdpa_kernel(backend):
                return call(q, k, v)

        return fallback

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> _R:
        previous = [get() for get, _, _ in flags]
        for _, set_flag, enabled in flags:
            set_flag(enabled)
        try:
            return call(q, k, v)
        finally:
            for (_, set_flag, _), was in zip(flags, previous, strict=True):
                set_flag(was)

    return fn


def _dispatched_backend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: CausalBias | None,
    is_causal: bool,
    gqa: bool,
) -> str:
    """The backend SDPA picks under the currently enabled flags; "unknown" if torch hides it.

    A `causal_lower_right` bias is dispatched in Python (torch/nn/attention/bias.py): the
    flash kernel if it can run the case, else memory-efficient with a lower-right mask type,
    else the bias is materialised as a dense Sq×Sk boolean mask and handed to the ordinary
    dispatch. This mirrors that order; the last case is recorded as "<BACKEND>+dense-mask"
    because it then costs O(Sq·Sk) memory like the naive implementation.
    """
    from torch.nn.attention import SDPBackend

    try:
        if mask is None:
            choice = torch._fused_sdp_choice(
                q, k, v, None, 0.0, is_causal, scale=None, enable_gqa=gqa
            )
            return SDPBackend(choice).name
        from torch.backends import cuda

        params = cuda.SDPAParams(q, k, v, None, 0.0, False, gqa)
        if cuda.can_use_flash_attention(params):
            return SDPBackend.FLASH_ATTENTION.name
        if cuda.can_use_efficient_attention(params):
            return SDPBackend.EFFICIENT_ATTENTION.name
        dense = mask._materialize(q.device)
        choice = torch._fused_sdp_choice(q, k, v, dense, 0.0, False, scale=None, enable_gqa=gqa)
        return f"{SDPBackend(choice).name}+dense-mask"
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return "unknown"


def _sdpa_builder(backend_name: str | None) -> Callable[..., Prepared]:
    def build(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Prepared:
        if case.mode is Mode.DECODE:
            # Before the bias import below: it imports torch._dynamo (1-2 s on this CPU).
            return reference_decode.sdpa_decode(case, q, k, v, pin=pin)
        if case.is_variant:
            return reference_variants.sdpa_variant(case, q, k, v, pin=pin)
        from torch.nn.attention.bias import causal_lower_right
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        gqa = case.heads_q != case.heads_kv
        is_causal = case.causal and case.seqlen_q == case.seqlen_k
        mask = None
        if case.causal and not is_causal:
            with warnings.catch_warnings():
                # For Sq > Sk torch warns that the bias "will produce NaNs"; the accuracy
                # check is what tells whether a backend does.
                warnings.simplefilter("ignore", UserWarning)
                mask = causal_lower_right(case.seqlen_q, case.seqlen_k)

        def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return sdpa(q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=gqa)

        fn = pin(call)

        sdpa_probe.first_call(fn, q, k, v)
        probe = functools.partial(_dispatched_backend, mask=mask, is_causal=is_causal, gqa=gqa)
        return Prepared(fn, backend=pin(probe)(q, k, v))

    def pin(call: Callable[..., _R]) -> Callable[..., _R]:
        if backend_name is None:
            return call
        from torch.nn.attention import SDPBackend

        return _pinned(getattr(SDPBackend, backend_name), call)

    return build


register(
    "sdpa",
    description="torch SDPA, default dispatch (the backend that ran is recorded)",
    modes=_WITH_DECODE,
    check=reference_variants.sdpa_check,
)(_sdpa_builder(None))
register(
    "sdpa-math",
    description="torch SDPA pinned to the math backend (eager composite)",
    modes=_WITH_DECODE,
    check=reference_variants.sdpa_check,
)(_sdpa_builder("MATH"))
register(
    "sdpa-flash",
    description="torch SDPA pinned to the flash backend (FlashAttention-2)",
    dtypes=_HALF,
    devices=("cuda",),
    availability=_flash_availability,
    check=reference_variants.sdpa_flash_check,
)(_sdpa_builder("FLASH_ATTENTION"))
register(
    "sdpa-efficient",
    description="torch SDPA pinned to the memory-efficient backend (xFormers cutlass)",
    modes=_WITH_DECODE,
    devices=("cuda",),
    availability=_cuda_reason,
    check=reference_variants.sdpa_check,
)(_sdpa_builder("EFFICIENT_ATTENTION"))
register(
    "sdpa-cudnn",
    description="torch SDPA pinned to the cuDNN backend",
    modes=_WITH_DECODE,
    dtypes=_HALF,
    devices=("cuda",),
    availability=_cudnn_availability,
    check=reference_variants.sdpa_check,
)(_sdpa_builder("CUDNN_ATTENTION"))


# ---------------------------------------------------------------------------------------
# FlexAttention through torch.compile.


@functools.cache
def _compiled_flex() -> Callable[..., torch.Tensor]:
    import torch._dynamo
    from torch.nn.attention.flex_attention import flex_attention

    # One worker process compiles a kernel per shape; past dynamo's recompile limit (8) it
    # silently falls back to eager flex, which materialises the scores: raise the limit.
    config = torch._dynamo.config
    limit = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, limit, max(getattr(config, limit), 128))
    # dynamic=False: each shape gets kernels specialised to it, as a user would deploy.
    return torch.compile(flex_attention, dynamic=False)


@functools.cache
def _compiled_block_mask() -> Callable[..., object]:
    from torch.nn.attention.flex_attention import create_block_mask

    # Compiled, create_block_mask never builds the dense Sq×Sk boolean mask (16 GB at 128k
    # tokens); its old `_compile=True` flag does the same but is deprecated.
    return torch.compile(create_block_mask)


@register(
    "flex",
    description=(
        "FlexAttention (torch.compile), block mask for causal; variants: score_mod "
        "(softcap, ALiBi), sparse block mask (window, documents)"
    ),
    modes=_WITH_DECODE,
    devices=("cuda",),
    backward_reruns=False,
    availability=_flex_availability,
)
def flex(case: Case, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Prepared:
    compiled = _compiled_flex()  # first: it raises the recompile limit the mask build uses too
    if case.mode is Mode.DECODE:
        return reference_decode.flex_decode(
            case, q, k, v, flex=compiled, block_mask_fn=_compiled_block_mask()
        )
    if case.is_variant:  # score_mod / mask_mod, a sparse block mask (issue 19)
        from fa_bench.kernels.reference_variants_flex import flex_variant

        return flex_variant(case, q, k, v, flex=compiled,
                            block_mask_fn=_compiled_block_mask(), warm_up=_warm_up)  # fmt: skip
    block_mask = None
    if case.causal:
        offset = case.seqlen_k - case.seqlen_q

        def bottom_right_causal(b, h, q_idx, kv_idx):  # flex mask_mod signature
            return q_idx + offset >= kv_idx

        block_mask = _compiled_block_mask()(
            bottom_right_causal, None, None, case.seqlen_q, case.seqlen_k, device=q.device
        )
    gqa = case.heads_q != case.heads_kv

    # AUTO lets flex pick its decoding kernel for short query blocks; with GQA, a block mask
    # and Sq < 128 (torch 2.11: Sq=100, Sk=300 causal) that kernel has no valid config and
    # inductor raises NoValidChoicesError. The general Triton kernel handles it: retry with
    # it (newer torch spells the option BACKEND, older FORCE_USE_FLEX_ATTENTION).
    attempts: list[tuple[str, dict | None]] = [
        ("AUTO", None),
        ("TRITON", {"BACKEND": "TRITON"}),
        ("TRITON", {"FORCE_USE_FLEX_ATTENTION": True}),
    ]
    errors: list[str] = []
    for label, options in attempts:

        def fn(
            q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, options: dict | None = options
        ) -> torch.Tensor:
            return compiled(q, k, v, block_mask=block_mask, enable_gqa=gqa, kernel_options=options)

        try:
            _warm_up(fn, q, k, v)
        except Exception as err:  # inductor's error types move between torch versions
            if not errors and "NoValidChoices" not in str(err):
                raise  # AUTO failing for another reason is a real error, not this limitation
            errors.append(f"{label} {options}: {str(err).splitlines()[0]}")
            continue
        return Prepared(fn, backend=label)
    raise Unsupported("FlexAttention found no kernel for this case: " + "; ".join(errors))


def _warm_up(fn: AttnFn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Compile forward and (when grads are wanted) backward now, not in the timed span."""
    o = fn(q, k, v)
    inputs = [t for t in (q, k, v) if t.requires_grad]
    if inputs:
        saved = [t.grad for t in inputs]
        o.backward(torch.randn_like(o))
        for t, grad in zip(inputs, saved, strict=True):
            t.grad = grad
