"""The copy warm-up: repeated random strings, loss on the repeats, and that it teaches copying."""
import math

import pytest

from tests.conftest import skip_without

skip_without("agents", "torch", "transformers")
import torch  # noqa: E402

from agents.training.backends import BackendSettings, TorchBackend  # noqa: E402
from agents.training.config import TrainConfig  # noqa: E402
from agents.training.copy_warmup import copy_batch, copy_warmup  # noqa: E402
from agents.policies.loading import tiny_causal_lm  # noqa: E402
from agents.policies.policy import HFPolicy  # noqa: E402
from agents.training.warm_start import warm_start  # noqa: E402
from search_env import SearchQAEnv  # noqa: E402


class BareLM(torch.nn.Module):
    """What the copy warm-up reads of a backend's policy: its causal LM (of any vocabulary: no tokenizer)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model


def backend_of(model) -> TorchBackend:
    """A torch backend training ``model``, without gradient clipping."""
    return TorchBackend(BareLM(model), BackendSettings.of(TrainConfig().updated({"optim.max_grad_norm": 0.0})))


def test_a_copy_batch_repeats_one_string_of_pool_ids_per_row():
    pool = torch.tensor([5, 9, 11, 40])
    batch = copy_batch(pool, 6, 7, 3, torch.Generator().manual_seed(0))
    assert batch.shape == (6, 21)
    for row in batch.tolist():
        assert row[:7] == row[7:14] == row[14:] and set(row) <= {5, 9, 11, 40}
    again = copy_batch(pool, 6, 7, 3, torch.Generator().manual_seed(0))
    assert torch.equal(batch, again)


def test_the_loss_is_the_cross_entropy_of_the_repeats_only():
    """At step 0 the loss equals the cross-entropy of the untouched model over the repeated part,
    worked out here from its logits, position by position."""
    torch.manual_seed(0)
    model = tiny_causal_lm(50, layers=1, hidden=16, heads=2, seed=0)
    pool = list(range(3, 50))
    ids = copy_batch(torch.tensor(pool), 4, 5, 2, torch.Generator().manual_seed(7))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    terms = [-torch.log_softmax(logits[b, t - 1], -1)[ids[b, t]].item() for b in range(4) for t in range(5, 10)]
    losses = copy_warmup(backend_of(model), pool, 1, lr=1e-3, seed=7, length=5, repeats=2, batch_size=4)
    assert losses[0] == pytest.approx(sum(terms) / len(terms), rel=1e-5)


def test_the_warm_up_teaches_a_small_model_to_copy_strings_it_never_saw():
    torch.manual_seed(0)
    model = tiny_causal_lm(200, layers=2, hidden=32, heads=2, seed=0)
    pool = list(range(10, 200))
    losses = copy_warmup(backend_of(model), pool, 250, lr=3e-3, seed=0, length=8, repeats=2, batch_size=32)
    assert losses[0] > math.log(len(pool)) - 1.0  # it starts by guessing
    probe = copy_batch(torch.tensor(pool), 64, 8, 2, torch.Generator().manual_seed(123))
    with torch.no_grad():
        predicted = model(input_ids=probe).logits[:, 7:-1].argmax(-1)
    assert (predicted == probe[:, 8:]).float().mean() > 0.9  # fresh strings are copied token for token


def test_the_warm_start_runs_it_first_on_the_demonstrations_ids():
    env = SearchQAEnv(protocol="search-r1", world_seed=4, world_size=60)
    policy = HFPolicy(tiny_causal_lm(env.codec.vocab_size, layers=1, hidden=32, heads=2, seed=0), env.codec)
    config = TrainConfig().updated({"warm_start.steps": 2, "warm_start.copy_steps": 3, "warm_start.examples": 8,
                                    "warm_start.learning_rate": 1e-3, "warm_start.batch_size": 4, "run.progress": False})
    result = warm_start(TorchBackend(policy, BackendSettings.of(config)), config, env)
    assert len(result.copy_losses) == 3 and len(result.losses) == 2
    assert result.as_dict()["warm_start/copy_loss_last"] == result.copy_losses[-1]
    config = config.updated({"warm_start.steps": 1, "warm_start.copy_steps": 0, "warm_start.examples": 4})
    assert warm_start(TorchBackend(policy, BackendSettings.of(config)), config, env).copy_losses == []


def test_bad_input():
    model = backend_of(tiny_causal_lm(50, layers=1, hidden=16, heads=2, seed=0))
    with pytest.raises(ValueError, match="steps"):
        copy_warmup(model, [1, 2], 0, lr=1e-3, seed=0)
    with pytest.raises(ValueError, match="repeats"):
        copy_warmup(model, [1, 2], 1, lr=1e-3, seed=0, repeats=1)
    with pytest.raises(ValueError, match="two distinct"):
        copy_warmup(model, [3, 3], 1, lr=1e-3, seed=0)
