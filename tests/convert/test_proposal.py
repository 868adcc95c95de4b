import json

import numpy as np
import pytest

from ninfer_convert.errors import RecipeError, SourceError
from ninfer_convert.proposal import read_ranking, select_shortlist, token_domain


def test_shortlist_keeps_specials_and_orders_by_count():
    counts = np.array([5, 9, 0, 9, 1, 7, 0, 0], dtype=np.int64)
    ids = select_shortlist(counts, rows=4, token_count=7, forced={6})
    assert ids.dtype == np.int32
    assert list(ids) == [1, 3, 5, 6]  # 9, 9 (ties by id), 7, then the forced special (count 0)
    assert len(set(select_shortlist(counts, 7, 7, {2, 6}))) == 7


def test_shortlist_errors():
    counts = np.zeros(8, dtype=np.int64)
    with pytest.raises(RecipeError, match="must be in"):
        select_shortlist(counts, 0, 8, set())
    with pytest.raises(RecipeError, match="special tokens"):
        select_shortlist(counts, 1, 8, {1, 2})


def test_ranking_file_and_token_domain(tmp_path):
    path = tmp_path / "rank.bin"
    np.arange(16, dtype="<i8").tofile(path)
    assert list(read_ranking(path, 8)) == list(range(8))
    with pytest.raises(SourceError, match="whole number"):
        read_ranking(path, 5)
    tok = {"model": {"vocab": {"a": 0, "b": 1}},
           "added_tokens": [{"id": 2, "content": "<s>", "special": True}]}  # fmt: skip
    count, special = token_domain({"tokenizer.json": json.dumps(tok).encode()})
    assert (count, special) == (3, {2})


def test_convert_with_proposal_head(tmp_path, tiny_dense):
    from ninfer_convert.pipeline import ProposalRequest, convert
    from ninfer_format import Artifact
    from ninfer_format.verify import verify

    rng = np.random.default_rng(0)
    counts = rng.integers(0, 1000, size=512).astype("<i8")
    ranking = tmp_path / "rank.bin"
    counts.tofile(ranking)
    out = tmp_path / "p.ninfer"
    convert("qwen3_6_27b", {"base": str(tiny_dense)}, out,
            proposal=ProposalRequest(ranking, rows=256))  # fmt: skip
    with Artifact.open(out) as art:
        assert art.binder_report.ok, art.binder_report.errors
        assert verify(art, strict=True).ok
        assert art.components["text"].proposal.rows == 256
        ids = art.parameter("proposal/token_ids")
        assert ids.dtype == np.int32 and len(set(ids.tolist())) == 256
        tok = json.loads(art.resource("tokenizer.json"))
        specials = {a["id"] for a in tok["added_tokens"] if a["special"]}
        assert specials <= set(ids.tolist())
        head = art.parameter("text/output_head")  # q6
        proposal = art.parameter("proposal/head")  # q4 of the same source rows
        assert proposal.shape == (256, 128)
        assert art.objects[art.bindings["proposal/head"].object].format == "q4_g64_fp16"
        err = np.abs(proposal - head[ids]).max() / np.abs(head[ids]).max()
        assert err < 0.3  # same rows, coarser format
        uses = {(u.parameter, u.input) for u in art.uses}
        assert ("proposal/head", "mtp/final_hidden") in uses
