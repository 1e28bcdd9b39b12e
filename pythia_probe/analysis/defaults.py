"""The analyses' defaults the commands' flags show, in a module that imports no torch (the
sweep's ``--help``)."""

DEFAULT_CHUNK = 4096
"""Vocabulary columns per block of a target matrix (``--chunk``)."""
