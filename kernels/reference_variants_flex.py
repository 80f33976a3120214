"""FlexAttention for the variant cases of issue 19: sliding windows, ALiBi, softcapping and
packed (varlen) batches.

The score transforms go in a `score_mod` (flex applies it to the scaled score, before the
mask): softcap `c · tanh(s / c)`, then ALiBi `s − m_h · |i + o − j|` with the standard
slopes of `fa_bench.case.alibi_slopes` indexed by the *query* head (flex's `h` under
enable_gqa). Window, causal and the documents of a packed batch go in a `mask_mod`, from
which a block mask is built once, outside the timed span: blocks a window or another
document masks entirely are never visited, so flex's work falls with the mask as ours
must. A packed case's inputs are (1, H, T, D), the documents back to back; a document is
its own self-attention (Sq = Sk, offset 0), so the window and ALiBi read the packed indices
directly (their differences are the same within a document) and the mask adds "same
document". A row with no visible key comes back 0, as flash-attn's do.

`flex_variant` takes flex_attention and create_block_mask as arguments: the registered
`flex` passes their compiled forms (CUDA only), the tests the eager ones on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fa_bench.case import Case, alibi_slopes
from fa_bench.registry import Prepared, Unsupported
from fa_bench.run.variant_inputs import window_bounds

ModFn = Callable[..., torch.Tensor]


def document_ids(case: Case, device: torch.device) -> torch.Tensor:
    """(T,) int32: the document of each packed token."""
    lengths = torch.tensor(case.sequence_lengths(), device=device)
    return torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths)


def mask_mod(case: Case, device: torch.device) -> ModFn | None:
    """The case's mask as a flex mask_mod, or None when every key is visible."""
    left, right = window_bounds(case)
    docs = document_ids(case, device) if case.varlen else None
    if left is None and right is None and docs is None:
        return None
    # Packed: Sq = Sk per document, so the diagonal is j = i; otherwise bottom-right.
    offset = 0 if docs is not None else case.seqlen_k - case.seqlen_q

    def visible(b, h, q_idx, kv_idx):  # flex mask_mod signature
        diag = q_idx + offset
        keep = kv_idx >= 0  # all True, in flex's index type
        if left is not None:
            keep = keep & (kv_idx >= diag - left)
        if right is not None:
            keep = keep & (kv_idx <= diag + right)
        if docs is not None:
            keep = keep & (docs[q_idx] == docs[kv_idx])
        return keep

    return visible


def score_mod(case: Case, device: torch.device) -> ModFn | None:
    """Softcap, then ALiBi, as a flex score_mod (on the scaled score), or None."""
    cap = float(case.softcap)
    slopes = None
    if case.alibi:
        slopes = torch.tensor(alibi_slopes(case.heads_q), dtype=torch.float32, device=device)
    if not cap and slopes is None:
        return None
    offset = 0 if case.varlen else case.seqlen_k - case.seqlen_q

    def transform(score, b, h, q_idx, kv_idx):  # flex score_mod signature
        if cap:
            score = cap * torch.tanh(score / cap)
        if slopes is not None:
            score = score - slopes[h] * (q_idx + offset - kv_idx).abs()
        return score

    return transform


def label(case: Case) -> str:
    """What the backend label says ran: the score_mod's transforms, the block mask's parts."""
    scores = [name for name, on in (("softcap", case.softcap), ("ALiBi", case.alibi)) if on]
    flags = (("window", case.has_window), ("causal", case.causal), ("documents", case.varlen))
    masks = [name for name, on in flags if on]
    parts = [f"score_mod ({' + '.join(scores)})"] if scores else []
    if masks:
        parts.append(f"block mask ({' + '.join(masks)})")
    return ", ".join(parts)


def flex_variant(
    case: Case,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    flex: Callable[..., torch.Tensor],
    block_mask_fn: Callable[..., object],
    warm_up: Callable[..., None] | None = None,
) -> Prepared:
    """A variant case's fn: mods and the block mask made here, outside the timed span.
    `warm_up(fn, q, k, v)` compiles it (the registered builder's). As the dense builder
    does, flex's AUTO choice is tried first, then its general Triton kernel (the decoding
    kernel AUTO may pick has no config for some GQA shapes: NoValidChoicesError); when
    none compiles, Unsupported with flex's words."""
    device = q.device
    masked = mask_mod(case, device)
    block_mask = None
    if masked is not None:
        q_len, kv_len = q.shape[2], k.shape[2]
        block_mask = block_mask_fn(masked, None, None, q_len, kv_len, device=device)
    scored = score_mod(case, device)
    gqa = case.heads_q != case.heads_kv
    errors: list[str] = []
    for options in _ATTEMPTS:

        def fn(
            q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, options: dict | None = options
        ) -> torch.Tensor:
            return flex(q, k, v, score_mod=scored, block_mask=block_mask, enable_gqa=gqa,
                        kernel_options=options)  # fmt: skip

        if warm_up is None:
            return Prepared(fn, backend=f"flex: {label(case)}")
        try:
            warm_up(fn, q, k, v)
        except Exception as err:  # inductor's error types move between torch versions
            if "NoValidChoices" not in str(err):
                raise
            errors.append(f"{options or 'AUTO'}: {str(err).splitlines()[0]}")
            continue
        return Prepared(fn, backend=f"flex {'TRITON' if options else 'AUTO'}: {label(case)}")
    raise Unsupported("FlexAttention found no kernel for this case: " + "; ".join(errors))


# AUTO, then the general Triton kernel (newer torch spells it BACKEND, older
# FORCE_USE_FLEX_ATTENTION).
_ATTEMPTS: tuple[dict | None, ...] = (
    None,
    {"BACKEND": "TRITON"},
    {"FORCE_USE_FLEX_ATTENTION": True},
)
