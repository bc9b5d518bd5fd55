"""Model-based reward parts: the judge's reply parsing, the HTTP backend against a local server, the
local transformers backend (scripted and tiny random models; SmolLM2 for real, marked slow)."""
from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Callable

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from rewards.models import (  # noqa: E402
    JUDGE_PROMPT,
    AnswerModel,
    LLMJudge,
    LocalChatModel,
    ModelCallError,
    OpenAIChatModel,
    batch_answer,
    batch_judge,
    default_model_path,
    f1_judge,
    parse_judgement,
)
from rewards.models.remote import chat_completions_url  # noqa: E402

SPEC_EVIDENCE_PROMPT = (
    "Answer the question based on the given passages. Only give me the answer and do not output any other "
    "words.\n\nThe following are given passages:\n{evidence}\n\nQuestion: {question}\nAnswer:"
)


# --------------------------------------------------------------------------------------------
# Judge reply parsing and the model-free parts


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("Yes", (1.0, True)),
        ("yes.", (1.0, True)),
        ("No", (0.0, True)),
        ("NO, it is a different city.", (0.0, True)),
        ("The predicted answer is correct.", (1.0, True)),
        ("The predicted answer is incorrect.", (0.0, True)),
        ("It is not correct", (0.0, True)),
        ("That isn't quite right", (0.0, True)),
        ("Wrong answer", (0.0, True)),
        ("True", (1.0, True)),
        ("false", (0.0, True)),
        ("Correct, although no units are given", (1.0, True)),  # the earliest verdict word decides
        ("0.7", (0.7, True)),
        ("Score: 1", (1.0, True)),
        ("7/10", (0.7, True)),
        ("80 %", (0.8, True)),
        ("Score: 8", (0.0, False)),  # out of [0, 1] with no scale given
        ("3/0", (0.0, False)),
        ("I cannot tell.", (0.0, False)),
        ("", (0.0, False)),
        ("Paris", (0.0, False)),
        ("nothing known", (0.0, False)),  # "no" only as a whole word
    ],
)
def test_parse_judgement(reply: str, expected: tuple[float, bool]) -> None:
    score, parsed = parse_judgement(reply)
    assert (score, parsed) == pytest.approx(expected)


def test_f1_judge_is_token_f1() -> None:
    # "the eiffel tower" -> [eiffel, tower]; gold -> [eiffel, tower, in, paris]: P=1, R=1/2, F1=2/3.
    assert f1_judge("Where?", ["Eiffel Tower in Paris"], "The Eiffel Tower") == pytest.approx(2 / 3)
    assert f1_judge("Where?", ["London", "Eiffel Tower"], "eiffel tower!") == 1.0
    assert f1_judge("Where?", ["London"], "Paris") == 0.0


class FakeChat:
    """A ChatModel that records every batch and answers from a script (or echoes)."""

    def __init__(self, reply: Callable[[str], str] = lambda prompt: f"echo:{prompt}") -> None:
        self.reply = reply
        self.batches: list[list[str]] = []

    def generate(self, prompts):
        self.batches.append(list(prompts))
        return [self.reply(p) for p in prompts]


def test_answer_model_prompts_with_the_r_search_template() -> None:
    chat = FakeChat()
    model = AnswerModel(chat)
    answer = model("Who wrote Hamlet?", "(Title: Hamlet) Hamlet is a play by William Shakespeare.")
    expected_prompt = SPEC_EVIDENCE_PROMPT.format(
        evidence="(Title: Hamlet) Hamlet is a play by William Shakespeare.", question="Who wrote Hamlet?"
    )
    assert chat.batches == [[expected_prompt]]
    assert answer == f"echo:{expected_prompt}"


def test_answer_batch_is_one_backend_batch_in_order() -> None:
    chat = FakeChat()
    model = AnswerModel(chat, template="{question}|{evidence}")
    assert model.answer_batch(["q1", "q2", "q3"], ["e1", "e2", "e3"]) == ["echo:q1|e1", "echo:q2|e2", "echo:q3|e3"]
    assert len(chat.batches) == 1
    with pytest.raises(ValueError, match="differ in length"):
        model.answer_batch(["q1", "q2"], ["e1"])


def test_llm_judge_scores_and_flags() -> None:
    replies = {"Paris": "Yes.", "Lyon": "No, the capital is Paris.", "Nice": "Hmm, maybe."}
    chat = FakeChat(lambda prompt: next(v for k, v in replies.items() if f"Predicted answer: {k}\n" in prompt))
    judge = LLMJudge(chat)
    questions = ["Capital of France?"] * 4
    golds = [["Paris", "City of Paris"]] * 4
    judgements = judge.assess_batch(questions, golds, ["Paris", "Lyon", "Nice", "   "])
    assert [j.score for j in judgements] == [1.0, 0.0, 0.0, 0.0]
    assert [j.parsed for j in judgements] == [True, True, False, True]
    assert [j.reply for j in judgements] == ["Yes.", "No, the capital is Paris.", "Hmm, maybe.", None]
    # the blank prediction was never sent; the three others went as one batch
    assert len(chat.batches) == 1 and len(chat.batches[0]) == 3
    assert chat.batches[0][0] == JUDGE_PROMPT.format(
        question="Capital of France?", golden_answers="Paris; City of Paris", prediction="Paris"
    )
    assert judge("Capital of France?", ["Paris"], "Lyon") == 0.0
    assert judge.judge_batch(questions[:2], golds[:2], ["Lyon", "Paris"]) == [0.0, 1.0]


def test_batch_helpers_accept_plain_functions_and_objects() -> None:
    calls = []

    def judge(question, golden_answers, prediction):
        calls.append(golden_answers)
        return 1.0 if prediction in golden_answers else 0.0

    assert batch_judge(judge, ["q", "q"], ["a", ["b", "c"]], ["a", "x"]) == [1.0, 0.0]
    assert calls == [["a"], ["b", "c"]]  # a single gold string arrives as a list, as rewards.score does
    assert batch_answer(lambda q, e: e.upper(), ["q1", "q2"], ["x", "y"]) == ["X", "Y"]
    chat = FakeChat(lambda prompt: "yes")
    assert batch_judge(LLMJudge(chat), ["q", "q"], [["a"], ["b"]], ["a", "b"]) == [1.0, 1.0]
    assert len(chat.batches) == 1
    with pytest.raises(ValueError, match="differ in length"):
        batch_judge(judge, ["q"], ["a", "b"], ["a"])


# --------------------------------------------------------------------------------------------
# OpenAI-compatible HTTP backend against a local server


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


def test_chat_completions_url() -> None:
    assert chat_completions_url("http://h:8000") == "http://h:8000/v1/chat/completions"
    assert chat_completions_url("http://h:8000/v1/") == "http://h:8000/v1/chat/completions"
    assert chat_completions_url("https://api.x.com/v1/chat/completions") == "https://api.x.com/v1/chat/completions"


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


# --------------------------------------------------------------------------------------------
# Local transformers backend: scripted model (padding/decoding logic) and a tiny random Llama


WORDS = "[PAD] [EOS] [UNK] the a cat dog sat on mat ran far is big small red blue who what where one two".split()


@pytest.fixture(scope="module")
def word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", eos_token="[EOS]", unk_token="[UNK]")


def ids(text: str) -> list[int]:
    return [WORDS.index(w) for w in text.split()]


class ScriptedModel:
    """Stands in for a causal LM: continues each (unpadded) prompt with scripted ids, padding with 0."""

    device = torch.device("cpu")
    generation_config = SimpleNamespace(eos_token_id=WORDS.index("[EOS]"))

    def __init__(self, script: dict[tuple[int, ...], list[int]]) -> None:
        self.script = script
        self.calls: list[dict] = []

    def eval(self):
        return self

    def generate(self, input_ids, attention_mask, max_new_tokens, **options):
        self.calls.append({"input_ids": input_ids, "attention_mask": attention_mask, "max_new_tokens": max_new_tokens, **options})
        new = torch.zeros((input_ids.shape[0], max_new_tokens), dtype=torch.long)
        for row, (prompt, mask) in enumerate(zip(input_ids, attention_mask)):
            continuation = self.script[tuple(prompt[mask.bool()].tolist())][:max_new_tokens]
            new[row, : len(continuation)] = torch.tensor(continuation)
        return torch.cat([input_ids, new], dim=1)


def test_local_left_pads_batches_and_cuts_at_eos(word_tokenizer) -> None:
    model = ScriptedModel({
        tuple(ids("cat")): ids("dog sat [EOS] mat"),
        tuple(ids("the big red dog")): ids("the mat"),
        tuple(ids("who ran")): ids("one two [EOS]"),
    })
    chat = LocalChatModel(model, word_tokenizer, max_new_tokens=4, batch_size=2)
    assert chat.generate(["cat", "the big red dog", "who ran"]) == ["dog sat", "the mat", "one two"]
    # rows are batched longest first: [the big red dog, who ran] then [cat]
    first, second = model.calls
    assert first["input_ids"].tolist() == [ids("the big red dog"), [0, 0] + ids("who ran")]
    assert first["attention_mask"].tolist() == [[1, 1, 1, 1], [0, 0, 1, 1]]
    assert second["input_ids"].tolist() == [ids("cat")]
    assert first["do_sample"] is False and first["max_new_tokens"] == 4
    assert first["eos_token_id"] == [WORDS.index("[EOS]")] and first["pad_token_id"] == 0
    assert chat.generate([]) == [] and len(model.calls) == 2  # an empty batch runs nothing


def test_local_chat_template_and_system_prompt(word_tokenizer) -> None:
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=word_tokenizer.backend_tokenizer, pad_token="[PAD]", eos_token="[EOS]")
    plain = LocalChatModel(ScriptedModel({}), tokenizer, system_prompt="be brief")
    assert plain.render("who ran") == "be brief\n\nwho ran"
    tokenizer.chat_template = (
        "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    templated = LocalChatModel(ScriptedModel({}), tokenizer, system_prompt="be brief")
    assert templated.render("who ran") == "<system>be brief<user>who ran<assistant>"
    assert LocalChatModel(ScriptedModel({}), tokenizer, use_chat_template=False).render("who ran") == "who ran"
    with pytest.raises(ValueError, match="no chat template"):
        LocalChatModel(ScriptedModel({}), word_tokenizer, use_chat_template=True)


@pytest.fixture(scope="module")
def tiny_llama(word_tokenizer, tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(WORDS), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, eos_token_id=WORDS.index("[EOS]"), bos_token_id=None,
    )
    model = transformers.LlamaForCausalLM(config)
    folder = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(folder)
    word_tokenizer.save_pretrained(folder)
    return folder


def test_local_batched_generation_matches_one_by_one(tiny_llama) -> None:
    prompts = ["cat", "the big red dog sat on the mat", "who ran far", "a small blue cat is big", "what"]
    batched = LocalChatModel.from_pretrained(tiny_llama, max_new_tokens=6, batch_size=5).generate(prompts)
    single = LocalChatModel.from_pretrained(tiny_llama, max_new_tokens=6, batch_size=1)
    assert batched == [single.generate([p])[0] for p in prompts]
    assert all(isinstance(r, str) and len(r.split()) <= 6 for r in batched)
    assert any(batched)  # a random model stops at EOS now and then, but not on every prompt


def constant_model(token: str):
    """A real Llama whose head ignores the hidden state and always prefers ``token``."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(WORDS), hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64, pad_token_id=0, eos_token_id=WORDS.index("[EOS]"),
    )
    model = transformers.LlamaForCausalLM(config)
    head = torch.nn.Linear(16, len(WORDS), bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[WORDS.index(token)] = 1.0
    model.lm_head = head
    return model


def test_local_max_new_tokens_bounds_the_reply(word_tokenizer) -> None:
    chat = LocalChatModel(constant_model("mat"), word_tokenizer, max_new_tokens=3)
    assert chat.generate(["the cat", "who"]) == ["mat mat mat", "mat mat mat"]


def test_local_reply_ending_at_once_is_empty(word_tokenizer) -> None:
    chat = LocalChatModel(constant_model("[EOS]"), word_tokenizer, max_new_tokens=3)
    assert chat.generate(["the cat", "who"]) == ["", ""]


# --------------------------------------------------------------------------------------------
# The real default model (SmolLM2-135M-Instruct), loaded once


@pytest.fixture(scope="module")
def smollm() -> LocalChatModel:
    return LocalChatModel.from_pretrained(max_new_tokens=16, batch_size=4)


@pytest.mark.slow
def test_default_model_is_the_packaged_smollm2() -> None:
    path = default_model_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()


@pytest.mark.slow
def test_smollm_answer_model_reads_the_evidence(smollm: LocalChatModel) -> None:
    model = AnswerModel(smollm)
    evidence = "(Title: Eiffel Tower) The Eiffel Tower is a wrought-iron lattice tower in Paris, France."
    answer = model("In which city is the Eiffel Tower?", evidence)
    assert isinstance(answer, str) and "paris" in answer.lower()
    batch = model.answer_batch(["In which city is the Eiffel Tower?", "What is the Eiffel Tower made of?"], [evidence] * 2)
    assert batch[0] == answer and isinstance(batch[1], str) and batch[1]


@pytest.mark.slow
def test_smollm_judge_scores_in_unit_interval(smollm: LocalChatModel) -> None:
    judge = LLMJudge(smollm)
    items = [
        ("What is the capital of France?", ["Paris"], "Paris"),
        ("What is the capital of France?", ["Paris"], "Berlin"),
        ("Who wrote Hamlet?", ["William Shakespeare"], "Shakespeare"),
    ]
    questions, golds, predictions = map(list, zip(*items))
    batch = judge.judge_batch(questions, golds, predictions)
    single = [judge(q, g, p) for q, g, p in items]
    assert batch == single
    assert all(isinstance(s, float) and 0.0 <= s <= 1.0 for s in batch)
    judgements = judge.assess_batch(questions, golds, predictions)
    assert [j.score for j in judgements] == batch
    assert all(isinstance(j.reply, str) and j.reply and j.parsed for j in judgements)  # SmolLM2 says yes/no
