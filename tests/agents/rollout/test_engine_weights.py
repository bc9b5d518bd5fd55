"""What an engine with its own copy of the weights declares (:mod:`agents.rollout.engine_weights`): both vLLM
engines claim it, an engine that claims it and lacks a member fails in one line, and one that counts syncs
without claiming it is refused rather than left unchecked. The trainer's side (a sync check built for such an
engine alone) is in ``test_sync_check.py`` and ``tests/agents/training/test_async_rollout.py``."""
from __future__ import annotations

import pytest

from agents.rollout.engine_weights import EngineWithWeights, check_engine_with_weights, holds_own_weights


class Complete(EngineWithWeights):
    decodes_trained_policy = False

    def __init__(self) -> None:
        self.syncs, self.dtype, self.lora = 0, "float32", False

    def sync(self, weights=None) -> None:
        self.syncs += 1

    def logprobs(self, sequences):
        return [[0.0] * len(s) for s in sequences]


def test_a_complete_engine_passes_and_an_engine_without_weights_is_left_alone():
    check_engine_with_weights(Complete())
    check_engine_with_weights(object())  # no copy of the weights: nothing to check
    assert holds_own_weights(Complete) and holds_own_weights(Complete()) and not holds_own_weights(object)


def test_both_vllm_engines_claim_their_own_weights_and_the_package_exports_the_claim():
    pytest.importorskip("torch")
    import agents
    from agents.rollout.vllm_engine import VLLMEngine
    from agents.rollout.vllm_server_engine import VLLMServerEngine

    assert issubclass(VLLMEngine, EngineWithWeights) and issubclass(VLLMServerEngine, EngineWithWeights)
    assert agents.EngineWithWeights is EngineWithWeights and "EngineWithWeights" in agents.__all__


def test_a_claim_without_an_attribute_or_a_snapshot_sync_fails_in_one_line():
    class NoLora(Complete):
        def __init__(self) -> None:
            self.syncs, self.dtype = 0, "float32"

    with pytest.raises(ValueError, match=r"^engine NoLora is an EngineWithWeights but lacks lora \(see .*\)$"):
        check_engine_with_weights(NoLora())

    class LiveOnly(Complete):
        def __init__(self) -> None:
            pass

        def sync(self) -> None:
            pass

    with pytest.raises(ValueError, match=r"^engine LiveOnly is an EngineWithWeights but lacks syncs, dtype, lora, sync\(weights=...\) "):
        check_engine_with_weights(LiveOnly())


def test_a_claim_without_its_methods_cannot_be_built():
    class NoLogprobs(EngineWithWeights):
        def sync(self, weights=None) -> None:
            pass

    with pytest.raises(TypeError, match=r"abstract .*logprobs"):
        NoLogprobs()


def test_an_engine_that_both_decodes_the_policy_and_claims_a_copy_is_refused():
    class Both(Complete):
        decodes_trained_policy = True

    with pytest.raises(ValueError, match=r"^engine Both is an EngineWithWeights but decodes_trained_policy"):
        check_engine_with_weights(Both())


def test_an_engine_counting_syncs_without_the_claim_is_refused_not_left_unchecked():
    class DuckTyped:
        syncs, dtype, lora = 0, "float32", False

        def sync(self, weights=None) -> None:
            pass

        def logprobs(self, sequences):
            return []

    with pytest.raises(ValueError, match=r"^engine DuckTyped counts weight syncs but is no EngineWithWeights, so they "
                                         r"would go unchecked: subclass .*EngineWithWeights$"):
        check_engine_with_weights(DuckTyped())
