"""Helpers the Gluon test files share (tests/test_flash_gluon_bwd*.py, the variant forward's
tests/test_flash_gluon_var*.py): the GPU skip mark, loading a tools/gpu module, and a triton
3.6 to compile with on a CPU. Not a test module (no test_ prefix)."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available() or INTERPRETED, reason="needs CUDA")


def tool(name: str) -> ModuleType:
    """tools/gpu/<name>.py, loaded (its folder on sys.path for its own imports, the module
    in sys.modules: a dataclass in it looks its module up). The compile tools drop
    TRITON_INTERPRET at import (they compile for sm_90): it is put back for the interpreter
    tests that run after in the same process."""
    folder = str(ROOT / "tools" / "gpu")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / "gpu" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    saved = os.environ.get("TRITON_INTERPRET")
    try:
        spec.loader.exec_module(mod)
    finally:
        if saved is not None:
            os.environ["TRITON_INTERPRET"] = saved
    return mod


# triton 3.6 installed aside for the variant forward's compile tests (their tools put it
# first on PYTHONPATH whatever the installed triton is)
TRI36 = os.environ.get("GLUON_TRITON_PATH") or "/tmp/tri36"


def triton36_path() -> str | None:
    """A triton 3.6 to compile with: "" for the installed one, $GLUON_TRITON_PATH's, or
    None (the compile tests skip)."""
    import triton

    from fa_bench.kernels import flash_gluon

    if flash_gluon.version_reason(triton.__version__) is None:
        return ""
    path = os.environ.get("GLUON_TRITON_PATH", "")
    return path if path and Path(path, "triton", "__init__.py").exists() else None


def compile_env(path: str) -> dict[str, str]:
    """The environment of a compile subprocess: that triton and the repository first on
    PYTHONPATH, the interpreter off."""
    keep = os.environ.get("PYTHONPATH", "")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (path, str(ROOT), keep) if p))
    env.pop("TRITON_INTERPRET", None)
    return env


def check_role(head_dim: int, role: str, shape: tuple, causal: bool) -> None:
    """A candidate launch's bf16 gradients within the accuracy rule (tools/gpu/
    gluon_bwd_check.py's check_one) on `shape`."""
    res = tool("gluon_bwd_check").check_one(shape, "bf16", head_dim, causal, against_det=False,
                                            role=role)  # fmt: skip
    assert res["ok"], res


def check_fp16_and_det(head_dim: int, role: str, causal: bool, shape: tuple) -> None:
    """The launch's fp16 gradients within the rule, and its bf16 ones within the rule's
    tolerance of the deterministic backward's."""
    check = tool("gluon_bwd_check")
    res = check.check_one(shape, "fp16", head_dim, causal, against_det=False, role=role)
    assert res["ok"], res
    res = check.check_one(shape, "bf16", head_dim, causal, against_det=True, role=role)
    assert res["ok"] and res.get("det_match") is True, res
