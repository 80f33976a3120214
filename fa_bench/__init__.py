"""fa-bench: benchmark and profile attention implementations on NVIDIA GPUs."""

__version__ = "0.1.0"
