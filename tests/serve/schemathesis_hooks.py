"""Schemathesis hooks for ``test_schemathesis``: name the served model in generated bodies.

A request for another model is a valid 404, so without this nearly every generated chat or
messages body would stop at the model check and the rest of the request would go untested.
"""

from __future__ import annotations

import os

import schemathesis

MODEL = os.environ.get("NINFER_TEST_MODEL", "tiny")


@schemathesis.hook
def map_body(context, body):  # type: ignore[no-untyped-def]
    if isinstance(body, dict) and "model" in body:
        body["model"] = MODEL
    return body
