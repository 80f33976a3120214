"""Running cases: the plan and its folder, the runner and its worker subprocess, one case's
execution, timing, the accuracy check, and spreading a run over GPUs or ranks.
"""
