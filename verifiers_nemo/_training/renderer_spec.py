"""What ``--renderer``, ``--renderer-model`` and ``--renderer-config`` name, as verifiers' ``[client.renderer]`` and
``renderer_model_name`` (the same keys prime-rl's ``[orchestrator.renderer]`` takes), and the one renderer built from
them for the replay engine and the fork report. Only the building imports ``renderers`` (the verifiers extra)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._exceptions import ConfigurationError


@dataclass(frozen=True)
class RendererSpec:
    """A renderer as a user names it: a typed renderer (``qwen3``, ``auto``, ...) or a custom one (``FILE.py:Class``,
    ``module.Class``), the model whose tokenizer it renders with, and extra config keys."""

    name: str = "auto"
    model: str | None = None
    """A Hugging Face model name or a local folder with its tokenizer (``renderer_model_name``)."""
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def custom(self) -> bool:
        """``FILE.py:Class``, ``module:Class`` or ``module.Class`` (a class name is capitalised); typed renderer
        names may hold dots too (``qwen3.5``, ``glm-4.5``)."""
        return ":" in self.name or self.name.endswith(".py") or self.name.rpartition(".")[2][:1].isupper()

    def as_config(self) -> dict[str, Any]:
        """The ``[client.renderer]`` table (``renderers.RendererConfig``)."""
        if self.custom:
            path = self.name
            file, sep, cls = path.rpartition(":")
            if sep and file.endswith(".py"):
                path = f"{Path(file).expanduser().resolve()}:{cls}"  # env servers run from folders of their own
            return {"name": "custom", "import_path": path, **self.config}
        return {"name": self.name, **self.config}

    def client_fields(self) -> dict[str, Any]:
        """The training client's renderer keys: ``renderer`` and ``renderer_model_name``."""
        fields: dict[str, Any] = {"renderer": self.as_config()}
        if self.model is not None:
            fields["renderer_model_name"] = self.model
        return fields


def build_renderer(spec: RendererSpec, model: str) -> tuple[Any, Any]:
    """The renderer ``spec`` names and its tokenizer (``spec.model``'s, else ``model``'s). Raises
    ``ConfigurationError`` naming what is missing."""
    try:
        from pydantic import TypeAdapter, ValidationError
        from renderers import RendererConfig, create_renderer
        from renderers.base import load_tokenizer
    except ImportError as exc:
        raise ConfigurationError(
            f"the training client needs verifiers and its renderers ({exc.name} is not installed): install "
            "'verifiers-nemo[verifiers]' in a venv without nemo-gym (the Gym runtime lives apart)."
        ) from None
    try:
        config = TypeAdapter(RendererConfig).validate_python(spec.as_config())
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise ConfigurationError(
            f"--renderer {spec.name}: {first['msg']}{f' ({where})' if where else ''}; a custom renderer is "
            "FILE.py:Class"
        ) from None
    source = spec.model or model
    try:
        tokenizer = load_tokenizer(source)
    except Exception as exc:  # a hub name offline, a folder without tokenizer files
        raise ConfigurationError(
            f"--renderer-model {source}: its tokenizer does not load ({type(exc).__name__}: {exc}); give a local "
            "folder with the model's tokenizer files (tokenizer.json, tokenizer_config.json) or a model name the "
            "Hugging Face cache holds."
        ) from None
    try:
        return create_renderer(tokenizer, config), tokenizer
    except Exception as exc:
        raise ConfigurationError(f"--renderer {spec.name}: {type(exc).__name__}: {exc}") from None
