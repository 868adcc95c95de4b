import copy
import json

import pytest

from ninfer_format.errors import DirectoryError
from ninfer_format.jsontext import parse_directory_text
from ninfer_format.validate import check_directory, parse_directory

from .helpers import load_example


def problems(document, entry="a.ninfer"):
    try:
        check_directory(parse_directory(document), entry)
    except DirectoryError as exc:
        return exc.problems
    return []


@pytest.fixture
def example():
    return load_example("artifact-v3-mixed-sharded.json")


def test_examples_validate():
    for name in ("artifact-v3-text.json", "artifact-v3-mixed-sharded.json"):
        assert problems(load_example(name), name.replace(".json", ".ninfer")) == []


@pytest.mark.parametrize(
    "text, message",
    [
        (b'{"a":1,"a":2}', "duplicate member 'a'"),
        (b'{"a":{"b":1,"b":1}}', "duplicate member 'b'"),
        (b'{"a":NaN}', "NaN"),
        (b'{"a":-Infinity}', "-Infinity"),
        (b'{"a":1e999}', "finite"),
        (b"\xef\xbb\xbf{}", "byte-order mark"),
        (b'{"a":"\xff"}', "UTF-8"),
        (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
        (b'{"a":', "Expecting value"),
        (b'{"a":' + b"9" * 5000 + b"}", "JSON directory"),
    ],
)
def test_json_text_rules(text, message):
    with pytest.raises(DirectoryError, match=message):
        parse_directory_text(text)


def test_trailing_whitespace_is_legal():
    assert parse_directory_text(b'{"a": 1}   \n\t ') == {"a": 1}


def mutate(doc, path, value):
    doc = copy.deepcopy(doc)
    target = doc
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return doc


@pytest.mark.parametrize(
    "path, value, message",
    [
        (["objects", 0, "offset"], True, "objects[0]<resource>.offset"),
        (["objects", 0, "offset"], 1.0, "valid integer"),
        (["objects", 0, "offset"], -1, "greater than or equal to 0"),
        (["objects", 0, "offset"], 2**64, "less than or equal"),
        (["objects", 0, "bytes"], 0, "greater than or equal to 1"),
        (["objects", 0, "kind"], "blob", "does not match any of the expected tags"),
        (["objects", 5, "shape"], [256, 0], "greater than or equal to 1"),
        (["objects", 5, "shape"], [1] * 17, "at most 16"),
        (["objects", 5, "shape"], [2**40, 2**40], "64 bits"),
        (["objects", 5, "extra"], 1, "Extra inputs"),
        (["objects", 5, "id"], "", "at least 1 character"),
        (["objects", 5, "id"], "a\x00b", "should match pattern"),
        (["files", 0, "payload_bytes"], 0, "greater than or equal to 1"),
        (["uses", 0, "activation_policy"], "AllowA2", "A16Only"),
        (["bindings"], KeyError, "bindings: Field required"),
        (["zzz"], {}, "zzz: Extra inputs"),
        (["objects"], [], "at least 1"),
        (["components", "text", "proposal"], {"domain": "full", "rows": 3}, "must not have rows"),
        (["components", "text", "proposal"], {"domain": "indexed"}, "requires rows"),
    ],
)
def test_schema_rules(example, path, value, message):
    found = problems(mutate(example, path, value))
    assert any(message in p for p in found), found


@pytest.mark.parametrize(
    "path, value, message",
    [
        (["objects", 1, "id"], "r.tokenizer", "duplicate object id"),
        (["objects", 1, "offset"], 5, "overlaps"),
        (["objects", -1, "offset"], 140_246_016, "runs past the payload"),
        (["files", 0, "path"], "x", "files[0].path: must be null"),
        (["files", 1, "path"], "../x", "plain sibling"),
        (["files", 1, "path"], "artifact-v3-mixed-sharded.ninfer.part-0002", "appears twice"),
        (["files", 1, "path"], "a.ninfer", "entry file itself"),
        (["components", "mtp"], {"config": {}, "target": "nope"}, "missing component 'nope'"),
        (["components", "text", "resources", "tokenizer.json"], "w.head", "not a resource"),
        (["components", "text", "resources", "x"], "nothing", "does not exist"),
        (["components", "vision"], {"config": {}, "proposal": {"domain": "full"}}, "only the text"),
        (["bindings", "x"], {"object": "r.tokenizer"}, "is a resource"),
        (["bindings", "x"], {"object": "nope"}, "does not exist"),
        (["bindings", "x"], {"parts": [{"object": "w.head", "range": [0, 10**9]}]}, "ends past"),
        (["bindings", "x"], {"parts": [{"object": "w.head", "range": [5, 5]}]}, "begin < end"),
        (["bindings", "x"], {"object": "w.head", "parts": []}, "Extra inputs"),
        (["uses", 0, "parameter"], "nope", "has no binding"),
        (["uses", 1], None, "duplicate use"),
        (["metadata", "name"], "", "metadata.name"),
    ],
)
def test_cross_reference_rules(example, path, value, message):
    if path == ["uses", 1]:
        value = copy.deepcopy(example["uses"][0])
    if path[0] == "components" and len(path) == 2:
        doc = copy.deepcopy(example)
        doc["components"][path[1]] = value
    else:
        doc = mutate(example, path, value)
    found = problems(doc)
    assert any(message in p for p in found), found


def test_missing_text_component(example):
    doc = copy.deepcopy(example)
    doc["components"] = {"mtp": doc["components"].pop("text")}
    assert any("'text' is missing" in p for p in problems(doc))


def test_all_problems_are_reported_together(example):
    doc = mutate(example, ["objects", 1, "offset"], 5)
    doc = mutate(doc, ["uses", 0, "parameter"], "nope")
    assert len(problems(doc)) >= 2


def test_document_round_trip_keeps_member_order(example):
    directory = parse_directory(example)
    doc = directory.to_document()
    assert list(doc) == [
        "components",
        "objects",
        "bindings",
        "uses",
        "metadata",
        "provenance",
        "files",
    ]
    assert doc["files"][0] == {"path": None, "payload_bytes": 63934464}
    assert json.loads(json.dumps(doc)) == doc
    assert "divisors" not in doc["objects"][5]
