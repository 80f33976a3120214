"""Suites: reading a suite's TOML (parse) and expanding it into cases with the command line's
overrides (expand).
"""
