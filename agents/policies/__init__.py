"""Policies: a Hugging Face causal LM as a token-level policy (log-probs at the sampling temperature,
entropy, an optional value head) and the loading of models and tokenizers (a local folder, the offline
SmolLM2 gguf, or a tiny Llama built from scratch).

The bottom room of ``agents``: it imports nothing else of the package.
"""
