"""The sources each dataset is searched with: built once per run, shared, recorded or replayed.

Real datasets share one source named ``wiki`` (the name the NL-DAG tool aliases point at): a retriever
registered in :mod:`search_env.sources.registry` (BM25, dense, a user's) over ``--corpus``, or a retrieval
server (``--retrieval-url``). The synthetic world is
searched with its own BM25 sources, one per world source plus ``all``, as ``gym.make`` builds them.
A source is built when the first dataset that needs it runs, so a run that only replays, or only asks
the synthetic world, builds no corpus index.

Environments get borrowed views of the sources: closing an environment closes its sources, and these
outlive every environment of the run; :meth:`Retrieval.close` closes each once at the end.

Record and replay (:mod:`search_env.sources.recorded`): each source is wrapped in a
:class:`~search_env.sources.recorded.RecordedSource` keyed by a configuration that names the retriever,
the corpus by its file name (so a replay elsewhere, where the corpus lives at another path or not at
all, still matches), the encoder and index of dense retrieval, or the server's URL. A replay with no
retriever flags replays the one real-data configuration its recording holds.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from search_env.resolve import resolve_sources
from search_env.sources.base import Passage, Source
from search_env.sources.recorded import RecordedSource, RetrievalRecording, describe_config
from search_env.sources.registry import SourceOptions, build_source

from benchmarks.evaluation import HarnessError
from benchmarks.evaluation.datasets import WORLD_SEED, WORLD_SIZE, Dataset
from benchmarks.evaluation.digests import file_digest

__all__ = ["Retrieval", "RetrievalOptions"]
#: The name of the real datasets' source.
REAL_SOURCE = "wiki"
_WORLD_CORPUS = f"synthetic world seed {WORLD_SEED} size {WORLD_SIZE}"


@dataclass(frozen=True)
class RetrievalOptions:
    """How real datasets are searched, and whether searches are recorded or replayed.

    Attributes:
        retriever: the registered retriever (``bm25``, ``dense``, a user's) built over ``corpus``.
        corpus: the passage jsonl real questions are answered from.
        url: a retrieval server (``/retrieve`` API) instead of a local corpus.
        encoder: the dense retriever's encoder folder (None: the offline default).
        dense_index: the faiss index kind (``flat``, ``hnsw``, ``ivf``).
        index_dir: where the retriever keeps its index between runs (dense: embeddings and faiss index;
            None: in memory).
        record: record every search into this file.
        replay: answer searches from this file, building no retriever.
        replay_missing: what a search the replay file lacks does: ``error`` (the run stops), or
            ``live`` (searched with the retriever, which is then built, and added to the file).
        probe: answer every real-data search with a probe of :class:`~search_env.sources.probes.ProbeSource`
            (``empty``: no passages) instead of its results: how much an agent's score owes to what it finds.
    """

    retriever: str = "bm25"
    corpus: Path | None = None
    url: str | None = None
    encoder: str | None = None
    dense_index: str = "flat"
    index_dir: Path | None = None
    record: Path | None = None
    replay: Path | None = None
    replay_missing: str = "error"
    probe: str | None = None

    @property
    def has_retriever(self) -> bool:
        """Whether real questions can be searched live (a corpus or a server)."""
        return self.corpus is not None or self.url is not None


class _Borrowed(Source):
    """A run's source as an environment holds it: searching goes through, closing is left to the run."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.name = source.name

    @property
    def fork_safe(self) -> bool:
        return self.source.fork_safe

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        return self.source.search(queries, k)


class Retrieval:
    """The sources of one run (see the module docstring).

    Raises:
        FileNotFoundError: ``options.replay`` does not exist.
        HarnessError (from :meth:`describe` and :meth:`sources` of a real dataset): a replay without
            retriever flags whose recording holds no, or several, real-data configurations.
    """

    def __init__(self, options: RetrievalOptions) -> None:
        self.options = options
        recording_path = options.replay or options.record
        self.recording = RetrievalRecording(recording_path, must_exist=options.replay is not None) if recording_path else None
        self._real: dict[str, Any] | None = None  # the real-data source's configuration, once asked for
        self._built: dict[str, dict[str, Source]] = {}  # dataset kind ("real", or the world's id) -> named sources

    def sources(self, dataset: Dataset) -> dict[str, Source]:
        """The named sources ``dataset`` is searched with, as borrowed views for one environment."""
        key = "real" if dataset.world is None else f"world-{id(dataset.world)}"
        if key not in self._built:
            self._built[key] = self._real_sources() if dataset.world is None else self._world_sources(dataset.world)
        return {name: _Borrowed(source) for name, source in self._built[key].items()}

    def real_config(self) -> dict[str, Any]:
        """The real-data source's configuration (retriever, corpus file name, encoder and index, or
        server URL; the recording's key): from the options, or, for a replay without retriever flags,
        the one the recording holds.

        Raises:
            HarnessError: a replay (``--replay-missing error``) whose recording holds no search under the
                configured retriever: one line naming the setting that differs (another corpus, say)."""
        if self._real is None:
            o = self.options
            self._real = self._configured() if o.has_retriever or o.replay is None else self._recorded_config()
            if o.replay is not None and o.has_retriever and o.replay_missing == "error":
                self._check_recorded(self._real)
        return self._real

    def describe(self, dataset: Dataset) -> dict[str, str]:
        """``retriever`` and ``corpus`` as the table states them for ``dataset``."""
        if dataset.world is not None:
            return {"retriever": "BM25", "corpus": _WORLD_CORPUS}
        config, options = self.real_config(), self.options
        if config["retriever"] == "remote":
            retriever, corpus = "retrieval server", config["url"]
        else:
            retriever = config["retriever"]
            if retriever == "bm25":
                retriever = "BM25"
            elif retriever == "dense":
                retriever = f"dense ({config['encoder']} encoder, {config['index']} index)"
            corpus = str(options.corpus) if options.corpus is not None else config["corpus"]
        if options.replay is not None:
            retriever += f", replayed from {options.replay}"
        if options.probe is not None:
            retriever += f", every search answered by the {options.probe!r} probe"
        return {"retriever": retriever, "corpus": corpus}

    def searched_with(self, dataset: Dataset) -> str:
        """How ``dataset``'s questions were searched, as a phrase: ``BM25 over corpus.jsonl``."""
        described = self.describe(dataset)
        if dataset.world is None and self.real_config()["retriever"] == "remote":
            return f"the {described['retriever']} at {described['corpus']}"
        return f"{described['retriever']} over {described['corpus']}"

    def check_replay(self) -> None:
        """Raise :class:`HarnessError` when a replaying source was asked for a search its file lacks."""
        if self.recording is None or not self.recording.misses:
            return
        miss = self.recording.misses[0]
        raise HarnessError(
            f"--replay-retrieval {self.recording.path} has no search of {miss.query!r} (k={miss.k}) by "
            f"{describe_config(miss.config)}: record the run again, or add --replay-missing live to search what is missing"
        )

    def close(self) -> None:
        """Close every source built (and the recording file)."""
        for sources in self._built.values():
            for source in {id(s): s for s in sources.values()}.values():
                source.close()
        self._built.clear()
        if self.recording is not None:
            self.recording.close()

    # -- building -----------------------------------------------------------------------------------
    def _configured(self) -> dict[str, Any]:
        """The real-data source's configuration from the options."""
        o = self.options
        if o.url is not None:
            return {"retriever": "remote", "url": o.url, "source": REAL_SOURCE}
        if o.corpus is None:
            raise HarnessError("searching real questions needs --corpus or --retrieval-url")
        present = o.corpus.is_file()
        if not present and (o.replay is None or o.replay_missing == "live"):
            raise HarnessError(f"no corpus file {o.corpus}")
        corpus = {"corpus": o.corpus.name, "corpus_sha256": file_digest(o.corpus) if present else None}
        if o.retriever == "dense":
            encoder = Path(o.encoder).name if o.encoder else "default"
            config = {"retriever": "dense", **corpus, "encoder": encoder, "index": o.dense_index, "source": REAL_SOURCE}
        else:
            config = {"retriever": o.retriever, **corpus, "source": REAL_SOURCE}
        if present:
            return config
        # a replay where the corpus is not at hand: the recorded corpus of that name, whatever its content
        assert self.recording is not None
        named = [c for c in self.recording.configs if {**c, "corpus_sha256": None} == config]
        return named[0] if len(named) == 1 else config

    def _check_recorded(self, config: dict[str, Any]) -> None:
        """Refuse a replay whose recording holds no search under ``config``, naming what differs."""
        assert self.recording is not None
        held = [c for c in self.recording.configs if c.get("corpus") != _WORLD_CORPUS]
        if config in held:
            return
        path = self.recording.path
        for other in held:
            differs = sorted(key for key in set(config) | set(other) if config.get(key) != other.get(key))
            if differs == ["corpus_sha256"]:
                raise HarnessError(
                    f"--replay-retrieval {path} was recorded against another {config['corpus']} (content sha256 "
                    f"{other['corpus_sha256']}, and --corpus {self.options.corpus} is {config['corpus_sha256']}): give the "
                    "corpus it was recorded with, or record again")
        recorded = "; ".join(describe_config(c) for c in held) or "none"
        raise HarnessError(f"--replay-retrieval {path} holds no searches by {describe_config(config)} (it holds: {recorded}): "
                           "give the retriever flags it was recorded with, record again, or add --replay-missing live")

    def _recorded_config(self) -> dict[str, Any]:
        """The one real-data configuration the replay file holds."""
        assert self.recording is not None
        real = [c for c in self.recording.configs if c.get("corpus") != _WORLD_CORPUS]
        if len(real) != 1:
            held = "; ".join(describe_config(c) for c in real) or "none"
            raise HarnessError(f"--replay-retrieval {self.recording.path} holds {len(real)} real-data retrievers ({held}): "
                               "give --corpus or --retrieval-url to say which")
        return real[0]

    def _live_real(self) -> Source:
        o = self.options
        if o.url is not None:
            from search_env.sources.remote import RemoteSource

            return RemoteSource(o.url, name=REAL_SOURCE)
        if o.corpus is None:
            raise HarnessError("searching real questions live needs --corpus or --retrieval-url")
        started = time.perf_counter()
        print(f"indexing {o.corpus} for {o.retriever} retrieval...", file=sys.stderr, flush=True)
        source = build_source(o.retriever, o.corpus, SourceOptions(name=REAL_SOURCE, index_dir=o.index_dir, encoder=o.encoder,
                                                                   dense_index=o.dense_index))
        print(f"indexed {o.corpus} in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
        return source

    def _real_sources(self) -> dict[str, Source]:
        source = self._wrapped(self.real_config(), REAL_SOURCE, self._live_real)
        if self.options.probe is not None:
            from search_env.sources.probes import ProbeSource

            source = ProbeSource(source, self.options.probe, share=1.0)
        return {REAL_SOURCE: source}

    def _world_sources(self, world: Any) -> dict[str, Source]:
        if self.recording is None:
            return resolve_sources(None, world)
        built: dict[str, Source] = {}

        def live(name: str) -> Callable[[], Source]:
            def build() -> Source:
                if not built:
                    built.update(resolve_sources(None, world))
                return built[name]
            return build

        names = [*world.sources, "all"]  # the sources resolve_sources builds for the world
        return {name: self._wrapped({"retriever": "bm25", "corpus": _WORLD_CORPUS, "source": name}, name, live(name))
                for name in names}

    def _wrapped(self, config: dict[str, Any], name: str, live: Callable[[], Source]) -> Source:
        """The source as the run uses it: live, recording, or replaying (live on a miss if asked)."""
        o = self.options
        if self.recording is None:
            return live()
        if o.replay is None:
            return RecordedSource(self.recording, config, name=name, live=live(), replay=False)
        return RecordedSource(self.recording, config, name=name, live=live if o.replay_missing == "live" else None)
