"""What a command says when its MODEL argument is not a .ninfer file it can open.

A checkpoint folder is the most common mistake (a model downloaded from the Hub is a folder);
the line names the conversion that makes an artifact of it instead of a bare "no such file".
"""

from __future__ import annotations

from pathlib import Path


def not_an_artifact(path: Path) -> str | None:
    """One line saying why ``path`` cannot be an artifact's entry file (None: it is a file)."""
    if path.is_file():
        return None
    if not path.is_dir():
        return f"{path}: no such file"
    held = sorted(p.name for p in path.glob("*.ninfer") if p.is_file())
    if held:
        return f"{path}: is a folder; give the artifact's entry file, e.g. {path / held[0]}"
    if not (path / "config.json").is_file():
        return f"{path}: is a folder, not a .ninfer artifact"
    return (
        f"{path}: is a checkpoint folder, not a .ninfer artifact; convert it first: "
        f"ninfer-convert --recipe NAME --source {path} -o model.ninfer "
        "(ninfer-convert --list-recipes names them)"
    )
