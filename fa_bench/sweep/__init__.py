"""Kernel config sweeps: the search space, the parallel compile phase, timing the points, and
the tuning cache the best configs go to.
"""
