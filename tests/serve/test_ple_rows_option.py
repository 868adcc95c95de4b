"""``--ple-rows`` (Qwen4Exp's ``ple_rows`` model option) on both command lines: ``ninfer`` and
``ninfer-serve`` (flag or ``[engine] ple_rows``) pass it as ``Engine(model_options=...)``, pass
nothing when it is not given, refuse a value not in the list, and a model that takes no such
option refuses it at load in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import ninfer_runtime.engine
from ninfer_convert.pipeline import convert
from ninfer_runtime.cli import PLE_ROWS_CHOICES
from ninfer_runtime.cli import main as ninfer_cli
from ninfer_runtime.errors import EngineError
from ninfer_serve import cli as serve_cli
from ninfer_serve.config import ConfigError, Settings, load_settings

from .conftest import BUNDLED


@pytest.fixture(scope="module")
def artifact(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled Qwen3.5 model, whose architecture takes no model options."""
    path = tmp_path_factory.mktemp("ple_rows") / "tiny.ninfer"
    convert("qwen3_5_bf16", {"base": str(BUNDLED)}, path, components=("text",))
    return path


def engine_options(monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    """The ``model_options`` ``ninfer ARGS`` builds its engine with (the engine is not built)."""
    seen: dict[str, Any] = {}

    def recording_engine(*_args: Any, **kwargs: Any) -> None:
        seen.update(kwargs)
        raise EngineError("stopped before loading")

    monkeypatch.setattr(ninfer_runtime.engine, "Engine", recording_engine)
    result = CliRunner().invoke(ninfer_cli, [*args, "--prompt", "hi"])
    assert "stopped before loading" in result.output, result.output
    return seen["model_options"]


def test_ninfer_passes_the_option(artifact: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    streamed = engine_options(monkeypatch, str(artifact), "--ple-rows", "streamed")
    assert streamed == {"ple_rows": "streamed"}
    assert engine_options(monkeypatch, str(artifact)) is None
    from ninfer_runtime.models.qwen4_exp.ple_rows import PLE_ROWS_MODES

    assert PLE_ROWS_CHOICES == PLE_ROWS_MODES  # the flag offers what the model takes
    bad = CliRunner().invoke(ninfer_cli, [str(artifact), "--prompt", "hi", "--ple-rows", "x"])
    assert bad.exit_code == 2 and "'x' is not one of 'auto', 'resident', 'streamed'" in bad.output


def test_a_model_without_the_option_refuses_it(artifact: Path) -> None:
    result = CliRunner().invoke(
        ninfer_cli, [str(artifact), "--prompt", "hi", "--ple-rows", "resident"]
    )
    assert result.exit_code == 1
    assert result.output == "ninfer: error: model option 'ple_rows' is not built for qwen3_5_text\n"


def test_ninfer_serve_reads_the_flag_and_the_config(
    artifact: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[Settings] = []
    monkeypatch.setattr(serve_cli, "serve", lambda _model, settings: served.append(settings) or 0)
    config = tmp_path / "ninfer.toml"
    config.write_text("[engine]\nple_rows = 'resident'\n")
    for args in ([], ["--config", str(config)], ["--config", str(config), "--ple-rows", "auto"]):
        result = CliRunner().invoke(serve_cli.main, [str(artifact), *args])
        assert result.exit_code == 0, result.output
    assert [s.engine.model_options() for s in served] == [
        None,
        {"ple_rows": "resident"},
        {"ple_rows": "auto"},
    ]
    config.write_text("[engine]\nple_rows = 'sometimes'\n")
    with pytest.raises(ConfigError, match=r"engine\.ple_rows: 'sometimes': expected one of auto"):
        load_settings(config, {})
