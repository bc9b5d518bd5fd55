"""The output folder of a run: its settings and its episodes, so a killed run resumes where it stopped.

``episodes.jsonl`` holds one line per finished episode, appended and flushed as it finishes, so a kill
loses only the episodes still being played. A torn last line (the kill came mid-write) is dropped when
the log is read and cut off before the next append. An episode is known by its dataset, protocol,
agent, seed and question id (:func:`episode_key`): a rerun with the same folder plays only what the log
lacks, and every table is computed from the log, never from memory alone.

``settings.json`` holds what the episodes' outcomes depend on beyond that key (retriever, corpus,
top-k, budgets, decoding, judge...), the corpus by its content's digest, and, under ``agents``, what
produced each agent's episodes beyond its name (a model folder's weights digest, a ``module:Name``
agent's source digest: :func:`~benchmarks.evaluation.digests.agent_producer`). Resuming with other
values would mix two runs in one table, or keep an old agent's episodes under a changed agent, so it
is refused; adding datasets, protocols, agents, questions or seeds is not.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any, Iterable, Mapping

from search_env.files import write_atomically

from benchmarks.evaluation import HarnessError

__all__ = ["EPISODES_FILE", "SETTINGS_FILE", "EpisodeKey", "EpisodeLog", "check_settings", "episode_key"]

EPISODES_FILE = "episodes.jsonl"
SETTINGS_FILE = "settings.json"

#: (dataset, protocol, agent, seed, question id)
EpisodeKey = tuple[str, str, str, int, str]


def episode_key(record: Mapping[str, Any]) -> EpisodeKey:
    """What identifies an episode record in a run."""
    return (record["dataset"], record["protocol"], record["agent"], int(record["seed"]), record["example_id"])


class EpisodeLog:
    """A run's episode records, kept in memory and, given a ``path``, in a JSON-lines file.

    Raises:
        ValueError: a complete line of the file is not JSON (the file is damaged, not torn); one line
            naming the file and line.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._records: dict[EpisodeKey, dict[str, Any]] = {}
        self._file: IO[str] | None = None
        self.dropped_torn_line = False  #: the file ended in a torn line, which was dropped
        if path is not None and path.is_file():
            self._load(path)

    def __contains__(self, key: EpisodeKey) -> bool:
        return key in self._records

    def __len__(self) -> int:
        return len(self._records)

    def records(self, keys: Iterable[EpisodeKey] | None = None) -> list[dict[str, Any]]:
        """The records of ``keys`` that the log holds, in that order (all of them, in log order, for None)."""
        if keys is None:
            return list(self._records.values())
        return [self._records[key] for key in keys if key in self._records]

    def append(self, record: dict[str, Any]) -> None:
        """Add a finished episode: written as one line and flushed at once when the log has a file."""
        key = episode_key(record)
        self._records[key] = record
        if self.path is None:
            return
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")
        self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def _load(self, path: Path) -> None:
        data = path.read_bytes()
        complete = data.rfind(b"\n") + 1
        if complete < len(data):
            os.truncate(path, complete)  # the torn line of a run killed mid-write
            self.dropped_torn_line = True
        for number, line in enumerate(data[:complete].decode("utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                self._records[episode_key(record)] = record
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"{path} line {number} is not an episode record ({type(exc).__name__}: {exc}); "
                                 "remove the line or use another --output-dir") from None


def check_settings(output_dir: Path, settings: Mapping[str, Any], producers: Mapping[str, Mapping[str, Any]]) -> None:
    """Write ``settings`` and the agents' ``producers`` (by agent name) to a new output folder, or check that
    an existing one's match them; agents new to the folder are added to it.

    Raises:
        HarnessError: the folder holds a run with other settings, or episodes of an agent of the same name
            produced by other weights or code (one line naming the first that differs, and how to start fresh).
    """
    path = output_dir / SETTINGS_FILE
    plain = json.loads(json.dumps(dict(settings)))  # as it reads back (tuples become lists)
    agents = json.loads(json.dumps(dict(producers)))
    if path.is_file():
        held = json.loads(path.read_text(encoding="utf-8"))
        held_agents = held.pop("agents", {})
        for name in sorted(set(held) | set(plain)):
            if held.get(name) != plain.get(name):
                raise HarnessError(f"{output_dir} holds a run with {name}={held.get(name)!r}, and this run asks for "
                                   f"{plain.get(name)!r}: resume with the same settings or give another --output-dir")
        for agent, produced in agents.items():
            before = held_agents.get(agent, produced)  # an agent new to the folder: nothing to compare
            for part in sorted(set(before) | set(produced)):
                if before.get(part) != produced.get(part):
                    raise HarnessError(
                        f"{output_dir} holds episodes of agent {agent!r} with {part} digest {before.get(part)}, and its {part} "
                        f"digest is now {produced.get(part)}: give another --output-dir (or delete {output_dir}) to start fresh")
        if set(agents) <= set(held_agents):
            return
        agents = {**held_agents, **agents}
    output_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps({**plain, "agents": agents}, indent=2) + "\n")
