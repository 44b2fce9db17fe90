"""The report's one error type."""

from __future__ import annotations

from .._exceptions import ConfigurationError


class ReportError(ConfigurationError):
    """Input the report cannot use; the message says what is missing or what was compared."""
