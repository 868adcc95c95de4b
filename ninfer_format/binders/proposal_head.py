"""The indexed proposal head (spec 5.6): which drafters read it, its rows and its parameters.

Shared by Qwen3.5 and the text contracts of other architectures.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ..schema import Directory
from .parameter_spec import ParamSpec, Role, _matrix
from .qwen3_5_geometry import Qwen35Geometry as Geometry
from .registry import Findings

#: Components that read hidden states through a head: each adds a Use input on the text head
#: and on ``proposal/head``. Only mtp is checked by this binder; dflash/dflash2 are not.
DRAFTERS = ("mtp", "dflash", "dflash2")


def _proposal(rows: int, hidden: int, drafters: Sequence[str]) -> Iterator[ParamSpec]:
    yield _matrix("proposal/head", rows, hidden, *(f"{d}/final_hidden" for d in drafters))
    yield ParamSpec("proposal/token_ids", (rows,), Role.TOKEN_IDS)


def _proposal_rows(
    directory: Directory, g: Geometry, drafters: Sequence[str], findings: Findings
) -> int | None:
    proposal = directory.components["text"].proposal
    if proposal is None or proposal.domain != "indexed" or proposal.rows is None:
        return None
    if proposal.rows > g.vocab:
        findings.error(f"text proposal rows ({proposal.rows}) exceed vocab_size ({g.vocab})")
    if not drafters:
        findings.warning("text has an indexed proposal but no drafter component reads it")
    return proposal.rows
