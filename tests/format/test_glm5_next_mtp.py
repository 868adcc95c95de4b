"""The GLM5Next binder checks an ``mtp`` component against the MTP block's parameters (the
layout the converter reads): bound completely it is clean, a missing or stray MTP parameter is
one error, and the component must draft for the text one."""

from __future__ import annotations

from typing import Any

from ninfer_format.binders import bind
from ninfer_format.binders.glm5_next import expected_parameters
from ninfer_format.binders.qwen3_5 import Role
from tests.format.test_binders import Doc, directory
from tests.format.test_glm5_next_geometry import _good_config


def _artifact(drop: str | None = None, extra: str | None = None, target: str = "text") -> Any:
    config = _good_config() | {"architectures": ["Glm5NextForConditionalGeneration"]}
    d = Doc()
    roles = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
    resources = {role: d.resource(role) for role in (*roles, "generation_config.json")}
    d.doc["components"]["text"] = {"config": config, "resources": resources}
    d.doc["components"]["mtp"] = {"config": {"architectures": ["Glm5NextMTP"]}, "target": target}
    for spec in expected_parameters(config, components=("text", "mtp")):
        if spec.name != drop:
            fmt = "fp32" if spec.role is Role.FP32_VECTOR else "bf16"
            d.param(spec.name, list(spec.shape), list(spec.inputs), fmt)
    if extra is not None:
        d.param(extra, [4], [], "bf16")
    return directory(d.finish())


def test_a_complete_mtp_component_binds_cleanly() -> None:
    report = bind(_artifact())
    assert report.ok and not report.warnings, (report.errors, report.warnings)
    assert report.parameters["mtp/input_projection"] == (32, 64)
    assert report.parameters["mtp/layers/0/indexer/pool_position"] == (4, 8)
    assert report.parameters["mtp/layers/0/moe/experts/3/down"] == (32, 16)


def test_mtp_parameters_are_checked() -> None:
    missing = bind(_artifact(drop="mtp/layers/0/mla/kv_down"))
    assert missing.errors == ["mtp/layers/0/mla/kv_down: not bound (expected shape [8, 32])"]
    stray = bind(_artifact(extra="mtp/layers/0/kda/norm"))
    assert stray.errors == ["mtp/layers/0/kda/norm: bound but not a parameter of this model"]
    wrong = bind(_artifact(target="mtp"))
    assert wrong.errors == ['mtp component must have target "text", got "mtp"']
