"""The tables that shape the engine: ``[engine]`` (backend, context, lanes, memory),
``[context_cache]``, ``[speculative]`` and ``[parallel]``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from .table import Table

if TYPE_CHECKING:
    from ninfer_runtime.speculative import SpecConfig

__all__ = [
    "DEFAULT_MAX_CONTEXT",
    "ContextCacheSettings",
    "EngineSettings",
    "ParallelSettings",
    "SpeculativeSettings",
]

DEFAULT_MAX_CONTEXT = 8192


class EngineSettings(Table):
    """``[engine]``: the engine and admission."""

    backend: Literal["cpu", "cuda"] = "cpu"
    #: an explicit value must not exceed the model's positions; the default is clamped to them
    max_context: int = Field(DEFAULT_MAX_CONTEXT, ge=2)
    #: decode lanes: ``auto`` (as many as the memory holds, ``lanes.choose_lanes``) or 1 up
    #: to the backend's most (``ninfer_runtime.lane_limits``: 64 on either backend)
    max_concurrency: int | Literal["auto"] = "auto"
    max_pending_requests: int = Field(16, ge=0)
    pending_timeout_ms: int = Field(30000, ge=1)
    #: prompt tokens a step; unset: the backend's (cpu 512, cuda 2048)
    prefill_chunk: int | None = Field(None, ge=1)
    chat_template: Path | None = None
    #: Memory for K/V pages and recurrent states: ``auto`` (what the device has free after
    #: the weights) or a size such as ``24GiB``; requests wait until their pages fit.
    context_capacity: str = "auto"
    #: With ``context_capacity = "auto"``: device memory left free beside the pool
    #: (activations, decode graphs, other processes); unset: 2 GiB or 5% of the GPU.
    memory_headroom: str | None = None
    #: Host memory preempted requests' context is copied to (pinned on the GPU) and copied
    #: back from, exactly; beyond it (or at 0) they are resumed by replaying their tokens.
    host_context_capacity: str = "4GiB"
    #: Device memory for weights, workspace and the context pool (``--vram-budget``, e.g.
    #: ``8GiB``): a MoE model's routed experts that do not fit are computed from host
    #: memory. Unset: ``$NINFER_VRAM_BUDGET_MIB`` if set, else no budget (all resident).
    vram_budget: str | None = None
    #: With a ``vram_budget``: host memory for decoded float32 copies of the host experts
    #: routing chooses most (``--host-expert-cache``, e.g. ``4GiB``; ``0``: none, each use
    #: decodes the stored codes block by block). Unset: a quarter of the available memory.
    host_expert_cache: str | None = None
    #: With a ``vram_budget``: a prefill chunk of more token rows than this streams the host
    #: experts it routes to through the device (``--expert-stream-rows``). Unset: 32.
    expert_stream_rows: int | None = Field(None, ge=0)
    #: With a ``vram_budget`` that leaves experts in host memory: prompt tokens per prefill
    #: step when more than ``prefill_chunk`` (``--expert-stream-chunk``). Unset: 8192.
    expert_stream_chunk: int | None = Field(None, ge=1)
    #: With a ``vram_budget`` on a GPU: how decode steps compute the host experts they route
    #: to (``--expert-stream-decode``): mapped (the device reads them in place from pinned
    #: host memory), all (streamed through the device), off (on the host), auto (mapped on a
    #: GPU). Unset: auto.
    expert_stream_decode: Literal["auto", "all", "off", "mapped"] | None = None
    #: How K/V are stored (``ninfer_runtime.kv_storage.KV_SETTINGS``): auto (the backend's
    #: choice: float32 on cpu, bfloat16 on cuda), float32 (exact), bfloat16 (half the memory
    #: and bandwidth) or fp8_e4m3 (a quarter; unscaled E4M3FN bytes).
    kv_dtype: str = "auto"
    #: Qwen4Exp's PLE n-gram tables (``--ple-rows``): ``resident``, ``streamed`` (rows read
    #: from the artifact as steps need them) or ``auto``; passed to the model as its
    #: ``ple_rows`` option, which another model refuses at load. Unset: the model's default.
    ple_rows: str | None = None

    @field_validator("ple_rows")
    @classmethod
    def _ple_rows(cls, value: str | None) -> str | None:
        from ninfer_runtime.cli import PLE_ROWS_CHOICES

        if value is not None and value not in PLE_ROWS_CHOICES:
            raise ValueError(f"{value!r}: expected one of {', '.join(PLE_ROWS_CHOICES)}")
        return value

    def model_options(self) -> dict[str, Any] | None:
        """The engine's ``model_options`` (None: none set, so no model refuses them)."""
        from ninfer_runtime.cli import model_options

        return model_options(self.ple_rows)

    @field_validator("max_concurrency", mode="before")
    @classmethod
    def _lanes(cls, value: Any, info: ValidationInfo) -> int | str:
        """``auto`` or 1 up to the most lanes the backend runs (the key declared above)."""
        from ninfer_runtime.lane_limits import MAX_LANES, backend_max_lanes

        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        lanes = None
        if isinstance(value, int) and not isinstance(value, bool):
            lanes = value
        elif isinstance(value, str) and value.strip().isdigit():
            lanes = int(value)
        backend = info.data.get("backend")  # absent when the backend itself was refused
        most = MAX_LANES if backend is None else backend_max_lanes(backend)
        if lanes is None or not 1 <= lanes <= most:
            runs = "" if backend is None else f" (the most the {backend} backend runs)"
            raise ValueError(f"{value!r}: expected 'auto' or 1..{most} lanes{runs}")
        return lanes

    @field_validator("kv_dtype")
    @classmethod
    def _kv_dtype(cls, value: str, info: ValidationInfo) -> str:
        """A storage name, or ``auto`` resolved to the backend's own (the key declared above)."""
        from ninfer_runtime.errors import EngineError
        from ninfer_runtime.state import resolve_kv_dtype

        try:
            return resolve_kv_dtype(value, info.data.get("backend", "cpu"))
        except EngineError as exc:
            raise ValueError(str(exc)) from None

    @field_validator(
        "context_capacity",
        "memory_headroom",
        "host_context_capacity",
        "vram_budget",
        "host_expert_cache",
    )
    @classmethod
    def _size(cls, value: Any, info: ValidationInfo) -> Any:
        """Each size checked on its own, so its error names its key (``engine.vram_budget``)."""
        from ninfer_runtime.engine import parse_capacity, parse_size
        from ninfer_runtime.errors import EngineError

        try:
            if info.field_name == "context_capacity":
                parse_capacity(value)
            else:
                parse_size(value, info.field_name.replace("_", " "))
        except EngineError as exc:
            raise ValueError(str(exc)) from None
        return value


class ContextCacheSettings(Table):
    """``[context_cache]``: prefix reuse across requests. On by default: requests resume from
    checkpoints of earlier prompts and generations (token-exact), kept at the end of each
    prompt and generation, where a chat prompt stops being what the next turn resends, and
    every ``checkpoint_interval`` tokens of a long prefill."""

    enabled: bool = True
    checkpoint_interval: int = Field(8192, ge=1)
    #: who shares cache entries (``cache_isolation.py``): everyone ("none"), requests with
    #: the same ``cache_salt`` ("salt"), or requests with the same API key ("api_key")
    isolation: Literal["none", "salt", "api_key"] = "none"


class SpeculativeSettings(Table):
    """``[speculative]``: draft-and-verify decoding. ``off``, or ``mtp``: the artifact's MTP
    component drafts ``draft_tokens`` (1..5, default 3) tokens a round, scoring the indexed
    proposal rows (``proposal_head = "optimized"``, when the artifact has them) or the whole
    vocabulary (``"full"``). The engine's ``SpecConfig`` decides what is valid."""

    method: str = "off"
    draft_tokens: int | None = None
    proposal_head: str | None = None

    @model_validator(mode="after")
    def _valid(self) -> SpeculativeSettings:
        from ninfer_runtime.errors import EngineError

        try:
            self.spec_config()
        except EngineError as exc:
            raise ValueError(str(exc)) from None
        return self

    def spec_config(self) -> SpecConfig | None:
        """The engine's ``SpecConfig`` (None: off); an ``EngineError`` when it is refused."""
        from ninfer_runtime.errors import EngineError
        from ninfer_runtime.speculative import SpecConfig

        given = {"draft_tokens": self.draft_tokens, "proposal_head": self.proposal_head}
        given = {key: value for key, value in given.items() if value is not None}
        if self.method == "off":
            if given:
                raise EngineError(f"{', '.join(given)} needs method 'mtp' (method is 'off')")
            return None
        return SpecConfig(self.method, **given)


class ParallelSettings(Table):
    """``[parallel]``: the model split over ranks, a process each (rank 0, the server's,
    schedules and the others follow)."""

    tensor_parallel: int = Field(1, ge=1)
    #: each routed expert of an MoE model whole on one rank (EP) instead of split over all
    expert_parallel: bool = False
