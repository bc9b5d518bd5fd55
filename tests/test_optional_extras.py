"""A missing optional package names the extra that installs it, wherever it is first needed.

Packages are made missing by a ``None`` entry in ``sys.modules`` (what ``import`` treats as "not
installed"), so these tests run on any install, the core one included.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from search_env._optional import MissingExtraError, requires_extra


def hide(monkeypatch: pytest.MonkeyPatch, *modules: str) -> None:
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)


def test_requires_extra_names_the_package_and_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    hide(monkeypatch, "faiss")
    with pytest.raises(MissingExtraError, match=r"^dense retrieval needs faiss: pip install 'searchqa-gym\[dense\]'$") as caught:
        with requires_extra("dense", "dense retrieval"):
            import faiss  # noqa: F401
    assert isinstance(caught.value, ModuleNotFoundError) and caught.value.name == "faiss"


def test_requires_extra_lets_other_errors_through() -> None:
    with pytest.raises(ValueError, match="not an import problem"):
        with requires_extra("dense", "dense retrieval"):
            raise ValueError("not an import problem")


def test_parquet_needs_the_data_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from search_env.data.loaders import load_searchr1_parquet

    hide(monkeypatch, "pyarrow", "pyarrow.parquet")
    with pytest.raises(MissingExtraError, match=r"reading parquet needs pyarrow: .*\[data\]"):
        load_searchr1_parquet(tmp_path / "train.parquet")


def test_dense_retrieval_needs_the_dense_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from search_env.sources.dense import faiss_gpu_available
    from search_env.sources.encoders import TransformersEncoder

    hide(monkeypatch, "faiss")
    with pytest.raises(MissingExtraError, match=r"needs faiss: .*\[dense\]"):
        faiss_gpu_available()
    hide(monkeypatch, "torch")
    with pytest.raises(MissingExtraError, match=r"needs torch: .*\[dense\]"):
        TransformersEncoder("no-such-model")


def test_a_tokenizer_folder_needs_transformers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from search_env.tokenization import as_codec

    hide(monkeypatch, "transformers")
    with pytest.raises(MissingExtraError, match=r"a transformers tokenizer needs transformers: .*\[agents\]"):
        as_codec(tmp_path)


def test_the_server_needs_the_server_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in sys.modules if name == "search_env.server" or name.startswith("search_env.server.")]:
        monkeypatch.delitem(sys.modules, name)
    hide(monkeypatch, "pydantic")
    with pytest.raises(MissingExtraError, match=r"the retrieval server needs pydantic: .*\[server\]"):
        importlib.import_module("search_env.server")


def test_model_based_rewards_need_the_judge_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from rewards.models import LocalChatModel, OpenAIChatModel

    hide(monkeypatch, "transformers", "httpx")
    with pytest.raises(ModuleNotFoundError, match=r"a local judge or answer model needs transformers: .*\[judge\]"):
        LocalChatModel.from_pretrained(tmp_path)
    with pytest.raises(ModuleNotFoundError, match=r"needs httpx: .*\[judge\]"):
        OpenAIChatModel("http://127.0.0.1:1", "judge")


def test_lora_needs_the_lora_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.conftest import skip_without

    skip_without("agents", "torch", "transformers")
    from agents.policies.config import ModelConfig
    from agents.policies.loading import add_lora, tiny_causal_lm

    lm = tiny_causal_lm(4096, layers=1, hidden=32, heads=2)
    hide(monkeypatch, "peft")
    with pytest.raises(MissingExtraError, match=r"^model.lora_rank \(LoRA adapters\) needs peft: pip install 'searchqa-gym\[lora\]'$"):
        add_lora(lm, ModelConfig(lora_rank=4))
    assert add_lora(lm, ModelConfig()) is lm  # no LoRA asked for: peft is never imported
