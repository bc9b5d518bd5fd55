"""Agents other than the sampler: the stop-string scanner, scripted agents, an OpenAI-compatible endpoint."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.conftest import CountingSource, skip_without

skip_without("agents", "torch", "transformers", "httpx")
from agents.rollout.endpoint import CompletionsEndpointAgent  # noqa: E402
from agents.rollout.agent import RolloutAgent, turn_stop_strings  # noqa: E402
from agents.scripted.rollout_agent import ScriptedRolloutAgent  # noqa: E402
from agents.rollout.collect import collect_rollouts  # noqa: E402
from agents.rollout.hf_sampler import HFSampler, StopScanner  # noqa: E402
from agents.scripted.agents import OracleAgent, run_episode  # noqa: E402
from search_env import AGENT, SEED_PROTOCOLS, BatchSearchQAEnv, SearchQAEnv, get_protocol  # noqa: E402
from search_env.data.example import QAExample  # noqa: E402
from search_env.tokenization import as_codec  # noqa: E402

TOKENS = [b"</", b"sea", b"rch>", b"</search>x", b"h>", b">", b"x", b"search", b"</answer>"]


def test_the_scanner_looks_only_at_ids_that_hold_a_stop_strings_last_byte():
    scanner = StopScanner(["</search>", "</answer>"], TOKENS)
    assert scanner.may_complete == [False, False, True, True, True, True, False, False, True]
    assert scanner.lookback == len("</answer>") - 1


@pytest.mark.parametrize(
    "before, token, stops",
    [
        (b"</sea", b"rch>", True),  # split across tokens
        (b"", b"</search>x", True),  # ends inside the token
        (b"text </search", b">", True),
        (b"</search>", b"x", False),  # a match that ended before this token was handled then
        (b"</search>", b"h>", False),
        (b"</sear", b"h>", False),
        (b"long text before </answe", b"r>", True),
        (b"", b"</answer>", True),
    ],
)
def test_the_scanner_finds_a_stop_string_that_ends_in_the_token(before, token, stops):
    assert StopScanner(["</search>", "</answer>"], TOKENS).completes(before, token) is stops


def test_research_stops_at_its_answer_tag_too():
    """ReSearch's answer does not end the episode, but a stray answer tag gets an error observation."""
    assert turn_stop_strings(get_protocol("research")) == ("</search>", "</answer>")
    assert turn_stop_strings(get_protocol("r1-searcher")) == ("<|end_of_query|>", "</answer>")


@pytest.mark.parametrize("protocol", SEED_PROTOCOLS)
def test_the_scripted_adapter_plays_the_episodes_run_episode_plays(protocol):
    env = BatchSearchQAEnv(3, protocol=protocol)
    assert isinstance(ScriptedRolloutAgent(OracleAgent), RolloutAgent)
    rollout = collect_rollouts(ScriptedRolloutAgent(OracleAgent), env, [0, 1, 2])
    single = SearchQAEnv(protocol=protocol)
    for i, traj in enumerate(rollout.trajectories):
        reference = run_episode(single, OracleAgent(), options={"index": i})
        assert traj.token_ids == reference.token_ids and traj.trained == reference.trained
        assert traj.reward == reference.reward and traj.end_reason == reference.end_reason


# -- an OpenAI-compatible endpoint, served on the loopback interface by the test ----------------------
class _FakeCompletions(BaseHTTPRequestHandler):
    """Searches first, then answers "Bob"; names the stop string (vLLM) or not (OpenAI), as configured."""

    requests: list[dict] = []
    name_stop = True
    length_cut = False

    def do_POST(self):  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, **body})
        prompt = body["prompt"] if isinstance(body["prompt"], str) else "".join(map(str, body["prompt"]))
        if self.length_cut:
            choice = {"text": "word " * 50, "finish_reason": "length"}
        elif "Bob" in prompt[-40:]:  # the answer is written (ReSearch goes on to EOS): end the sequence
            choice = {"text": "", "finish_reason": "stop"}
        elif "Zarbo founder" not in prompt:
            choice = {"text": "<think> I look it up. </think>\n<search> Zarbo founder", "finish_reason": "stop", "stop_reason": "</search>"}
        else:
            answer = "The final answer is \\[ \\boxed{Bob} \\]" if "boxed" in prompt else "Bob"
            choice = {"text": f"<answer> {answer}", "finish_reason": "stop", "stop_reason": "</answer>"}
        if not self.name_stop:
            choice.pop("stop_reason", None)
        payload = json.dumps({"choices": [{"index": 0, **choice}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    handler = type("Handler", (_FakeCompletions,), {"requests": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield handler, f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def _endpoint_env(protocol, **options):
    examples = [QAExample("zarbo", "Who founded Zarbo?", ["Bob"]), QAExample("zarbo2", "Who founded Zarbo city?", ["Bob"])]
    return BatchSearchQAEnv(2, protocol=protocol, dataset=examples, sources=CountingSource(), **options)


@pytest.mark.parametrize("protocol", ["search-r1", "research"])
@pytest.mark.parametrize("name_stop", [True, False])
def test_an_endpoint_agent_searches_and_answers_through_the_environment(server, protocol, name_stop):
    handler, url = server
    handler.name_stop = name_stop
    env = _endpoint_env(protocol, max_new_tokens=100)
    codec = env.envs[0].codec
    agent = CompletionsEndpointAgent(url, "fake-model", temperature=0.0, api_key="k")
    rollout = collect_rollouts(agent, env, [0, 1])
    agent.close()
    for traj in rollout.trajectories:
        assert traj.reward == 1.0 and len(traj.tool_calls) == 1  # the reward read the answer where it belongs
        assert traj.end_reason == ("eos" if protocol == "research" else "answer")
    first, *_ = handler.requests
    assert first["path"] == "/v1/completions" and first["model"] == "fake-model" and first["temperature"] == 0.0
    assert first["stop"] == list(turn_stop_strings(get_protocol(protocol))) and first["max_tokens"] == 100
    # The prompt of the answering turn is the episode so far: prompt, the search chunk, the results.
    traj = rollout.trajectories[0]
    after_results = max(t for t in range(len(traj.token_ids)) if traj.producers[t] != AGENT) + 1
    assert codec.decode(traj.token_ids[:after_results]) in [r["prompt"] for r in handler.requests]


def test_an_endpoint_can_be_sent_token_ids_and_a_length_cut_adds_no_stop_string(server):
    handler, url = server
    env = _endpoint_env("search-r1", max_new_tokens=100)
    agent = CompletionsEndpointAgent(url, "m", send_ids=True)
    traj = collect_rollouts(agent, env, [0]).trajectories[0]
    assert handler.requests[0]["prompt"] == traj.token_ids[: traj.prompt_length]
    handler.length_cut = True
    traj = collect_rollouts(agent, _endpoint_env("search-r1", max_new_tokens=12), [0]).trajectories[0]
    agent.close()
    assert traj.end_reason == "max_new_tokens" and as_codec(None).decode(traj.response_ids).startswith("word word")


def test_the_sampler_and_the_endpoint_agent_are_rollout_agents():
    assert issubclass(HFSampler, RolloutAgent) and issubclass(CompletionsEndpointAgent, RolloutAgent)
