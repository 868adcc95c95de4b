"""What a first session with the commands meets: each mistake gets one line that names the
thing at fault and what to do, and the documentation's commands are the ones that work."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from ninfer_convert.recipe import available_recipes, load_recipe
from ninfer_format.sample import main as sample_cli
from ninfer_format.sample import write_sample
from ninfer_runtime.cli import main as ninfer_cli
from ninfer_runtime.engine import Engine
from ninfer_runtime.errors import EngineError
from ninfer_runtime.sizes import format_size
from ninfer_serve.cli import main as serve_cli
from tests.bundled import BUNDLED

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("new_user") / "sample.ninfer"
    write_sample(path)
    return path


def one_line(output: str) -> str:
    assert output.count("\n") == 1, output
    return output.rstrip("\n")


@pytest.mark.parametrize(
    ("command", "prefix", "args"),
    [(ninfer_cli, "ninfer: ", ["--prompt", "Hi"]), (serve_cli, "ninfer-serve: error: ", [])],
    ids=["ninfer", "ninfer-serve"],
)
def test_a_checkpoint_folder_is_named_with_the_conversion_to_run(command, prefix, args):
    result = CliRunner().invoke(command, [str(BUNDLED), *args])
    assert result.exit_code == 2
    line = one_line(result.output)
    assert line == (
        f"{prefix}{BUNDLED}: is a checkpoint folder, not a .ninfer artifact; convert it first: "
        f"ninfer-convert --recipe NAME --source {BUNDLED} -o model.ninfer "
        "(ninfer-convert --list-recipes names them)"
    )


def test_a_folder_holding_an_artifact_points_at_its_entry_file(sample):
    result = CliRunner().invoke(ninfer_cli, [str(sample.parent), "--prompt", "Hi"])
    assert result.exit_code == 2
    assert one_line(result.output) == (
        f"ninfer: {sample.parent}: is a folder; give the artifact's entry file, e.g. {sample}"
    )


def test_a_missing_chat_template_is_named_not_the_model(sample, tmp_path):
    missing = tmp_path / "mine.jinja"
    result = CliRunner().invoke(serve_cli, [str(sample), "--chat-template", str(missing)])
    assert result.exit_code == 2
    assert one_line(result.output) == (
        f"ninfer-serve: error: chat template {missing}: cannot read: No such file or directory"
    )
    latin1 = tmp_path / "latin1.jinja"
    latin1.write_bytes("{{ 'café' }}".encode("latin-1"))
    result = CliRunner().invoke(serve_cli, [str(sample), "--chat-template", str(latin1)])
    assert result.exit_code == 2
    assert one_line(result.output) == f"ninfer-serve: error: chat template {latin1}: not UTF-8 text"


def test_sample_names_its_force_flag(tmp_path):
    path = tmp_path / "s.ninfer"
    assert CliRunner().invoke(sample_cli, [str(path)]).exit_code == 0
    again = CliRunner().invoke(sample_cli, [str(path)])
    assert again.exit_code == 1
    assert one_line(again.output) == (
        f"ninfer-sample: {path}: already exists; add --force to replace it"
    )
    assert CliRunner().invoke(sample_cli, [str(path), "--force"]).exit_code == 0


def test_sizes_read_in_a_unit_that_fits():
    shown = [format_size(n) for n in (0, 1000, 10 * 1024, 1536, 163840, 3 * 2**20, 24 * 2**30)]
    assert shown == ["0 B", "1000 B", "10 KiB", "1.5 KiB", "160 KiB", "3 MiB", "24 GiB"]


def test_a_small_context_capacity_is_shown_in_its_own_unit(sample):
    with pytest.raises(EngineError) as refused:
        Engine(sample, context_capacity="10KiB")
    message = str(refused.value)
    assert message.startswith("context capacity 10 KiB holds no K/V page: 8 lanes need "), message
    assert re.fullmatch(r"[^\n]* \(>= \d+(\.\d+)? [KM]iB\)", message), message
    assert " 0 MiB" not in message


def test_the_cpu_torch_install_is_the_makefiles():
    makefile = (ROOT / "Makefile").read_text()
    version = re.search(r"^TORCH_VERSION := (\S+)$", makefile, re.M)[1]
    index = re.search(r"^TORCH_CPU_INDEX := (\S+)$", makefile, re.M)[1]
    install = "--extra-index-url $(TORCH_CPU_INDEX) torch==$(TORCH_VERSION)+cpu"
    assert install in makefile  # what `make setup` runs on a CPU machine
    doc = (ROOT / "docs" / "convert.md").read_text()
    assert f"pip install --extra-index-url {index} torch=={version}+cpu\n" in doc
    assert f"pip install torch=={version}`" not in doc  # PyPI's Linux torch is the CUDA build


def test_the_recipe_table_is_one_table_naming_every_recipe():
    doc = (ROOT / "docs" / "convert.md").read_text()
    section = doc.split("\n## Recipes\n", 1)[1].split("\n## ", 1)[0]
    rows = [i for i, line in enumerate(section.splitlines()) if line.startswith("|")]
    assert rows == list(range(rows[0], rows[0] + len(rows))), "a paragraph splits the table"
    table = "\n".join(section.splitlines()[rows[0] : rows[-1] + 1])
    named = set(re.findall(r"`(\w+)`", table))
    assert set(available_recipes()) <= named, set(available_recipes()) - named


def test_gguf_recipes_say_the_gguf_alone_is_enough():
    recipes = [name for name in available_recipes() if name.endswith("_gguf")]
    assert len(recipes) >= 2
    for name in recipes:
        description = " ".join(load_recipe(name).description.split())
        assert "--source FILE.gguf alone" in description, (name, description)
        assert "supplies config.json" not in description, (name, description)
