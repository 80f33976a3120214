"""What this machine is: host, versions, GPUs. Recorded in every results file."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from pathlib import Path

from fa_bench import __version__


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


# Other projects' kernels that fa-bench runs when installed (fa_bench/kernels/peers.py),
# and what they are built on, by pip name: their versions go into every results file.
PEER_PACKAGES = ("flash-attn-4", "nvidia-cutlass-dsl", "flash-attn", "xformers")


def package_versions(names: tuple[str, ...] = PEER_PACKAGES) -> dict[str, str | None]:
    """Each pip distribution's installed version, None where it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def nvidia_driver() -> tuple[str | None, str | None]:
    """(driver version, reason it is unknown)."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return None, f"NVML unavailable: {exc}"
    try:
        version = pynvml.nvmlSystemGetDriverVersion()
        return (version.decode() if isinstance(version, bytes) else version), None
    finally:
        pynvml.nvmlShutdown()


def gpu_info(index: int) -> dict:
    import torch

    p = torch.cuda.get_device_properties(index)
    return {
        "index": index,
        "name": p.name,
        "uuid": str(getattr(p, "uuid", "")) or None,
        "memory_bytes": int(p.total_memory),
        "sm_count": int(p.multi_processor_count),
        "compute_capability": f"{p.major}.{p.minor}",
        "l2_bytes": int(getattr(p, "L2_cache_size", 0)) or None,
    }


def collect_env(device: object | None = None) -> dict:
    """Versions and hardware; `device` (a torch.device) names the GPU the run uses."""
    import torch

    cuda_ok = torch.cuda.is_available()
    driver, driver_note = nvidia_driver() if cuda_ok else (None, "no CUDA device")
    gpus = [gpu_info(i) for i in range(torch.cuda.device_count())] if cuda_ok else []
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "fa_bench": __version__,
        "torch": torch.__version__,
        "triton": _triton_version(),
        "packages": package_versions(),
        "cuda": torch.version.cuda,
        "cudnn": cudnn,
        "driver": driver,
        "driver_note": driver_note,
        "device": str(device) if device is not None else None,
        "gpus": gpus,
    }


def cpu_threads() -> dict:
    """The threads CPU work ran with (the worker sets them: fa_bench.run.timing's
    worker_threads), and the OpenMP/MKL settings it started with (None: unset). The
    worker's env only: in `fa-bench env` this process's count would say nothing of a run."""
    import torch

    return {
        "cpu_threads": torch.get_num_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "mkl_num_threads": os.environ.get("MKL_NUM_THREADS"),
    }


def git_sha(path: Path | None = None) -> str | None:
    """The checkout's commit when fa-bench runs from a git clone, with '+dirty' if changed."""
    root = Path(path or Path(__file__).resolve().parent.parent)
    try:
        sha = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("+dirty" if dirty else "") if sha else None


def cudnn_version(value: object) -> str:
    """cuDNN's version as torch reports it (`torch.backends.cudnn.version()`, an int) in
    dotted form: cuDNN 9 encodes it as major·10000 + minor·100 + patch (91900 is 9.19.0),
    earlier releases as major·1000 + minor·100 + patch (8907 is 8.9.7)."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        return "–" if value is None else str(value)
    major, rest = divmod(value, 10000) if value >= 90000 else divmod(value, 1000)
    return f"{major}.{rest // 100}.{rest % 100}"
