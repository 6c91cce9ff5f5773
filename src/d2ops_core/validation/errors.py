"""Exceptions whose class names are error names Step Functions routes on (keep the names stable)."""

from __future__ import annotations


class DatasetNotFound(Exception):
    """The dataset version has no manifest.json (nothing was uploaded, or not yet)."""


class DatasetUnreadable(Exception):
    """The dataset's location cannot be read at all (bucket missing, access denied, not a directory)."""


class SourceFileError(Exception):
    """One file of the dataset cannot be read; reported as FILE_UNREADABLE, validation goes on."""


class ObjectChanged(SourceFileError):
    """An object changed or was deleted after validation listed it (OBJECT_CHANGED): it must not reach the run."""
