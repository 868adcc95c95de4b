"""Open-time validation of a directory (rules R4-R12), shared by the reader and the writer.

Every problem found is collected, so a tool can print all of them at once; the caller gets one
``DirectoryError`` whose ``problems`` lists a line per problem.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import ValidationError

from .errors import DirectoryError
from .jsontext import MAX_DEPTH, nesting_depth
from .schema import Directory, PartsBinding, Resource, Tensor, WholeBinding

_UNION_TAGS = {"tensor", "resource", "WholeBinding", "PartsBinding"}


def _where(loc: tuple[Any, ...]) -> str:
    out = ""
    for item in loc:
        if isinstance(item, int):
            out += f"[{item}]"
        elif item in _UNION_TAGS:
            out += f"<{item}>"
        else:
            out += f".{item}" if out else str(item)
    return out or "directory"


def parse_directory(document: Any) -> Directory:
    """Schema check (R4, R5 and record-local parts of R6-R12) of a parsed JSON document."""
    if not isinstance(document, dict):
        raise DirectoryError("JSON directory: the root must be an object")
    try:
        return Directory.model_validate(document)
    except ValidationError as exc:
        problems = [f"{_where(e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise DirectoryError(problems=problems) from None


def check_directory(directory: Directory, entry_name: str) -> None:
    """Cross-record rules R6, R8-R12; raises ``DirectoryError`` listing every problem."""
    problems: list[str] = []
    problems += _check_files(directory, entry_name)
    objects = _check_objects(directory, problems)
    _check_components(directory, objects, problems)
    for name, binding in directory.bindings.items():
        _check_binding(f"bindings[{name!r}]", binding, objects, problems)
    seen: set[tuple[str, str]] = set()
    for i, use in enumerate(directory.uses):
        where = f"uses[{i}]"
        if use.parameter not in directory.bindings:
            problems.append(f"{where}: parameter {use.parameter!r} has no binding")
        if (use.parameter, use.input) in seen:
            problems.append(f"{where}: duplicate use of {use.parameter!r} at input {use.input!r}")
        seen.add((use.parameter, use.input))
        for role, binding in (use.auxiliaries or {}).items():
            _check_binding(f"{where}.auxiliaries[{role!r}]", binding, objects, problems)
    for where, value in _free_form(directory):
        if nesting_depth(value) > MAX_DEPTH:
            problems.append(f"{where}: nested deeper than {MAX_DEPTH} levels")
    name = (directory.metadata or {}).get("name")
    if name is not None and (not isinstance(name, str) or not name or "\x00" in name):
        problems.append("metadata.name: must be a non-empty string without U+0000")
    if problems:
        raise DirectoryError(problems=problems)


def _free_form(directory: Directory) -> list[tuple[str, Any]]:
    found = [(f"components[{c!r}].config", comp.config) for c, comp in directory.components.items()]
    found += [("metadata", directory.metadata), ("provenance", directory.provenance)]
    return found


def _check_files(directory: Directory, entry_name: str) -> list[str]:
    problems = []
    files = directory.files
    if files[0].path is not None:
        problems.append("files[0].path: must be null (the entry file)")
    seen: set[str] = set()
    for i, f in enumerate(files[1:], start=1):
        if f.path is None:
            problems.append(f"files[{i}].path: continuation files need a path")
            continue
        if f.path in (".", "..") or any(c in f.path for c in "/\\"):
            problems.append(f"files[{i}].path: {f.path!r} must be a plain sibling file name")
        if f.path == entry_name:
            problems.append(f"files[{i}].path: {f.path!r} is the entry file itself")
        if f.path in seen:
            problems.append(f"files[{i}].path: {f.path!r} appears twice")
        seen.add(f.path)
    if directory.payload_bytes > 2**64 - 1:
        problems.append("files: total payload_bytes does not fit in 64 bits")
    return problems


def _check_objects(directory: Directory, problems: list[str]) -> dict[str, Tensor | Resource]:
    """Unique ids, ascending non-overlapping ranges inside the payload (rule R8).

    A vectorized pass answers "all fine" for the common case; the loop below runs only when
    something is wrong, to say exactly what."""
    listed = directory.objects
    objects = {obj.id: obj for obj in listed}
    payload = directory.payload_bytes
    offsets = np.fromiter((o.offset for o in listed), dtype=np.uint64, count=len(listed))
    sizes = np.fromiter((o.bytes for o in listed), dtype=np.uint64, count=len(listed))
    if (
        len(objects) == len(listed)
        and payload < 2**62
        and offsets.max() < 2**62
        and (sizes.max() < 2**62)
    ):
        stops = offsets + sizes
        ordered = not np.any(offsets[1:] < np.maximum.accumulate(stops)[:-1])
        if ordered and int(stops.max()) <= payload:
            return objects
    return _explain_objects(directory, problems)


def _explain_objects(directory: Directory, problems: list[str]) -> dict[str, Tensor | Resource]:
    objects: dict[str, Tensor | Resource] = {}
    end = 0
    payload = directory.payload_bytes
    for i, obj in enumerate(directory.objects):
        offset, stop = obj.offset, obj.offset + obj.bytes
        if obj.id in objects or offset < end or stop > payload:
            where = f"objects[{i}] ({obj.id!r})"
            if obj.id in objects:
                problems.append(f"{where}: duplicate object id")
            if offset < end:
                problems.append(
                    f"{where}: offset {offset} overlaps or precedes the previous object "
                    f"(which ends at {end}); objects must be sorted and must not overlap"
                )
            if stop > payload:
                problems.append(
                    f"{where}: range [{offset}, {stop}) runs past the payload ({payload} bytes)"
                )
        objects[obj.id] = obj
        end = max(end, stop)
    return objects


def _check_components(
    directory: Directory, objects: dict[str, Tensor | Resource], problems: list[str]
) -> None:
    if "text" not in directory.components:
        problems.append("components: the required component 'text' is missing")
    for cid, comp in directory.components.items():
        where = f"components[{cid!r}]"
        if comp.target is not None and comp.target not in directory.components:
            problems.append(f"{where}.target: names missing component {comp.target!r}")
        for role, oid in (comp.resources or {}).items():
            obj = objects.get(oid)
            if obj is None:
                problems.append(f"{where}.resources[{role!r}]: object {oid!r} does not exist")
            elif not isinstance(obj, Resource):
                problems.append(f"{where}.resources[{role!r}]: object {oid!r} is not a resource")
        if comp.proposal is not None and cid != "text":
            problems.append(f"{where}.proposal: only the text component may have a proposal")


def target_cycles(directory: Directory) -> list[str]:
    """Components whose ``target`` chain comes back to itself, one line per cycle.

    The generic schema does not forbid them (spec section 8, question 4), so opening accepts
    them, but a chain of targets is meant to end at the main component: ``verify`` warns."""
    targets = {cid: comp.target for cid, comp in directory.components.items()}
    found, settled = [], set()
    for start in sorted(targets):
        chain: list[str] = []
        cid: str | None = start
        while cid is not None and cid not in settled and cid not in chain:
            chain.append(cid)
            cid = targets.get(cid)
        settled.update(chain)
        if cid is not None and cid in chain:  # this walk closed a loop of its own
            loop = chain[chain.index(cid) :]
            shown = " -> ".join(repr(c) for c in [*loop, cid])
            found.append(
                f"components[{cid!r}].target: the targets form a cycle {shown}; a chain of "
                "targets must end at a component without one"
            )
    return found


def _check_binding(
    where: str,
    binding: WholeBinding | PartsBinding,
    objects: dict[str, Tensor | Resource],
    problems: list[str],
) -> None:
    if isinstance(binding, WholeBinding):
        if not isinstance(objects.get(binding.object), Tensor):
            _reference_problem(where, binding.object, objects, problems)
        return
    for i, part in enumerate(binding.parts):
        obj = objects.get(part.object)
        if not isinstance(obj, Tensor):
            _reference_problem(f"{where}.parts[{i}]", part.object, objects, problems)
        elif part.range[1] > obj.elements:
            problems.append(
                f"{where}.parts[{i}]: range {part.range} ends past the {obj.elements} "
                f"elements of {part.object!r}"
            )


def _reference_problem(
    where: str, oid: str, objects: dict[str, Tensor | Resource], problems: list[str]
) -> None:
    if oid not in objects:
        problems.append(f"{where}: object {oid!r} does not exist")
    else:
        problems.append(f"{where}: object {oid!r} is a resource, bindings need tensors")
