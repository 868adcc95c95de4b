"""What an engine loads before it serves: the artifact, the model and its runner, the tokenizer,
the chat template and the image path.

One process holds the whole model (``load_model`` and a ``ModelRunner``), or with
``tensor_parallel`` > 1 this process is rank 0 and the other ranks follow its runner's calls
(``tensor_parallel.parallel_runner``). A ``vram_budget`` plans the routed experts beside the
context pool before any weight is prepared, so the pool's plan comes in already made.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ninfer_format import Artifact, ArtifactError

from .errors import EngineError
from .expert_offload import ExpertOffload
from .frontend import ChatTemplate, Tokenizer
from .images import VisionInput, VisionOptions, load_vision
from .models import Model, load_model
from .pool_plan import PoolPlan
from .runner import ModelRunner
from .tensor_parallel import parallel_runner


@dataclass
class LoadedModel:
    """An engine's loaded parts (``load``)."""

    artifact: Artifact
    model: Model
    runner: ModelRunner
    tokenizer: Tokenizer
    template: ChatTemplate
    #: images in chat messages (a VLM artifact's tower on the CPU backend), or None and
    #: ``no_images``, the one line an image request is refused with
    vision: VisionInput | None
    no_images: str | None
    #: with a ``vram_budget``: the routed experts computed from host memory; None: all resident
    expert_offload: ExpertOffload | None
    #: what ends the other tensor-parallel ranks (None in one process)
    stop: Callable[[], None] | None


def load(
    artifact: str | Path | Artifact,
    *,
    backend: str,
    pool_plan: PoolPlan,
    chat_template: str | None = None,
    tensor_parallel: int = 1,
    expert_parallel: bool = False,
    vram_budget: int | str | None = None,
    host_expert_cache: int | str | None = None,
    expert_stream_rows: int | None = None,
    expert_stream_chunk: int | None = None,
    expert_stream_decode: str | None = None,
    prefill_chunk: int | None = None,
    vision: VisionOptions | None = None,
    model_options: dict[str, Any] | None = None,
) -> LoadedModel:
    """Open ``artifact`` and load what an engine of these settings serves it with
    (``prefill_chunk``: the rows of the engine's prefill calls, which a ``vram_budget``
    plans the backend's workspace for, or for ``expert_stream_chunk`` rows where the budget
    leaves host experts to stream: ``expert_offload.prefill_rows``)."""
    try:
        opened = artifact if isinstance(artifact, Artifact) else Artifact.open(artifact)
        resources = {
            role: opened.resource(role) for role in (opened.components["text"].resources or {})
        }
    except ArtifactError as exc:
        raise EngineError(str(exc)) from None
    if tensor_parallel < 1:
        raise EngineError(f"tensor_parallel must be >= 1, got {tensor_parallel}")
    if expert_parallel and tensor_parallel < 2:
        raise EngineError(
            "expert_parallel (--expert-parallel) needs tensor_parallel (--tensor-parallel) "
            ">= 2: it holds each expert on one of the ranks"
        )
    expert_offload = ExpertOffload.for_budget(
        vram_budget,
        backend,
        tensor_parallel=tensor_parallel,
        host_cache=host_expert_cache,
        stream_rows=expert_stream_rows,
        prefill_rows=prefill_chunk,
        stream_chunk=expert_stream_chunk,
        stream_decode=expert_stream_decode,
    )
    # the context pool's byte budget needs the backend: the experts are planned beside it
    if expert_offload is not None:
        expert_offload.context_bytes = pool_plan.planned_bytes
    if model_options and tensor_parallel > 1:
        raise EngineError("model_options are not passed to tensor-parallel ranks yet")
    stop = None
    if tensor_parallel > 1:  # rank 0 here, the other ranks following its runner's calls
        model, runner, stop = parallel_runner(opened, backend, tensor_parallel, expert_parallel)
    else:
        # model_options: an architecture's own load options (Qwen4Exp's ple_rows)
        model = load_model(
            opened, backend=backend, expert_offload=expert_offload, options=model_options
        )
        runner = ModelRunner(model)
    try:
        tokenizer = Tokenizer.from_resources(resources)
        model_type = (opened.components["text"].config or {}).get("model_type")
        template = ChatTemplate.from_resources(
            resources, override=chat_template, model_type=model_type
        )
        vision_input, no_images = load_vision(
            opened,
            model.backend,
            tokenizer,
            vision or VisionOptions(),
            backend_name=backend,
            tensor_parallel=tensor_parallel,
        )
    except BaseException:
        if stop is not None:  # the other ranks are running: end them with the failed load
            stop()
        raise
    return LoadedModel(
        opened, model, runner, tokenizer, template, vision_input, no_images, expert_offload, stop
    )
