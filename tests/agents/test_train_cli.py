"""The command line: recipes and flags become the algorithm's config, bad input is one ``error:`` line
(exit status 2, no traceback), and a short run prints the before/after table and where its files are."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, skip_without

skip_without("agents", "torch", "transformers", "yaml", "jsonargparse", "matplotlib")
from agents.learners import GRPOConfig, PPOConfig  # noqa: E402
from agents.policies.loading import tiny_causal_lm  # noqa: E402
from agents.train import main, parse_config  # noqa: E402

ROOT = REPO_ROOT
RECIPE = ROOT / "agents" / "configs" / "search-r1-grpo.yaml"


def test_recipe_then_flags_make_the_algorithms_config(tmp_path):
    config = parse_config(["--config", str(RECIPE), "--model", "tiny", "--steps", "3", "--adam_betas", "[0.8, 0.9]"])
    assert isinstance(config, GRPOConfig)
    assert (config.model, config.steps, config.adam_betas) == ("tiny", 3, (0.8, 0.9))
    assert (config.questions_per_step, config.top_p, config.kl_estimator) == (512, 0.95, "k3")  # from the recipe
    recipe = tmp_path / "ppo.yaml"
    recipe.write_text("algo: ppo\ncritic: head\nreward_stages: [[0, search-r1], [5, search-r1-format]]\n")
    config = parse_config(["--config", str(recipe)])
    assert isinstance(config, PPOConfig) and config.critic == "head"
    assert config.reward_stages == [[0, "search-r1"], [5, "search-r1-format"]]
    assert parse_config(["--algo", "grpo", "--dual_clip", "3", "--progress", "false"]).dual_clip == 3.0


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
    "no algorithm": ([], "choose an algorithm"),
    "missing model path": (["--algo", "grpo", "--model", "/no/such/model"], "'/no/such/model' is not"),
    "missing dataset": (["--algo", "grpo", "--dataset", "/no/such/hotpotqa.jsonl", "--corpus", "{corpus}"], "no file '/no/such/hotpotqa.jsonl'"),
    "missing corpus": (["--algo", "grpo", "--dataset", "{dataset}", "--corpus", "/no/such/corpus.jsonl"], "corpus file not found"),
    "real data without corpus": (["--algo", "grpo", "--dataset", "{dataset}"], "needs --corpus"),
    "mismatched tokenizer": (["--algo", "grpo", "--model", "{model}", "--tokenizer", "{tokenizer}"], "belong to different models"),
    "unknown field": (["--algo", "grpo", "--learning_rat", "0.1"], "unrecognized arguments: --learning_rat"),
    "bad value": (["--algo", "grpo", "--steps", "many"], "steps"),
    "invalid setting": (["--algo", "grpo", "--group_size", "1"], "group_size must be >= 2"),
    "model left to the user": (["--config", str(RECIPE)], "the recipe leaves model to you"),
    "missing recipe": (["--config", "/no/such/recipe.yaml"], "recipe file not found"),
    "unknown protocol": (["--algo", "grpo", "--protocol", "search-r2"], "unknown protocol 'search-r2'; available:"),
    "resume without a checkpoint": (["--algo", "grpo", "--resume", "true"], "no checkpoint at"),
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
    assert main(argv + ["--output_dir", str(tmp_path / "run")]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert expected in err


def test_the_module_entry_point_reports_one_line():
    done = subprocess.run([sys.executable, "-m", "agents.train", "--algo", "dqn"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["error: unknown algorithm 'dqn'; known: ppo, grpo, reinforce++, reinforce++-baseline"]


def test_a_short_run_prints_the_table_and_its_files(tmp_path, capsys):
    argv = ["--algo", "reinforce++-baseline", "--steps", "1", "--questions_per_step", "2", "--group_size", "2",
            "--max_new_tokens", "12", "--world_size", "20", "--eval_questions", "2", "--tensorboard", "false",
            "--output_dir", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "reinforce++-baseline: 1 of 1 steps"
    rows = [line.split()[:2] for line in lines if line.startswith(("start", "final"))]
    assert rows == [["start", "greedy"], ["start", "sampled"], ["final", "greedy"], ["final", "sampled"]]
    paths = {line.split(":", 1)[0]: Path(line.split(":", 1)[1].strip()) for line in lines if line.startswith(("curve", "metrics", "checkpoint"))}
    assert set(paths) == {"curve", "metrics", "checkpoint"} and all(p.is_file() for p in paths.values())
    assert "tensorboard" not in out


def test_a_warm_start_on_real_format_data_without_decompositions(tmp_path, capsys):
    """A FlashRAG jsonl has no gold decompositions: the warm start demonstrates "search the question,
    answer the gold answer" instead of failing."""
    dataset = tmp_path / "qa.jsonl"
    dataset.write_text("".join(f'{{"id": "{i}", "question": "Where was {name} born?", "golden_answers": ["{city}"]}}\n'
                               for i, (name, city) in enumerate([("Ann", "Oslo"), ("Bo", "Lima"), ("Cy", "Rome")])))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(f'{{"id": "p{i}", "title": "{name}", "text": "{name} was born in {city}."}}\n'
                              for i, (name, city) in enumerate([("Ann", "Oslo"), ("Bo", "Lima"), ("Cy", "Rome")])))
    argv = ["--algo", "grpo", "--dataset", str(dataset), "--corpus", str(corpus), "--steps", "1", "--questions_per_step", "2",
            "--group_size", "2", "--max_new_tokens", "40", "--eval_questions", "0", "--sft_steps", "2", "--sft_examples", "4",
            "--tensorboard", "false", "--output_dir", str(tmp_path / "run")]
    assert main(argv) == 0
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    warm = [r for r in metrics if "sft/steps" in r]
    assert warm and warm[0]["sft/steps"] == 2 and warm[0]["sft/demo_reward"] == 1.0
