"""NVML telemetry: the library binding, the per-case measurement window, the fields derived
from it and the environment it reports.
"""
