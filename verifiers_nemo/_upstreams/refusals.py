"""Refusals no retry can change, recognised by what the answering server says, each with its cause and fix.

A policy call made through verifiers' training client (``client.type = "train"``, prime-rl's) is answered by
verifiers' interception server, which turns any exception of its client into an HTTP 502, the status an HTTP client
retries. Some of those exceptions are refusals that fail the same way every time: the engine answers in a shape the
client cannot read, the client is asked to speak a dialect it does not, or its renderer cannot parse tool calls.
Retrying them only delays the one line that says what to change, so they are recognised here and not retried.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._protocol.codec import loads


@dataclass(frozen=True, slots=True)
class KnownRefusal:
    """A refusal recognised by a phrase of its error message."""

    phrase: str
    cause: str
    fix: str

    def describe(self) -> str:
        return f"{self.cause}. Fix: {self.fix}."


KNOWN_REFUSALS: tuple[KnownRefusal, ...] = (
    KnownRefusal(
        ".token must be 'token_id:",
        "verifiers' training client (renderers) cannot read the engine's /inference/v1/generate logprobs: it needs "
        'each as {"token": "token_id:N"}, as vLLM 0.26 to 0.31 and prime-rl\'s inference server answer; vLLM 0.32 '
        'and newer answer {"token_id": N}',
        "serve the policy with prime-rl's inference server (`uv run inference`), or a vLLM from 0.26 to 0.31 started "
        "with --enable-scale-out",
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
