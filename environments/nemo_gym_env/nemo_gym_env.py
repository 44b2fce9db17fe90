"""NeMo Gym environments as a Verifiers-style environment package.

from nemo_gym_env import load_environment
env = load_environment(nemo_env="example_multi_step")
results = env.run_sync(env.taskset, endpoint, concurrency=32)
"""

from verifiers_nemo import NeMoGymEnv, load_environment

__all__ = ["NeMoGymEnv", "load_environment"]
