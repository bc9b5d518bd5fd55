"""An OpenAI-compatible ``/v1/chat/completions`` endpoint as a chat backend (vLLM, or any provider).

Scoring a rollout batch with a remote judge is latency-bound, so several requests are kept in flight
by a small thread pool (a vLLM server batches them on its side). Transient failures - connection
errors, timeouts, HTTP 408, 429 and 5xx - are retried with exponential backoff a bounded number of times;
anything else, or running out of retries, raises ``ModelCallError`` saying what went wrong, because
a reward silently computed without its model would poison training. ``httpx`` is imported when a
client is made, so ``import rewards`` needs nothing beyond the standard library.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from rewards._optional import requires_extra
from rewards.models.chat import ModelCallError

if TYPE_CHECKING:
    import httpx

__all__ = ["OpenAIChatModel", "chat_completions_url"]

# The retry rule (408, 429 and 5xx again, any other 4xx final) and the doubling backoff below are those of
# search_env.http_retry, kept here as a copy: rewards imports nothing of the project (search_env itself
# imports rewards), and this client, on httpx with one timeout per operation and no overall deadline,
# shares only these two lines with the urllib3 clients there.
_RETRY_STATUSES = frozenset({408, 429})


def chat_completions_url(base_url: str) -> str:
    """The endpoint for ``base_url``: a server root, an OpenAI-style ``.../v1`` base, or the endpoint itself."""
    base = base_url.rstrip("/")
    if base.endswith("/chat/completions"):
        return base
    if base.endswith("/v1"):
        return f"{base}/chat/completions"
    return f"{base}/v1/chat/completions"


class OpenAIChatModel:
    """Greedy (``temperature=0``) chat completions from an OpenAI-compatible server.

    ``api_key`` defaults to the environment variable named by ``api_key_env``; with neither, no
    ``Authorization`` header is sent (a local vLLM server needs none). ``timeout`` bounds each of
    connecting, sending and reading, in seconds. A request is tried ``1 + max_retries`` times, waiting
    ``backoff * 2**i`` seconds before retry ``i + 1``. ``extra_body`` is merged into every request body
    (e.g. ``{"max_completion_tokens": 16}`` for providers that want it, or vLLM sampling fields).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        timeout: float = 30.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        max_workers: int = 4,
        max_tokens: int = 32,
        temperature: float = 0.0,
        system_prompt: str | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> None:
        with requires_extra("judge", "an OpenAI-compatible judge or answer model"):
            import httpx

        if max_retries < 0 or max_workers < 1 or timeout <= 0 or backoff < 0:
            raise ValueError(
                f"need max_retries >= 0, max_workers >= 1, timeout > 0, backoff >= 0; got {max_retries}, "
                f"{max_workers}, {timeout}, {backoff}"
            )
        self.url = chat_completions_url(base_url)
        self.model = model
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_workers = max_workers
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.system_prompt = system_prompt
        self.extra_body = dict(extra_body or {})
        key = api_key if api_key is not None else os.environ.get(api_key_env)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(timeout=httpx.Timeout(timeout), headers=headers)
        self._timeout = timeout

    def generate(self, prompts: Sequence[str]) -> list[str]:
        """Reply to each prompt, in order, with up to ``max_workers`` requests in flight."""
        if len(prompts) <= 1 or self.max_workers == 1:
            return [self.complete(prompt) for prompt in prompts]
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(prompts))) as pool:
            return list(pool.map(self.complete, prompts))

    def complete(self, prompt: str) -> str:
        """One chat completion for one user message, retried on transient failures."""
        with requires_extra("judge", "an OpenAI-compatible judge or answer model"):
            import httpx

        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages.append({"role": "user", "content": prompt})
        body = {
            "model": self.model,
            "messages": messages,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            **self.extra_body,
        }
        last_error = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                response = self._client.post(self.url, json=body)
            except httpx.TimeoutException:
                last_error = f"no reply within the {self._timeout}s timeout"
                continue
            except httpx.TransportError as exc:
                last_error = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code >= 500 or response.status_code in _RETRY_STATUSES:
                last_error = f"HTTP {response.status_code}: {response.text[:200]}"
                continue
            if response.status_code >= 400:
                raise ModelCallError(f"{self.url} refused the request: HTTP {response.status_code}: {response.text[:300]}")
            return self._reply_text(response)
        raise ModelCallError(f"{self.url} failed {self.max_retries + 1} times; last error: {last_error}")

    def _reply_text(self, response: httpx.Response) -> str:
        try:
            content = response.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise ModelCallError(
                f"{self.url} answered HTTP {response.status_code} with a body that is not a chat completion: "
                f"{response.text[:300]!r}"
            ) from None
        if content is not None and not isinstance(content, str):
            raise ModelCallError(f"{self.url} returned non-text message content: {content!r:.300}")
        return (content or "").strip()

    def close(self) -> None:
        """Close the pooled HTTP connections."""
        self._client.close()

    def __enter__(self) -> OpenAIChatModel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
