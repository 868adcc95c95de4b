"""Histogram buckets the request series share, in seconds or tokens."""

from __future__ import annotations

__all__ = ["LATENCY", "TOKENS", "TOKEN_LATENCY"]

#: a whole request or one of its phases (queue, prefill, first token, end to end)
LATENCY = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
#: the gap between consecutive generated tokens
TOKEN_LATENCY = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
)
#: a prompt's or a generation's length
TOKENS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)
