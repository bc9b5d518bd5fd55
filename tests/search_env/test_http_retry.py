"""The HTTP parts the clients share: which statuses are final, the backoff, Retry-After, the target of a
URL, the socket cut, and one exchange on a keep-alive connection against a local server."""
from __future__ import annotations

import email.utils
import http.server
import socket
import threading
import time
from typing import Iterator

import pytest
from urllib3.connection import HTTPConnection, HTTPSConnection

from search_env.http_retry import (
    TRANSPORT_ERRORS, DeadlinePassed, HttpTarget, SocketCut, backoff_wait, exchange, is_final_rejection, retry_after_s,
    unreachable,
)


@pytest.mark.parametrize("status, final", [(400, True), (401, True), (404, True), (422, True), (499, True), (408, False),
                                           (429, False), (500, False), (503, False), (200, False), (302, False)])
def test_only_a_4xx_other_than_408_and_429_is_final(status: int, final: bool) -> None:
    assert is_final_rejection(status) is final


def test_the_backoff_doubles_from_the_first_retry() -> None:
    assert [backoff_wait(0.5, retry) for retry in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 4.0]
    assert backoff_wait(0.0, 3) == 0.0


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after_s("3") == 3.0 and retry_after_s("0.25") == 0.25
    assert retry_after_s("-5") == 0.0  # never a negative wait
    assert retry_after_s(None) is None and retry_after_s("") is None and retry_after_s("soon") is None
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 27.0 <= retry_after_s(later) <= 30.5  # type: ignore[operator]
    assert retry_after_s(email.utils.formatdate(time.time() - 60, usegmt=True)) == 0.0


def test_a_target_keeps_the_query_and_picks_the_connection_class() -> None:
    plain = HttpTarget.from_url("http://127.0.0.1:8000/retrieve?index=wiki")
    assert (plain.host, plain.port, plain.path, plain.connection_class) == ("127.0.0.1", 8000, "/retrieve?index=wiki", HTTPConnection)
    secure = HttpTarget.from_url("https://example.org/v1/completions")
    assert (secure.host, secure.port, secure.path, secure.connection_class) == ("example.org", None, "/v1/completions", HTTPSConnection)
    assert isinstance(plain.connect(), HTTPConnection)


def test_a_transport_failure_reads_as_one_line() -> None:
    assert unreachable(ConnectionResetError("reset by peer")) == "cannot reach the server (ConnectionResetError: reset by peer)"
    assert issubclass(DeadlinePassed, TRANSPORT_ERRORS[0])  # a client that catches transport errors catches it too


def test_a_cut_shuts_the_armed_socket_and_one_armed_after_it_fired() -> None:
    left, right = socket.socketpair()
    try:
        cut = SocketCut()
        cut.arm(left)
        assert not cut.fired
        cut.fire()
        assert cut.fired and left.recv(1) == b""  # shut: a read returns at once instead of blocking
        assert cut.disarm() is True
    finally:
        left.close(), right.close()
    late_left, late_right = socket.socketpair()
    try:
        early = SocketCut()
        early.fire()  # before the request had a socket
        early.arm(late_left)
        assert late_left.recv(1) == b""
    finally:
        late_left.close(), late_right.close()
    untouched = SocketCut()
    assert untouched.disarm() is False


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive

    def do_POST(self) -> None:  # noqa: N802 - the http.server API
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/slow":
            time.sleep(5)
        reply = b"echo:" + body + b":" + self.headers["X-Test"].encode()
        try:
            self.send_response(503 if self.path == "/busy" else 200)
            self.send_header("Content-Length", str(len(reply)))
            self.send_header("Retry-After", "2")
            self.end_headers()
            self.wfile.write(reply)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up on /slow (the timeout test)
            pass

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_an_exchange_reads_the_whole_reply_and_reuses_the_connection(server: str) -> None:
    target = HttpTarget.from_url(server + "/echo")
    connection = target.connect()
    first = exchange(connection, target.path, b"one", {"X-Test": "a"}, 5.0, SocketCut())
    sock = connection.sock
    busy = exchange(connection, "/busy", b"two", {"X-Test": "b"}, 5.0, SocketCut())
    assert (first.status, first.data) == (200, b"echo:one:a")
    assert (busy.status, busy.data, retry_after_s(busy.headers.get("Retry-After"))) == (503, b"echo:two:b", 2.0)
    assert connection.sock is sock  # kept alive between the two
    connection.close()


def test_a_cut_that_fired_before_the_request_ends_it_as_deadline_passed(server: str) -> None:
    target = HttpTarget.from_url(server + "/echo")
    cut = SocketCut()
    cut.fire()
    with pytest.raises(DeadlinePassed):
        exchange(target.connect(), target.path, b"x", {"X-Test": "c"}, 5.0, cut)


def test_a_cut_fired_mid_reply_ends_a_slow_exchange_at_once(server: str) -> None:
    target = HttpTarget.from_url(server + "/slow")
    cut = SocketCut()
    timer = threading.Timer(0.2, cut.fire)
    timer.start()
    started = time.monotonic()
    with pytest.raises(TRANSPORT_ERRORS):
        exchange(target.connect(), target.path, b"x", {"X-Test": "d"}, 10.0, cut)
    assert time.monotonic() - started < 2.0 and cut.fired  # not the server's 5 s, nor the 10 s socket timeout
