"""Comparing two runs: matching cases, the statistics behind a verdict, and the terminal /
Markdown / JSON output.
"""
