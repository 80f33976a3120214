"""The cores behind `cli.py`'s commands: keyword-only functions, one per command, and the flags
they share.
"""
