"""Which replica of a retrieval server the next attempt goes to, and which ones are down.

:class:`~search_env.sources.remote.RemoteSource` sends each request through rounds over its replicas; this
module is its bookkeeping, apart from the HTTP and the batching: a round robin over the replicas that
are up, a cool-down after a failure, and how the time left is shared among the attempts a round still
has to make. It holds no lock: its owner calls it under its own, together with the state it guards
beside it (which batch is in flight, whether the source is closed).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

from search_env.http_retry import HttpTarget

__all__ = ["Replica", "ReplicaPool", "ReplicaStatus"]


@dataclass(frozen=True)
class ReplicaStatus:
    """How one replica of a :class:`~search_env.sources.remote.RemoteSource` has fared since the source
    was made (:meth:`~search_env.sources.remote.RemoteSource.replica_status`).

    Attributes:
        url: its ``/retrieve`` URL.
        requests: HTTP attempts sent to it.
        failures: of those, the ones that failed (no connection, no reply in time, HTTP 5xx, 408 or
            429, a malformed reply) and so went to another replica or a retry.
        down: it failed and has not answered since; requests skip it during each cool-down.
        last_problem: what went wrong the last time it failed (None: never failed).
    """

    url: str
    requests: int
    failures: int
    down: bool
    last_problem: str | None


@dataclass(eq=False)
class Replica:
    """One server behind the source: where it is and how it has fared."""

    url: str
    requests: int = 0
    failures: int = 0
    failures_in_a_row: int = 0
    down: bool = False
    retry_at: float = 0.0  # time.monotonic() at which a down replica may be tried again
    last_problem: str | None = None
    target: HttpTarget = field(init=False)

    def __post_init__(self) -> None:
        self.target = HttpTarget.from_url(self.url)

    def eligible(self, now: float) -> bool:
        """Up, or down with its cool-down over (the next request to it is the probe)."""
        return not self.down or now >= self.retry_at


class ReplicaPool:
    """The replicas of one source, in the order given, and where the round robin goes on.

    Args:
        urls: the replicas' ``/retrieve`` URLs.
        cooldown_s: how long a replica that failed is skipped.
    """

    def __init__(self, urls: Sequence[str], cooldown_s: float) -> None:
        self.replicas = [Replica(url) for url in urls]
        self.cooldown_s = cooldown_s
        self._next = 0

    def __len__(self) -> int:
        return len(self.replicas)

    def choose(self, tried: set[int]) -> int:
        """The replica of the next attempt (some replica is not in ``tried``): the next one in turn that is
        up or past its cool-down, else the down one that failed the fewest times in a row (and, among
        those, the one whose cool-down ends first)."""
        now = time.monotonic()
        count = len(self.replicas)
        for step in range(count):
            index = (self._next + step) % count
            if index not in tried and self.replicas[index].eligible(now):
                self._next = (index + 1) % count
                return index
        untried = [index for index in range(count) if index not in tried]
        return min(untried, key=lambda index: (self.replicas[index].failures_in_a_row, self.replicas[index].retry_at))

    def sharing(self, index: int, tried: set[int]) -> int:
        """Over how many attempts the time left is shared: the replicas up and not in ``tried`` when
        ``index`` is one of them, else (no replica up is left) those not tried."""
        now = time.monotonic()
        untried = [replica for i, replica in enumerate(self.replicas) if i not in tried]
        if self.replicas[index].eligible(now):
            return sum(replica.eligible(now) for replica in untried)
        return len(untried)

    def failed(self, replica: Replica, problem: str) -> bool:
        """Count a failure and skip the replica for a cool-down; returns whether it went down just now."""
        replica.failures += 1
        replica.failures_in_a_row += 1
        replica.last_problem = problem
        replica.retry_at = time.monotonic() + self.cooldown_s
        went_down, replica.down = not replica.down, True
        return went_down

    def answered(self, replica: Replica) -> int | None:
        """A reply: the replica is up. Returns the failed attempts before it when it was down, else None."""
        came_back, replica.down = replica.down, False
        failed, replica.failures_in_a_row = replica.failures_in_a_row, 0
        return failed if came_back else None

    def up(self) -> int:
        """How many replicas are up."""
        return sum(not replica.down for replica in self.replicas)

    def status(self) -> dict[str, ReplicaStatus]:
        """Each replica's counters and state, by URL, in the order given."""
        return {r.url: ReplicaStatus(r.url, r.requests, r.failures, r.down, r.last_problem) for r in self.replicas}
