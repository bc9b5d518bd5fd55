"""Datasets and corpora: :func:`load_dataset` (FlashRAG jsonl, Search-R1 parquet, the synthetic world)
into :class:`QAExample` lists, and :func:`load_corpus` for passage files."""
from search_env.data.corpus import load_corpus
from search_env.data.example import QAExample, SubQuestion
from search_env.data.loaders import load_dataset

__all__ = ["QAExample", "SubQuestion", "load_dataset", "load_corpus"]
