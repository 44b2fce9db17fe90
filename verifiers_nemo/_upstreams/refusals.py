"""Refusals no retry can change, recognised by what the answering server says, each with its cause and fix.

A policy call made through verifiers' training client (``client.type = "train"``, prime-rl's) is answered by
verifiers' interception server, which turns any exception of its client into an HTTP 502, the status an HTTP client
retries. Some of those exceptions are refusals that fail the same way every time: the engine answers in a shape the
client cannot read, the client is asked to speak a dialect it does not, or its renderer cannot parse tool calls.
Retrying them only delays the one line that says what to change, so they are recognised here and not retried.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass

from .._protocol.codec import loads


@dataclass(frozen=True, slots=True)
class KnownRefusal:
    """A refusal recognised by a phrase of its error message.

    ``installed``: distributions whose versions here the description names (the ones the fix is about);
    ``ends_run``: the refusal says the set-up cannot work at all (every call of every rollout fails the same way),
    so a run that meets it stops at once (``run_ending``) rather than failing each rollout."""

    phrase: str
    cause: str
    fix: str
    installed: tuple[str, ...] = ()
    ends_run: bool = False

    def describe(self) -> str:
        versions = ", ".join(f"{name} {_version(name)}" for name in self.installed)
        return f"{self.cause}{f' (installed here: {versions})' if versions else ''}. Fix: {self.fix}."


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


KNOWN_REFUSALS: tuple[KnownRefusal, ...] = (
    GENERATE_SHAPE_REFUSAL := KnownRefusal(
        ".token must be 'token_id:",
        "verifiers' training client (renderers) cannot read the engine's /inference/v1/generate logprobs: it needs "
        'each as {"token": "token_id:N"}, as vLLM 0.26 to 0.31 and prime-rl\'s inference server answer; vLLM 0.32 '
        'and newer answer {"token_id": N}',
        "serve the policy with prime-rl's inference server (`uv run inference`), or a vLLM from 0.26 to 0.31 started "
        "with --enable-scale-out; or read vLLM 0.32 and newer with renderers >= 0.1.13.dev17 (it reads both shapes "
        "and vLLM 0.33's weight versions; the pre-release verifiers 0.4.1.dev86 requires it: "
        "pip install --pre 'verifiers>=0.4.1.dev86')",
        installed=("renderers", "verifiers"),
        ends_run=True,
    ),
    KnownRefusal(
        "only supports the chat-completions dialect",
        "verifiers' training client speaks Chat Completions only, and this harness was set to the Responses API",
        'leave the harness\'s api at "auto" (Chat Completions under a training client) or set it to "chat" '
        "(--env.agent.harness.api chat)",
    ),
    KnownRefusal(
        "does not support tools. Choose a model-specific renderer",
        "the renderer verifiers' training client uses for this model cannot parse tool calls (DefaultRenderer has "
        "no tool-call parser), and this environment offers tools",
        "set the client's renderer to the model's typed renderer (renderers' `name`, e.g. qwen3), or to a custom "
        'renderer that parses its tool calls (`name = "custom"`, `import_path`; docs/guides/train.md)',
    ),
    IMAGES_REFUSAL := KnownRefusal(
        "does not support process_multimodal=False",
        "this rollout's messages hold images, and the training client's renderer is a text renderer: it cannot "
        "carry them (renderers renders image parts only with a vision renderer)",
        "train a vision model with its vision renderer (e.g. qwen3-vl), or leave this environment out of a text "
        "model's mix",
    ),
)


NOT_CARRIED = {"images": IMAGES_REFUSAL.cause}
"""Refusals that say what a rollout holds that a training client cannot carry (not a failure of the setup), by name:
their cause is in the error message of the rollouts they end."""


def run_ending(message: str) -> KnownRefusal | None:
    """The refusal that ends a run, when ``message`` (a rollout's error) carries one's cause; else None."""
    return next((r for r in KNOWN_REFUSALS if r.ends_run and r.cause in message), None)


def known_refusal(status: int, body: bytes) -> KnownRefusal | None:
    """The refusal an error answer is, when it is one of ``KNOWN_REFUSALS``; else None."""
    if status < 400:
        return None
    try:
        data = loads(body)
    except ValueError:
        return None
    error = data.get("error") if isinstance(data, dict) else None
    message = error.get("message") if isinstance(error, dict) else error
    if not isinstance(message, str):
        return None
    return next((refusal for refusal in KNOWN_REFUSALS if refusal.phrase in message), None)
