"""Checks of the vLLM rollout engine, run inside the vLLM virtualenv (``.ci/vllm_venv.sh``) by
``test_vllm_engine.py``, which reads the JSON line this script prints last.

    python tests/agents/rollout/vllm_checks.py CHECK [CHECK ...]

Checks: ``sync`` (tiny model: engine log-probs equal the trainer's, change after an optimiser step and
a sync whose weights vLLM reads as the backend produces them), ``lora`` (tiny model with LoRA adapters:
the engine serves them on the frozen base, its log-probs the trainer's adapted model's before and after
an optimiser step), ``protocols`` (SmolLM2: sampled episodes under every protocol; trajectory ids and producer
masks equal what the agent and the environment exchanged; greedy episodes of vLLM and the HF sampler
compared), ``multi_turn`` (a scripted model that searches, then answers, under every protocol, with
``rollout.engine: vllm``: episodes, masks and learner batches equal the environment's records and the HF
sampler's), ``prefill_budget`` (a seeded rollout whose prompts exceed one engine step's token budget),
``grpo`` (a few GRPO steps of SmolLM2 with ``rollout.engine: vllm``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from agents.rollout.collect import collect_rollouts  # noqa: E402
from agents.rollout.hf_sampler import HFSampler  # noqa: E402
from agents.rollout.engines import EngineSetup, lookup_engine  # noqa: E402
from agents.rollout.vllm_engine import VLLMEngine, VLLMEngineOptions  # noqa: E402
from search_env import SEED_PROTOCOLS, BatchSearchQAEnv  # noqa: E402
from search_env.tokenization import as_codec  # noqa: E402
from search_env.trajectory import AGENT, ENVIRONMENT  # noqa: E402

MEMORY = 0.05  # of the machine's memory for the KV cache (capped at 2 GiB)


def registered_engine(config, policy, backend):
    """The engine of ``config``'s ``rollout.engine`` over ``policy``, attached to ``backend``: what the
    trainer builds (``RolloutDriver._build_engine``)."""
    setup = EngineSetup(policy, temperature=config.rollout.temperature, top_p=config.rollout.top_p,
                        max_context=config.env.max_context, seed=config.run.seed, whole_weights=backend.generation)
    engine = lookup_engine(config.rollout.engine).build(config.engine, setup)
    engine.attach(backend)
    return engine


class Recorder:
    """Passes every call to ``agent`` and records what each row was given and gave back, to rebuild the
    producer mask the environment must have recorded."""

    def __init__(self, agent):
        self.agent, self.streams_chunks = agent, False

    def begin(self, prompt_ids, **kw):
        self.producers = [[ENVIRONMENT] * len(p) for p in prompt_ids]
        self.pending: dict[int, list[int]] = {}
        self.agent.begin(prompt_ids, **kw)

    def generate(self, rows, budgets):
        chunks = self.agent.generate(rows, budgets)
        for row, chunk in zip(rows, chunks):
            self.producers[row] += [AGENT] * len(chunk.ids)
        return chunks

    def feed(self, row, ids):
        self.producers[row] += [ENVIRONMENT] * len(ids)
        self.agent.feed(row, ids)

    def finish(self, row):
        self.agent.finish(row)


def multi_turn(traj) -> bool:
    seen_env = False
    for t in range(traj.prompt_length, len(traj.token_ids)):
        if traj.producers[t] != AGENT:
            seen_env = True
        elif seen_env:
            return True
    return False


SEQUENCE = "Who founded the Tallis Group? <search> Tallis Group founder </search>"


def trainer_logprobs(policy, sequence) -> torch.Tensor:
    with torch.no_grad():
        ids = torch.tensor([sequence])
        return policy(ids, torch.ones_like(ids)).logprobs[0, 1:]


def optimiser_step(policy, backend, sequence) -> None:
    """One step that raises ``sequence``'s log-likelihood (the post-step hook marks the engine's weights stale)."""
    policy.train()
    ids = torch.tensor([sequence])
    (-policy(ids, torch.ones_like(ids)).logprobs.sum()).backward()
    backend.step()


def within(function_name: str) -> bool:
    """Whether a function of that name is running further up the stack (a resumed generator's frame
    links back to whatever asked it for its next item)."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == function_name:
            return True
        frame = frame.f_back
    return False


FORGETFUL_PROCESS = f"""
from agents.policies.loading import load_policy
from agents.rollout.vllm_engine import VLLMEngine
engine = VLLMEngine(load_policy("tiny", seed=0), memory_fraction={MEMORY}, max_model_len=256)
print(engine._folder)
"""


def check_sync() -> dict:
    """The tiny model's engine before and after an optimiser step; every tensor the backend yields is asked
    for from within vLLM's ``reload_weights`` (a list of them all would be built before it is called)."""
    from agents.learners import GRPO, GRPOConfig
    from agents.policies.loading import load_policy
    from agents.training.backends import build_backend
    from agents.training.config import OptimConfig, TrainConfig

    policy = load_policy("tiny", seed=0)
    config = TrainConfig("grpo", algorithm=GRPOConfig(group_size=2, kl_coef=0.0), optim=OptimConfig(learning_rate=1e-2))
    backend = build_backend(config, policy, GRPO(config.algorithm))
    yielded = []  # per tensor the backend yields: was vLLM's reload running?
    read = backend.rollout_weights

    def watched(**options):
        for item in read(**options):
            yielded.append(within("reload_weights"))
            yield item

    backend.rollout_weights = watched
    engine = VLLMEngine(policy, memory_fraction=MEMORY, max_model_len=1024).attach(backend)
    sequence = policy.codec.encode(SEQUENCE)
    before_engine, before_trainer = torch.tensor(engine.logprobs([sequence])[0][1:]), trainer_logprobs(policy, sequence)
    optimiser_step(policy, backend, sequence)
    stale = engine.stale
    after_engine, after_trainer = torch.tensor(engine.logprobs([sequence])[0][1:]), trainer_logprobs(policy, sequence)
    engine.close()
    # A process that exits without closing its engine leaves no model folder behind either.
    child = subprocess.run([sys.executable, "-c", FORGETFUL_PROCESS], capture_output=True, text=True, timeout=600, check=True)
    forgotten_folder = child.stdout.strip().splitlines()[-1]
    return {
        "folder_removed_on_close": not os.path.exists(engine._folder),
        "folder_removed_at_exit": os.path.isabs(forgotten_folder) and not os.path.exists(forgotten_folder),
        "tokens": len(sequence) - 1,
        "stale_after_step": stale,
        "syncs": engine.syncs,
        "before_gap": float((before_engine - before_trainer).abs().max()),
        "after_gap": float((after_engine - after_trainer).abs().max()),
        "moved": float((after_engine - before_engine).abs().max()),
        "tensors_yielded": len(yielded),
        "state_dict_tensors": 2 * len(policy.model.state_dict()),  # two syncs
        "yielded_within_reload": sum(yielded),
    }


def check_demo_shape() -> dict:
    """The demo's tiny model (a Qwen2 96 wide with four heads of 32, which vLLM's Qwen2 would read as heads
    of 24) through the engine, before and after an optimiser step: the folder's config as vLLM reads it and
    the gaps to the trainer's log-probs."""
    from agents.learners import GRPO, GRPOConfig
    from agents.policies.config import ModelConfig
    from agents.policies.loading import load_policy
    from agents.training.backends import build_backend
    from agents.training.config import OptimConfig, TrainConfig

    policy = load_policy(ModelConfig(name="tiny", tiny_layers=2, tiny_hidden=96, tiny_heads=4, tiny_head_dim=32, tiny_arch="qwen2"), seed=0)
    config = TrainConfig("grpo", algorithm=GRPOConfig(group_size=2, kl_coef=0.0), optim=OptimConfig(learning_rate=1e-2))
    backend = build_backend(config, policy, GRPO(config.algorithm))
    engine = VLLMEngine(policy, memory_fraction=MEMORY, max_model_len=1024).attach(backend)
    with open(os.path.join(engine._folder, "config.json"), encoding="utf-8") as file:
        served = json.load(file)
    sequence = policy.codec.encode(SEQUENCE)
    before_engine, before_trainer = torch.tensor(engine.logprobs([sequence])[0][1:]), trainer_logprobs(policy, sequence)
    optimiser_step(policy, backend, sequence)
    after_engine, after_trainer = torch.tensor(engine.logprobs([sequence])[0][1:]), trainer_logprobs(policy, sequence)
    engine.close()
    return {
        "trainer_model_type": policy.lm.config.model_type, "served_model_type": served["model_type"],
        "served_head_dim": served["head_dim"], "qkv_bias": served.get("qkv_bias"), "syncs": engine.syncs,
        "before_gap": float((before_engine - before_trainer).abs().max()),
        "after_gap": float((after_engine - after_trainer).abs().max()),
        "moved": float((after_engine - before_engine).abs().max()),
    }


def check_lora() -> dict:
    """A tiny Llama with LoRA adapters whose ``B`` is non-zero, through ``rollout.engine: vllm``: the engine's
    log-probs are the trainer's adapted model's, not its base's, and follow the adapters after an
    optimiser step and a sync."""
    from agents.learners import GRPO, GRPOConfig
    from agents.policies.config import ModelConfig
    from agents.policies.loading import load_policy
    from agents.training.backends import build_backend
    from agents.training.config import EnvConfig, OptimConfig, RolloutConfig, TrainConfig

    config = TrainConfig("grpo", model=ModelConfig(lora_rank=4), algorithm=GRPOConfig(group_size=2, kl_coef=0.0),
                         optim=OptimConfig(learning_rate=1e-2), env=EnvConfig(max_context=1024),
                         rollout=RolloutConfig(engine="vllm"), engine=VLLMEngineOptions(memory_fraction=MEMORY))
    policy = load_policy(config.model, seed=0)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)
    backend = build_backend(config, policy, GRPO(config.algorithm))
    engine = registered_engine(config, policy, backend)
    sequence = policy.codec.encode(SEQUENCE)

    def base_logprobs() -> torch.Tensor:
        with policy.adapters_off():
            return trainer_logprobs(policy, sequence)

    before_engine, before_trainer = torch.tensor(engine.logprobs([sequence])[0][1:]), trainer_logprobs(policy, sequence)
    before_base = base_logprobs()
    optimiser_step(policy, backend, sequence)
    stale = engine.stale
    after_engine, after_trainer = torch.tensor(engine.logprobs([sequence])[0][1:]), trainer_logprobs(policy, sequence)
    lora_config = engine.llm.llm_engine.vllm_config.lora_config
    result = {
        "lora": engine.lora,
        "max_lora_rank": lora_config.max_lora_rank if lora_config is not None else None,
        "stale_after_step": stale,
        "syncs": engine.syncs,
        "before_gap": float((before_engine - before_trainer).abs().max()),
        "base_gap": float((before_engine - before_base).abs().max()),
        "after_gap": float((after_engine - after_trainer).abs().max()),
        "moved": float((after_engine - before_engine).abs().max()),
        "base_unchanged": float((base_logprobs() - before_base).abs().max()),
        "loaded_adapters": sorted(engine.llm.llm_engine.list_loras()),
        "current_adapter": engine.lora_request.lora_int_id,
        "adapter_folders": sorted(n for n in os.listdir(engine._folder) if n.startswith("adapter-")),
    }
    engine.close()
    return result


def check_protocols() -> dict:
    from agents.policies.loading import load_policy

    policy = load_policy("smollm2")
    engine = VLLMEngine(policy, memory_fraction=MEMORY, max_model_len=2048)
    result = {}
    for protocol in SEED_PROTOCOLS:
        env = BatchSearchQAEnv(4, protocol=protocol, tokenizer=policy.codec, max_new_tokens=96, max_context=2048)
        recorder = Recorder(engine.agent(temperature=1.0, seed=7))
        rollout = collect_rollouts(recorder, env, [0, 1], group_size=2)  # raises when ids disagree
        masks_equal = all(list(t.producers) == recorder.producers[r][: len(t.producers)]
                          and len(recorder.producers[r]) >= len(t.producers)
                          for r, t in enumerate(rollout.trajectories))
        logprobs_on_agent_only = all(
            all(lp == 0.0 for lp, p in zip(lps, t.producers) if p != AGENT)
            for lps, t in zip(rollout.sampled_logprobs, rollout.trajectories))
        started = time.perf_counter()
        greedy_vllm = collect_rollouts(engine.agent(greedy=True), env, [0, 1, 2, 3])
        vllm_s = time.perf_counter() - started
        greedy_hf = collect_rollouts(HFSampler(policy, greedy=True), env, [0, 1, 2, 3])
        same = [a.token_ids == b.token_ids for a, b in zip(greedy_vllm.trajectories, greedy_hf.trajectories)]
        first_diff = []
        for a, b in zip(greedy_vllm.trajectories, greedy_hf.trajectories):
            n = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), min(len(a.token_ids), len(b.token_ids)))
            first_diff.append(n - a.prompt_length)
        result[protocol] = {
            "masks_equal": masks_equal, "logprobs_on_agent_only": logprobs_on_agent_only,
            "multi_turn": sum(multi_turn(t) for t in rollout.trajectories),
            "searches": sum(len(t.tool_calls) for t in rollout.trajectories),
            "greedy_equal": sum(same), "greedy_episodes": len(same),
            "greedy_first_difference_after_prompt": first_diff,
            "greedy_multi_turn": sum(multi_turn(t) for t in greedy_hf.trajectories),
            "greedy_vllm_s": vllm_s,
        }
    engine.close()
    return result


def agent_ids(traj) -> list[int]:
    return [tid for tid, producer in zip(traj.token_ids, traj.producers) if producer == AGENT]


def same_record(a, b) -> bool:
    """Two episodes with the same ids, producers and trained mask."""
    return a.token_ids == b.token_ids and a.producers == b.producers and a.trained == b.trained


def batch_matches(batch, trajectories) -> bool:
    """The learner batch's rows are the trajectories' ids and trained masks, then padding."""
    for b, traj in enumerate(trajectories):
        n = len(traj.token_ids)
        if (batch.input_ids[b, :n].tolist() != traj.token_ids or batch.trained_mask[b, :n].tolist() != list(traj.trained)
                or int(batch.attention_mask[b].sum()) != n or float(batch.trained_mask[b, n:].sum()) != 0.0):
            return False
    return True


def check_multi_turn() -> dict:
    """Episodes of the scripted model (``scripted_lm.py``) under every protocol, one engine whose weights
    are replaced for each protocol's model (they share their shapes), built by the trainer's
    ``rollout.engine: vllm`` engine; greedy, like the HF sampler's episodes they are compared with."""
    from agents.learners import GRPO, GRPOConfig
    from agents.policies.policy import HFPolicy
    from agents.rollout.batch import build_batch
    from agents.training.backends import build_backend
    from agents.training.config import EnvConfig, RolloutConfig, TrainConfig
    from tests.agents.rollout.scripted_lm import script_episode, scriptable_protocols, scripted_lm

    codec = as_codec(None)
    config = TrainConfig("grpo", algorithm=GRPOConfig(group_size=2, kl_coef=0.0),
                         env=EnvConfig(max_new_tokens=64, max_context=1024),
                         rollout=RolloutConfig(engine="vllm"), engine=VLLMEngineOptions(memory_fraction=MEMORY))
    questions, group_size = [0, 1, 2], 2
    policy = engine = None
    result = {}
    for protocol in scriptable_protocols():
        env = BatchSearchQAEnv(len(questions) * group_size, protocol=protocol, tokenizer=codec,
                               max_new_tokens=config.env.max_new_tokens, max_context=config.env.max_context)
        prompts = [env.envs[0].first_observation(env.examples[q])[0]["token_ids"] for q in questions]
        episode = script_episode(env.protocol, codec, prompts)
        lm = scripted_lm(episode, codec)
        if policy is None:
            policy = HFPolicy(lm, codec)
            engine = registered_engine(config, policy, build_backend(config, policy, GRPO(config.algorithm)))
        else:
            policy.model.load_state_dict(lm.state_dict())
            engine.sync()
        recorder = Recorder(engine.agent(greedy=True, seed=0))
        vllm = collect_rollouts(recorder, env, questions, group_size=group_size)  # raises when ids disagree
        hf = collect_rollouts(HFSampler(policy, greedy=True), env, questions, group_size=group_size)
        pad = codec.pad_id
        vllm_batch = build_batch(vllm.trajectories, vllm.group_ids, pad, vllm.sampled_logprobs)
        hf_batch = build_batch(hf.trajectories, hf.group_ids, pad, hf.sampled_logprobs)
        agent_logprobs = [lp for lps, t in zip(vllm.sampled_logprobs, vllm.trajectories)
                          for lp, p in zip(lps, t.producers) if p == AGENT]
        result[protocol] = {
            "episodes": len(vllm.trajectories),
            "multi_turn": sum(multi_turn(t) for t in vllm.trajectories),
            "searches": [len(t.tool_calls) for t in vllm.trajectories],
            "search_errors": [c.error for t in vllm.trajectories for c in t.tool_calls if c.error],
            "end_reasons": sorted({t.end_reason for t in vllm.trajectories}),
            "wrote_the_script": sum(agent_ids(t) == episode.agent_ids for t in vllm.trajectories),
            "masks_equal": all(list(t.producers) == recorder.producers[r] for r, t in enumerate(vllm.trajectories)),
            "batch_equal": batch_matches(vllm_batch, vllm.trajectories),
            "hf_equal": sum(same_record(a, b) for a, b in zip(vllm.trajectories, hf.trajectories)),
            "hf_batch_equal": (vllm_batch.input_ids.shape == hf_batch.input_ids.shape
                               and bool((vllm_batch.input_ids == hf_batch.input_ids).all())
                               and bool((vllm_batch.trained_mask == hf_batch.trained_mask).all())),
            "min_agent_logprob": min(agent_logprobs),
            "logprobs_on_agent_only": all(lp == 0.0 for lps, t in zip(vllm.sampled_logprobs, vllm.trajectories)
                                          for lp, p in zip(lps, t.producers) if p != AGENT),
        }
        env.close()
    engine.close()
    return result


def check_prefill_budget() -> dict:
    """A sampled rollout whose first turn holds more prompt tokens than one engine step may take (a
    512-token step, 16 distinct prompts of about 280 tokens). Every request is seeded, and vLLM's CPU
    backend fails a seeded request whose prompt is prefilled over several steps (see ``VLLMEngine``)."""
    from agents.policies.policy import HFPolicy
    from tests.agents.rollout.scripted_lm import script_episode, scripted_lm

    codec = as_codec(None)
    questions = list(range(16))
    env = BatchSearchQAEnv(len(questions), protocol="search-r1", tokenizer=codec, max_new_tokens=32, max_context=512)
    prompts = [env.envs[0].first_observation(env.examples[q])[0]["token_ids"] for q in questions]
    episode = script_episode(env.protocol, codec, prompts)
    policy = HFPolicy(scripted_lm(episode, codec), codec)
    engine = VLLMEngine(policy, memory_fraction=MEMORY, max_model_len=512, max_num_batched_tokens=512)
    rollout = collect_rollouts(engine.agent(temperature=1.0, seed=5), env, questions)
    result = {
        "prompt_tokens": sum(map(len, prompts)),
        "step_budget": engine.llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens,
        "episodes": len(rollout.trajectories),
        "wrote_the_script": sum(agent_ids(t) == episode.agent_ids for t in rollout.trajectories),
        "multi_turn": sum(multi_turn(t) for t in rollout.trajectories),
    }
    engine.close()
    env.close()
    return result


def check_grpo() -> dict:
    from agents.training.build import build_trainer
    from agents.training.config import EnvConfig, EvalConfig, RolloutConfig, RunConfig, TrainConfig
    from agents.learners import GRPOConfig
    from agents.policies.config import ModelConfig

    out = tempfile.mkdtemp(prefix="vllm-grpo-")
    config = TrainConfig(
        "grpo", model=ModelConfig(name="smollm2"), algorithm=GRPOConfig(group_size=2),
        env=EnvConfig(max_new_tokens=48, max_context=1536),
        rollout=RolloutConfig(questions_per_step=2, engine="vllm"), engine=VLLMEngineOptions(memory_fraction=MEMORY),
        eval=EvalConfig(questions=0),
        run=RunConfig(steps=3, output_dir=out, report_to=[]),
    )
    trainer = build_trainer(config)
    engine = trainer.engine
    steps = [trainer.train_step() for _ in range(config.run.steps)]
    keys = ("rollout/logprob_gap_mean", "rollout/logprob_gap_max", "rollout_correction/weight", "loss/total", "reward_mean")
    return {"tis_cap": trainer.algorithm.config.tis_cap, "config_tis_cap": config.algorithm.tis_cap, "syncs": engine.syncs,
            "steps": [{k: s[k] for k in keys if k in s} for s in steps],
            "metric_keys": sorted(k for k in steps[0] if k.startswith(("rollout", "time/")))}


CHECKS = {"sync": check_sync, "demo_shape": check_demo_shape, "lora": check_lora, "protocols": check_protocols, "multi_turn": check_multi_turn,
          "prefill_budget": check_prefill_budget, "grpo": check_grpo}

if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("VLLM_CHECK_THREADS", "2")))
    results: dict = {"seconds": {}}
    for name in sys.argv[1:]:
        started = time.perf_counter()
        results[name] = CHECKS[name]()
        results["seconds"][name] = round(time.perf_counter() - started, 1)
        print(f"check {name} done in {results['seconds'][name]} s", file=sys.stderr, flush=True)
    print(json.dumps(results))
