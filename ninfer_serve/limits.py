"""Request limits every front door applies alike, so one API cannot take what another refuses.

Each lives here once, with the check that names the client's field; the wire models state
them in the published schema from the same constants.
"""

from __future__ import annotations

from .errors import ApiError

__all__ = ["MAX_STOP", "check_stop_count"]

#: the most stop strings a request may give (Chat ``stop``, Anthropic ``stop_sequences``):
#: every generated token is matched against each of them
MAX_STOP = 16


def check_stop_count(stop: str | list[str] | None, param: str) -> None:
    """Refuse more than ``MAX_STOP`` stop strings in the field ``param``."""
    if isinstance(stop, list) and len(stop) > MAX_STOP:
        raise ApiError(
            400,
            f"{param}: at most {MAX_STOP} stop strings, not {len(stop)}",
            code="invalid_value",
            param=param,
        )
