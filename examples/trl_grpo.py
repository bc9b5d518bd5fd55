"""Train a tiny Llama on SearchQA-v0 with TRL's own GRPOTrainer, two steps on the CPU (pip install -e '.[trl]')."""
from datasets import Dataset
from transformers import LlamaConfig, LlamaForCausalLM
from trl import GRPOConfig, GRPOTrainer

from search_env.integrations.trl import SearchQARollout, environment_reward

rollout = SearchQARollout(protocol="search-r1-compact", max_new_tokens=32)  # multi-turn episodes, the env's reward
tokenizer = rollout.tokenizer  # the environment's tokenizer, as transformers wants it (pass yours with tokenizer=...)
model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=2, pad_token_id=tokenizer.pad_token_id,
                                     eos_token_id=tokenizer.eos_token_id))
args = GRPOConfig(output_dir="runs/trl-searchqa", use_cpu=True, bf16=False, max_steps=2, per_device_train_batch_size=4,
                  num_generations=4, max_completion_length=32, logging_steps=1, report_to="none", save_strategy="no")
trainer = GRPOTrainer(model=model, args=args, reward_funcs=environment_reward, processing_class=tokenizer,
                      train_dataset=Dataset.from_dict({"prompt": rollout.questions[:8]}), rollout_func=rollout)
trainer.train()
print("steps:", trainer.state.global_step, "rewards:", [log["reward"] for log in trainer.state.log_history if "reward" in log])
