"""Architectures by ``model_type``: the text component's config names the math to run.

Each architecture package registers a factory at import; ``load_model`` opens the artifact
(if given a path), picks the factory and hands it a backend.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..backends import Backend, decode_eagerly, get_backend
from ..errors import ModelError
from .base import Model

Factory = Callable[..., Model]  # (artifact, backend, collective=None) -> Model

_FACTORIES: dict[str, Factory] = {}
#: packages imported on first lookup so their ``register_model`` calls run
_PACKAGES = (
    "ninfer_runtime.models.qwen3_5",
    "ninfer_runtime.models.qwen4_exp",
    "ninfer_runtime.models.glm5_next",
)


def register_model(*model_types: str) -> Callable[[Factory], Factory]:
    """Decorator: ``factory(artifact, backend) -> Model`` serves these ``model_type`` values
    (and ``factory(..., collective=)`` if the architecture runs tensor-parallel)."""

    def wrap(factory: Factory) -> Factory:
        for model_type in model_types:
            _FACTORIES[model_type] = factory
        return factory

    return wrap


def known_architectures() -> list[str]:
    for package in _PACKAGES:
        importlib.import_module(package)
    return sorted(_FACTORIES)


def model_factory(model_type: str) -> Factory:
    known = known_architectures()
    factory = _FACTORIES.get(model_type)
    if factory is None:
        raise ModelError(f"no model for architecture {model_type}; known: {', '.join(known)}")
    return factory


def check_backend(
    model: str, backend: Backend, served: Sequence[str], host_reads: str | None
) -> None:
    """Refuses in one line a backend ``model`` is not served on (``served``: those its path
    has run on); the model's steps read ``host_reads`` on the host, so they synchronise and
    the backend runs them eagerly (never captured as CUDA graphs); None: the model says per
    step (``step_variant``)."""
    if backend.name not in served:
        raise ModelError(
            f"{model} runs on the {' and '.join(served)} backend only so far (its "
            f"{backend.name} path has not yet run on a GPU): use --backend cpu"
        )
    if host_reads is not None:
        decode_eagerly(backend, f"{model}'s decode steps read {host_reads} on the host")


def load_model(
    artifact: Any,
    backend: str | Backend = "cpu",
    collective: Any = None,
    expert_parallel: bool = False,
    expert_offload: Any = None,
    options: Mapping[str, Any] | None = None,
) -> Model:
    """The runnable model of an artifact (an open ``Artifact`` or a path to its entry file);
    with a ``collective`` (``ninfer_runtime.parallel``) of more than one rank, this rank's
    share of a tensor-parallel model (with ``expert_parallel``, its routed experts whole
    rather than a share of each). ``expert_offload`` (``expert_offload.ExpertOffload``):
    the routed experts are left to it, to be placed within a device-memory budget.
    ``options``: an architecture's own keyword options (Qwen4Exp's ``ple_rows``), refused by
    name where its factory takes no such keyword."""
    if isinstance(artifact, str | os.PathLike):
        from ninfer_format import Artifact

        artifact = Artifact.open(Path(artifact))
    text = artifact.components.get("text")
    if text is None:
        raise ModelError("artifact has no text component")
    model_type = (text.config or {}).get("model_type")
    if not model_type:
        raise ModelError("the text component's config has no model_type")
    factory = model_factory(str(model_type))
    check_auxiliaries(artifact)
    accepted = inspect.signature(factory).parameters
    kwargs = dict(options or {})
    for name in kwargs:
        if name not in accepted:
            raise ModelError(f"model option {name!r} is not built for {model_type}")
    if expert_offload is not None:
        if "expert_offload" not in accepted:
            raise ModelError(f"expert offload (--vram-budget) is not built for {model_type}")
        kwargs["expert_offload"] = expert_offload
    elif collective is not None:
        kwargs.update(collective=collective, expert_parallel=expert_parallel)
    return factory(artifact, get_backend(backend), **kwargs)


#: the use auxiliaries the runtime honours: stored input columns are put in place as the
#: weights load (``Artifact.parameter(..., in_order=True)``), and the NVFP4 A4 path's
#: activation divisor does not apply (activations are never quantized below 16 bits)
HONOURED_AUXILIARIES = frozenset({"input_columns", "activation_input_divisor"})


def check_auxiliaries(artifact: Any) -> None:
    """Refuse an artifact whose uses carry an auxiliary the runtime would not apply (such as
    ``hadamard_signs``): running it would compute different products, silently."""
    honoured = ", ".join(sorted(HONOURED_AUXILIARIES))
    for use in artifact.uses:
        for role in use.auxiliaries or {}:
            if role not in HONOURED_AUXILIARIES:
                raise ModelError(
                    f"use of {use.parameter!r} at {use.input!r}: auxiliary {role!r} is not "
                    f"applied by this runtime (it applies {honoured})"
                )
