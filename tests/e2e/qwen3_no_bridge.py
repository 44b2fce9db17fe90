"""Qwen3's typed renderer (renderers 0.1.12) with its bridge turned off: every turn after the first is rendered
again from messages, as a renderer without a bridge does. Test-only: the fork count it gives is the comparison the
training guide quotes (docs/guides/train.md). Loaded by verifiers' training client as a custom renderer
(``name = "custom"``, ``import_path = "<this file>:Qwen3RendererWithoutBridge"``)."""

from __future__ import annotations

from typing import Any

from renderers.configs import Qwen3RendererConfig
from renderers.qwen3 import Qwen3Renderer


class Qwen3RendererWithoutBridge(Qwen3Renderer):
    config_class = Qwen3RendererConfig

    def bridge_to_next_turn(self, *args: Any, **kwargs: Any) -> None:
        return None
