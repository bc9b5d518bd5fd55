"""Run by GEM's virtualenv's Python (``.ci/gem_venv.sh``; it has no pytest): the scripted episodes of
every protocol through :class:`search_env.integrations.gem.SearchQAGemEnv` against ``gym.make``.

Prints one JSON line per check, ``{"check": ..., "ok": bool, "detail": ...}``; test_gem.py asserts on them.
"""
from __future__ import annotations

import json
import sys

import gem

from search_env.integrations.gem import ENV_ID, SearchQAGemEnv, register
from tests.search_env.integrations.scripted import PROTOCOLS, base_env, plan_tool, reference, script, shared_settings


def report(check: str, ok: bool, detail: object = None) -> None:
    print(json.dumps({"check": check, "ok": bool(ok), "detail": detail}), flush=True)


def episode(protocol: str, base) -> None:
    example = base.examples[3]
    settings = shared_settings(base, protocol)
    turns = script(protocol, example, plan_tool(base, protocol))
    ref = reference(settings, example, turns)
    env = SearchQAGemEnv(example.question, example.golden_answers, **settings)
    text, info = env.reset()
    codec = env.episode.codec
    env_ids, texts, rewards, ends = [], [], [], []
    for turn in turns:
        observation, reward, terminated, truncated, step_info = env.step(turn.text(protocol))
        env_ids.append(step_info["observation_ids"])
        texts.append(observation)
        rewards.append(reward)
        if terminated or truncated:
            ends.append((terminated, truncated, step_info.get("end_reason")))
            break
    trajectory = env.episode.trajectory
    checks = {
        "prompt": info["prompt_ids"] == ref.prompt_ids and text == codec.decode(ref.prompt_ids),
        "environment tokens": env_ids == ref.env_ids,
        "observation text": texts == [codec.decode(ids) for ids in ref.env_ids],
        "reward": rewards[-1] == ref.reward and sum(rewards[:-1]) == 0 and ref.reward > 0,
        "episode": list(trajectory.token_ids) == ref.token_ids and list(trajectory.trained) == ref.trained,
        "end": ends == [(True, False, ref.end_reason)],
    }
    for name, ok in checks.items():
        report(f"{protocol}: {name}", ok, {"reward": rewards, "reference": ref.reward} if name == "reward" else None)


def registry(base) -> None:
    register(**shared_settings(base, "search-r1"))
    register()  # a second registration is a no-op
    env = gem.make(ENV_ID)
    first, _ = env.reset(seed=7)
    again, _ = env.reset(seed=7)
    question = env.episode.env.example
    _, reward, terminated, _, _ = env.step(f"<answer> {question.golden_answers[0]} </answer>")
    report("gem.make builds it; reset(seed) draws the same question", first == again and terminated and reward == 1.0)
    spawned = env.spawn()
    report("spawn keeps the settings", spawned.settings == env.settings and spawned.reset(seed=7)[0] == first)


def main() -> None:
    base = base_env()
    for protocol in sys.argv[1:] or PROTOCOLS:
        episode(protocol, base)
    registry(base)


if __name__ == "__main__":
    main()
