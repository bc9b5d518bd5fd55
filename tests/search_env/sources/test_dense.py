"""Text encoders and the dense source: pooling, prefixes, truncation, length-sorted batching, each
faiss index type against brute force, and the build/save/load round trip.

Fast tests use a tiny randomly initialised BERT built here (word-level tokenizer over the test
corpus), saved to a temporary folder and loaded through the same code path as a real model. One
slow test runs the real all-MiniLM-L6-v2 on ~200 passages of the shared corpus.
"""
from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
import pytest

from tests.conftest import skip_without

skip_without("dense", "torch", "transformers", "faiss")
import torch  # noqa: E402

from search_env.sources.base import Passage  # noqa: E402
from search_env.sources.dense import (  # noqa: E402
    EMBEDDINGS,
    INDEX_FILE,
    MANIFEST,
    DenseSource,
    IndexConfig,
    as_passages,
    faiss_gpu_available,
    passage_text,
)
from search_env.sources.encoders import (  # noqa: E402
    MIN_SLICE,
    PREFIX_PRESETS,
    TextEncoder,
    TransformersEncoder,
    detect_pooling,
    resolve_prefixes,
)

WORDS = ("river mountain castle violin physics poet harbour glacier senate opera falcon copper "
         "desert lantern orchard comet theatre bridge island tiger novel museum canal engine").split()


def make_corpus(n: int = 30, seed: int = 0) -> list[Passage]:
    """Passages of varied length (2 to 40 words) so batches need padding."""
    rng = random.Random(seed)
    return [
        Passage(f"p{i}", f"Title {WORDS[i % len(WORDS)]}",
                " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 40))))
        for i in range(n)
    ]


CORPUS = make_corpus()


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    prefix_text = " ".join(q + " " + p for q, p in PREFIX_PRESETS.values())
    words = {w.lower() for w in WORDS} | {w.lower() for w in (prefix_text + " title : p").split()} | {":"}
    vocab = {tok: i for i, tok in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *sorted(words)])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]",
                                        cls_token="[CLS]", sep_token="[SEP]")
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64, initializer_range=0.5)
    folder = tmp_path_factory.mktemp("models") / "tiny-encoder"
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def encoder(tiny_model_dir: Path) -> TransformersEncoder:
    # torch with two workers, so that the concurrent batch path runs even on a one-core machine;
    # the OpenVINO backend is checked against this one below
    return TransformersEncoder(tiny_model_dir, precision="fp32", batch_size=4, workers=2, prefixes="none", backend="torch")


class CountingEncoder(TextEncoder):
    """Wraps an encoder and counts passage-encoding calls, to prove a reload does not re-encode."""

    def __init__(self, inner: TextEncoder) -> None:
        self.inner = inner
        self.dim = inner.dim
        self.signature = inner.signature
        self.passage_calls = 0

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        return self.inner.encode_queries(queries)

    def encode_passages(self, passages: Sequence[str], *, show_progress: bool = False) -> np.ndarray:
        self.passage_calls += 1
        return self.inner.encode_passages(passages, show_progress=show_progress)


# --- encoders -------------------------------------------------------------------------------------


def test_length_sorted_batches_equal_one_by_one_encoding(encoder: TransformersEncoder) -> None:
    texts = [passage_text(p) for p in CORPUS]
    batched = encoder.encode_passages(texts)
    single = np.stack([encoder.encode_passages([t])[0] for t in texts])
    assert batched.shape == (len(texts), 32) and batched.dtype == np.float32
    np.testing.assert_allclose(batched, single, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-5)
    assert encoder.encode_queries([]).shape == (0, 32)


@pytest.mark.parametrize("n", [3, 8, 9])
def test_a_small_query_batch_split_over_workers_equals_one_by_one(tiny_model_dir: Path, n: int) -> None:
    # n <= batch_size: from 2 * MIN_SLICE texts on, the batch is cut into one slice per worker,
    # each written back in input order
    encoder = TransformersEncoder(tiny_model_dir, precision="fp32", batch_size=16, workers=2, prefixes="none", backend="torch")
    queries = [passage_text(p) for p in CORPUS[:n]]
    assert len({len(q.split()) for q in queries}) > n // 2  # varied lengths, so sorting reorders them
    batched = encoder.encode_queries(queries)
    single = np.stack([encoder.encode_queries([q])[0] for q in queries])
    np.testing.assert_allclose(batched, single, atol=1e-5)
    assert (encoder._workers_pool is not None) == (n >= 2 * MIN_SLICE)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_pooling_matches_hand_computation(tiny_model_dir: Path, pooling: str) -> None:
    enc = TransformersEncoder(tiny_model_dir, pooling=pooling, precision="fp32", prefixes="none")
    text = "violin castle comet river"
    batch = enc.tokenizer([text], return_tensors="pt")
    with torch.no_grad():
        hidden = enc.model(**batch).last_hidden_state[0]
    vector = hidden.mean(dim=0) if pooling == "mean" else hidden[0]
    expected = (vector / vector.norm()).numpy()
    np.testing.assert_allclose(enc.encode_queries([text])[0], expected, atol=1e-5)


def test_pooling_read_from_sentence_transformers_config(tiny_model_dir: Path, tmp_path: Path) -> None:
    folder = tmp_path / "st-model"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "modules.json").write_text(json.dumps([{"idx": 1, "name": "1", "path": "1_Pool", "type": "sentence_transformers.models.Pooling"}]))
    (folder / "1_Pool").mkdir()
    (folder / "1_Pool" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}))
    assert TransformersEncoder(folder, precision="fp32").pooling == "cls"
    (folder / "1_Pool" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True}))
    assert detect_pooling(folder, "bge-like") == "mean"  # the config wins over the name
    (folder / "1_Pool" / "config.json").write_text(json.dumps({"pooling_mode_max_tokens": True}))
    with pytest.raises(ValueError, match="pooling"):
        detect_pooling(folder, "x")
    assert detect_pooling(None, "BAAI/bge-base-en-v1.5") == "cls"
    assert detect_pooling(None, "intfloat/e5-base-v2") == "mean"


def test_prefix_presets_by_name() -> None:
    assert resolve_prefixes("auto", "intfloat/e5-base-v2") == ("query: ", "passage: ")
    assert resolve_prefixes("auto", "BAAI/bge-large-en-v1.5") == (
        "Represent this sentence for searching relevant passages: ", "")
    assert resolve_prefixes("auto", "BAAI/bge-small-zh-v1.5")[0] == "为这个句子生成表示以用于检索相关文章："
    assert resolve_prefixes("auto", "BAAI/bge-m3") == ("", "")
    assert resolve_prefixes("auto", "all-MiniLM-L6-v2") == ("", "")
    assert resolve_prefixes(("q> ", "d> "), "whatever") == ("q> ", "d> ")
    with pytest.raises(ValueError, match="unknown prefix preset"):
        resolve_prefixes("e6", "x")


def test_prefixes_are_applied(tiny_model_dir: Path, encoder: TransformersEncoder, tmp_path: Path) -> None:
    text = "falcon opera copper"
    e5 = TransformersEncoder(tiny_model_dir, prefixes="e5", precision="fp32")
    np.testing.assert_allclose(e5.encode_queries([text]), encoder.encode_queries(["query: " + text]), atol=1e-5)
    np.testing.assert_allclose(e5.encode_passages([text]), encoder.encode_passages(["passage: " + text]), atol=1e-5)
    assert not np.allclose(e5.encode_queries([text]), encoder.encode_queries([text]), atol=1e-3)

    bge = TransformersEncoder(tiny_model_dir, prefixes="bge", precision="fp32")
    instruction = PREFIX_PRESETS["bge"][0]
    np.testing.assert_allclose(bge.encode_queries([text]), encoder.encode_queries([instruction + text]), atol=1e-5)
    np.testing.assert_allclose(bge.encode_passages([text]), encoder.encode_passages([text]), atol=1e-5)

    named = tmp_path / "e5-tiny"  # "auto" picks the E5 prefixes from the folder name
    shutil.copytree(tiny_model_dir, named)
    assert TransformersEncoder(named, precision="fp32").query_prefix == "query: "


def test_truncation_at_max_length(tiny_model_dir: Path) -> None:
    # [CLS] + 4 words + [SEP] = 6 tokens: texts that differ only after the 4th word coincide
    short = TransformersEncoder(tiny_model_dir, max_length=6, precision="fp32", prefixes="none")
    full = TransformersEncoder(tiny_model_dir, precision="fp32", prefixes="none")
    a, b = "river castle poet comet tiger novel", "river castle poet comet museum canal engine"
    np.testing.assert_allclose(short.encode_passages([a]), short.encode_passages([b]), atol=1e-6)
    assert not np.allclose(full.encode_passages([a]), full.encode_passages([b]), atol=1e-3)
    assert full.max_length == 64  # the model's position limit when there is no sentence-transformers config


def test_signature_tracks_what_changes_passage_embeddings(tiny_model_dir: Path, encoder: TransformersEncoder) -> None:
    same = TransformersEncoder(tiny_model_dir, precision="fp32", prefixes=("only for queries: ", ""))
    assert same.signature == encoder.signature
    for other in (
        TransformersEncoder(tiny_model_dir, precision="fp32", prefixes="e5"),
        TransformersEncoder(tiny_model_dir, precision="fp32", prefixes="none", pooling="cls"),
        TransformersEncoder(tiny_model_dir, precision="fp32", prefixes="none", max_length=16),
    ):
        assert other.signature != encoder.signature


def test_bf16_close_to_fp32(tiny_model_dir: Path, encoder: TransformersEncoder) -> None:
    bf16 = TransformersEncoder(tiny_model_dir, precision="bf16", prefixes="none", backend="torch")
    # converted once at load (not autocast on every call), while the output stays float32
    assert {p.dtype for p in bf16.model.parameters()} == {torch.bfloat16}
    texts = [passage_text(p) for p in CORPUS[:8]]
    vectors = bf16.encode_passages(texts)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    cosine = (vectors * encoder.encode_passages(texts)).sum(axis=1)
    assert cosine.min() > 0.99
    with pytest.raises(ValueError, match="precision"):
        TransformersEncoder(tiny_model_dir, precision="int4")  # type: ignore[arg-type]


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_openvino_backend_equals_torch(tiny_model_dir: Path, pooling: str) -> None:
    ov = TransformersEncoder(tiny_model_dir, pooling=pooling, precision="fp32", batch_size=4, workers=2, prefixes="none", backend="openvino")
    reference = TransformersEncoder(tiny_model_dir, pooling=pooling, precision="fp32", prefixes="none", backend="torch")
    assert ov.backend == "openvino" and "backend=openvino, threads=2" in repr(ov)
    assert ov.workers == 1  # batches are not sliced: every inference runs on the two threads
    texts = [passage_text(p) for p in CORPUS]
    vectors = ov.encode_passages(texts)  # length-sorted batches of 4, padded differently than below
    assert vectors.dtype == np.float32 and vectors.shape == (len(texts), 32)
    np.testing.assert_allclose(vectors, reference.encode_passages(texts), atol=1e-4)
    for n in (1, 3, 9):  # a lone query (its own path), and padded batches
        np.testing.assert_allclose(ov.encode_queries(texts[:n]), reference.encode_queries(texts[:n]), atol=1e-4)
    assert ov.signature == reference.signature  # the backend does not change what the index holds


def test_openvino_backend_is_thread_safe(tiny_model_dir: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    ov = TransformersEncoder(tiny_model_dir, precision="fp32", prefixes="none", backend="openvino")
    texts = [passage_text(p) for p in CORPUS]
    expected = [ov.encode_queries(texts[i : i + 3]) for i in range(0, len(texts), 3)]
    with ThreadPoolExecutor(4) as pool:  # one inference request per thread on the shared model
        got = list(pool.map(lambda i: ov.encode_queries(texts[i : i + 3]), range(0, len(texts), 3)))
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the signal-stack guard is Linux's sigaltstack")
def test_openvino_models_leave_the_signal_stack_as_they_found_it(tiny_model_dir: Path) -> None:
    # OpenVINO's CPU plugin gives the compiling thread a signal stack per model; freed first-made first
    # (not in reverse), the models left the thread on a freed one and the next signal (a Ctrl-C) was a
    # segfault.
    # A fresh process, because that segfault would take pytest down with it.
    script = f"""
import signal
from search_env.sources.encoders import TransformersEncoder
from search_env.sources.openvino_runtime import _signal_stack
before = _signal_stack()
encoders = [TransformersEncoder({str(tiny_model_dir)!r}, precision="fp32", prefixes="none", backend="openvino") for _ in range(3)]
del encoders[0], encoders[0], encoders[0]  # in creation order
handled = []
signal.signal(signal.SIGINT, lambda *args: handled.append(True))
signal.raise_signal(signal.SIGINT)
print(_signal_stack() == before, handled == [True])
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "True"]


def test_auto_backend_falls_back_to_torch_when_conversion_fails(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import search_env.sources.encoders as encoders

    def unconvertible(*args: object, **kwargs: object) -> None:
        raise RuntimeError("unsupported operation")

    monkeypatch.setattr(encoders, "OpenVINOModel", unconvertible)
    fallback = TransformersEncoder(tiny_model_dir, precision="bf16", prefixes="none")
    assert fallback.backend == "torch" and "running it on PyTorch" in caplog.text
    assert {p.dtype for p in fallback.model.parameters()} == {torch.bfloat16}  # the asked precision, in torch
    assert fallback.encode_queries(["river"]).shape == (1, 32)
    with pytest.raises(RuntimeError, match="unsupported operation"):  # asked for by name: no fallback
        TransformersEncoder(tiny_model_dir, precision="fp32", prefixes="none", backend="openvino")


def test_backend_choice(tiny_model_dir: Path) -> None:
    # auto: OpenVINO on a CPU when installed (the dense extra installs it), torch when compiling
    assert TransformersEncoder(tiny_model_dir, precision="fp32", prefixes="none").backend == "openvino"
    with pytest.raises(ValueError, match="openvino backend runs on the CPU"):
        TransformersEncoder(tiny_model_dir, precision="fp32", backend="openvino", compile_model=True)
    with pytest.raises(ValueError, match="openvino backend runs on the CPU"):
        TransformersEncoder(tiny_model_dir, precision="fp32", backend="openvino", device="meta")
    with pytest.raises(ValueError, match="backend must be"):
        TransformersEncoder(tiny_model_dir, precision="fp32", backend="onnx")  # type: ignore[arg-type]


# --- dense source ---------------------------------------------------------------------------------


def brute_force(encoder: TextEncoder, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k ids (as corpus rows) and scores by numpy, independent of faiss."""
    docs = encoder.encode_passages([passage_text(p) for p in CORPUS])
    sims = encoder.encode_queries(queries) @ docs.T
    order = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(sims, order, axis=1)


@pytest.mark.parametrize(
    "config",
    [IndexConfig("flat"), IndexConfig("hnsw", hnsw_m=8, hnsw_ef_search=64),
     IndexConfig("ivf", ivf_nlist=4, ivf_nprobe=4), IndexConfig("ivf")],
    ids=["flat", "hnsw", "ivf-nlist4", "ivf-default"],
)
def test_each_index_type_matches_brute_force(encoder: TransformersEncoder, config: IndexConfig) -> None:
    source = DenseSource(CORPUS, encoder, index=config, show_progress=False)
    queries = [passage_text(p) for p in CORPUS[:6]] + ["glacier senate harbour", "tiger"]
    results = source.search(queries, k=5)
    rows, scores = brute_force(encoder, queries, 5)
    for got, want_rows, want_scores in zip(results, rows, scores):
        np.testing.assert_allclose([p.score for p in got], want_scores, atol=1e-5)
        # ids agree except where two passages tie on score
        for p, row, score in zip(got, want_rows, want_scores):
            assert p.id == CORPUS[row].id or abs(p.score - score) < 1e-6
    for i, result in enumerate(results[:6]):  # a passage's own text finds it first, at cosine 1
        assert result[0].id == CORPUS[i].id and result[0].score == pytest.approx(1.0, abs=1e-5)
        assert (result[0].title, result[0].text) == (CORPUS[i].title, CORPUS[i].text)


def test_build_save_load_round_trip(encoder: TransformersEncoder, tmp_path: Path) -> None:
    index_dir = tmp_path / "index"
    built = DenseSource(CORPUS, CountingEncoder(encoder), index_dir=index_dir, show_progress=False)
    assert {f.name for f in index_dir.iterdir()} == {MANIFEST, EMBEDDINGS, INDEX_FILE}
    manifest = json.loads((index_dir / MANIFEST).read_text())
    assert manifest["num_passages"] == len(CORPUS) and manifest["encoder"] == encoder.signature
    assert manifest["index"]["kind"] == "flat"
    assert np.load(index_dir / EMBEDDINGS).shape == (len(CORPUS), 32)
    assert not built.stats.reused_embeddings

    counting = CountingEncoder(encoder)
    loaded = DenseSource(CORPUS, counting, index_dir=index_dir, show_progress=False)
    assert counting.passage_calls == 0
    assert loaded.stats.reused_embeddings and loaded.stats.reused_index
    queries = ["opera copper falcon", passage_text(CORPUS[3])]
    assert loaded.search(queries, 7) == built.search(queries, 7)

    # another index type over the same folder: the stored embeddings are reused, only the index is new
    hnsw = DenseSource(CORPUS, counting, index="hnsw", index_dir=index_dir, show_progress=False)
    assert counting.passage_calls == 0
    assert hnsw.stats.reused_embeddings and not hnsw.stats.reused_index
    assert json.loads((index_dir / MANIFEST).read_text())["index"]["kind"] == "hnsw"
    assert [p.id for p in hnsw.search(queries, 1)[0]] == [p.id for p in built.search(queries, 1)[0]]


def test_progress_bars_only_on_a_terminal_unless_forced(encoder: TransformersEncoder, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    skip_without("dense", "tqdm")
    monkeypatch.delenv("SEARCHQA_PROGRESS", raising=False)
    DenseSource(CORPUS, encoder)  # the default: stderr is captured here, not a terminal
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("SEARCHQA_PROGRESS", "1")
    DenseSource(CORPUS, encoder)
    err = capsys.readouterr().err
    assert "encoding" in err and "indexing (flat)" in err


def test_stale_index_is_refused_unless_rebuilt(encoder: TransformersEncoder, tiny_model_dir: Path, tmp_path: Path) -> None:
    index_dir = tmp_path / "index"
    DenseSource(CORPUS, encoder, index_dir=index_dir, show_progress=False)
    with pytest.raises(ValueError, match="different corpus"):
        DenseSource(CORPUS[:-1], encoder, index_dir=index_dir, show_progress=False)
    other_encoder = TransformersEncoder(tiny_model_dir, precision="fp32", prefixes="e5")
    with pytest.raises(ValueError, match="encoder"):
        DenseSource(CORPUS, other_encoder, index_dir=index_dir, show_progress=False)
    counting = CountingEncoder(other_encoder)
    rebuilt = DenseSource(CORPUS[:-1], counting, index_dir=index_dir, rebuild=True, show_progress=False)
    assert counting.passage_calls == 1 and len(rebuilt) == len(CORPUS) - 1
    assert json.loads((index_dir / MANIFEST).read_text())["encoder"] == other_encoder.signature


def test_search_edge_cases(encoder: TransformersEncoder) -> None:
    source = DenseSource(CORPUS[:5], encoder, show_progress=False)
    assert source.search([], 3) == []
    assert source.search(["poet"], 0) == [[]]
    assert len(source.search(["poet"], 50)[0]) == 5  # k larger than the corpus
    with pytest.raises(ValueError, match="non-negative"):
        source.search(["poet"], -1)
    narrow = DenseSource(CORPUS, encoder, index=IndexConfig("hnsw", hnsw_ef_search=2), show_progress=False)
    assert len(narrow.search(["poet"], 25)[0]) == 25  # the search beam widens to k
    with pytest.raises(ValueError, match="empty corpus"):
        DenseSource([], encoder)
    with pytest.raises(ValueError, match="unknown index kind"):
        IndexConfig("lsh")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ivf_nlist"):
        DenseSource(CORPUS[:5], encoder, index=IndexConfig("ivf", ivf_nlist=6), show_progress=False)


def test_gpu_request_without_faiss_gpu_is_an_error(encoder: TransformersEncoder) -> None:
    if faiss_gpu_available():
        pytest.skip("faiss sees a GPU here; this checks the CPU-only error path")
    with pytest.raises(RuntimeError, match="faiss-gpu"):
        DenseSource(CORPUS[:5], encoder, use_gpu=True, show_progress=False)
    assert DenseSource(CORPUS[:5], encoder, use_gpu=None, show_progress=False).search(["poet"], 2)


def test_corpus_from_jsonl_dicts_or_passages(encoder: TransformersEncoder, tmp_path: Path) -> None:
    plain, wiki18 = tmp_path / "plain.jsonl", tmp_path / "wiki18.jsonl"
    plain.write_text("\n".join(json.dumps({"id": p.id, "title": p.title, "text": p.text}) for p in CORPUS) + "\n")
    wiki18.write_text("\n".join(json.dumps({"id": p.id, "contents": f'"{p.title}"\n{p.text}'}) for p in CORPUS))
    assert as_passages(plain) == CORPUS
    assert as_passages(str(wiki18)) == CORPUS
    assert as_passages([{"id": p.id, "title": p.title, "text": p.text} for p in CORPUS]) == CORPUS
    source = DenseSource(plain, encoder, show_progress=False)
    assert source.search([passage_text(CORPUS[7])], 1)[0][0].id == CORPUS[7].id
    with pytest.raises(ValueError, match="passage 1"):
        as_passages([CORPUS[0], {"id": "x", "body": "no text"}])


# --- the real default model -----------------------------------------------------------------------


def _hotpot_subset(shared_data: Path, questions: int, extra: int) -> tuple[list[dict], list[Passage]]:
    """The first ``questions`` HotpotQA questions, their gold passages, and ``extra`` other passages."""
    rows = [json.loads(line) for line in open(shared_data / "hotpotqa_dev.jsonl", encoding="utf-8")][:questions]
    gold = {c["corpus_id"] for r in rows for c in r["contexts"] if c["is_supporting"]}
    corpus = as_passages(shared_data / "corpus.jsonl")
    chosen = [p for p in corpus if p.id in gold] + [p for p in corpus if p.id not in gold][:extra]
    return rows, chosen


@pytest.mark.slow
def test_minilm_finds_gold_passages(shared_data: Path, tmp_path: Path) -> None:
    rows, passages = _hotpot_subset(shared_data, questions=50, extra=100)
    assert 180 <= len(passages) <= 200
    encoder = TransformersEncoder()  # the offline default, all-MiniLM-L6-v2
    assert (encoder.pooling, encoder.max_length, encoder.dim) == ("mean", 256, 384)
    source = DenseSource(passages, encoder, index_dir=tmp_path / "minilm", show_progress=False)
    results = source.search([r["question"] for r in rows], 1)
    hits = [
        bool({c["corpus_id"] for c in r["contexts"] if c["is_supporting"]} & {p.id for p in result})
        for r, result in zip(rows, results)
    ]
    # the top passage is a gold one for (nearly) every question among these 200 passages; a
    # broken encoder (unmasked padding, no normalisation, wrong model) falls far below
    assert sum(hits) / len(hits) >= 0.9
    counting = CountingEncoder(encoder)
    reloaded = DenseSource(passages, counting, index_dir=tmp_path / "minilm", show_progress=False)
    assert counting.passage_calls == 0
    assert reloaded.search([r["question"] for r in rows], 1) == results


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "openvino"])
def test_minilm_matches_reference_values(backend: str) -> None:
    # the first six dimensions and the cosine, as sentence-transformers 6.2 computes them for
    # all-MiniLM-L6-v2 (SentenceTransformer(folder).encode(texts, normalize_embeddings=True))
    texts = ["Who is the spouse of the Green performer?", "Miquette Giraudy is a keyboard player and vocalist."]
    vectors = TransformersEncoder(precision="fp32", backend=backend).encode_passages(texts)
    np.testing.assert_allclose(vectors[:, :6], [[-0.016980, 0.030191, 0.001041, -0.020255, -0.028525, 0.078878],
                                                [-0.043246, -0.111438, -0.007547, -0.066764, -0.188601, 0.045155]],
                               atol=2e-5)
    assert float(vectors[0] @ vectors[1]) == pytest.approx(0.387214, abs=1e-4)


@pytest.mark.slow
def test_minilm_matches_sentence_transformers_reference(shared_data: Path) -> None:
    # sentence-transformers is not a dependency of this project; where it is installed, compare
    # whole embeddings with it
    sentence_transformers = pytest.importorskip("sentence_transformers", reason="sentence-transformers (not a dependency) gives the reference")
    from search_env.sources.encoders import default_model_path

    passages = as_passages(shared_data / "corpus.jsonl")[:16]
    texts = [passage_text(p) for p in passages] + ["who wrote the novel?"]
    ours = TransformersEncoder(precision="fp32").encode_passages(texts)
    reference = sentence_transformers.SentenceTransformer(str(default_model_path()), device="cpu").encode(
        texts, normalize_embeddings=True)
    np.testing.assert_allclose(ours, reference, atol=1e-5)


@pytest.mark.slow
def test_minilm_bf16_weights_match_fp32(shared_data: Path) -> None:
    # bf16 weights (the default on CPUs with native bfloat16) must not move embeddings enough to
    # change rankings: the cosine to the fp32 embedding of each text stays above 0.999
    passages = as_passages(shared_data / "corpus.jsonl")[:16]
    texts = [passage_text(p) for p in passages] + ["Who is the spouse of the Green performer?"]
    fp32 = TransformersEncoder(precision="fp32", backend="torch").encode_passages(texts)
    bf16 = TransformersEncoder(precision="bf16", backend="torch").encode_passages(texts)
    assert (fp32 * bf16).sum(axis=1).min() > 0.999


@pytest.mark.slow
def test_minilm_openvino_bf16_matches_torch_fp32(shared_data: Path) -> None:
    # the server's default on a CPU with native bfloat16: OpenVINO, bf16 inference precision
    passages = as_passages(shared_data / "corpus.jsonl")[:16]
    texts = [passage_text(p) for p in passages] + ["Who is the spouse of the Green performer?"]
    fp32 = TransformersEncoder(precision="fp32", backend="torch").encode_passages(texts)
    ov = TransformersEncoder(precision="bf16", backend="openvino")
    assert (fp32 * ov.encode_passages(texts)).sum(axis=1).min() > 0.999
    assert (fp32[-1:] * ov.encode_queries(texts[-1:])).sum() > 0.999


@pytest.mark.slow
def test_compiled_encoder_equals_eager(tiny_model_dir: Path, encoder: TransformersEncoder) -> None:
    # torch.compile needs a C++ compiler on CPU and takes tens of seconds even for a tiny model
    compiled = TransformersEncoder(tiny_model_dir, precision="fp32", batch_size=4, workers=2, prefixes="none",
                                   compile_model=True, backend="torch")
    assert compiled.compiled and "compiled=True" in repr(compiled)
    texts = [passage_text(p) for p in CORPUS]
    np.testing.assert_allclose(compiled.encode_passages(texts), encoder.encode_passages(texts), atol=1e-4)
    np.testing.assert_allclose(compiled.encode_queries(texts[:1]), encoder.encode_queries(texts[:1]), atol=1e-4)
