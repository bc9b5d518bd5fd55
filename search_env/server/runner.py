"""Running the retrieval app on uvicorn: in the foreground (the CLI) or on a background thread.

The background form is for tests, notebooks and single-process experiments that want a real HTTP
endpoint next to the environment; binding the socket here (port 0 allowed) means the URL is known
before the first request, with no race for a "free" port.
"""
from __future__ import annotations

import socket
import threading
import time
from typing import Any

from search_env._optional import requires_extra

with requires_extra("server", "the retrieval server"):
    import uvicorn

from search_env.server.app import create_app
from search_env.server.readiness import SourceBuild, SourceBuildFailed
from search_env.sources.base import Source

__all__ = ["RetrievalServer", "serve"]

LOOPBACK = "127.0.0.1"


def _uvicorn_config(app: Any, host: str, port: int, log_level: str) -> uvicorn.Config:
    # No access log: one line per request costs more than a BM25 search.
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False, lifespan="on")


def serve(source: Source, *, host: str = LOOPBACK, port: int = 8000, log_level: str = "info", **app_options: Any) -> None:
    """Serve ``source`` until interrupted (Ctrl-C / SIGTERM). ``app_options`` go to :func:`create_app`.

    A :class:`SourceBuild` is built while the server already answers (503 until it is ready); if the
    build fails, the server stops and this raises :class:`SourceBuildFailed` saying why, so that a
    supervisor sees the process end rather than a server that will never be ready.
    """
    server = uvicorn.Server(_uvicorn_config(create_app(source, **app_options), host, port, log_level))
    if isinstance(source, SourceBuild):

        def stop_if_failed() -> None:
            if source.state == "failed":
                server.should_exit = True

        source.start(on_done=stop_if_failed)
    server.run()
    if isinstance(source, SourceBuild) and source.state == "failed":
        raise SourceBuildFailed(source.describe())


class RetrievalServer:
    """A retrieval server on a background thread; use as a context manager or start()/stop().

    Example::

        with RetrievalServer(source) as server:      # binds 127.0.0.1 on a free port
            remote = RemoteSource(server.retrieve_url, name="wiki")

    ``source`` may be a :class:`SourceBuild`: the server then answers (503) while it is built.
    """

    def __init__(self, source: Source, *, host: str = LOOPBACK, port: int = 0, log_level: str = "warning", **app_options: Any) -> None:
        self.source = source
        self.host = host
        self.app = create_app(source, **app_options)
        self._requested_port = port
        self._log_level = log_level
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:43121``."""
        if self.port is None:
            raise RuntimeError("RetrievalServer is not started")
        return f"http://{self.host}:{self.port}"

    @property
    def retrieve_url(self) -> str:
        """The ``/retrieve`` URL that Search-R1-style clients are configured with."""
        return f"{self.url}/retrieve"

    def start(self, timeout_s: float = 10.0) -> "RetrievalServer":
        """Bind, start serving on a daemon thread, and return once requests are accepted."""
        if self._thread is not None:
            raise RuntimeError("RetrievalServer already started")
        # IPPROTO_TCP must be explicit: asyncio only disables Nagle's algorithm (TCP_NODELAY) on
        # sockets whose proto says TCP, and accepted sockets inherit proto 0 from socket.socket()'s
        # default, which costs every response a 40 ms delayed-ACK stall.
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self._requested_port))
        except OSError as exc:
            sock.close()
            raise OSError(f"cannot bind the retrieval server to {self.host}:{self._requested_port}: {exc}") from exc
        self.port = sock.getsockname()[1]
        self._server = uvicorn.Server(_uvicorn_config(self.app, self.host, self.port, self._log_level))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, name="retrieval-server", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                sock.close()
                raise RuntimeError("the retrieval server thread exited during startup (see its log)")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the retrieval server did not start within {timeout_s} s")
            time.sleep(0.005)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask uvicorn to shut down (finishing in-flight requests) and wait for the thread."""
        if self._server is None or self._thread is None:
            return
        self._server.should_exit = True
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise TimeoutError(f"the retrieval server did not stop within {timeout_s} s")
        self._server = self._thread = None

    def __enter__(self) -> "RetrievalServer":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
