"""Server settings: one pydantic model per TOML table, filled from ``--config`` then flags.

Why pydantic with ``extra="forbid"``: a misspelt key in a config file must stop the server with
a message naming the key, not be ignored while the server runs with a default the user did not
mean. Flags win over the file; both land in the same models, so validation happens once.
"""

from __future__ import annotations

import ipaddress
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

if TYPE_CHECKING:
    from ninfer_runtime.images import VisionOptions
    from ninfer_runtime.speculative import SpecConfig

    from .image_reader import ImageLimits

__all__ = [
    "ConfigError",
    "ContextCacheSettings",
    "EngineSettings",
    "MediaSettings",
    "ServerSettings",
    "Settings",
    "SpeculativeSettings",
    "VisionSettings",
    "fit_to_model",
    "is_loopback",
    "load_settings",
]

DEFAULT_MAX_CONTEXT = 8192
#: A generous bound on request-body bytes per prompt token: text is about 4 bytes a token,
#: JSON-escaped CJK (``\uXXXX``) about 9. The default body limit is the context times this,
#: at least 1 MiB. It also bounds the parsing and validation a body costs on the event loop
#: (about 0.1 s per MiB of the smallest messages).
BODY_BYTES_PER_TOKEN = 32
_MIB = 1024 * 1024


class ConfigError(Exception):
    """The configuration cannot be used; the message names the file, key and problem."""


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ServerSettings(_Table):
    """``[server]``: the HTTP side."""

    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    api_key: str | None = None
    #: The model name clients send; None: the artifact file's name without ``.ninfer`` (as
    #: vLLM serves the model it was given). ``model_id`` is its older spelling.
    served_model_name: str | None = Field(None, min_length=1)
    allow_insecure: bool = False
    #: None: sized for the context (``max_context`` × ``BODY_BYTES_PER_TOKEN``, at least 1 MiB)
    #: plus one image of ``max_image_mib`` in base64 (when images are taken)
    max_request_mib: float | None = Field(None, gt=0)
    #: Images (``image_reader.py``): the bytes of one image (decoded or fetched), the images of
    #: one request (0: no image input), whether ``http(s)`` image URLs are fetched (off: a
    #: server that fetches what requests name can be made to reach hosts clients cannot),
    #: and the seconds a fetch may take.
    max_image_mib: float = Field(10, gt=0)
    max_images_per_request: int = Field(16, ge=0)
    allow_image_urls: bool = False
    image_fetch_timeout_s: float = Field(10, gt=0)
    #: Used when a request gives no max_tokens (None: the rest of the context).
    default_max_tokens: int | None = Field(None, ge=1)
    #: Template default for requests that do not say (None: the template's own default).
    enable_thinking: bool | None = None
    response_store_max_records: int = Field(1024, ge=0)
    #: Seconds a Ctrl-C waits for running requests before cancelling them.
    drain_timeout_s: float = Field(30, ge=0)
    #: An SSE comment is sent after this many seconds without an event (proxies drop idle
    #: connections, and a queued or long-prefilling request is otherwise silent).
    keepalive_s: float = Field(5, gt=0)
    #: Seconds an idle connection is kept open between requests (HTTP keep-alive).
    keep_alive_timeout_s: float = Field(5, gt=0)
    #: Seconds a request head may take to arrive in full, from the connection's opening or
    #: its first byte after a response; a slower one is answered 408 and closed (slowloris).
    header_timeout_s: float = Field(10, gt=0)
    #: Connections served at once; more are answered 503 and closed. None: 4096, or fewer
    #: when the descriptor limit (``ulimit -n``, raised to its hard limit) leaves less.
    max_connections: int | None = Field(None, ge=1)
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    #: Origins whose web pages may call the server (CORS, ``cors.py``): ``scheme://host[:port]``
    #: or ``*``, as a list or one comma-separated string; None or empty: no CORS headers at all.
    allowed_origins: list[str] | None = None
    #: Let those pages send cookies and HTTP authentication (never with ``*``).
    allow_credentials: bool = False

    @field_validator("allowed_origins", mode="before")
    @classmethod
    def _origins(cls, value: Any) -> Any:
        from .cors import check_origin

        if isinstance(value, str):
            value = [part for part in value.split(",") if part.strip()]
        if isinstance(value, list):
            return [check_origin(o) if isinstance(o, str) else o for o in value]
        return value

    @model_validator(mode="after")
    def _credentials(self) -> ServerSettings:
        if self.allow_credentials and not self.allowed_origins:
            raise ValueError("allow_credentials needs allowed_origins")
        if self.allow_credentials and "*" in (self.allowed_origins or ()):
            raise ValueError(
                "allow_credentials cannot go with allowed_origins '*' (browsers refuse "
                "credentials for any origin); list the origins"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _older_names(cls, data: Any) -> Any:
        # the older key still works; the newer wins when a file and a flag give both
        if isinstance(data, dict) and "model_id" in data:
            data = dict(data)
            data.setdefault("served_model_name", data.pop("model_id"))
        return data


class EngineSettings(_Table):
    """``[engine]``: the engine and admission."""

    backend: Literal["cpu", "cuda"] = "cpu"
    #: an explicit value must not exceed the model's positions; the default is clamped to them
    max_context: int = Field(DEFAULT_MAX_CONTEXT, ge=2)
    #: decode lanes: ``auto`` (as many as the memory holds, ``lanes.choose_lanes``) or 1..8
    max_concurrency: int | Literal["auto"] = "auto"
    max_pending_requests: int = Field(16, ge=0)
    pending_timeout_ms: int = Field(30000, ge=1)
    prefill_chunk: int = Field(1024, ge=1)
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
    #: How K/V are stored (``ninfer_runtime.state.KV_DTYPES``): float32 (exact), bfloat16
    #: (half the memory and bandwidth) or fp8_e4m3 (a quarter; unscaled E4M3FN bytes).
    kv_dtype: str = "float32"
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
    def _lanes(cls, value: Any) -> int | str:
        from .lanes import ENGINE_MAX_LANES

        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        lanes = None
        if isinstance(value, int) and not isinstance(value, bool):
            lanes = value
        elif isinstance(value, str) and value.strip().isdigit():
            lanes = int(value)
        if lanes is None or not 1 <= lanes <= ENGINE_MAX_LANES:
            raise ValueError(f"{value!r}: expected 'auto' or 1..{ENGINE_MAX_LANES} lanes")
        return lanes

    @field_validator("kv_dtype")
    @classmethod
    def _kv_dtype(cls, value: str) -> str:
        from ninfer_runtime.errors import EngineError
        from ninfer_runtime.state import kv_storage_dtype

        try:
            kv_storage_dtype(value)
        except EngineError as exc:
            raise ValueError(str(exc)) from None
        return value

    @model_validator(mode="after")
    def _capacity(self) -> EngineSettings:
        from ninfer_runtime.engine import parse_capacity, parse_size
        from ninfer_runtime.errors import EngineError

        try:
            parse_capacity(self.context_capacity)
            parse_size(self.memory_headroom)
            parse_size(self.host_context_capacity, "host context capacity")
            parse_size(self.vram_budget, "vram budget")
            parse_size(self.host_expert_cache, "host expert cache")
        except EngineError as exc:
            raise ValueError(str(exc)) from None
        return self


class ContextCacheSettings(_Table):
    """``[context_cache]``: prefix reuse across requests. On by default: requests resume from
    checkpoints of earlier prompts and generations (token-exact), kept at the end of each
    prompt and generation, where a chat prompt stops being what the next turn resends, and
    every ``checkpoint_interval`` tokens of a long prefill."""

    enabled: bool = True
    checkpoint_interval: int = Field(8192, ge=1)
    #: who shares cache entries (``cache_isolation.py``): everyone ("none"), requests with
    #: the same ``cache_salt`` ("salt"), or requests with the same API key ("api_key")
    isolation: Literal["none", "salt", "api_key"] = "none"


class SpeculativeSettings(_Table):
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


class ParallelSettings(_Table):
    """``[parallel]``: the model split over ranks, a process each (rank 0, the server's,
    schedules and the others follow)."""

    tensor_parallel: int = Field(1, ge=1)
    #: each routed expert of an MoE model whole on one rank (EP) instead of split over all
    expert_parallel: bool = False


class VisionSettings(_Table):
    """``[vision]``: images in chat messages, for an artifact with a vision component (read at
    start-up). ``enabled = false``: the vision tower is not loaded and requests with images
    are refused. Per request, beside ``[server] max_images_per_request``: all its images
    together at most ``max_image_tokens`` tokens, each at most ``max_image_pixels`` pixels as
    stored in its file (checked on the header, before any pixel is decoded)."""

    enabled: bool = True
    max_image_tokens: int = Field(16384, ge=1)
    max_image_pixels: int = Field(40_000_000, ge=1)


class MediaSettings(_Table):
    """``[media]``: ``cache_capacity``, the bytes of encoded images kept by their digest, so
    an image sent again (the next turn of a chat about it) skips the vision encoder; a size
    such as ``512MiB``, 0 for none."""

    cache_capacity: str = "128MiB"

    @field_validator("cache_capacity")
    @classmethod
    def _size(cls, value: str) -> str:
        from ninfer_runtime.engine import parse_size
        from ninfer_runtime.errors import EngineError

        try:
            parse_size(value, "media cache capacity")
        except EngineError as exc:
            raise ValueError(str(exc)) from None
        return value


class Settings(_Table):
    """The whole configuration: the seven TOML tables."""

    server: ServerSettings = Field(default_factory=ServerSettings)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    context_cache: ContextCacheSettings = Field(default_factory=ContextCacheSettings)
    speculative: SpeculativeSettings = Field(default_factory=SpeculativeSettings)
    parallel: ParallelSettings = Field(default_factory=ParallelSettings)
    vision: VisionSettings = Field(default_factory=VisionSettings)
    media: MediaSettings = Field(default_factory=MediaSettings)

    def vision_options(self) -> VisionOptions:
        """The engine's image settings (``ninfer_runtime.images.VisionOptions``)."""
        from ninfer_runtime.engine import VisionOptions, parse_size

        return VisionOptions(
            enabled=self.vision.enabled,
            max_images=self.server.max_images_per_request,
            max_image_pixels=self.vision.max_image_pixels,
            max_image_tokens=self.vision.max_image_tokens,
            cache_capacity=parse_size(self.media.cache_capacity, "media cache capacity") or 0,
        )

    @property
    def max_request_bytes(self) -> int:
        server = self.server
        if server.max_request_mib is not None:
            return int(server.max_request_mib * _MIB)
        text = max(self.engine.max_context * BODY_BYTES_PER_TOKEN, _MIB)
        if server.max_images_per_request == 0:
            return text
        return text + -(-self.image_limits.max_bytes * 4 // 3)  # one image, base64

    @property
    def image_limits(self) -> ImageLimits:
        """What a request may send as images (``image_reader.ImageReader``)."""
        from .image_reader import ImageLimits

        server = self.server
        return ImageLimits(
            max_bytes=int(server.max_image_mib * _MIB),
            max_images=server.max_images_per_request,
            allow_urls=server.allow_image_urls,
            fetch_timeout_s=server.image_fetch_timeout_s,
        )


def fit_to_model(settings: Settings, positions: int | None) -> None:
    """Clamp a default ``max_context`` to the model's ``positions`` (its
    ``max_position_embeddings``); an explicit larger value is a ``ConfigError``."""
    engine = settings.engine
    if positions is None or engine.max_context <= positions:
        return
    if "max_context" in engine.model_fields_set:
        raise ConfigError(
            f"max_context {engine.max_context} is more than the model's {positions} positions "
            f"(its max_position_embeddings); give {positions} or less"
        )
    engine.max_context = positions


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _describe(error: ValidationError, source: str) -> str:
    lines = []
    for item in error.errors():
        key = ".".join(str(p) for p in item["loc"])
        if item["type"] == "extra_forbidden":
            lines.append(f"{source}: unknown key {key!r}")
        else:
            message = item["msg"].removeprefix("Value error, ")
            lines.append(f"{source}: {key}: {message}")
    return "\n".join(lines)


def load_settings(config: Path | None, overrides: dict[str, dict[str, Any]]) -> Settings:
    """Settings from a TOML file (optional) with flag ``overrides`` per table on top.

    ``overrides`` holds only the flags the user gave (``None`` values are dropped), so a default
    flag never masks a value from the file.
    """
    data: dict[str, Any] = {}
    source = "flags"
    if config is not None:
        source = str(config)
        try:
            data = tomllib.loads(config.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"{config}: cannot read: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{config}: not valid TOML: {exc}") from None
    for table, values in overrides.items():
        given = {k: v for k, v in values.items() if v is not None}
        if given:
            current = data.get(table)
            if current is not None and not isinstance(current, dict):
                raise ConfigError(f"{source}: {table} must be a table")
            data[table] = {**(current or {}), **given}
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, source)) from None
