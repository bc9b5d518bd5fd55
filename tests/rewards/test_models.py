"""The local transformers backend of the model-based rewards: a scripted model (padding and decoding
logic), a tiny random Llama, and the real SmolLM2 default (slow). Needs the judge extra's torch and
transformers."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.conftest import skip_without

skip_without("judge", "torch", "transformers")
import torch  # noqa: E402
import transformers  # noqa: E402

from rewards.models import AnswerModel, LLMJudge, LocalChatModel, default_model_path  # noqa: E402

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
