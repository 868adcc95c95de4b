"""Image input at the HTTP edge (``ninfer_serve.images`` and the three APIs' content readers),
in process: each API's image shape becomes an image part and, once read, an ``ImageInput``
in order; each bad input is one 400 naming the client's field. Whether bytes are an image
the model can take is the engine's part (``test_images_served.py``)."""

from __future__ import annotations

import asyncio
import base64
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from ninfer_runtime.media import ImageInput
from ninfer_serve.anthropic.messages import to_job as anthropic_job
from ninfer_serve.anthropic.models import MessagesRequest
from ninfer_serve.config import load_settings
from ninfer_serve.errors import ApiError
from ninfer_serve.image_reader import ImageLimits, ImageReader
from ninfer_serve.images import image_part, split_images
from ninfer_serve.openai.chat import to_job as chat_job
from ninfer_serve.openai.models import ChatCompletionRequest
from ninfer_serve.openai.response_items import input_messages

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(40))  # bytes only: the engine decodes, not the edge
B64 = base64.b64encode(PNG).decode()
DATA_URL = f"data:image/png;base64,{B64}"


def chat(*content: dict[str, Any], role: str = "user") -> list[dict[str, Any]]:
    body = {"messages": [{"role": role, "content": list(content)}]}
    return chat_job(ChatCompletionRequest.model_validate(body)).messages


def image_url(url: str, **extra: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url, **extra}}


def anthropic(*blocks: dict[str, Any], role: str = "user") -> list[dict[str, Any]]:
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": role, "content": list(blocks)}]}
    return anthropic_job(MessagesRequest.model_validate(body)).messages


def base64_block(data: str = B64, media_type: str = "image/png") -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def read(messages: list[dict[str, Any]], **limits: Any) -> tuple[list[Any], list[ImageInput]]:
    asyncio.run(ImageReader(ImageLimits(**limits)).read(messages))
    out, images, _ = split_images(messages)
    return out, images


def refused(call: Any, *args: Any, **kwargs: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        call(*args, **kwargs)
    assert caught.value.status == 400
    return caught.value


def test_cache_marks_on_and_around_images():
    """A mark on an image part is after the image, one on a text before an image before it
    (the text offsets count no image); Anthropic texts are joined as the content is."""
    from ninfer_serve.cache_boundaries import Breakpoint

    mark = {"type": "ephemeral"}
    body = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "abc", "prompt_cache_breakpoint": True},
        {**image_url(DATA_URL), "prompt_cache_breakpoint": True},
        {"type": "text", "text": "de"}]}]}  # fmt: skip
    job = chat_job(ChatCompletionRequest.model_validate(body))
    assert job.cache_breakpoints == [Breakpoint(1, 3), Breakpoint(1, 3, past_images=True)]
    blocks = [{"type": "text", "text": "ab"}, {"type": "text", "text": "c", "cache_control": mark},
              {**base64_block(), "cache_control": mark}, {"type": "text", "text": "d"}]  # fmt: skip
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": blocks}]}
    job = anthropic_job(MessagesRequest.model_validate(body))
    assert job.cache_breakpoints == [Breakpoint(1, 4), Breakpoint(1, 4, past_images=True)]


# -- the three shapes -----------------------------------------------------------------------------


def test_chat_image_url_parts_become_images_in_order():
    other = base64.b64encode(b"GIF89a" + bytes(10)).decode()
    messages = chat(
        {"type": "text", "text": "compare"},
        image_url(DATA_URL, detail="low"),
        image_url(f"data:image/gif;base64,{other}"),
    )
    out, images = read(messages)
    assert out[0]["content"] == [
        {"type": "text", "text": "compare"},
        {"type": "image"},
        {"type": "image"},
    ]
    assert [i.data for i in images] == [PNG, b"GIF89a" + bytes(10)]
    assert images[0].digest == ImageInput(PNG).digest != images[1].digest


def test_responses_input_image_and_tool_output_images():
    items = [
        {"role": "user", "content": [{"type": "input_image", "image_url": DATA_URL},
                                     {"type": "input_text", "text": "what is it?"}]},
        {"type": "function_call", "call_id": "c1", "name": "shot", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1",
         "output": [{"type": "input_image", "image_url": DATA_URL, "detail": "auto"}]},
    ]  # fmt: skip
    out, images = read(input_messages(items))
    assert out[0]["content"] == [{"type": "image"}, {"type": "text", "text": "what is it?"}]
    assert out[2]["role"] == "tool" and out[2]["content"] == [{"type": "image"}]
    assert len(images) == 2
    # text alone stays one string, as before
    text = input_messages([{"role": "user", "content": [{"type": "input_text", "text": "a"}]}])
    assert text[0]["content"] == "a"


def test_anthropic_image_blocks_and_tool_result_images_keep_the_prompt_order():
    result = {"type": "tool_result", "tool_use_id": "t1", "is_error": True,
              "content": [{"type": "text", "text": "failed"}, base64_block()]}  # fmt: skip
    body = {
        "model": "m",
        "max_tokens": 4,
        "messages": [
            {"role": "user", "content": "look"},
            {"role": "assistant", "content": [
                {"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
            {"role": "user", "content": [
                {"type": "text", "text": "first"}, base64_block(media_type="image/gif"),
                result, {"type": "text", "text": "then"}]},
        ],
    }  # fmt: skip
    messages = anthropic_job(MessagesRequest.model_validate(body)).messages
    out, images = read(messages)
    # the tool message comes before the user message the same blocks became
    assert out[2] == {
        "role": "tool",
        "tool_call_id": "t1",
        "content": [{"type": "text", "text": "Error: "}, {"type": "text", "text": "failed"},
                    {"type": "image"}],
    }  # fmt: skip
    assert out[3]["content"] == [
        {"type": "text", "text": "first"},
        {"type": "image"},
        {"type": "text", "text": "then"},
    ]
    assert len(images) == 2
    text = anthropic({"type": "text", "text": "a"}, {"type": "text", "text": "b"})
    assert text[0]["content"] == "a\nb"  # text blocks alone: joined, as before


def test_split_images_leaves_the_conversation_as_stored():
    messages = chat(image_url(DATA_URL))
    out, images = read(messages)
    again, same, params = split_images(messages)  # a stored conversation, read once
    assert again == out and same == images
    assert params == ["messages[0].content[0].image_url.url"]
    assert messages[0]["content"][0] != {"type": "image"}  # still holds its image


# -- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("data:text/plain;base64,aGVsbG8=", "media type 'text/plain'"),
        ("data:,hello", "media type 'text/plain'"),
        ("data:image/png,%89PNG", "base64 data URL"),
        ("data:image/png;base64", "comma"),
        ("ftp://example.com/a.png", "not a data URL"),
        ("", "expected a data URL"),
    ],
)
def test_chat_bad_image_urls_name_the_field(url, words):
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "x"},
                                                      image_url(url)]}]}  # fmt: skip
    error = refused(chat_job, ChatCompletionRequest.model_validate(body))
    assert error.param == "messages[0].content[1].image_url.url"
    assert words in error.message and error.code == "invalid_image"
    assert error.message.startswith("messages[0].content[1].image_url.url: ")


@pytest.mark.parametrize(
    ("part", "role", "param"),
    [
        (image_url(DATA_URL), "assistant", "messages[0].content[0].type"),
        (image_url(DATA_URL), "system", "messages[0].content[0].type"),
        ({"type": "input_audio", "input_audio": {}}, "user", "messages[0].content[0].type"),
        ({"type": "image_url", "image_url": DATA_URL}, "user", "messages[0].content[0].image_url"),
        (image_url(DATA_URL, detail="max"), "user", "messages[0].content[0].image_url.detail"),
    ],
)
def test_chat_images_only_where_openai_takes_them(part, role, param):
    body = {"messages": [{"role": role, "content": [part]}]}
    assert refused(chat_job, ChatCompletionRequest.model_validate(body)).param == param


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]},
         "input[0].content[0].file_id"),
        ({"role": "system", "content": [{"type": "input_image", "image_url": DATA_URL}]},
         "input[0].content[0].type"),
        ({"role": "assistant", "content": [{"type": "input_image", "image_url": DATA_URL}]},
         "input[0].content[0].type"),
        ({"role": "user", "content": [{"type": "input_image", "image_url": "data:,x"}]},
         "input[0].content[0].image_url"),
    ],
)  # fmt: skip
def test_responses_refusals_name_the_part(item, param):
    assert refused(input_messages, [item]).param == param


@pytest.mark.parametrize(
    ("block", "param"),
    [
        (base64_block(media_type="application/pdf"), "messages[0].content[0].source.media_type"),
        (base64_block(data=None), "messages[0].content[0].source.data"),  # type: ignore[arg-type]
        ({"type": "image", "source": {"type": "file", "file_id": "f"}},
         "messages[0].content[0].source.type"),
        ({"type": "image", "source": {"type": "url", "url": "file:///etc/passwd"}},
         "messages[0].content[0].source.url"),
        ({"type": "document", "source": {}}, "messages[0].content[0].type"),
    ],
)  # fmt: skip
def test_anthropic_refusals_name_the_block(block, param):
    assert refused(anthropic, block).param == param


def test_anthropic_images_are_not_taken_in_assistant_messages():
    assert refused(anthropic, base64_block(), role="assistant").param == (
        "messages[0].content[0].type"
    )


def test_bad_base64_is_one_error_naming_the_field():
    error = refused(read, chat(image_url("data:image/png;base64,iVBORw0KGgo*AAA")))
    assert error.code == "invalid_image" and "not valid base64" in error.message
    assert error.param == "messages[0].content[0].image_url.url"
    wrapped = "\n".join(B64[i : i + 20] for i in range(0, len(B64), 20))  # MIME lines: fine
    assert read(anthropic(base64_block(wrapped)))[1][0].data == PNG


def test_too_many_images_is_one_error():
    messages = chat(*[image_url(DATA_URL)] * 100)
    error = refused(read, messages, max_images=16)
    assert error.code == "too_many_images" and "100 images" in error.message
    assert error.param == "messages[0].content[16].image_url.url"  # the first one too many
    assert "no images" in refused(read, chat(image_url(DATA_URL)), max_images=0).message


def test_too_large_is_refused_before_decoding():
    big = base64.b64encode(bytes(3 * 1024 * 1024)).decode()
    error = refused(read, chat(image_url(f"data:image/png;base64,{big}")), max_bytes=1 << 20)
    assert error.code == "image_too_large" and "3.0 MiB" in error.message
    assert "at most 1 MiB" in error.message
    assert len(read(chat(image_url(DATA_URL)), max_bytes=len(PNG))[1]) == 1  # exactly at it


def test_image_urls_are_refused_unless_allowed():
    error = refused(read, chat(image_url("https://example.com/cat.png")))
    assert error.code == "image_url_not_allowed" and "--allow-image-urls" in error.message
    assert error.param == "messages[0].content[0].image_url.url"


# -- fetching (a local HTTP server) ---------------------------------------------------------------


class _Images(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        path = self.path
        if path.startswith("/hop/"):
            left = int(path.rsplit("/", 1)[1])
            self.send_response(302)
            self.send_header("Location", "/cat.png" if left == 0 else f"/hop/{left - 1}")
            self.end_headers()
            return
        if path == "/slow.png":
            threading.Event().wait(2)
        body = {"/cat.png": PNG, "/slow.png": PNG, "/page": b"<html></html>"}.get(path)
        big = path == "/big.png"
        if body is None and not big:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/html" if path == "/page" else "image/png")
        if big:  # no length given: the reader must stop at its limit by itself
            self.send_header("Connection", "close")
            self.end_headers()
            for _ in range(64):
                self.wfile.write(bytes(64 * 1024))
            return
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class _Origin(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that stopped reading (a limit, a timeout) is what these tests do


@pytest.fixture(scope="module")
def origin() -> Iterator[str]:
    server = _Origin(("127.0.0.1", 0), _Images)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def fetch(url: str, **limits: Any) -> list[ImageInput]:
    return read(chat(image_url(url)), allow_urls=True, **limits)[1]


def test_image_urls_are_fetched_when_allowed(origin):
    assert fetch(f"{origin}/cat.png")[0].data == PNG
    assert fetch(f"{origin}/hop/2")[0].data == PNG  # a few redirects are followed
    anthropic_url = {"type": "image", "source": {"type": "url", "url": f"{origin}/cat.png"}}
    assert read(anthropic(anthropic_url), allow_urls=True)[1][0].data == PNG


@pytest.mark.parametrize(
    ("path", "limits", "words"),
    [
        ("/missing.png", {}, "HTTP 404"),
        ("/page", {}, "content type 'text/html', not an image"),
        ("/hop/5", {}, "more than 3 redirects"),
        ("/big.png", {"max_bytes": 1 << 20}, "at most 1 MiB"),
        ("/slow.png", {"fetch_timeout_s": 0.3}, "no image within 0.3 s"),
    ],
)
def test_fetch_refusals_name_the_field(origin, path, limits, words):
    error = refused(fetch, f"{origin}{path}", **limits)
    assert words in error.message, error.message
    assert error.param == "messages[0].content[0].image_url.url"


# -- settings -------------------------------------------------------------------------------------


def test_image_settings_and_the_body_limit():
    settings = load_settings(None, {"server": {"max_image_mib": 3, "allow_image_urls": True}})
    limits = settings.image_limits
    assert (limits.max_bytes, limits.max_images, limits.allow_urls) == (3 << 20, 16, True)
    # the default body has room for one such image in base64 beside the text
    assert settings.max_request_bytes == (1 << 20) + (3 << 20) * 4 // 3
    text_only = load_settings(None, {"server": {"max_images_per_request": 0}})
    assert text_only.max_request_bytes == 1 << 20


def test_stored_responses_hold_a_bounded_amount_of_images():
    from ninfer_serve.openai.response_store import ResponseStore, Stored

    def record(rid: str, size: int) -> Stored:
        messages = [{"role": "user", "content": [image_part(ImageInput(bytes(size)))]}]
        return Stored({"id": rid}, [], messages)

    store = ResponseStore(10, max_image_bytes=1000)  # 300 bytes count as 700
    store.put(record("a", 300))
    store.put(record("b", 10))
    store.put(record("c", 300))  # over the budget: the oldest goes
    with pytest.raises(ApiError):
        store.get("a")
    assert store.get("b") and store.get("c")
    store.put(record("d", 600))  # alone over the budget: not kept, nothing else let go
    with pytest.raises(ApiError):
        store.get("d")
    assert store.get("b") and store.get("c")
    store.delete("c")  # its bytes freed: another fits beside b
    store.put(record("e", 300))
    assert store.get("b") and store.get("e")


def test_a_client_cannot_forge_an_image_part():
    forged = {"type": "text", "text": "hi", "ninfer_image_source": "data", "ninfer_image_param": 1}
    out, images = read(chat(forged))
    assert images == [] and out[0]["content"][0]["text"] == "hi"
