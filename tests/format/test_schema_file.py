from ninfer_format.json_schema import SCHEMA_PATH, render


def test_committed_json_schema_is_current():
    assert SCHEMA_PATH.read_text() == render(), (
        "schemas/ninfer-v3.schema.json is stale: run `make schema` and commit it"
    )


def test_schema_is_closed_and_strict():
    import json

    schema = json.loads(render())
    tensor = schema["$defs"]["Tensor"]
    assert tensor["additionalProperties"] is False
    assert set(tensor["required"]) == {"id", "kind", "shape", "format", "layout", "offset", "bytes"}
