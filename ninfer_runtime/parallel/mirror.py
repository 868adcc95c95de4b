"""Rank 0 plans, the other ranks follow: every call the scheduler makes on the objects rank
0 holds (the model runner, its context pool) is sent to the followers, which make the same
call on their own (each rank's runner computes its share and the collectives inside meet);
then rank 0 makes it. Objects such a call returns and later calls pass back (sequence
states, checkpoints, host copies, pools) are known on every rank by the number of the call
that made them, so a follower resolves rank 0's object to its own.

``Leader`` wraps rank 0's objects; ``follow`` is a follower's loop. The calls travel through
anything with ``put`` on rank 0's side and ``get`` on the follower's: a ``queue.Queue``
between threads, a pipe between processes (``processes.Outbox`` / ``Inbox``).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

#: the runner's handle on every rank
RUNNER = 0
#: calls after which their first argument is no longer passed back (a pool's ``close`` of a
#: sequence state, ``drop`` of a checkpoint): every rank forgets it
RELEASES = frozenset({"close", "drop"})


@dataclass(frozen=True)
class Handle:
    """An object known on every rank: the number of the call that made it."""

    number: int


@dataclass(frozen=True)
class Call:
    target: int  # the handle of the object called
    method: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    number: int  # what its result is known by, when kept


class Leader:
    """Rank 0's side. ``kept``: the types of results later calls pass back (and, among them,
    ``wrapped``, those the scheduler calls methods on: they come back as proxies too)."""

    def __init__(
        self,
        followers: Sequence[Any],  # each with put(message)
        kept: tuple[type, ...],
        wrapped: tuple[type, ...],
    ):
        self.followers, self.kept, self.wrapped = list(followers), kept, wrapped
        for t in wrapped:
            if not issubclass(t, kept):
                raise TypeError(f"{t.__name__} is wrapped but not kept")
        self._numbers = itertools.count(RUNNER + 1)
        self._known: dict[int, tuple[int, Any]] = {}  # id(obj) -> (handle, obj)
        self._lock = threading.Lock()

    def wrap(self, runner: Any) -> Any:
        """Rank 0's runner as the scheduler should hold it (known on every rank as ``RUNNER``)."""
        self._known[id(runner)] = (RUNNER, runner)
        return _Proxy(self, runner, RUNNER)

    def stop(self) -> None:
        """End the followers' loops."""
        for q in self.followers:
            q.put(None)

    def call(self, target: int, obj: Any, method: str, args: tuple, kwargs: dict) -> Any:
        with self._lock:
            number = next(self._numbers)
            message = Call(target, method, self._handles(args), self._handles(kwargs), number)
            for q in self.followers:
                q.put(message)
        result = getattr(obj, method)(*args, **kwargs)
        if method in RELEASES and args:
            self._known.pop(id(args[0]), None)
        if isinstance(result, self.kept):
            self._known[id(result)] = (number, result)
            if isinstance(result, self.wrapped):
                return _Proxy(self, result, number)
        return result

    def _handles(self, value: Any) -> Any:
        if isinstance(value, _Proxy):
            return Handle(value._number)
        known = self._known.get(id(value))
        if known is not None and known[1] is value:
            return Handle(known[0])
        if isinstance(value, list | tuple):
            return type(value)(self._handles(v) for v in value)
        if isinstance(value, dict):
            return {k: self._handles(v) for k, v in value.items()}
        return value


class _Proxy:
    """Rank 0's object as the scheduler sees it: attributes read through, calls mirrored."""

    def __init__(self, leader: Leader, obj: Any, number: int):
        self._leader, self._obj, self._number = leader, obj, number

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._obj, name)
        if not callable(value) or not hasattr(value, "__self__"):
            return value
        return lambda *args, **kwargs: self._leader.call(
            self._number, self._obj, name, args, kwargs
        )


def follow(inbox: Any, runner: Any, kept: tuple[type, ...], failed: Callable) -> None:
    """A follower's loop: make each call rank 0 sends, on this rank's objects, until told to
    stop; ``failed(exc)`` on the first error (which should break the group)."""
    objects: dict[int, Any] = {RUNNER: runner}

    def resolve(value: Any) -> Any:
        if isinstance(value, Handle):
            return objects[value.number]
        if isinstance(value, list | tuple):
            return type(value)(resolve(v) for v in value)
        if isinstance(value, dict):
            return {k: resolve(v) for k, v in value.items()}
        return value

    while (message := inbox.get()) is not None:
        try:
            target = objects[message.target]
            result = getattr(target, message.method)(
                *resolve(message.args), **resolve(message.kwargs)
            )
        except BaseException as exc:
            failed(exc)
            return
        if message.method in RELEASES and message.args and isinstance(message.args[0], Handle):
            objects.pop(message.args[0].number, None)
        if isinstance(result, kept):
            objects[message.number] = result
