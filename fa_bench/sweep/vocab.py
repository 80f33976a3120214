"""The sweep's config vocabulary, in one place: which FlashConfig fields a sweep of each
mode varies, the names sweep.json gives them whatever the mode, and the label that names
a config wherever one is shown.

A sweep (and a tuning cache entry) of mode `fwd` sets the forward kernel's four fields,
one of mode `bwd` the backward kernels' four `bwd_*` fields; the rest of a FlashConfig
stays at the heuristic's values. sweep.json's `config` holds the four under the forward
names (`block_m`, `block_n`, `num_warps`, `num_stages`) for either mode, so the report
reads one shape.

A label is `bm{block_m}-bn{block_n}-w{num_warps}-s{num_stages}` of a mode's four fields,
e.g. "bm128-bn64-w4-s3": sweep.json's rows and case summaries, the terminal's table and
progress line, and the report show it; a run's backend string names its config with
`config_label`, where a backward config carries a "bwd-" prefix. Nothing parses a label
back: readers keep the fields beside it.

Standard library only: the report and the tuning cache import it without torch.
"""

from __future__ import annotations

from collections.abc import Mapping

SWEEP_MODES = ("fwd", "bwd")
# In label order: the held-or-streamed tile pair, then warps and pipeline stages.
MODE_FIELDS: dict[str, tuple[str, ...]] = {
    "fwd": ("block_m", "block_n", "num_warps", "num_stages"),
    "bwd": ("bwd_block_m", "bwd_block_n", "bwd_num_warps", "bwd_num_stages"),
}
# sweep.json's `config` keys, the same for both modes.
SHORT_FIELDS = MODE_FIELDS["fwd"]


def fields_mode(fields: Mapping[str, object]) -> str:
    """The sweep mode whose fields `fields` holds: "bwd" for `bwd_*` fields, else "fwd"."""
    return "bwd" if MODE_FIELDS["bwd"][0] in fields else "fwd"


def short_fields(fields: Mapping[str, int]) -> dict[str, int]:
    """{"block_m", "block_n", "num_warps", "num_stages"} whatever the mode's field names."""
    names = MODE_FIELDS[fields_mode(fields)]
    return {short: fields[name] for short, name in zip(SHORT_FIELDS, names, strict=True)}


def mode_fields(cfg: object, mode: str) -> dict[str, int]:
    """The fields of a FlashConfig that a sweep of `mode` varies."""
    return {name: getattr(cfg, name) for name in MODE_FIELDS[mode]}


def label(fields: Mapping[str, int]) -> str:
    """The one label format, e.g. "bm128-bn64-w4-s3", for one mode's fields."""
    s = short_fields(fields)
    return f"bm{s['block_m']}-bn{s['block_n']}-w{s['num_warps']}-s{s['num_stages']}"


def config_label(cfg: object, mode: str = "fwd_bwd") -> str:
    """A FlashConfig's label for a run of `mode`, as the `triton` backend string shows it:
    the forward label, "bwd-" and the backward label, or both for `fwd_bwd` ("a/bwd-b")."""
    fwd = label(mode_fields(cfg, "fwd"))
    bwd = "bwd-" + label(mode_fields(cfg, "bwd"))
    return {"fwd": fwd, "bwd": bwd}.get(mode, f"{fwd}/{bwd}")
