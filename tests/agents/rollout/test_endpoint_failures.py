"""The completions endpoint agent against servers that misbehave (:class:`agents.rollout.endpoint.CompletionsEndpointAgent`):
a server that drips its reply cannot hold a call past ``timeout_s``, a huge completion is cut before it is
encoded, malformed replies and final errors are one line naming the server, and transient failures (5xx,
429 with ``Retry-After``, a dropped connection) are retried.

The servers run on 127.0.0.1 in the test's own threads; every loop in them is bounded. No verdict depends
on timing: the deadline test asserts that the call failed with a timeout against a server that would
otherwise drip for over a minute, and pytest-timeout bounds it."""
from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agents.rollout.endpoint import CompletionsEndpointAgent
from search_env import get_protocol
from search_env.tokenization import as_codec

DRIP_BYTES = 150  #: one every half second: 75 s, far past any deadline below


class _Scripted(BaseHTTPRequestHandler):
    """Answers the n-th request with ``script[n]`` (the last entry for every later one)."""

    script: list[tuple] = []
    requests: list[dict] = []
    stop: threading.Event

    def do_POST(self):  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        kind, *args = self.script[min(len(self.requests), len(self.script)) - 1]
        getattr(self, f"_{kind}")(*args)

    def _send(self, status: int, payload: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def _ok(self, text: str, finish: str = "stop", stop_reason: str | None = "</answer>") -> None:
        choice = {"index": 0, "text": text, "finish_reason": finish, **({"stop_reason": stop_reason} if stop_reason else {})}
        self._send(200, json.dumps({"choices": [choice]}).encode())

    def _status(self, status: int, payload: bytes, headers: dict[str, str] | None = None) -> None:
        self._send(status, payload, headers)

    def _raw(self, payload: bytes) -> None:
        self._send(200, payload)

    def _drop(self) -> None:
        """Close the connection without a reply."""
        self.close_connection = True

    def _drip(self, where: str) -> None:
        """A byte every half second, in the headers or in the body, for far longer than any deadline here."""
        try:
            if where == "headers":
                self.wfile.write(b"HTTP/1.1 200 OK\r\nX-Pad: ")
            else:
                self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
            self.wfile.flush()
            for _ in range(DRIP_BYTES):
                if self.stop.wait(0.5):
                    break
                self.wfile.write(b"a" if where == "headers" else b" ")
                self.wfile.flush()
        except OSError:  # the client hung up
            pass
        self.close_connection = True

    def log_message(self, *args):
        pass


@pytest.fixture
def serve():
    """``serve(*script)``: a server answering with ``script``; returns its handler class and base URL."""
    servers = []

    def start(*script):
        handler = type("Handler", (_Scripted,), {"script": list(script), "requests": [], "stop": threading.Event()})
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append((httpd, handler))
        return handler, f"http://127.0.0.1:{httpd.server_address[1]}/v1"

    yield start
    for httpd, handler in servers:
        handler.stop.set()
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="module")
def codec():
    return as_codec(None)


def agent_for(url: str, codec, **options) -> CompletionsEndpointAgent:
    agent = CompletionsEndpointAgent(url, "m", **{"backoff_s": 0.01, **options})
    agent.begin([codec.encode("Who founded Zarbo?")], examples=[], protocol=get_protocol("search-r1"), codec=codec)
    return agent


def one_chunk(agent: CompletionsEndpointAgent, budget: int = 64) -> list[int]:
    try:
        return agent.generate([0], [budget])[0].ids
    finally:
        agent.close()


def one_line_naming(error: BaseException, url: str) -> str:
    message = str(error)
    assert "\n" not in message and f"{url}/completions" in message
    return message


@pytest.mark.timeout(40)
@pytest.mark.parametrize("where", ["body", "headers"])
def test_a_dripping_server_cannot_hold_a_call_past_its_deadline(serve, codec, where):
    from agents.rollout.endpoint import EndpointTimeout

    handler, url = serve(("drip", where))
    with pytest.raises(EndpointTimeout) as caught:
        one_chunk(agent_for(url, codec, timeout_s=2.0))
    assert isinstance(caught.value, TimeoutError)
    assert "no complete reply within 2 s" in one_line_naming(caught.value, url)
    assert len(handler.requests) == 1  # the deadline covers the call, not an attempt: no second try after it


@pytest.mark.timeout(60)
def test_a_huge_completion_is_cut_before_it_is_encoded(serve, codec, monkeypatch):
    text = "word " * 2_000_000  # 10 MB for a 64-token budget
    handler, url = serve(("ok", text, "length", None))
    longest = []
    encode = codec.encode
    monkeypatch.setattr(codec, "encode", lambda s: longest.append(len(s)) or encode(s))
    agent = agent_for(url, codec)
    ids = one_chunk(agent, budget=64)
    assert ids == encode("word " * 200)[:64]
    assert max(longest) < 100_000  # what was encoded was cut from the reply, not the reply


@pytest.mark.parametrize("payload", [b"not json at all", b"[1, 2]", b'{"object": "text_completion"}',
                                     b'{"choices": []}', b'{"choices": ["text"]}', b'{"choices": [{"text": 5}]}'])
def test_a_malformed_reply_is_one_line_naming_the_server(serve, codec, payload):
    from agents.rollout.endpoint import EndpointError

    handler, url = serve(("raw", payload))
    with pytest.raises(EndpointError) as caught:
        one_chunk(agent_for(url, codec, retries=1))
    assert "malformed reply" in one_line_naming(caught.value, url) and "2 attempt(s)" in str(caught.value)
    assert len(handler.requests) == 2  # retried once: a proxy may garble one reply


@pytest.mark.parametrize("script", [
    [("status", 500, b'{"error": {"message": "CUDA out of memory"}}')],
    [("status", 503, b"busy"), ("status", 429, b'{"detail": "slow down"}', {"Retry-After": "0"})],
    [("drop",)],
    [("status", 502, b""), ("drop",), ("status", 500, b"")],
])
def test_transient_failures_are_retried_within_the_deadline(serve, codec, script):
    handler, url = serve(*script, ("ok", "<answer> Bob"))
    ids = one_chunk(agent_for(url, codec, retries=3))
    assert ids == codec.encode("<answer> Bob</answer>")
    assert len(handler.requests) == len(script) + 1


def test_a_retry_after_is_followed_and_one_past_the_deadline_ends_the_call(serve, codec):
    from agents.rollout.endpoint import EndpointError

    handler, url = serve(("status", 429, b'{"error": {"message": "rate limited"}}', {"Retry-After": "1"}), ("ok", "<answer> Bob"))
    # Its own backoff (30 s) would not fit in the 10 s deadline: the retry happens because the server's 1 s is followed.
    assert one_chunk(agent_for(url, codec, backoff_s=30.0, timeout_s=10.0)) == codec.encode("<answer> Bob</answer>")
    assert len(handler.requests) == 2
    handler, url = serve(("status", 429, b'{"error": {"message": "rate limited"}}', {"Retry-After": "3600"}), ("ok", "<answer> Bob"))
    with pytest.raises(EndpointError) as caught:
        one_chunk(agent_for(url, codec, timeout_s=60.0))
    message = one_line_naming(caught.value, url)
    assert "HTTP 429: rate limited" in message and "retry in 3600 s" in message
    assert len(handler.requests) == 1


def test_final_failures_are_one_line_naming_the_server_and_its_message(serve, codec):
    from agents.rollout.endpoint import EndpointError

    handler, url = serve(("status", 500, b'{"error": {"message": "engine\\ndead"}}'))
    with pytest.raises(EndpointError) as caught:
        one_chunk(agent_for(url, codec, retries=2))
    assert "failed after 3 attempt(s): HTTP 500: engine dead" in one_line_naming(caught.value, url)
    assert len(handler.requests) == 3
    handler, url = serve(("status", 400, b'{"error": {"message": "max_tokens is too large"}}'))
    with pytest.raises(EndpointError) as caught:
        one_chunk(agent_for(url, codec, retries=2))
    assert "rejected the request with HTTP 400: max_tokens is too large" in one_line_naming(caught.value, url)
    assert len(handler.requests) == 1  # the request itself is wrong: not retried


def test_a_server_that_is_not_there_is_named(codec):
    from agents.rollout.endpoint import EndpointError

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(EndpointError) as caught:
        one_chunk(agent_for(url, codec, retries=1))
    assert "cannot reach the server" in one_line_naming(caught.value, url)


def test_keep_alive_connections_are_reused_and_closed(serve, codec):
    handler, url = serve(("ok", "<answer> Bob"))
    handler.protocol_version = "HTTP/1.1"  # the server keeps connections open
    agent = agent_for(url, codec, max_concurrency=1)
    for _ in range(3):
        assert agent.generate([0], [64])[0].ids == codec.encode("<answer> Bob</answer>")
    connections = list(agent._connections)
    assert len(connections) == 1 and len(handler.requests) == 3
    agent.close()
    assert connections[0].sock is None
