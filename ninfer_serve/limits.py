"""Request limits every front door applies alike, so one API cannot take what another refuses.

Each lives here once, with the check that names the client's field; the wire models state
them in the published schema from the same constants.
"""

from __future__ import annotations

from ninfer_runtime.lane_limits import COMMON_LANES

from .errors import ApiError

__all__ = [
    "MAX_CHOICES",
    "MAX_SAMPLES",
    "MAX_STOP",
    "MAX_TEMPLATE_KWARGS",
    "MAX_TEMPLATE_KWARGS_BYTES",
    "check_sample_count",
    "check_stop_count",
]

#: the most stop strings a request may give (Chat ``stop``, Anthropic ``stop_sequences``):
#: every generated token is matched against each of them
MAX_STOP = 16
#: the most strings a choice constraint (``guided_choice``) may list: each is a branch of the
#: grammar every answer token is checked against
MAX_CHOICES = 256
#: the most entries ``chat_template_kwargs`` may hold, and the most bytes of JSON: the
#: template sees each as a variable, and a prompt is rendered once or twice per request
MAX_TEMPLATE_KWARGS = 32
MAX_TEMPLATE_KWARGS_BYTES = 16 * 1024
#: the most samples a request may ask for (Chat and Completions ``n``) on any server: the
#: lanes every backend runs, so the published schema is one for all of them. A server takes
#: at most its own lanes (``check_sample_count``)
MAX_SAMPLES = COMMON_LANES


def check_stop_count(stop: str | list[str] | None, param: str) -> None:
    """Refuse more than ``MAX_STOP`` stop strings in the field ``param``."""
    if isinstance(stop, list) and len(stop) > MAX_STOP:
        raise ApiError(
            400,
            f"{param}: at most {MAX_STOP} stop strings, not {len(stop)}",
            code="invalid_value",
            param=param,
        )


def check_sample_count(n: int, lanes: int, param: str = "n") -> None:
    """Refuse more samples than the server has decode lanes: each sample holds a lane, and
    with more of them than lanes a request would wait on its own samples (and could be
    refused by a queue it fills itself)."""
    if n > lanes:
        raise ApiError(
            400,
            f"{param}: at most {lanes} samples on this server (its decode lanes), not {n}",
            code="invalid_value",
            param=param,
        )
