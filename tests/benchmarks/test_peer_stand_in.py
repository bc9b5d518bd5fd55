"""The Search-R1 server stand-in that the throughput benchmark runs beside ours: a side-by-side ratio
means something only if the stand-in answers the same API with the same passages as our server."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import skip_without

skip_without("bench", "fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from benchmarks.peers.search_r1_server import PeerRetriever, create_app  # noqa: E402
from search_env.sources.dense import DenseSource, as_passages  # noqa: E402
from search_env.sources.encoders import TransformersEncoder, default_model_path  # noqa: E402


def test_stand_in_answers_like_our_dense_source(shared_data: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    rows = [json.loads(line) for line in (shared_data / "corpus.jsonl").read_text(encoding="utf-8").splitlines()[:300]]
    corpus.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    ours = DenseSource(corpus, TransformersEncoder(precision="fp32", backend="torch"), index_dir=tmp_path / "dense", show_progress=False)
    client = TestClient(create_app(PeerRetriever(default_model_path(), tmp_path / "dense" / "index.faiss", corpus)))

    questions = [row["title"] for row in rows[:12]]  # each title should find its own passage first
    reply = client.post("/retrieve", json={"queries": questions, "topk": 3, "return_scores": True})
    assert reply.status_code == 200
    result = reply.json()["result"]
    expected = ours.search(questions, 3)
    assert [[hit["document"]["id"] for hit in hits] for hits in result] == [[p.id for p in row] for row in expected]
    for hits, row in zip(result, expected):
        assert [hit["score"] for hit in hits] == pytest.approx([p.score for p in row], abs=1e-4)
    first = as_passages(corpus)[0]
    assert result[0][0]["document"]["contents"] == f'"{first.title}"\n{first.text}'  # the wiki-18 layout
    bare = client.post("/retrieve", json={"queries": questions[:2]}).json()["result"]  # default topk, no scores
    assert [len(docs) for docs in bare] == [3, 3] and set(bare[0][0]) == {"id", "contents"}
