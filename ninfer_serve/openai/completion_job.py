"""A legacy Completions prompt as a protocol-neutral ``Job``: its token ids rendered by no
template, the answer constraint and the sampling (vLLM's extensions included); the prompt's
``n`` samples share that job (``samples.Samples``)."""

from __future__ import annotations

from ..generation import Job
from . import vllm_fields
from .completion_request import CompletionRequest, Prompt

__all__ = ["prompt_job"]


def prompt_job(
    body: CompletionRequest, prompt: Prompt, answer: vllm_fields.AnswerConstraint
) -> Job:
    """The job of one prompt (``samples.Samples`` makes its ``n`` samples)."""
    return Job(
        messages=[],
        prompt_ids=prompt.ids,
        parse_output=False,
        prompt_param=prompt.param,
        json_schema=answer.json_schema,
        json_schema_param=answer.json_param,
        answer_grammar=answer.grammar,
        cache_salt=body.cache_salt,
        token_breakpoints=(
            list(body.prompt_cache_options.breakpoints) if body.prompt_cache_options else []
        ),
        sampling={
            # nothing to generate: the engine samples one token (it always takes a step),
            # which is dropped
            "max_tokens": 1 if body.max_tokens == 0 else body.max_tokens,
            **body.sampling(),
            **vllm_fields.sampling_fields(body),
            "logprobs": body.logprobs,
            "prompt_logprobs": body.logprobs if body.echo else None,
        },
    )
