"""Generate ``schemas/ninfer-v3.schema.json`` from the pydantic models.

Run ``python -m ninfer_format.json_schema`` after changing ``schema.py``; a test fails while
the committed file is stale.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .schema import Directory

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "schemas" / "ninfer-v3.schema.json"


def render() -> str:
    schema = Directory.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "ninfer v3 artifact directory"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else SCHEMA_PATH
    target.write_text(render())
    print(f"wrote {target}")
