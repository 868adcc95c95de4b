"""Hugging Face Hub repositories as tensor sources, through the local Hub cache.

``open_hub("org/name@rev")`` resolves the repo with ``huggingface_hub.snapshot_download`` (only
the files a conversion reads: JSON, safetensors, jinja, txt and sentencepiece models) and opens
the snapshot folder as an ``HFDirectorySource``. The cache makes a second conversion free and
lets machines without network convert what a connected machine downloaded.

huggingface_hub reads ``HF_HUB_OFFLINE`` and the cache location when it is imported. This
module reads them again at call time and passes them explicitly, so a caller (or a test) that
sets them later still gets what it asked for. Every failure becomes a ``SourceError`` that says
what to do, instead of the Hub client's stack of HTTP errors.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import SourceError
from .hf_dir import HFDirectorySource

#: what a conversion reads from a repo; ``*.model`` covers sentencepiece tokenizers
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model"]

# Hub ids: "org/name", each part letters, digits, "-", "_", "." and at most 96 characters.
_PART = r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
_REPO_SPEC = re.compile(rf"^(?P<repo>{_PART}/{_PART})(?:@(?P<revision>[^\s@]+))?$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_TRUE = frozenset({"1", "ON", "YES", "TRUE"})


def parse_repo_spec(spec: str) -> tuple[str, str | None]:
    """Split ``org/name[@revision]`` into (repo id, revision or None).

    The revision may be a branch, a tag, a commit hash or a ref such as ``refs/pr/3``.
    """
    match = _REPO_SPEC.match(spec.strip())
    if match is None:
        raise SourceError(
            f"{spec!r} is not a Hugging Face repo id; expected org/name or org/name@revision"
        )
    return match["repo"], match["revision"]


def looks_like_repo_spec(spec: str) -> bool:
    """Whether ``spec`` has the form of ``org/name[@revision]`` (it may still not exist)."""
    return _REPO_SPEC.match(spec.strip()) is not None


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` as set now (huggingface_hub itself only reads it at import)."""
    from huggingface_hub import constants

    value = os.environ.get("HF_HUB_OFFLINE")
    if value is not None:
        return value.strip().upper() in _TRUE
    return bool(constants.HF_HUB_OFFLINE)


def hub_cache_dir() -> Path:
    """The Hub cache folder as the environment names it now, with huggingface_hub's precedence."""
    from huggingface_hub import constants

    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        value = os.environ.get(variable)
        if value:
            return Path(value).expanduser()
    home = os.environ.get("HF_HOME")
    if home:
        return Path(home).expanduser() / "hub"
    return Path(constants.HF_HUB_CACHE).expanduser()


def open_hub(
    repo: str, revision: str | None = None, *, cache_dir: str | Path | None = None
) -> HFDirectorySource:
    """Open ``org/name[@revision]`` from the Hub cache, downloading it first when online.

    A revision given both in ``repo`` and as ``revision`` must agree. The source's provenance
    records the repo id, the requested revision and the commit the snapshot resolved to.
    """
    repo_id, spec_revision = parse_repo_spec(repo)
    if revision and spec_revision and revision != spec_revision:
        raise SourceError(
            f"{repo!r} names revision {spec_revision!r} but revision={revision!r} was also given"
        )
    revision = revision or spec_revision
    display = f"{repo_id}@{revision}" if revision else repo_id
    cache = Path(cache_dir).expanduser() if cache_dir is not None else hub_cache_dir()
    offline = hub_offline()

    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    download_hint = f"`hf download {repo_id}" + (f" --revision {revision}`" if revision else "`")
    try:
        folder = snapshot_download(
            repo_id,
            revision=revision,
            cache_dir=str(cache),
            local_files_only=offline,
            allow_patterns=ALLOW_PATTERNS,
        )
    except IncompleteSnapshotError as exc:
        raise SourceError(
            f"cannot fetch {display}: the cached snapshot is incomplete and the Hub is "
            f"unreachable; finish the download on a connected machine with {download_hint} "
            f"or pass a local directory (cache: {cache})"
        ) from exc
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as exc:
        raise SourceError(
            f"cannot fetch {display}: not in the Hugging Face cache and the Hub is unreachable "
            f"(HF_HUB_OFFLINE=1?); download it on a connected machine with {download_hint} "
            f"or pass a local directory (cache searched: {cache})"
        ) from exc
    except GatedRepoError as exc:
        raise SourceError(
            f"cannot fetch {display}: the repo is gated; accept its terms on huggingface.co "
            "and log in with `hf auth login`"
        ) from exc
    except RepositoryNotFoundError as exc:
        raise SourceError(
            f"cannot fetch {display}: no such repo on the Hub (or it is private and you are "
            "not logged in: `hf auth login`)"
        ) from exc
    except RevisionNotFoundError as exc:
        raise SourceError(f"cannot fetch {display}: the repo has no revision {revision!r}") from exc
    except HFValidationError as exc:
        raise SourceError(f"cannot fetch {display}: {exc}") from exc
    except Exception as exc:  # HTTP, disk and anything else the client raises
        raise SourceError(f"cannot fetch {display}: {type(exc).__name__}: {exc}") from exc

    snapshot = Path(folder)
    commit = snapshot.name if _COMMIT.match(snapshot.name) else None
    return HFDirectorySource(
        snapshot,
        repo_id=repo_id,
        revision=revision,
        commit=commit,
        display_id=display,
        kind="hf_hub",
    )
