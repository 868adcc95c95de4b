"""A lane's chosen tokens become its events: tokens, parsed text, its end.

``EventWriter.emit`` takes each token the engine chose for a lane: a stop token ends the
lane; any other is recorded, reported as a ``TokenEvent``, detokenized, checked against the
stop strings and fed to the output parser (``OutputEvent``), and the lane ends when a stop
string matches or ``max_tokens`` is reached. Ending (``close``, ``finish``) flushes what the
detokenizer and the stop matcher held back, closes the parser and retires the lane with the
scheduler (``Finished``); ``fail`` ends a lane whose own parameters raised (``Failed``). The
event types themselves are in ``request``.
"""

from __future__ import annotations

import time

from .frontend import StopReason, TextDelta, Tokenizer
from .logprobs import TokenLogprobs
from .request import Event, Failed, Finished, OutputEvent, TokenEvent, Usage
from .scheduler import Lane, Scheduler


class EventWriter:
    """The events of one engine's lanes; ``scheduler`` retires the lanes that end."""

    def __init__(self, scheduler: Scheduler, tokenizer: Tokenizer):
        self.scheduler = scheduler
        self.tokenizer = tokenizer

    def emit(
        self, a: Lane, token: int, events: list[Event], score: TokenLogprobs | None = None
    ) -> None:
        """Lane ``a`` has chosen ``token`` (scored when it asks for logprobs): its events,
        and its end when the token ends it; else it is the lane's next pending token."""
        rid = a.request.request_id
        a.pending = None
        stop = a.stops.check_token(token)
        if stop is not None:
            self.close(a, "stop", stop, events)
            return
        a.generated.append(token)
        close = self.tokenizer.think_close_ids
        if a.answer_start is None and close and tuple(a.generated[-len(close) :]) == close:
            a.answer_start = len(a.generated)
        if score is None:
            events.append(TokenEvent(rid, token))
        else:
            events.append(TokenEvent(rid, token, score.logprob, score.top))
        may_stop = len(a.generated) >= a.request.sampling.min_tokens
        step = a.stops.feed(a.detokenizer.add(token), matching=may_stop)
        parse(a, step.text, events)
        if step.stop is not None:
            self.close(a, "stop", step.stop, events)
        elif len(a.generated) >= a.max_tokens:
            self.close(a, "length", None, events)
        else:
            a.pending = token

    def close(self, a: Lane, reason: str, stop: StopReason | None, events: list[Event]) -> None:
        """End lane ``a`` for ``reason``: the text still held back (unless a stop string
        cut it), then ``Finished``."""
        if stop is None or stop.kind != "stop_string":
            tail = a.detokenizer.flush()
            may_stop = len(a.generated) >= a.request.sampling.min_tokens
            step = (
                a.stops.feed(tail, matching=may_stop) if tail and a.stops.stopped is None else None
            )
            text = (step.text if step else "") + (
                a.stops.flush() if a.stops.stopped is None else ""
            )
            parse(a, text, events)
        events.append(self.finish(a, reason, stop, events))

    def finish(
        self, a: Lane, reason: str, stop: StopReason | None, events: list[Event]
    ) -> Finished:
        """Lane ``a``'s parser closed (its last events into ``events``) and the lane
        retired; its ``Finished`` event."""
        rid = a.request.request_id
        if a.parser is not None:
            # a limit ended the output (max_tokens, the context, a stop the client asked for)
            cut_off = reason == "length" or (stop is not None and stop.kind != "eos")
            events.extend(OutputEvent(rid, e) for e in a.parser.finish(cut_off=cut_off))
        now = time.perf_counter()
        first = a.first_token or now
        self.scheduler.retire(a, keep=reason in ("stop", "length"))
        reasoning = len(a.generated) if a.answer_start is None else a.answer_start
        return Finished(
            rid,
            reason,
            stop,
            Usage(
                len(a.prompt_ids),
                len(a.generated),
                cached_tokens=a.cached,
                reasoning_tokens=reasoning,
                accepted_draft_tokens=a.accepted,
                rejected_draft_tokens=a.drafted - a.accepted,
                images=0 if a.images is None else a.images.count,
                cached_images=0 if a.images is None else a.images.from_cache,
            ),
            prompt_seconds=first - a.started,
            decode_seconds=now - first,
        )

    def fail(self, a: Lane, error: Exception, events: list[Event]) -> None:
        """End lane ``a`` by an error of its own request; its memory is freed."""
        self.scheduler.retire(a, keep=False)
        events.append(Failed(a.request.request_id, error))


def parse(a: Lane, text: str, events: list[Event]) -> None:
    """``text`` of lane ``a`` as output events: parsed, or as it is without a parser."""
    if not text:
        return
    rid = a.request.request_id
    if a.parser is None:
        events.append(OutputEvent(rid, TextDelta(text)))
        return
    events.extend(OutputEvent(rid, e) for e in a.parser.feed(text))
