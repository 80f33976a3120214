"""Run one case in this process: inputs, preparation, accuracy check, timing, peak memory.

Called by the worker subprocess (fa_bench.run.worker). Every expected failure becomes a
status with its message; the caller never sees an exception from a case.
"""

from __future__ import annotations

import dataclasses
import gc
import time
import traceback
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

from fa_bench import models, registry
from fa_bench.case import Case, DType, Mode, Status
from fa_bench.results.record import CaseRecord, Latency
from fa_bench.run.timing import Timing, TimingConfig, measure, summarize
from fa_bench.telemetry.session import TelemetrySession, case_telemetry

if TYPE_CHECKING:
    import torch

# What an implementation's prepared function returns: the attention output.
TensorFn = Callable[..., "torch.Tensor"]


@dataclass(frozen=True)
class ExecOptions:
    timing: TimingConfig = field(default_factory=TimingConfig)
    seed: int = 0
    check_accuracy: bool = True
    # NVML opened once by the worker; None (a direct caller) records telemetry as absent.
    telemetry: TelemetrySession | None = None


def case_seed(base: int, case: Case) -> int:
    """Fresh inputs per case, reproducible for the same run seed."""
    return (base * 1_000_003 + zlib.crc32(case.id.encode())) % (2**31)


def make_inputs(
    case: Case, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    import torch

    from fa_bench.run.variant_inputs import input_shape

    # An fp8 case's inputs are made in bf16 and quantised per tensor (run/fp8_inputs.py).
    dt = torch.bfloat16 if case.dtype is DType.FP8_E4M3 else case.dtype.torch()
    # (B, S): a packed (varlen) case's documents back to back in one (1, H, T, D) sequence.
    batch, seqlen_q, seqlen_k = input_shape(case)
    q = torch.randn(batch, case.heads_q, seqlen_q, case.head_dim, device=device, dtype=dt)
    k = torch.randn(batch, case.heads_kv, seqlen_k, case.head_dim, device=device, dtype=dt)
    v = torch.randn_like(k)
    do = torch.randn_like(q)
    if case.mode is Mode.DECODE:
        from fa_bench.run.decode_inputs import fill_padding

        # The dense cache past each context length: large values no one may read.
        fill_padding(case, k, v)
    return q, k, v, do


def _is_oom(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(exc)
    # CUDA's caching allocator and cuDNN say "out of memory" / ALLOC_FAILED; the CPU
    # allocator says "DefaultCPUAllocator: can't allocate memory" (c10/core/impl/alloc_cpu).
    return any(sign in text.lower() for sign in _OOM_SIGNS)


_OOM_SIGNS = ("out of memory", "cudnn_status_alloc_failed", "can't allocate memory")


def run_case(
    case: Case, device: torch.device, opts: ExecOptions, impl_options: dict | None = None
) -> CaseRecord:
    """Measure one case; returns its result record.

    `impl_options` go to the implementation's builder (`fa-bench sweep` passes a kernel
    config this way)."""
    import torch

    impl = registry.get(case.impl)
    reason = impl.unsupported_reason(case, device)
    if reason:
        return CaseRecord.for_case(case, device, Status.UNSUPPORTED, error=reason)
    if opts.timing.cuda_graph and case.mode.backward:
        return CaseRecord.for_case(
            case,
            device,
            Status.UNSUPPORTED,
            error="--cuda-graph times forward only (a captured backward cannot reset grads)",
        )
    torch.manual_seed(case_seed(opts.seed, case))
    try:
        return _run(case, impl, device, opts, impl_options)
    except registry.Unsupported as exc:
        return CaseRecord.for_case(case, device, Status.UNSUPPORTED, error=str(exc))
    except Exception as exc:
        status = Status.OOM if _is_oom(exc) else Status.ERROR
        return CaseRecord.for_case(
            case,
            device,
            status,
            error=f"{type(exc).__name__}: {exc}"[:2000],
            traceback=None if status is Status.OOM else traceback.format_exc()[-4000:],
        )
    finally:
        gc.collect()
        if getattr(device, "type", "") == "cuda":
            torch.cuda.empty_cache()


def _run(
    case: Case,
    impl: registry.Impl,
    device: torch.device,
    opts: ExecOptions,
    impl_options: dict | None,
) -> CaseRecord:
    q, k, v, do = make_inputs(case, device)
    from fa_bench.run.fp8_inputs import case_inputs

    # an fp8 case: quantised, V's layout made, outside the timed span (else unchanged)
    q, k, v, impl_options, fp8 = case_inputs(case, q, k, v, impl_options)
    t_prepare = time.perf_counter()
    prepared = impl.prepare(case, q, k, v, impl_options)
    # Preparation (compilation for Triton on a GPU) is outside the timed span; its
    # wall time is reported on its own.
    prepare_s = round(time.perf_counter() - t_prepare, 4)
    fn = cast(TensorFn, prepared.fn)
    grads_needed = case.mode.backward

    accuracy = None
    if opts.check_accuracy and fp8 is not None:
        from fa_bench.run.accuracy import check_fp8_accuracy

        accuracy = check_fp8_accuracy(case, *fp8.dequantised(), fn(q, k, v))
    elif opts.check_accuracy:
        accuracy = _check(case, fn, q, k, v, do if grads_needed else None)

    closure, before = _timed_call(case, impl, fn, q, k, v, do)
    clock = opts.telemetry.clock_probe() if opts.telemetry is not None else None
    timing = measure(closure, device=device, config=opts.timing, before=before, clock=clock)
    derived = None
    if case.mode is Mode.BWD and not impl.backward_reruns:
        timing, derived = _subtract_forward(timing, fn, q, k, v, device, opts)

    latency = Latency.from_json(timing.stats(), case.id)
    median = latency.median
    flops, nbytes = models.case_flops(case), models.case_bytes(case)
    mismatch = accuracy is not None and not accuracy["passed"]
    return CaseRecord.for_case(
        case,
        device,
        Status.MISMATCH if mismatch else Status.OK,
        error=_mismatch_message(accuracy) if accuracy is not None and mismatch else None,
        backend=prepared.backend,
        derived=derived,
        latency_ms=latency,
        timing=_timing_meta(timing, opts.timing),
        tflops=models.tflops(flops, median) if median > 0 else None,
        gbps_model=models.gbps(nbytes, median) if median > 0 else None,
        peak_mem_bytes=_peak_memory(closure, before, device),
        accuracy=accuracy,
        # Its own >= 1 s window after timing, with the same closure and `before`.
        telemetry=case_telemetry(
            opts.telemetry, case, closure, before, median_ms=median, derived=derived is not None
        ),
        prepare_s=prepare_s,
        fp8_scales=fp8.scales() if fp8 is not None else None,
    )


def _timed_call(
    case: Case,
    impl: registry.Impl,
    fn: TensorFn,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    do: torch.Tensor,
) -> tuple[Callable[[], object], Callable[[], None] | None]:
    """The call to time for the case's mode, and what runs before each call (outside the
    timed span): a backward starts from fresh grads, so none accumulate into the timing."""
    if not case.mode.backward:  # fwd and decode
        return (lambda: fn(q, k, v)), None
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))

    def reset_grads() -> None:
        qg.grad = kg.grad = vg.grad = None

    closure: Callable[[], object]
    if case.mode is Mode.FWD_BWD or not impl.backward_reruns:

        def closure() -> None:
            fn(qg, kg, vg).backward(do)

    else:  # backward alone, replayed on one forward's graph
        out = fn(qg, kg, vg)

        def closure() -> None:
            out.backward(do, retain_graph=True)

    return closure, reset_grads


def _check(
    case: Case,
    fn: TensorFn,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    do: torch.Tensor | None,
) -> dict:
    from fa_bench.run.accuracy import check_accuracy

    if do is None:
        return check_accuracy(case, q, k, v, fn(q, k, v))
    qg, kg, vg = (t.detach().requires_grad_(True) for t in (q, k, v))
    out = fn(qg, kg, vg)
    out.backward(do)
    return check_accuracy(case, q, k, v, out.detach(), do=do, dq=qg.grad, dk=kg.grad, dv=vg.grad)


def _subtract_forward(
    fwd_bwd: Timing,
    fn: TensorFn,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    device: torch.device,
    opts: ExecOptions,
) -> tuple[Timing, str]:
    """Backward time for implementations whose backward cannot be replayed."""
    fwd = measure(lambda: fn(q, k, v), device=device, config=opts.timing)
    fwd_median = summarize(fwd.samples_ms)["median"]
    samples = [s - fwd_median for s in fwd_bwd.samples_ms]
    note = (
        f"fwd_bwd samples minus the forward median ({fwd_median:.4g} ms): "
        "this implementation's backward cannot be re-run with retain_graph"
    )
    return dataclasses.replace(fwd_bwd, samples_ms=samples), note


def _timing_meta(timing: Timing, cfg: TimingConfig) -> dict:
    return {
        "method": timing.method,
        "stop_reason": timing.stop_reason,
        "warmup_calls": timing.warmup_calls,
        "l2_flush": timing.l2_flush,
        # how the L2 was flushed ("read", "zero"; null: no flush); files before it lack it
        "l2_flush_op": timing.l2_flush_op,
        "target_noise": cfg.target_noise,
        "min_samples": cfg.min_samples,
        "max_time_s": cfg.max_time_s,
        "warmup_ms": cfg.warmup_ms,
        # NVML's SM clock while the samples ran (telemetry on); null without it.
        "sm_clock_mhz": timing.clock_stats(),
    }


def _peak_memory(
    closure: Callable[[], object], before: Callable[[], None] | None, device: torch.device
) -> int | None:
    """Bytes allocated above what was live before one call (inputs, saved activations)."""
    import torch

    if getattr(device, "type", "") != "cuda":
        return None  # the CPU allocator keeps no peak statistics
    if before:
        before()
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    closure()
    torch.cuda.synchronize(device)
    return int(torch.cuda.max_memory_allocated(device) - base)


def _mismatch_message(accuracy: dict) -> str:
    bad = [
        f"{name}: {t['nonfinite']} non-finite values"
        if t.get("nonfinite")
        else f"{name}: max_abs_err {t['max_abs_err']:.3g} > tolerance {t['tolerance']:.3g}"
        for name, t in accuracy.get("tensors", {}).items()
        if not t.get("passed", True)
    ]
    return "accuracy check failed: " + ("; ".join(bad) or "non-finite output")
