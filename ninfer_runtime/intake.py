"""A request becomes a lane: its prompt rendered and checked, its output's tools made.

``RequestIntake.render`` turns a request's chat messages (the chat template), prompt string
or token ids into prompt token ids, each image's placeholder widened to the image's tokens,
and says whether the output starts inside reasoning (the template opened ``<think>``).
``lane`` checks those ids against the engine's limits (the context, the vocabulary, the
context pool), encodes the images, and builds the ``Lane`` the scheduler queues: its
sampler, stop matcher, detokenizer and output parser, its token and thinking budgets, and
with the prefix cache where the next chat turn's prompt stops being this one's
(``history_end``). Every refusal is a one-line ``RequestError``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .checkpoint_plan import check_cache_fields
from .errors import RequestError
from .frontend import ChatTemplate, Sampler, StopMatcher, Tokenizer
from .frontend.tokenizer import THINK_OPEN
from .images import VisionInput
from .prefix_cache import common_prefix
from .request import GenerationRequest
from .scheduler import Lane


class RequestIntake:
    """Requests to lanes for one engine: its ``tokenizer`` and chat ``template``, its image
    path (``vision``; None, with the one line ``no_images`` says why, when it takes none)
    and the model's vocabulary size (``vocab``)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        template: ChatTemplate,
        vision: VisionInput | None,
        no_images: str | None,
        *,
        vocab: int,
    ):
        self.tokenizer = tokenizer
        self.template = template
        self.vision = vision
        self.no_images = no_images
        self.vocab = vocab

    def render(self, request: GenerationRequest) -> tuple[list[int], bool]:
        """Prompt token ids, and whether the output starts inside reasoning."""
        given = [x is not None for x in (request.messages, request.prompt, request.prompt_ids)]
        if sum(given) != 1:
            raise RequestError(
                "give exactly one of messages, prompt or prompt_ids", param="messages"
            )
        if request.images:
            self.check_images(request)
        if request.prompt_ids is not None:
            ids = [int(t) for t in request.prompt_ids]
            return ids, False
        if request.prompt is not None:
            return self.tokenizer.encode(request.prompt), False
        text = self.template.render(
            request.messages,  # type: ignore[arg-type]
            tools=request.tools,
            add_generation_prompt=request.add_generation_prompt
            and not request.continue_final_message,
            continue_final_message=request.continue_final_message,
            enable_thinking=request.enable_thinking,
            chat_template_kwargs=request.chat_template_kwargs,
        )
        opened = text.rstrip().endswith(THINK_OPEN)
        ids = self.tokenizer.encode(text)
        if request.images:  # each image's placeholder as many tokens as the image takes
            ids = self.vision.expand(ids, request.images)  # type: ignore[union-attr]
        return ids, opened

    def check_images(self, request: GenerationRequest) -> None:
        """Whether this engine takes ``request``'s images at all (one line when not)."""
        if self.vision is None:
            raise RequestError(self.no_images or "this model takes no images", param="images")
        if request.messages is None:
            raise RequestError(
                "images come with chat messages (image content parts), not with prompt or "
                "prompt_ids",
                param="images",
            )

    def lane(
        self,
        request: GenerationRequest,
        rendered: tuple[Sequence[int], bool],
        *,
        max_context: int,
        pool_tokens: int,
        history_end: int | None,
    ) -> Lane:
        """The lane of ``request`` whose ``render`` is ``rendered``, checked against the
        engine's ``max_context`` and the ``pool_tokens`` its context pool holds for one
        sequence, noting its ``history_end`` (with a prefix cache)."""
        ids, in_reasoning = rendered
        ids = [int(t) for t in ids]
        if not ids:
            raise RequestError("the prompt is empty", param="messages")
        if len(ids) >= max_context:
            raise RequestError(
                f"the prompt has {len(ids)} tokens; max_context is {max_context} "
                "(prompt plus at least one generated token)",
                param="messages",
                code="context_length_exceeded",
            )
        vocab = self.vocab
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise RequestError(
                f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})", param="prompt_ids"
            )
        params = request.sampling
        room = min(max_context, pool_tokens) - len(ids)
        if room < 1:
            raise RequestError(
                f"the prompt has {len(ids)} tokens; the context pool holds {pool_tokens} in all",
                param="messages",
                code="context_length_exceeded",
            )
        max_tokens = min(params.max_tokens or room, room)
        budget = params.max_thinking_tokens
        if request.logits_processor is not None:  # a constrained answer is never starved
            budget = min(budget or max_tokens, max(max_tokens // 2, 1))
        images = None
        if request.images:  # the tower's rows (or the media cache's), positions, cache key
            self.check_images(request)
            assert self.vision is not None
            images = self.vision.encode(np.asarray(ids, dtype=np.int64), request.images)
        parser = None
        if request.parse_output:
            parser = self.template.chat_format.output_parser(
                starts_in_reasoning=in_reasoning,
                tools=request.tools,
                parse_tool_calls=request.parse_tool_calls,
                continues_text=request.continue_final_message,
            )
        lane = Lane(
            request=request,
            prompt_ids=np.asarray(ids, dtype=np.int64),
            state=None,  # type: ignore[arg-type]  (allocated when admitted to a lane)
            sampler=Sampler(params, ids),
            stops=StopMatcher.from_params(params, self.tokenizer.eos_token_ids),
            detokenizer=self.tokenizer.detokenize_stream(
                skip_special_tokens=params.skip_special_tokens
            ),
            parser=parser,
            max_tokens=max_tokens,
            answer_start=None if in_reasoning else 0,
            thinking_budget=budget if in_reasoning else None,
            images=images,
        )
        if params.seed is not None:
            lane.seed = params.seed
        if params.prompt_logprobs is not None:
            lane.prompt_scores = [None] * len(ids)
        check_cache_fields(request.cache_salt, request.cache_boundaries, len(ids))
        if history_end is not None and not 0 < history_end < len(ids):
            raise RequestError(
                f"history_end is {history_end}; expected 1..{len(ids) - 1} for a prompt of "
                f"{len(ids)} tokens",
                param="history_end",
            )
        lane.history_end = history_end
        return lane

    def history_end(self, request: GenerationRequest, ids: Sequence[int]) -> int | None:
        """How many of a chat prompt's tokens the next turn resends unchanged: the prompt's
        common prefix with the conversation rendered as history (this turn answered, one
        more user message), None when that is all of it or nothing."""
        if request.messages is None or request.continue_final_message:
            return None
        placeholder = [{"role": "assistant", "content": "x"}, {"role": "user", "content": "x"}]
        text = self.template.render(
            [*request.messages, *placeholder],
            tools=request.tools,
            add_generation_prompt=False,
            enable_thinking=request.enable_thinking,
            chat_template_kwargs=request.chat_template_kwargs,
        )
        later = self.tokenizer.encode(text)
        if request.images:  # the same images, widened as the prompt's were
            try:
                later = self.vision.expand(later, request.images)  # type: ignore[union-attr]
            except RequestError:  # the template wrote the history's images otherwise
                return None
        shared = common_prefix(np.asarray(ids, dtype=np.int64), np.asarray(later, dtype=np.int64))
        return shared if 0 < shared < len(ids) else None
