"""The stored responses: a bounded in-memory LRU that ``previous_response_id`` and the
``/v1/responses/{id}`` routes read.

A restart forgets them, and the oldest go first when the store is full (a later
``previous_response_id`` to them gets 404). Images count against their own budget, since one
conversation's images can outweigh thousands of text-only records.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ..errors import ApiError, shown
from ..images import image_bytes

__all__ = ["STORED_IMAGE_BYTES", "ResponseStore", "Stored"]

#: the bytes of images stored conversations may hold together (each record counts its
#: conversation's images and the base64 its input items keep); beyond it the oldest go
STORED_IMAGE_BYTES = 512 * 1024 * 1024


@dataclass
class Stored:
    response: dict[str, Any]
    input_items: list[dict[str, Any]]
    #: the whole conversation as chat messages, including this response's output
    messages: list[dict[str, Any]]

    @property
    def image_bytes(self) -> int:
        return (image_bytes(self.messages) * 7 + 2) // 3  # the bytes, and 4/3 of them in base64


class ResponseStore:
    """Bounded LRU of stored responses (``max_records`` 0 stores nothing), holding at most
    ``max_image_bytes`` of images (a record over it is not kept)."""

    def __init__(self, max_records: int, max_image_bytes: int = STORED_IMAGE_BYTES):
        self.max_records = max_records
        self.max_image_bytes = max_image_bytes
        self._items: OrderedDict[str, tuple[Stored, int]] = OrderedDict()
        self._image_bytes = 0

    def put(self, record: Stored) -> None:
        if self.max_records <= 0:
            return
        rid = record.response["id"]
        if rid in self._items:
            self._drop(rid)
        size = record.image_bytes
        if size > self.max_image_bytes:
            return  # would push every other record out and still not fit
        self._items[rid] = (record, size)
        self._image_bytes += size
        while self._items and (
            len(self._items) > self.max_records or self._image_bytes > self.max_image_bytes
        ):
            self._drop(next(iter(self._items)))

    def _drop(self, rid: str) -> None:
        _, size = self._items.pop(rid)
        self._image_bytes -= size

    def get(self, rid: str, param: str | None = None) -> Stored:
        record = self._items.get(rid)
        if record is None:
            raise ApiError(
                404,
                f"Response with id {shown(rid)} not found.",
                code="response_not_found",
                param=param,
            )
        self._items.move_to_end(rid)
        return record[0]

    def delete(self, rid: str) -> None:
        self.get(rid)
        self._drop(rid)
