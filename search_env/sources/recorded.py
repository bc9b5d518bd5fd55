"""Record every search a run makes, and replay a later run from the record with no retriever loaded.

Why: scores depend on what retrieval returned, and the retriever is the expensive, perishable part of
a run (a BM25 or dense index takes minutes to hours to build, a retrieval server may be gone next
month). A recording makes a run reproducible without it, and makes two agents compare on exactly the
same passages.

A :class:`RetrievalRecording` is one JSON-lines file shared by every source of a run. Each search is
keyed by its source's *configuration* (plain JSON data naming the retriever, corpus and source name,
given by whoever builds the source), the query and ``k``: a replay under another configuration finds
nothing rather than someone else's passages. Lines are appended and flushed as searches happen, so a
run killed half-way keeps every search it finished; a torn last line is dropped when the file is read
and cut off before the next append. The lines::

    {"kind": "source", "id": 0, "config": {"retriever": "bm25", "corpus": "corpus.jsonl", "source": "wiki"}}
    {"kind": "search", "source": 0, "query": "...", "k": 3, "passages": [{"id": ..., "title": ..., "text": ..., "score": ...}]}

A :class:`RecordedSource` wraps one source of the run: recording (always search live, add what is
new) or replaying (answer from the file; what the file lacks is searched live when a live source is
given, else it is a :class:`MissingSearchError`). The environment turns a source error into an error
observation, never an exception, so a replay miss would silently change an episode: the recording
keeps every miss in :attr:`RetrievalRecording.misses` for the caller to check after its episodes.
"""
from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Union

from search_env.sources.base import Passage, Source, SourceError, checked_results

__all__ = ["MissingSearchError", "RecordedSource", "RetrievalRecording", "SearchMiss", "describe_config"]

#: What :class:`RecordedSource` searches for real: a source, or a function building one when first needed.
LiveSource = Union[Source, Callable[[], Source]]


def describe_config(config: Mapping[str, Any]) -> str:
    """A source configuration on one line, for messages: ``retriever=bm25 corpus=corpus.jsonl source=wiki``."""
    return " ".join(f"{key}={value}" for key, value in sorted(config.items()))


def _config_key(config: Mapping[str, Any]) -> str:
    return json.dumps(dict(config), sort_keys=True, ensure_ascii=False)


@dataclass(frozen=True)
class SearchMiss:
    """A search a replaying source was asked for and the recording does not hold."""

    config: dict[str, Any]
    query: str
    k: int


class MissingSearchError(SourceError):
    """A replaying source was asked for a search its recording lacks (and has no live source to ask)."""


class RetrievalRecording:
    """The searches of one recording file (see the module docstring): read at construction, new
    searches appended and flushed one line each.

    Args:
        path: the JSON-lines file; created on the first append when it does not exist.
        must_exist: raise ``FileNotFoundError`` when the file is absent (a replay needs one).

    Raises:
        ValueError: a complete line of the file is not a record of this format (the file is damaged,
            or is not a recording); one line naming the file and the line number.
    """

    def __init__(self, path: str | os.PathLike[str], *, must_exist: bool = False) -> None:
        self.path = Path(path)
        if must_exist and not self.path.is_file():
            raise FileNotFoundError(f"no retrieval recording at {self.path}")
        self.misses: list[SearchMiss] = []
        self._configs: dict[str, int] = {}  # config key -> id in the file
        self._searches: dict[tuple[int, str, int], tuple[Passage, ...]] = {}
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        self._valid_bytes = self._load() if self.path.is_file() else 0

    def __len__(self) -> int:
        return len(self._searches)

    @property
    def configs(self) -> list[dict[str, Any]]:
        """The source configurations the recording holds searches of, in the order first recorded."""
        return [json.loads(key) for key in self._configs]

    def lookup(self, config: Mapping[str, Any], query: str, k: int) -> list[Passage] | None:
        """The recorded passages of ``query`` with ``k`` under ``config``, or None when not recorded."""
        with self._lock:
            config_id = self._configs.get(_config_key(config))
            found = None if config_id is None else self._searches.get((config_id, query, k))
        return None if found is None else list(found)

    def add(self, config: Mapping[str, Any], query: str, k: int, passages: Sequence[Passage]) -> None:
        """Record a search (one line, flushed); a search already recorded is kept as first recorded."""
        key = _config_key(config)
        with self._lock:
            config_id = self._configs.get(key)
            if config_id is None:
                config_id = self._configs[key] = len(self._configs)
                self._write({"kind": "source", "id": config_id, "config": json.loads(key)})
            if (config_id, query, k) in self._searches:
                return
            self._searches[(config_id, query, k)] = tuple(passages)
            self._write({"kind": "search", "source": config_id, "query": query, "k": k,
                         "passages": [{"id": p.id, "title": p.title, "text": p.text, "score": float(p.score)} for p in passages]})

    def note_miss(self, config: Mapping[str, Any], query: str, k: int) -> None:
        """Remember a search a replaying source could not answer (see :attr:`misses`)."""
        with self._lock:
            self.misses.append(SearchMiss(dict(config), query, k))

    def close(self) -> None:
        """Close the file (searches added later open it again)."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            if self.path.is_file() and self.path.stat().st_size != self._valid_bytes:
                os.truncate(self.path, self._valid_bytes)  # a torn last line, dropped when read
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")
        line = json.dumps(record, ensure_ascii=False) + "\n"
        self._file.write(line)
        self._file.flush()
        self._valid_bytes += len(line.encode("utf-8"))

    def _load(self) -> int:
        """Read the complete lines; returns their length in bytes (what follows is a torn line)."""
        data = self.path.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]
        ids: dict[int, int] = {}  # id in the file -> id here (the same unless the file was edited)
        for number, line in enumerate(complete.decode("utf-8", "replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if record["kind"] == "source":
                    key = _config_key(record["config"])
                    ids[int(record["id"])] = self._configs.setdefault(key, len(self._configs))
                elif record["kind"] == "search":
                    passages = tuple(Passage(str(p["id"]), str(p["title"]), str(p["text"]), float(p["score"]))
                                     for p in record["passages"])
                    self._searches.setdefault((ids[int(record["source"])], str(record["query"]), int(record["k"])), passages)
                else:
                    raise ValueError(f"unknown kind {record['kind']!r}")
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{self.path} line {number} is not a retrieval record ({type(exc).__name__}: {exc})") from None
        return len(complete)


class RecordedSource(Source):
    """A source answered through a :class:`RetrievalRecording` (see the module docstring).

    Args:
        recording: the run's recording, shared by its sources.
        config: what identifies this source in the recording: plain JSON values (retriever, corpus,
            source name, encoder...), the same in the recording run and the replaying one.
        name: the source's name in the environment.
        live: the source that searches for real: a :class:`Source`, a function without arguments that
            builds one when it is first needed (so a replay that finds everything builds no index),
            or None (replay only).
        replay: answer from the recording where it holds the search, searching live only what it
            lacks (or, without ``live``, raising :class:`MissingSearchError`); False: always search
            live and record what is new.
    """

    def __init__(self, recording: RetrievalRecording, config: Mapping[str, Any], *, name: str,
                 live: LiveSource | None = None, replay: bool = True) -> None:
        if live is None and not replay:
            raise ValueError("a recording source needs a live source to search (replay=False)")
        self.recording = recording
        self.config = dict(config)
        _config_key(self.config)  # plain JSON data, or a TypeError now rather than at the first search
        self.name = name
        self.replay = replay
        self._live = live
        self._live_lock = threading.Lock()

    @property
    def fork_safe(self) -> bool:
        if self._live is None:
            return True
        return self._live.fork_safe if isinstance(self._live, Source) else False  # unknown until built

    @property
    def live_built(self) -> bool:
        """Whether a live source exists (given as one, or built on a replay miss)."""
        return isinstance(self._live, Source)

    def search(self, queries: Sequence[str], k: int) -> list[list[Passage]]:
        """Each query's passages: from the recording when replaying and recorded, else searched live
        and recorded. Raises :class:`MissingSearchError` for a query neither can answer."""
        if isinstance(queries, str):
            raise TypeError("search() takes a sequence of queries, not a single string")
        results: list[list[Passage] | None] = [self.recording.lookup(self.config, q, k) if self.replay else None for q in queries]
        missing = list(dict.fromkeys(q for q, found in zip(queries, results) if found is None))
        if not missing:
            return results  # type: ignore[return-value]  # every query was recorded
        live = self._live_source()
        if live is None:
            for query in missing:
                self.recording.note_miss(self.config, query, k)
            raise MissingSearchError(f"the retrieval recording {self.recording.path} has no search of {missing[0]!r} "
                                     f"(k={k}) by {describe_config(self.config)}")
        fetched = dict(zip(missing, checked_results(live.search(missing, k), len(missing), self.name)))
        for query, passages in fetched.items():
            self.recording.add(self.config, query, k, passages)
        return [found if found is not None else list(fetched[q]) for q, found in zip(queries, results)]

    def close(self) -> None:
        """Close the live source if there is one (the recording is the caller's, shared by its sources)."""
        if isinstance(self._live, Source):
            self._live.close()

    def _live_source(self) -> Source | None:
        with self._live_lock:
            if self._live is not None and not isinstance(self._live, Source):
                self._live = self._live()
            return self._live
