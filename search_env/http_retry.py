"""What the project's HTTP clients share: which failures are worth a retry, how long to back off, what a
``Retry-After`` header asks for, and one request on a keep-alive connection that a deadline can cut.

The retrieval client (:class:`search_env.sources.remote.RemoteSource`) and the completions agent
(:class:`agents.rollout.endpoint.CompletionsEndpointAgent`) both promise a deadline per call rather than
per socket operation: a socket timeout bounds each read, so a server (or a proxy) that sends a byte now
and then would otherwise hold a training step or an evaluation for as long as it likes. Each client
keeps its own loop - the retrieval client rotates over replicas, the agent follows ``Retry-After`` - but
both build it from these parts, so a status is retried, a backoff grows and a stalled request is cut the
same way in both. (The reward models' client, :mod:`rewards.models.remote`, keeps its own short copy of
the status rule and the backoff: ``rewards`` imports nothing of the project, see its module docstring.)

Built on urllib3's connection objects, not a session: on a 2-core machine a session's extra layers cost
about twice urllib3's CPU time per request, which is the whole budget of a BM25 query.
"""
from __future__ import annotations

import email.utils
import http.client
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping
from urllib.parse import urlsplit

from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import HTTPError

__all__ = [
    "DeadlinePassed", "HttpTarget", "RETRIED_CLIENT_STATUSES", "Reply", "SocketCut", "TRANSPORT_ERRORS", "backoff_wait",
    "exchange", "is_final_rejection", "retry_after_s", "unreachable",
]

RETRIED_CLIENT_STATUSES = (408, 429)
"""The 4xx statuses that ask the client to come back later (request timeout, too many requests)."""

TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (OSError, http.client.HTTPException, HTTPError)
"""What a failed connection, write or read raises (timeouts and a cut socket included)."""


def is_final_rejection(status: int) -> bool:
    """A 4xx other than 408 and 429: the request itself is wrong, and sending it again cannot help."""
    return 400 <= status < 500 and status not in RETRIED_CLIENT_STATUSES


def backoff_wait(backoff_s: float, retry: int) -> float:
    """The wait before retry number ``retry`` (1: the first): ``backoff_s``, doubled for each retry after
    it, so a server that is overloaded for a moment gets room to recover instead of a burst of retries."""
    return backoff_s * 2 ** (retry - 1)


def retry_after_s(value: str | None) -> float | None:
    """Seconds a ``Retry-After`` header asks for (a number of seconds or an HTTP date; never negative),
    or None when there is no header or it cannot be read."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def unreachable(exc: BaseException) -> str:
    """A transport failure as the one-line problem an error message ends with."""
    return f"cannot reach the server ({type(exc).__name__}: {exc})"


@dataclass(frozen=True)
class HttpTarget:
    """Where one endpoint is: what a connection needs from its http(s) URL."""

    url: str
    host: str
    port: int | None
    path: str  #: the path with its query, as the request line sends it
    connection_class: type[HTTPConnection]

    @classmethod
    def from_url(cls, url: str) -> HttpTarget:
        """The target of an http(s) URL (its scheme and host are the caller's to check)."""
        parts = urlsplit(url)
        path = f"{parts.path}?{parts.query}" if parts.query else parts.path
        connection_class = HTTPSConnection if parts.scheme == "https" else HTTPConnection
        return cls(url, parts.hostname or "", parts.port, path, connection_class)

    def connect(self) -> HTTPConnection:
        """A new keep-alive connection (it opens on its first request; :func:`exchange` sets its timeout)."""
        return self.connection_class(self.host, self.port)


class DeadlinePassed(TimeoutError):
    """A request's deadline passed while it was under way, and its socket was shut."""


class SocketCut:
    """Shuts the socket of a request under way when its deadline passes (or its callers give up).

    :meth:`fire` may come from another thread (a timer, a caller that stopped waiting) at any moment: before
    the request has a socket (then :meth:`arm` shuts it as soon as it has one), while the socket is armed
    (a blocked read or write on it returns at once), or after :meth:`disarm`. Once fired it stays fired.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._fired = False

    @property
    def fired(self) -> bool:
        return self._fired

    def arm(self, sock: socket.socket | None) -> None:
        """Cut ``sock`` when :meth:`fire` comes (at once if it came already)."""
        with self._lock:
            self._sock = sock
            if self._fired:
                self._shut()

    def fire(self) -> None:
        with self._lock:
            self._fired = True
            self._shut()

    def disarm(self) -> bool:
        """Stop cutting the armed socket; returns whether the cut has fired."""
        with self._lock:
            self._sock = None
            return self._fired

    def _shut(self) -> None:
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed
                pass


@dataclass(frozen=True)
class Reply:
    """A whole HTTP reply."""

    status: int
    headers: Any  #: urllib3's ``HTTPHeaderDict`` (case-insensitive ``get``)
    data: bytes


def exchange(connection: HTTPConnection, path: str, body: bytes, headers: Mapping[str, str], timeout_s: float,
             cut: SocketCut) -> Reply:
    """POST ``body`` on ``connection`` (reopened if the server closed it while idle) and read the whole
    reply. Each socket operation waits at most ``timeout_s``; the deadline of the request as a whole is
    kept by whoever fires ``cut``, which this arms with the request's socket. Raises one of
    :data:`TRANSPORT_ERRORS` (:class:`DeadlinePassed` when the cut had fired before there was a socket to
    shut); the caller closes the connection then, as its state is unknown."""
    if connection.sock is not None and not connection.is_connected:
        connection.close()  # the server closed the idle keep-alive connection
    connection.timeout = timeout_s
    connection.request("POST", path, body=body, headers=dict(headers))
    # Kept now rather than read from the connection later: a reply with "Connection: close" takes the
    # socket over from the connection while its body is still being read.
    cut.arm(connection.sock)
    if cut.fired:
        raise DeadlinePassed("the request's deadline passed")
    reply = connection.getresponse()
    return Reply(reply.status, reply.headers, reply.data)
