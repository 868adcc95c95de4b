"""Each parent object planned from the prepared choices, then made and written: streamed by
an importer that keeps stored words, else encoded whole (an importer's words or quantized
float values) with its report lines."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from ninfer_format import ArtifactWriter
from ninfer_format.codecs import codec_for
from ninfer_format.progress import Advance

from .errors import ConvertError, RecipeError
from .plan import Auxiliary, Parent, attach_auxiliaries, bindings_and_uses, plan_parents
from .prepare import Prepared
from .quantize import quantize
from .recipe import Choice
from .report import ConversionReport, kept_reports, object_record, parameter_errors


def _parent_values(parent: Parent, views: Mapping[str, Any]) -> torch.Tensor:
    source = views[parent.choice.source]
    values = [m.load(source) for m in parent.stacked]
    if len(values) == 1:
        return values[0]
    return torch.cat([v.reshape(-1, v.shape[-1]) for v in values], dim=0)


#: makes a parent's object bytes and the source values the decoded object should match
ParentEncoder = Callable[[Parent], tuple[bytes, "torch.Tensor | np.ndarray"]]


def encoder_for(parent: Parent, prepared: Prepared, device: str) -> ParentEncoder:
    """An importer for its method, else quantization of the float values."""
    importer = prepared.importers.get(parent.choice.method)
    if importer is not None:
        return importer.encode

    def quantized(parent: Parent) -> tuple[bytes, torch.Tensor]:
        values = _parent_values(parent, prepared.views)
        encoded = quantize(
            parent.choice.method,
            values.to(device),
            parent.choice.format,
            divisors=parent.divisors or 1,
            **dict(parent.choice.params),
        )
        return encoded, values

    return quantized


def _stacking(prepared: Prepared) -> Callable[[Any, Choice], int]:
    def stacking(members: Any, choice: Choice) -> int:
        importer = prepared.importers.get(choice.method)
        return importer.stacking(members, choice) if importer is not None else 1

    return stacking


def plan(prepared: Prepared) -> tuple[list[Parent], dict[str, Any], list[dict], list[Auxiliary]]:
    """Parents, bindings, uses and the auxiliary objects their uses bind."""
    parents = plan_parents(
        prepared.logical,
        prepared.recipe,
        choices=prepared.choices,
        stacking=_stacking(prepared),
    )
    bindings, uses = bindings_and_uses(parents)

    def provide(parent: Parent, use: dict[str, Any]) -> Any:
        importer = prepared.importers.get(parent.choice.method)
        return importer.auxiliaries(parent, use) if importer is not None else {}

    return parents, bindings, uses, attach_auxiliaries(parents, uses, provide)


def write_parent(
    parent: Parent,
    prepared: Prepared,
    device: str,
    writer: ArtifactWriter,
    report: ConversionReport,
    advance: Advance,
) -> None:
    """One parent object into the writer, streamed (kept words) or encoded whole, and its
    lines of the report; the bar advances by the object's bytes."""
    importer = prepared.importers.get(parent.choice.method)
    if importer is not None and importer.streams:
        non_finite = importer.copy(parent, lambda chunk: writer.write(parent.id, chunk), advance)
        report.parameters += kept_reports(parent, non_finite)
        report.objects.append(object_record(parent, object_bytes(parent)))
        return
    names = ", ".join(m.name for m in parent.members)
    with _threads_for(math.prod(parent.shape)):
        try:
            encoded, reference = encoder_for(parent, prepared, device)(parent)
        except ConvertError as exc:
            raise RecipeError(f"{names}: {exc}") from None
        report.parameters += parameter_errors(parent, encoded, reference)
    writer.write(parent.id, encoded)
    report.objects.append(object_record(parent, len(encoded)))
    advance(len(encoded), names)


#: parents with fewer elements are encoded on one CPU thread
PARALLEL_ELEMENTS = 1 << 22


@contextmanager
def _threads_for(elements: int) -> Iterator[None]:
    """One torch thread for a small parent: each of its many small operations would start and
    join a parallel region, which costs more than the work, and on a busy machine an OpenMP
    team spins waiting for a core it does not get (docs/performance.md has the figures)."""
    threads = torch.get_num_threads()
    if elements >= PARALLEL_ELEMENTS or threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def object_bytes(parent: Parent) -> int:
    codec = codec_for(parent.choice.format, parent.layout)
    return codec.encoded_size(parent.shape, parent.divisors or 1)
