"""A damaged checkpoint is refused in one line naming the file and what is wrong (a flipped byte in the
weights included, which torch alone loads silently), a checkpoint of another model says so, the command
line turns each into one ``error:`` line (exit status 2), and saving a step again never touches the
folder the checkpoint in place names."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers", "jsonargparse", "matplotlib")
import torch  # noqa: E402

from agents.policies.loading import tiny_causal_lm  # noqa: E402
from agents.policies.policy import HFPolicy  # noqa: E402
from agents.training.backends import BACKEND_FILE, BackendSettings, TorchBackend  # noqa: E402
from agents.training.checkpoint import load_checkpoint, load_run, save_checkpoint, save_run  # noqa: E402
from agents.training.config import TrainConfig  # noqa: E402

#: The command line of the tiny run the damaged copies are made from (one of two steps done).
FLAGS = ["--run.steps", "2", "--run.stop_after", "1", "--rollout.questions_per_step", "2", "--algorithm.group_size", "2",
         "--env.max_new_tokens", "16", "--data.world_size", "30", "--eval.questions", "0", "--run.report_to", "[]",
         "--run.progress", "false", "--model.tiny_layers", "1", "--model.tiny_hidden", "32", "--model.tiny_heads", "2"]


def backend(hidden: int = 32, seed: int = 0) -> TorchBackend:
    return TorchBackend(HFPolicy(tiny_causal_lm(4096, layers=1, hidden=hidden, heads=2, seed=seed), None), BackendSettings.of(TrainConfig()))


def flip_middle_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


DAMAGE = {
    "flipped byte": (flip_middle_byte, "is corrupt: its SHA-256 differs"),
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]), "is truncated"),
    "empty": (lambda p: p.write_bytes(b""), "is empty"),
    "random bytes": (lambda p: p.write_bytes(os.urandom(4096)), "is not a checkpoint"),
}


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory) -> Path:
    """A run checkpoint of a tiny backend, written by :func:`save_run`."""
    folder = tmp_path_factory.mktemp("saved")
    save_run(folder / "checkpoint.pt", 1, {"step": 1}, backend())
    return folder


@pytest.mark.parametrize("damage", DAMAGE)
@pytest.mark.parametrize("part", ["backend", "checkpoint"])
def test_a_damaged_checkpoint_is_one_line_naming_the_file(saved_run, tmp_path, part, damage):
    folder = tmp_path / "run"
    shutil.copytree(saved_run, folder)
    target = folder / "checkpoints" / "step-1" / BACKEND_FILE if part == "backend" else folder / "checkpoint.pt"
    harm, what = DAMAGE[damage]
    harm(target)
    fresh = backend(seed=1)
    before = {k: v.clone() for k, v in fresh.policy.state_dict().items()}
    with pytest.raises(ValueError) as error:
        load_run(folder / "checkpoint.pt", fresh)
    message = str(error.value)
    assert str(target) in message and what in message and "\n" not in message
    assert "weights_only" not in message
    if part == "checkpoint":  # nothing was loaded from a checkpoint that names a folder it cannot be trusted on
        assert all(torch.equal(v, before[k]) for k, v in fresh.policy.state_dict().items())


def test_a_flipped_byte_in_a_plain_checkpoint_file_is_found(tmp_path):
    path = save_checkpoint(tmp_path / "state.pt", {"w": torch.arange(10_000.0)})
    flip_middle_byte(path)
    with pytest.raises(ValueError, match="is corrupt"):
        load_checkpoint(path)


def test_a_checkpoint_holding_code_is_refused_without_torchs_advice(tmp_path):
    path = save_checkpoint(tmp_path / "checkpoint.pt", {"module": torch.nn.Linear(2, 2)})  # whole, but pickled code
    with pytest.raises(ValueError) as error:
        load_checkpoint(path)
    assert "holds objects other than tensors" in str(error.value) and "weights_only" not in str(error.value)


def test_a_checkpoint_of_another_model_says_what_does_not_fit(saved_run):
    with pytest.raises(ValueError) as error:
        load_run(saved_run / "checkpoint.pt", backend(hidden=64))
    message = str(error.value)
    assert message.startswith(f"checkpoint {saved_run / 'checkpoints' / 'step-1' / BACKEND_FILE} does not fit this model:")
    assert "size mismatch" in message and "\n" not in message


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory) -> Path:
    """A tiny run of the command line, stopped after its first step."""
    from agents.train import main

    folder = tmp_path_factory.mktemp("cli") / "run"
    assert main([*FLAGS, "--run.output_dir", str(folder)]) == 0
    return folder


@pytest.mark.parametrize("part, damage", [("backend", "flipped byte"), ("backend", "random bytes"),
                                          ("checkpoint", "truncated"), ("checkpoint", "empty")])
def test_the_command_refuses_to_resume_a_damaged_checkpoint_in_one_error_line(cli_run, tmp_path, capsys, part, damage):
    from agents.train import main

    folder = tmp_path / "run"
    shutil.copytree(cli_run, folder)
    target = folder / "checkpoints" / "step-1" / BACKEND_FILE if part == "backend" else folder / "checkpoint.pt"
    harm, what = DAMAGE[damage]
    harm(target)
    capsys.readouterr()
    status = main([*FLAGS, "--run.output_dir", str(folder), "--run.resume", "true", "--run.stop_after", "2"])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("error: ") and str(target) in err and what in err


# -- a crash mid-save ---------------------------------------------------------------------------
def test_saving_the_same_step_again_never_touches_the_folder_in_use(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    first = backend(seed=0)
    save_run(path, 1, {"step": 1}, first)
    expected = {k: v.clone() for k, v in first.policy.state_dict().items()}

    def dies_half_way(directory):
        (Path(directory) / BACKEND_FILE).write_bytes(b"half a file")
        raise KeyboardInterrupt("killed mid-save")

    other = backend(seed=3)
    monkeypatch.setattr(other, "save", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        save_run(path, 1, {"step": 1}, other)  # the same step again (e.g. the final save after a periodic one)
    monkeypatch.undo()
    loaded = backend(seed=5)
    assert load_run(path, loaded) == {"step": 1}
    assert all(torch.equal(v, expected[k]) for k, v in loaded.policy.state_dict().items())
    save_run(path, 1, {"step": 1}, other)  # a complete save of the same step replaces it, and cleans up
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == [load_checkpoint(path)["backend_dir"].split("/")[1]]
