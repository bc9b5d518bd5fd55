"""The OpenAI-compatible HTTP backend of the model-based rewards, against a chat-completions server on
127.0.0.1 (needs the judge extra's httpx)."""
from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

import pytest

from tests.conftest import skip_without

skip_without("judge", "httpx")

from rewards.models import AnswerModel, LLMJudge, ModelCallError, OpenAIChatModel  # noqa: E402

class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def handle_error(self, request, client_address) -> None:  # a client that timed out closed the socket
        pass


class FakeOpenAI:
    """A chat-completions server on 127.0.0.1; ``behaviour(index, body) -> (status, body, delay)``."""

    def __init__(self) -> None:
        self.behaviour: Callable[[int, dict], tuple[int, bytes, float]] = self.echo
        self.requests: list[tuple[dict, dict]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    index = len(server.requests)
                    server.requests.append((dict(self.headers), body | {"path": self.path}))
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                try:
                    status, payload, delay = server.behaviour(index, body)
                    time.sleep(delay)
                finally:  # before replying: once the client has the reply it may send its next request
                    with server.lock:
                        server.in_flight -= 1
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args) -> None:
                pass

        self.httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    @staticmethod
    def completion(content: str | None) -> bytes:
        return json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}).encode()

    def echo(self, index: int, body: dict) -> tuple[int, bytes, float]:
        return 200, self.completion(f"  echo:{body['messages'][-1]['content']}\n"), 0.0

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    fake = FakeOpenAI()
    yield fake
    fake.close()


def test_http_success_sends_an_openai_request(server: FakeOpenAI) -> None:
    with OpenAIChatModel(server.url, "judge-model", api_key="sk-test", max_tokens=7, system_prompt="Be brief.") as chat:
        assert chat.generate(["Is the sky blue?"]) == ["echo:Is the sky blue?"]
    headers, body = server.requests[0]
    assert body["path"] == "/v1/chat/completions"
    assert body["model"] == "judge-model"
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Is the sky blue?"},
    ]
    assert body["max_tokens"] == 7 and body["temperature"] == 0.0
    assert headers["Authorization"] == "Bearer sk-test"


def test_http_api_key_from_environment(server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_JUDGE_KEY", "from-env")
    with OpenAIChatModel(server.url, "m", api_key_env="MY_JUDGE_KEY") as chat:
        chat.generate(["x"])
    monkeypatch.delenv("MY_JUDGE_KEY")
    with OpenAIChatModel(server.url, "m", api_key_env="MY_JUDGE_KEY") as chat:
        chat.generate(["y"])
    assert server.requests[0][0]["Authorization"] == "Bearer from-env"
    assert "Authorization" not in server.requests[1][0]


def test_http_batch_keeps_several_requests_in_flight(server: FakeOpenAI) -> None:
    server.behaviour = lambda index, body: (200, server.completion(body["messages"][-1]["content"][::-1]), 0.2)
    prompts = [f"prompt {i}" for i in range(8)]
    with OpenAIChatModel(server.url, "m", max_workers=4) as chat:
        replies = chat.generate(prompts)
    assert replies == [p[::-1] for p in prompts]  # in order, whatever order they completed in
    assert len(server.requests) == 8
    assert 2 <= server.max_in_flight <= 4


def test_http_retries_a_500_then_succeeds(server: FakeOpenAI) -> None:
    server.behaviour = lambda index, body: (500, b'{"error": "overloaded"}', 0.0) if index == 0 else server.echo(index, body)
    with OpenAIChatModel(server.url, "m", max_retries=2, backoff=0.01) as chat:
        assert chat.generate(["hello"]) == ["echo:hello"]
    assert len(server.requests) == 2


def test_http_gives_up_after_bounded_retries(server: FakeOpenAI) -> None:
    server.behaviour = lambda index, body: (503, b"busy", 0.0)
    with OpenAIChatModel(server.url, "m", max_retries=2, backoff=0.01) as chat:
        with pytest.raises(ModelCallError, match=r"failed 3 times; last error: HTTP 503: busy"):
            chat.generate(["hello"])
    assert len(server.requests) == 3


def test_http_client_error_is_not_retried(server: FakeOpenAI) -> None:
    server.behaviour = lambda index, body: (401, b'{"error": "bad key"}', 0.0)
    with OpenAIChatModel(server.url, "m", max_retries=3, backoff=0.01) as chat:
        with pytest.raises(ModelCallError, match="refused the request: HTTP 401"):
            chat.generate(["hello"])
    assert len(server.requests) == 1


def test_http_timeout_is_retried_then_reported(server: FakeOpenAI) -> None:
    # Replies are held until the client has given up (30 s at most): a client that waited for them
    # would get "late" and no error, so the error proves it gave up on both attempts first.
    release = threading.Event()
    server.behaviour = lambda index, body: (release.wait(30), (200, server.completion("late"), 0.0))[1]
    try:
        with OpenAIChatModel(server.url, "m", timeout=0.2, max_retries=1, backoff=0.01) as chat:
            with pytest.raises(ModelCallError, match="failed 2 times; last error: no reply within the 0.2s timeout"):
                chat.generate(["hello"])
    finally:
        release.set()
    assert len(server.requests) == 2


@pytest.mark.parametrize("payload", [b"{not json", b'{"choices": []}', b'{"id": "x"}', b'{"choices": [{"message": {"content": 3}}]}'])
def test_http_malformed_reply_is_a_clear_error(server: FakeOpenAI, payload: bytes) -> None:
    server.behaviour = lambda index, body: (200, payload, 0.0)
    with OpenAIChatModel(server.url, "m", max_retries=2, backoff=0.01) as chat:
        with pytest.raises(ModelCallError, match="not a chat completion|non-text message content"):
            chat.generate(["hello"])
    assert len(server.requests) == 1


@pytest.mark.parametrize("option", [{"max_retries": -1}, {"max_workers": 0}, {"timeout": 0.0}, {"backoff": -1.0}])
def test_http_rejects_bad_settings(option: dict) -> None:
    with pytest.raises(ValueError, match="need max_retries >= 0"):
        OpenAIChatModel("http://127.0.0.1:1", "m", **option)


def test_http_null_content_is_an_empty_reply(server: FakeOpenAI) -> None:
    server.behaviour = lambda index, body: (200, server.completion(None), 0.0)
    with OpenAIChatModel(server.url, "m") as chat:
        assert chat.generate(["hello"]) == [""]


def test_http_unreachable_server() -> None:
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with OpenAIChatModel(f"http://127.0.0.1:{port}", "m", max_retries=1, backoff=0.01) as chat:
        with pytest.raises(ModelCallError, match="failed 2 times; last error: ConnectError"):
            chat.generate(["hello"])


def test_http_judge_and_answer_model_end_to_end(server: FakeOpenAI) -> None:
    def reply(index: int, body: dict) -> tuple[int, bytes, float]:
        prompt = body["messages"][-1]["content"]
        if prompt.startswith("Answer the question based on the given passages"):
            return 200, server.completion(" Paris "), 0.0
        return 200, server.completion("Yes" if "Predicted answer: Paris\n" in prompt else "No"), 0.0

    server.behaviour = reply
    answer_model = AnswerModel.http(server.url, "reader", max_retries=0)
    judge = LLMJudge.http(server.url, "judge", max_retries=0)
    assert answer_model("Capital of France?", "Paris is the capital of France.") == "Paris"
    assert judge.judge_batch(["Capital of France?"] * 2, [["Paris"]] * 2, ["Paris", "Rome"]) == [1.0, 0.0]
    assert [body["max_tokens"] for _, body in server.requests] == [32, 16, 16]
