"""Where the models and optimisers live: the trainer's one interface to a training engine
(:class:`~agents.training.backends.base.TrainingBackend`) and the engines that implement it, each picked
by ``run.backend`` and set by the run config's ``backend`` group:

* ``torch`` (:mod:`~agents.training.backends.torch`): plain PyTorch on one device;
* ``deepspeed`` (:mod:`~agents.training.backends.deepspeed`): DeepSpeed ZeRO-2/3, one process per device;
* ``fsdp`` (:mod:`~agents.training.backends.fsdp`): PyTorch's FSDP2 (``fully_shard``), one process per device.

What they share lives beside them: what they read of the run's config (:mod:`.settings`), the process group
and its collectives (:mod:`.distributed`), the critic and reference they build (:mod:`.models`) and the
learning-rate schedules (:mod:`.schedules`). Importing
this package registers no engine but ``torch``; the others load when their name is looked up.
"""
from __future__ import annotations

from agents.training.backends.base import (
    BACKENDS, TrainingBackend, backend_options_class, build_backend, lookup_backend, register_backend, training_dtype,
)
from agents.training.backends.settings import BackendSettings
from agents.training.backends.torch import BACKEND_FILE, TorchBackend, TorchOptions

__all__ = [
    "BACKENDS", "BACKEND_FILE", "BackendSettings", "TorchBackend", "TorchOptions", "TrainingBackend", "backend_options_class", "build_backend",
    "lookup_backend", "register_backend", "training_dtype",
]
