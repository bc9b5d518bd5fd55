"""SkyRL's training entry point with SearchQA-v0 registered in SkyRL-gym (GPU; not run by this project's CI).

    python -m search_env.integrations.verl_data --protocol search-r1 --output-dir $HOME/data/searchqa
    python examples/skyrl_searchqa.py data.train_data="['$HOME/data/searchqa/train.parquet']" \
        data.val_data="['$HOME/data/searchqa/test.parquet']" environment.env_class=searchqa \
        generator.use_conversation_multi_turn=false generator.sampling_params.stop="['</search>','</answer>']" \
        trainer.policy.model.path=Qwen/Qwen2.5-3B-Instruct trainer.algorithm.advantage_estimator=grpo

The environment's settings (SearchQAEnv's keyword arguments) come from SkyRL's per-environment config
(``environment.skyrl_gym.searchqa``); give it the trained model's tokenizer for token-exact episodes.
"""
import sys

import ray
from skyrl.train.config import SkyRLTrainConfig
from skyrl.train.entrypoints.main_base import BasePPOExp, validate_cfg
from skyrl.train.utils import initialize_ray

from search_env.integrations.skyrl import register


@ray.remote(num_cpus=1)
def run(cfg: SkyRLTrainConfig) -> None:
    register()  # in the Ray task that builds the environments
    BasePPOExp(cfg).run()


if __name__ == "__main__":
    config = SkyRLTrainConfig.from_cli_overrides(sys.argv[1:])
    validate_cfg(config)
    initialize_ray(config)
    ray.get(run.remote(config))
