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

A forward sweep of the Gluon kernel (`fa-bench sweep --kernel gluon`) carries a Gluon
launch as the FlashConfig's `gluon_*` fields, every one set (kernels/gluon_fields.py);
its label is the Gluon config's, "gluon-ws-m64-n128-s3", as a backend string names it.

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


def label(fields: Mapping[str, object]) -> str:
    """The one label format, e.g. "bm128-bn64-w4-s3", for one mode's fields; a Gluon
    launch's fields: its `gluon_label`."""
    if fields_kernel(fields) == "gluon":
        return gluon_label(fields)
    s = short_fields(fields)  # type: ignore[arg-type]
    return f"bm{s['block_m']}-bn{s['block_n']}-w{s['num_warps']}-s{s['num_stages']}"


# Which kernel a forward sweep times: the `tl` kernel's four fields, or one Gluon launch
# named by the FlashConfig's gluon_* fields (kernels/gluon_fields.py), all of them set.
KERNELS = ("tl", "gluon")
GLUON_MARK = "gluon_variant"  # a field dict holding it names a Gluon launch


def fields_kernel(fields: Mapping[str, object]) -> str:
    """The forward kernel whose launch `fields` names: "gluon" or "tl"."""
    return "gluon" if GLUON_MARK in fields else "tl"


def gluon_label(fields: Mapping[str, object]) -> str:
    """A pinned Gluon launch's label, as a backend string names it:
    "gluon-" + GluonConfig.label(), e.g. "gluon-ws-m64-n128-s3-persist"."""
    from fa_bench.kernels.gluon_fields import pinned

    return "gluon-" + pinned(fields).label()


def row_config(fields: Mapping[str, object]) -> dict[str, object]:
    """sweep.json's `config` of a row: the four short fields of a `tl` config; for a Gluon
    launch its GluonConfig fields under the same four names (block_m: rows per consumer
    warpgroup or per CTA, block_n, num_warps, num_stages: the ring depth) and the rest."""
    if fields_kernel(fields) == "tl":
        return dict(short_fields(fields))  # type: ignore[arg-type]
    from fa_bench.kernels.gluon_fields import pinned

    g = pinned(fields)
    return {"block_m": g.block_m, "block_n": g.block_n, "num_warps": g.num_warps,
            "num_stages": g.stages, "variant": g.variant, "pingpong": g.pingpong,
            "persistent": g.persistent, "consumers": g.consumers,
            "q_buffers": g.q_buffers}  # fmt: skip


def config_label(cfg: object, mode: str = "fwd_bwd") -> str:
    """A FlashConfig's label for a run of `mode`, as the `triton` backend string shows it:
    the forward label, "bwd-" and the backward label, or both for `fwd_bwd` ("a/bwd-b")."""
    fwd = label(mode_fields(cfg, "fwd"))
    bwd = "bwd-" + label(mode_fields(cfg, "bwd"))
    return {"fwd": fwd, "bwd": bwd}.get(mode, f"{fwd}/{bwd}")
