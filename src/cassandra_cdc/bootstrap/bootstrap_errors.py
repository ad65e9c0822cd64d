"""The one error a bootstrap raises: what failed, and what to do about it."""

from __future__ import annotations


class BootstrapError(RuntimeError):
    """A bootstrap that cannot start (no schema, SSTables of another table, ...) or did not finish.

    A run that failed midway has recorded the tasks it completed: running it again resumes.
    """
