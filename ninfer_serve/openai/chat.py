"""POST /v1/chat/completions: OpenAI Chat Completions on the shared engine adapter.

Behaviour follows OpenAI where OpenAI defines it and vLLM where it extends it (``top_k``,
``min_p``, ``repetition_penalty``, ``stop_token_ids``, ``ignore_eos``, ``chat_template_kwargs``,
``reasoning_content``, ``stop_reason``). Fields that would change the result but cannot be
honoured (``logit_bias``, ``best_of``, beam search, audio, predicted outputs, legacy functions)
are refused with a 400 that names them instead of being ignored.

``n`` samples run as separate engine requests (``samples.Samples``: they share the prompt's
prefill), each a choice with its own index. With ``logprobs`` a choice lists every token it
generated, reasoning and tool-call markup included (as vLLM does): their ``bytes`` joined are
the text the model wrote before it was split into ``reasoning_content``, ``content`` and
``tool_calls``. A streamed chunk carries the tokens generated since the previous chunk of its
choice, so the chunks' lists joined are the non-streamed list.

The request becomes a ``Job`` in ``chat_request``, the collected reply is shaped in
``chat_output`` and the streamed one in ``chat_stream``; this module runs the samples between
them (and keeps the names its callers import from here).
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Response
from litestar.response import Stream

from ..cache_isolation import isolate
from ..http import ServerState, sse_response, until_disconnect
from ..limits import check_sample_count
from ..samples import Samples
from .chat_output import completion_body
from .chat_request import to_job
from .chat_stream import chat_chunks
from .logprobs import chat_logprobs, scored
from .models import ChatCompletionRequest
from .reasoning_effort import EFFORT_BUDGETS

__all__ = ["EFFORT_BUDGETS", "chat_completions", "to_job"]


async def chat_completions(
    state: ServerState, request: Request[Any, Any, Any], body: ChatCompletionRequest
) -> Response[Any] | Stream:
    model = state.check_model(body.model)
    job = to_job(body)
    isolate(job, state.settings.context_cache.isolation, request.headers)
    n = body.n or 1
    if n > 1:
        state.loop.check_available()  # the lanes are known once the engine is loaded
        check_sample_count(n, state.loop.max_concurrency)
    samples = await until_disconnect(request, Samples.start(state.generator, job, n))
    cid = f"chatcmpl-{samples.job.request_id}"
    tokenizer = state.generator.engine.tokenizer if body.logprobs else None
    if body.stream:
        chunks = chat_chunks(cid, model, samples, body.stream_options, tokenizer)
        return sse_response(chunks, samples.cancel)
    try:
        outcomes = await until_disconnect(request, samples.collect())
    finally:
        samples.cancel()  # no-op when finished; frees the lanes when the wait was cut short
    logprobs = None
    if tokenizer is not None:
        logprobs = [chat_logprobs(tokenizer, scored(run.tokens)) for run in samples.runs]
    created = samples.runs[0].created
    return Response(completion_body(cid, model, created, outcomes, logprobs))
