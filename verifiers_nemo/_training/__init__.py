"""An eval the way prime-rl trains: verifiers' environment under its training client, a replay engine that plays
recorded rollouts as tokens, and what each rollout trains on (samples, forks). Importing this package imports
neither verifiers nor renderers; running it does."""

from .env_config import verifiers_env_config
from .renderer_spec import RendererSpec
from .runner import TrainingClientRunner, TrainingSetup

__all__ = ["RendererSpec", "TrainingClientRunner", "TrainingSetup", "verifiers_env_config"]
