"""The command line: recipes and grouped flags (``--GROUP.FIELD VALUE``) become a TrainConfig, ``--help``
shows the groups and the chosen algorithm's defaults without loading transformers, bad input is one
``error:`` line (exit status 2, no traceback), and a short run prints the before/after table and where its
files are."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.training.metric_keys import MACHINE_KEYS
from tests.conftest import REPO_ROOT, skip_without

skip_without("agents", "torch", "transformers", "yaml", "jsonargparse", "matplotlib")
from agents.learners import GRPOConfig, PPOConfig  # noqa: E402
from agents.policies.loading import tiny_causal_lm  # noqa: E402
from agents.train import main, parse_config  # noqa: E402
from agents.training.config import TrainConfig  # noqa: E402

ROOT = REPO_ROOT
RECIPE = ROOT / "agents" / "configs" / "search-r1-grpo.yaml"


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agents.train", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def _flag_help(help_text: str) -> dict[str, str]:
    """Each ``--flag``'s help text (up to the next flag), whitespace collapsed."""
    blocks = re.split(r"\n  (?=--)", help_text)
    return {block.split()[0]: " ".join(block.split()) for block in blocks[1:] if block.startswith("--")}


def test_recipe_then_flags_make_the_config(tmp_path):
    config = parse_config(["--config", str(RECIPE), "--model.name", "tiny", "--run.steps", "3",
                           "--optim.adam_betas", "[0.8, 0.9]"])
    assert isinstance(config, TrainConfig) and isinstance(config.algorithm, GRPOConfig)
    assert (config.model.name, config.run.steps, config.optim.adam_betas) == ("tiny", 3, (0.8, 0.9))
    assert (config.rollout.questions_per_step, config.rollout.top_p, config.algorithm.kl_estimator) == (512, 0.95, "k3")
    recipe = tmp_path / "ppo.yaml"
    recipe.write_text("algo: ppo\nalgorithm:\n  critic: head\nenv:\n  reward_stages: [[0, search-r1], [5, search-r1-format]]\n")
    config = parse_config(["--config", str(recipe)])
    assert config.algo == "ppo" and isinstance(config.algorithm, PPOConfig) and config.algorithm.critic == "head"
    assert config.env.reward_stages == [[0, "search-r1"], [5, "search-r1-format"]]
    config = parse_config(["--algo", "grpo", "--algorithm.dual_clip", "3", "--run.progress", "false"])
    assert (config.algorithm.dual_clip, config.run.progress) == (3.0, False)
    recipe.write_text("algo: ppo\nrun:\n  steps: 2\n")
    assert parse_config(["--config", str(recipe), "--algo", "grpo"]).algo == "grpo"  # the flag beats the recipe


def test_flags_override_the_recipe_before_it_or_after_it(tmp_path):
    for argv in (["--run.steps", "3", "--config", str(RECIPE), "--model.name", "tiny"],
                 ["--config", str(RECIPE), "--model.name", "tiny", "--run.steps", "3"],
                 ["--model.name", "tiny", "--run.steps", "3", f"--config={RECIPE}"]):
        config = parse_config(argv)
        assert (config.model.name, config.run.steps) == ("tiny", 3), argv
        assert config.rollout.top_p == 0.95  # the recipe's still, where no flag changes it
    assert parse_config(["--model.name", "tiny", "--config", str(RECIPE), "--smoke"]).model.name == "tiny"
    second = tmp_path / "second.yaml"
    second.write_text("run:\n  steps: 7\n  seed: 5\n")
    config = parse_config(["--run.steps", "3", "--config", str(RECIPE), "--model.name", "tiny", "--config", str(second)])
    assert (config.run.steps, config.run.seed) == (3, 5)  # recipes in their order, then every flag
    done = _run("--run.steps", "3", "--config", str(ROOT / "agents" / "configs" / "demo.yaml"), "--print_config")
    assert done.returncode == 0, done.stderr
    assert re.search(r"^run:\n(?:  .*\n)*?  steps: 3$", done.stdout, re.M), done.stdout


def test_a_bad_device_suggests_the_nearest_one_without_torchs_list():
    for device, hint in (("gpu", "did you mean 'cuda'?"), ("gpu:1", "did you mean 'cuda:1'?"), ("cdu", "did you mean 'cpu'?")):
        with pytest.raises(ValueError) as info:
            parse_config(["--run.device", device])
        message = str(info.value)
        assert hint in message and "give auto, cpu, cuda, cuda:N or mps" in message and "mkldnn" not in message, message


def test_help_says_each_default_once_and_no_field_twice():
    text = " ".join(_run("--help").stdout.split())
    assert "every every" not in text and "every eval.every steps" in text
    algo = _flag_help(_run("--help").stdout)["--algo"]
    assert algo.count("default") == 1, algo


def test_a_recipe_field_of_another_algorithm_says_whose_fields_to_see(tmp_path):
    recipe = tmp_path / "ppo.yaml"
    recipe.write_text("algo: ppo\nalgorithm:\n  critic: head\n")
    with pytest.raises(ValueError, match=r"'critic'.*grpo's config has no such field.*--algo grpo --help"):
        parse_config(["--config", str(recipe), "--algo", "grpo"])


def test_help_shows_the_groups_and_grpos_defaults_quickly():
    start = time.monotonic()
    done = _run("--help")
    seconds = time.monotonic() - start
    assert done.returncode == 0, done.stderr
    assert seconds < 60, f"--help took {seconds:.1f} s"
    flags = _flag_help(done.stdout)
    for flag in ("--config", "--algo", "--import", "--model.name", "--data.dataset", "--env.protocol",
                 "--rollout.temperature", "--optim.learning_rate", "--optim.warmup_ratio", "--warm_start.steps",
                 "--eval.every", "--run.output_dir", "--algorithm.group_size"):
        assert flag in flags, flag
    assert "default: 5" in flags["--algorithm.group_size"]  # GRPO's, not AlgorithmConfig's 8
    assert "default: 0.001" in flags["--algorithm.kl_coef"]
    assert "--algorithm.scale_rewards" in flags  # a GRPO field
    assert "--algo NAME --help" in " ".join(done.stdout.split())  # how to see another algorithm's flags


def test_help_for_another_algorithm_shows_its_defaults():
    done = _run("--algo", "ppo", "--help")
    assert done.returncode == 0, done.stderr
    flags = _flag_help(done.stdout)
    assert "default: 1" in flags["--algorithm.group_size"]
    assert "default: k1" in flags["--algorithm.kl_estimator"]
    assert "default: 1e-05" in flags["--algorithm.critic_lr"]
    assert "default: 0.015" in flags["--algorithm.critic_warmup_ratio"]
    assert "--algorithm.scale_rewards" not in flags


def test_help_does_not_import_transformers():
    code = ("import sys, agents.train as t\n"
            "try:\n    t.parse_config(['--help'])\nexcept SystemExit as exc:\n    assert exc.code == 0, exc.code\n"
            "else:\n    raise AssertionError('--help did not exit')\n"
            "assert 'transformers' not in sys.modules, 'transformers imported'\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_a_mistyped_flag_names_the_nearest_one():
    done = _run("--optim.learning_rat", "0.1")
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert "did you mean --optim.learning_rate" in lines[0]


def test_an_unknown_algorithm_is_one_line_listing_the_known_ones():
    done = _run("--algo", "dqn")
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unknown algorithm 'dqn'; known: "), done.stderr
    # The subprocess knows the built-in algorithms only (this session's test modules register more).
    assert all(name in lines[0] for name in ("grpo", "ppo", "reinforce++", "reinforce++-baseline"))


@pytest.fixture(scope="module")
def mismatched_model(tmp_path_factory, split_tag_tokenizer):
    """A local model folder (4096-row embedding) and a 400-id tokenizer of another model."""
    folder = tmp_path_factory.mktemp("tiny-model")
    tiny_causal_lm(4096, layers=1, hidden=32, heads=2).save_pretrained(folder)
    tokenizer = folder / "other-tokenizer.json"
    split_tag_tokenizer.save(str(tokenizer))
    return folder, tokenizer


BAD_INPUT = {
    "unknown algorithm": (["--algo", "a2c"], "unknown algorithm 'a2c'"),
    "missing model path": (["--model.name", "/no/such/model"], "'/no/such/model' is not"),
    "missing dataset": (["--data.dataset", "/no/such/hotpotqa.jsonl", "--data.corpus", "{corpus}"], "no file '/no/such/hotpotqa.jsonl'"),
    "missing corpus": (["--data.dataset", "{dataset}", "--data.corpus", "/no/such/corpus.jsonl", "--eval.questions", "0"],
                       "corpus file not found"),
    "real data without corpus": (["--data.dataset", "{dataset}"], "needs data.corpus"),
    "retrieval server for the synthetic world": (["--data.retrieval_url", "http://127.0.0.1:9/retrieve"],
                                                 "the synthetic world searches its own passages"),
    "corpus and retrieval server": (["--data.dataset", "{dataset}", "--data.corpus", "{corpus}", "--data.retrieval_url",
                                     "http://127.0.0.1:9/retrieve"], "not both"),
    "empty replica URL": (["--data.dataset", "{dataset}", "--data.retrieval_url", "http://127.0.0.1:9/retrieve,"], "empty URL"),
    "mismatched tokenizer": (["--model.name", "{model}", "--model.tokenizer", "{tokenizer}"], "belong to different models"),
    "unknown field": (["--optim.learning_rat", "0.1"], "did you mean --optim.learning_rate"),
    "unknown group": (["--optimiser.learning_rate", "0.1"], "unrecognized arguments: --optimiser.learning_rate"),
    "another algorithm's field": (["--algo", "ppo", "--algorithm.scale_rewards", "true"], "--algorithm.scale_rewards"),
    "bad value": (["--run.steps", "many"], "run.steps"),
    "invalid setting": (["--algorithm.group_size", "1"], "group_size must be >= 2"),
    "warm-up given twice": (["--optim.warmup_steps", "3", "--optim.warmup_ratio", "0.1"], "not both"),
    "model left to the user": (["--config", str(RECIPE)], "the recipe leaves model.name to you"),
    "missing recipe": (["--config", "/no/such/recipe.yaml"], "recipe file not found"),
    "unknown protocol": (["--env.protocol", "search-r2"], "unknown protocol 'search-r2'"),
    "resume without a checkpoint": (["--run.resume", "true"], "no checkpoint at"),
    "import of a missing module": (["--import", "no_such_module_xyz"], "--import no_such_module_xyz"),
    "context below the prompt": (["--env.max_context", "40"], "env.max_context 40 leaves no room for an answer"),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_is_one_error_line(case, capsys, tmp_path, mismatched_model):
    argv, expected = BAD_INPUT[case]
    dataset = tmp_path / "qa.jsonl"
    dataset.write_text('{"id": "1", "question": "Who?", "golden_answers": ["Ann"]}\n')
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "p1", "title": "Ann", "text": "Ann was here."}\n')
    model, tokenizer = mismatched_model
    argv = [a.format(dataset=dataset, corpus=corpus, model=model, tokenizer=tokenizer) for a in argv]
    assert main(argv + ["--run.output_dir", str(tmp_path / "run")]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert expected in err


def test_a_context_below_the_prompt_is_refused_before_the_model_is_built(tmp_path, capsys, monkeypatch):
    import agents.training.build as build

    def no_model(*args, **kwargs):
        raise AssertionError("the model was built before the prompts were measured")

    monkeypatch.setattr(build, "load_policy", no_model)
    assert main(["--env.max_context", "40", "--run.output_dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    tokens = int(err.split("the longest prompt takes ")[1].split()[0])
    assert 40 <= tokens and f"raise --env.max_context above {tokens}" in err, err
    # one token of room is enough to start: the check refuses only a prompt that fills the context
    from agents.training.run_checks import check_prompt_room
    from agents.training.config import TrainConfig
    from agents.policies.loading import load_codec
    from search_env.data.example import QAExample

    question = QAExample(id="q", question="Who founded Doszresk Holdings?", golden_answers=["Ann"])
    config = TrainConfig().updated({"env.max_context": tokens + 1})
    check_prompt_room(config, load_codec("tiny"), [question] * 3)  # a short question under a long one's room


def test_a_tool_calls_prompt_is_measured_with_the_runs_sources_as_its_tools(tmp_path, capsys, monkeypatch):
    """The tool-calls prompt lists every source of the run as a tool: its room is checked with them, in one
    line before the model loads, not at the first episode's reset."""
    import agents.training.build as build
    from agents.training.run_checks import check_prompt_room
    from agents.policies.loading import load_codec
    from search_env.data.example import QAExample
    from search_env.sources.bm25 import BM25Source

    monkeypatch.setattr(build, "load_policy", lambda *a, **k: (_ for _ in ()).throw(AssertionError("model built")))
    argv = ["--env.protocol", "tool-calls", "--data.world_size", "20", "--eval.questions", "2", "--env.max_context", "800",
            "--run.output_dir", str(tmp_path / "run")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: env.max_context 800 leaves no room for an answer") and "\n" not in err, err
    question = [QAExample(id="q", question="Who founded Doszresk Holdings?", golden_answers=["Ann"])]
    codec, config = load_codec("tiny"), TrainConfig().updated({"env.protocol": "tool-calls", "env.max_context": 800})
    passages = [{"id": "1", "title": "A", "text": "a"}]
    one, four = ({f"s{i}": BM25Source(passages, name=f"s{i}") for i in range(n)} for n in (1, 4))
    check_prompt_room(config, codec, question, one)  # one tool fits in 800 tokens (about 570)
    with pytest.raises(ValueError, match="leaves no room"):  # four tools' descriptions do not (about 1,070)
        check_prompt_room(config, codec, question, four)


def test_a_short_run_prints_the_table_and_its_files(tmp_path, capsys):
    argv = ["--algo", "reinforce++-baseline", "--run.steps", "1", "--rollout.questions_per_step", "2",
            "--algorithm.group_size", "2", "--env.max_new_tokens", "12", "--data.world_size", "20",
            "--eval.questions", "2", "--run.report_to", "[]", "--run.output_dir", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "reinforce++-baseline: 1 of 1 steps"
    rows = [line.split()[:2] for line in lines if line.startswith(("start", "final"))]
    assert rows == [["start", "greedy"], ["start", "sampled"], ["final", "greedy"], ["final", "sampled"]]
    paths = {line.split(":", 1)[0]: Path(line.split(":", 1)[1].strip())
             for line in lines if line.startswith(("curve", "metrics", "checkpoint", "policy"))}
    assert set(paths) == {"curve", "metrics", "checkpoint", "policy"}
    assert all(paths[name].is_file() for name in ("curve", "metrics", "checkpoint"))
    assert (paths["policy"] / "config.json").is_file()  # a transformers model folder: --model.name takes it
    assert "tensorboard" not in out


def test_a_warm_start_on_real_format_data_without_decompositions(tmp_path, capsys):
    """A FlashRAG jsonl has no gold decompositions: the warm start demonstrates "search the question,
    answer the gold answer" instead of failing."""
    people = [("Ann", "Oslo"), ("Bo", "Lima"), ("Cy", "Rome")]
    dataset = tmp_path / "qa.jsonl"
    dataset.write_text("".join(f'{{"id": "{i}", "question": "Where was {name} born?", "golden_answers": ["{city}"]}}\n'
                               for i, (name, city) in enumerate(people)))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(f'{{"id": "p{i}", "title": "{name}", "text": "{name} was born in {city}."}}\n'
                              for i, (name, city) in enumerate(people)))
    argv = ["--algo", "grpo", "--data.dataset", str(dataset), "--data.corpus", str(corpus), "--run.steps", "1",
            "--rollout.questions_per_step", "2", "--algorithm.group_size", "2", "--env.max_new_tokens", "40",
            "--eval.questions", "0", "--warm_start.steps", "2", "--warm_start.examples", "4", "--run.report_to", "[]",
            "--run.output_dir", str(tmp_path / "run")]
    assert main(argv) == 0
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    warm = [r for r in metrics if "warm_start/steps" in r]
    assert warm and warm[0]["warm_start/steps"] == 2 and warm[0]["warm_start/demo_reward"] == 1.0


@pytest.mark.slow  # two short runs of the demo recipe (its world built twice), one beside two busy processes
def test_the_demo_command_logs_the_same_steps_on_a_quiet_and_a_busy_machine(tmp_path):
    """The README's command ends on step counts, never on a clock: run short (3 GRPO steps on a smaller
    world, a short warm start, the environment worker on as in the recipe), alone and then with two processes keeping
    both cores busy, its logs agree in everything but what they measure of the machine."""
    flags = ["--config", str(ROOT / "agents" / "configs" / "demo.yaml"), "--run.steps", "3", "--eval.every", "1",
             "--eval.questions", "4", "--data.world_size", "300", "--data.world_scale", "5", "--warm_start.steps", "6", "--warm_start.examples", "96",
             "--warm_start.copy_steps", "3", "--run.progress", "false"]

    def logged(folder: Path, busy: int) -> list[dict]:
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
        try:
            done = subprocess.run([sys.executable, "-m", "agents.train", *flags, "--run.output_dir", str(folder)], cwd=ROOT,
                                  capture_output=True, text=True, timeout=900)
        finally:
            for hog in hogs:
                hog.kill()
                hog.wait()
        assert done.returncode == 0, done.stderr[-2000:]
        records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if not k.startswith(MACHINE_KEYS)} for r in records]

    quiet, busy = logged(tmp_path / "quiet", 0), logged(tmp_path / "busy", 2)
    assert [(r["step"], r.get("stage")) for r in quiet] == [(0, "start"), (0, "warm start"), (1, None), (2, None), (3, None), (3, "final")]
    assert any("eval/greedy/1-hop/em" in r for r in quiet) and any("warm_start/loss_last" in r for r in quiet)
    assert busy == quiet
