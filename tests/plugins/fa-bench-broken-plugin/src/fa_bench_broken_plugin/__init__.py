"""Its entry point names `register_all`, but importing the package already fails."""

import fa_bench_missing_dependency_ep  # noqa: F401  (not installed anywhere)


def register_all() -> None:
    raise AssertionError("never reached")
