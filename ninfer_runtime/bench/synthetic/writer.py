"""Writing a synthetic artifact: the plan's resources, parents and auxiliaries streamed into an
``ArtifactWriter``, with provenance that records ``"synthetic": true`` with the geometry,
recipe, seed, components and proposal rows (and, with fewer layers, the reduction)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ninfer_convert.recipe import Recipe
from ninfer_format import ArtifactWriter
from ninfer_format.framing import DEFAULT_SHARD_LIMIT
from ninfer_format.progress import ProgressBar, silent

from .chunks import parent_chunks
from .plan import plan_synthetic


@dataclass
class SynthesisReport:
    path: str
    geometry: str
    recipe: str
    payload_bytes: int
    seconds: float

    @property
    def mb_per_s(self) -> float:
        return self.payload_bytes / 1e6 / self.seconds if self.seconds else 0.0


def write_synthetic(
    path: str | Path,
    geometry: str,
    formats: str | Recipe,
    seed: int = 0,
    overwrite: bool = False,
    *,
    mtp: bool = True,
    proposal_rows: int | None = None,
    layers: int | None = None,
    ple_rows_scale: float = 1.0,
    vision: bool = False,
    shard_limit: int = DEFAULT_SHARD_LIMIT,
    progress: ProgressBar = silent,
) -> SynthesisReport:
    """Write a synthetic artifact of ``geometry`` with the formats of recipe ``formats``
    (``mtp``, ``proposal_rows``, ``layers``, ``ple_rows_scale``, ``vision``: as
    ``plan_synthetic``);
    ``progress`` shows the weight bytes written (``terminal_bar`` draws a bar)."""
    started = time.perf_counter()
    path = Path(path)
    plan = plan_synthetic(
        geometry, formats, mtp=mtp, proposal_rows=proposal_rows, layers=layers,
        ple_rows_scale=ple_rows_scale, vision=vision,
    )  # fmt: skip
    provenance = {
        "converter": "ninfer-bench synth",
        "synthetic": True,
        "source": "synthetic",
        "geometry": geometry,
        "recipe": plan.recipe.name,
        "seed": seed,
        "components": sorted(plan.components),
        "proposal_rows": plan.proposal_rows,
    }
    if plan.reduction is not None:
        provenance["reduced"] = plan.reduction
    sizes = {r["id"]: r["bytes"] for r in plan.objects}
    total = sum(sizes.values())
    with (
        ArtifactWriter(
            path,
            components=plan.components,
            objects=plan.specs,
            bindings=plan.bindings,
            uses=plan.uses,
            metadata={"name": path.stem, "synthetic": True},
            provenance=provenance,
            shard_limit=shard_limit,
            overwrite=overwrite,
        ) as writer,
        progress(total, "writing", "B") as advance,
    ):
        for rid, data in plan.resources.items():
            writer.write(rid, data)
        for parent in plan.parents:
            for chunk in parent_chunks(parent, seed):
                writer.write(parent.id, chunk)
            advance(sizes[parent.id])
        for aux in plan.auxiliaries:
            writer.write(aux.id, aux.data)
        payload = writer.directory.payload_bytes
    return SynthesisReport(
        str(path), geometry, plan.recipe.name, payload, time.perf_counter() - started
    )
