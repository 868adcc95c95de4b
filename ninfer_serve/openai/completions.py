"""POST /v1/completions: OpenAI's legacy Completions, as vLLM serves them.

A prompt is raw text (no chat template) or token ids, one prompt or a list of them; each
gets ``n`` independent samples, the choices indexed prompt by prompt, then sample by sample.
The output is plain text: no reasoning or tool-call parsing. The request model and the
reading of its prompts are in ``completion_request``; this module runs and shapes them.

The samples of one prompt share its prefill (``samples.Samples``: the first is submitted
alone, the others once the engine has read the prompt, resuming from its prefix-cache
checkpoint); ``n`` is at most the server's decode lanes. Each prompt is tokenized once, and
all are checked (vocabulary, context) before anything is generated. A request never runs more
samples at a time than the server has lanes, so a long list of prompts waits for its own
lanes instead of filling the admission queue. Usage counts each prompt once:
``prompt_tokens`` over the prompts, ``cached_tokens`` what the cache held for them before
the request (the first samples'), and ``completion_tokens`` over every choice.

``echo`` puts the prompt's text before each choice's text; with ``logprobs`` the prompt's
tokens come first in the choice's log-probabilities (the first one's null: nothing predicts
it), scored once by the prompt's first sample (``prompt_logprobs``). ``max_tokens: 0``
generates nothing (the engine samples one token, which is dropped): with ``echo`` and
``logprobs`` that scores a prompt, as evaluation harnesses do. vLLM's extensions are Chat's
(``vllm_fields``: guided decoding, ``min_tokens``, ``ignore_eos`` ...). Fields the engine
cannot honour (``suffix``, ``best_of`` above 1, beam search, a non-zero ``logit_bias``) are
refused with a 400 that names them; unknown fields are refused too. A streamed request's
first prompt is submitted before the stream opens, so what would refuse the request comes
as its status, not inside a 200 stream.

A prompt becomes a ``Job`` in ``completion_job``; ``completion_batch`` runs a request's
prompts within its lanes, ``completion_output`` shapes the collected choices and usage and
``completion_stream`` the streamed chunks; this module checks a request and runs it.
"""

from __future__ import annotations

import time
from typing import Any

from litestar import Request, Response
from litestar.response import Stream

from ..cache_isolation import isolate
from ..http import ServerState, new_id, sse_response, until_disconnect
from ..limits import check_sample_count, check_stop_count
from . import vllm_fields
from .completion_batch import CompletionBatch
from .completion_job import prompt_job
from .completion_output import ChoiceShaper
from .completion_request import (
    MAX_PROMPTS,
    CompletionRequest,
    prompt_forms,
    read_prompts,
    refuse_unsupported,
)
from .completion_stream import CompletionStream

__all__ = ["MAX_PROMPTS", "CompletionRequest", "create_completion"]


async def create_completion(
    state: ServerState, request: Request[Any, Any, Any], body: CompletionRequest
) -> Response[Any] | Stream:
    model = state.check_model(body.model)
    refuse_unsupported(body)
    check_stop_count(body.stop, "stop")
    answer = vllm_fields.answer_constraint(body)
    generator = state.generator
    state.loop.check_available()  # the lanes are known once the engine is loaded
    check_sample_count(body.n, generator.loop.max_concurrency)
    forms = prompt_forms(body.prompt)
    prompts = await until_disconnect(
        request, generator.admitted(read_prompts, generator, forms, bool(body.echo))
    )
    shaper = ChoiceShaper(body, generator.engine.tokenizer, prompts)
    jobs = [prompt_job(body, p, answer) for p in prompts]
    for job in jobs:
        isolate(job, state.settings.context_cache.isolation, request.headers)
    batch = CompletionBatch(generator, jobs, body.n)
    created = int(time.time())
    base = {"id": new_id("cmpl-"), "object": "text_completion", "created": created, "model": model}
    if body.stream:
        stream = CompletionStream(batch, shaper, base, body.stream_options, generator.keepalive)
        stream.begin()
        try:
            await until_disconnect(request, batch.first_started())
        except BaseException:
            batch.cancel()
            raise
        return sse_response(stream.frames(), batch.cancel)
    await until_disconnect(request, batch.run_all())
    choices = [shaper.choice(batch, p, i) for p in range(len(prompts)) for i in range(body.n)]
    return Response({**base, "choices": choices, "usage": shaper.usage(batch)})
