"""A `renderers` custom renderer for a ChatML model that calls tools in Hermes text: the example to follow for a
fine-tune that no typed renderer knows.

verifiers' training client (`client.type = "train"`, what prime-rl's orchestrator uses) renders every prompt to
token IDs itself and parses what the model samples. For a model the `renderers` package does not know, it falls
back to `DefaultRenderer`: the tokenizer's own chat template, no tool-call parser, and no *bridge*. Without a
bridge, every turn after the first is rendered again from messages, the re-rendered tokens differ from the ones the
model sampled (whitespace, JSON spacing, a dropped `<think>`), and verifiers forks the rollout into a new training
sample at the first differing token. This renderer adds the two missing parts:

* `parse_response`: the sampled text's `<think>…</think>` becomes `reasoning_content` and each
  `<tool_call>{"name": …, "arguments": {…}}</tool_call>` block a tool call (an unclosed or malformed block is kept
  as a failed attempt, never as a call);
* `bridge_to_next_turn`: the next prompt is the previous prompt and the sampled completion *as sampled* (closed
  with `<|im_end|>` when the turn was cut at `max_tokens`), then the new tool results and user turns the way the
  chat template renders them, then the assistant header. Every multi-turn rollout stays one training sample.

Use it from a verifiers or prime-rl config (relative paths resolve against the working directory):

    [client.renderer]                         # prime-rl: [orchestrator.renderer]
    name = "custom"
    import_path = "docs/examples/hermes_chatml_renderer.py:HermesChatMLRenderer"
    chat_template = "path/to/template.jinja"  # optional: one that renders tools; default: the tokenizer's own
    bridge = true                             # false: re-render every turn, as DefaultRenderer does

For your own model, change what its format differs in: the turn tokens (`TURN_START`, `TURN_END`), how a tool
result is wrapped (`_tool_turn`), and the tool-call and reasoning markers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, ClassVar, Literal

from renderers import DefaultRenderer, DefaultRendererConfig
from renderers.base import (
    ParsedResponse,
    ParsedToolCall,
    RenderedTokens,
    ToolCallParseStatus,
    extract_message_tool_names,
    reject_assistant_in_extension,
    trim_to_turn_close,
)
from renderers.configs import BaseRendererConfig

TURN_START = "<|im_start|>"
TURN_END = "<|im_end|>"
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


class HermesChatMLRendererConfig(BaseRendererConfig):
    """The fields a `[renderer]` table may set next to `name = "custom"` and `import_path`."""

    name: Literal["hermes-chatml"] = "hermes-chatml"
    chat_template: str | None = None
    """A Jinja chat template file that renders `tools` and tool calls (default: the tokenizer's own)."""
    bridge: bool = True
    """Extend the sampled tokens from turn to turn; false re-renders every turn (`DefaultRenderer`'s way)."""

    _internal_fields: ClassVar[frozenset[str]] = frozenset({"chat_template", "bridge"})


class HermesChatMLRenderer(DefaultRenderer):
    """ChatML turns, Hermes tool calls: renders with the chat template, parses the sampled text, bridges turns."""

    config_class = HermesChatMLRendererConfig

    def __init__(self, tokenizer: Any, config: HermesChatMLRendererConfig | None = None) -> None:
        self.hermes = config or HermesChatMLRendererConfig()
        template = {"chat_template": Path(self.hermes.chat_template).read_text()} if self.hermes.chat_template else {}
        super().__init__(tokenizer, DefaultRendererConfig(**template))  # extra fields go to apply_chat_template
        self.tokenizer = tokenizer
        self.turn_end_id: int = tokenizer.convert_tokens_to_ids(TURN_END)

    @property
    def supports_tools(self) -> bool:
        return True

    def get_stop_token_ids(self) -> list[int]:
        return [self.turn_end_id]

    def parse_response(
        self, token_ids: list[int], *, tools: list[Any] | None = None, prompt_ids: list[int] | None = None
    ) -> ParsedResponse:
        """The sampled tokens as a message: reasoning, text content and tool calls, each exactly as sampled."""
        if token_ids and token_ids[-1] == self.turn_end_id:
            token_ids = token_ids[:-1]
        text = self.tokenizer.decode(token_ids, skip_special_tokens=False)
        reasoning: str | None = None
        if text.lstrip().startswith(_THINK_OPEN):
            thought, closed, rest = text.lstrip()[len(_THINK_OPEN) :].partition(_THINK_CLOSE)
            if not closed:  # cut inside its reasoning: all of it is reasoning, still open
                return ParsedResponse(content="", reasoning_content=thought.strip(), reasoning_complete=False)
            reasoning, text = thought.strip(), rest
        calls = [_tool_call(match) for match in _TOOL_CALL.finditer(text)]
        content = _TOOL_CALL.sub("", text)
        if "<tool_call>" in content:  # cut inside a call (max_tokens): a failed attempt, its text kept as content
            unclosed = content[content.index("<tool_call>") :]
            calls.append(ParsedToolCall(raw=unclosed, status=ToolCallParseStatus.UNCLOSED_BLOCK))
        return ParsedResponse(content=content.strip(), reasoning_content=reasoning, tool_calls=calls)

    def bridge_to_next_turn(
        self,
        previous_prompt_ids: list[int],
        previous_completion_ids: list[int],
        new_messages: list[dict[str, Any]],
        *,
        tools: list[Any] | None = None,
    ) -> RenderedTokens | None:
        """The previous prompt and completion as sampled, then the new turns and the assistant header.

        Returns None (the caller re-renders) when bridging is off, when the new messages hold an assistant turn
        (those would be re-tokenized), or when there is nothing to extend."""
        if not self.hermes.bridge or not previous_prompt_ids or not new_messages:
            return None
        if reject_assistant_in_extension(new_messages):
            return None
        previous = trim_to_turn_close(
            previous_prompt_ids, previous_completion_ids, {self.turn_end_id}, synthesize_close=self.turn_end_id
        )
        if previous is None:
            return None
        added: list[int] = []
        owners: list[int] = []

        def emit(text: str, owner: int) -> None:
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            added.extend(ids)
            owners.extend([owner] * len(ids))

        emit("\n", -1)  # the template's newline after a turn's end, which generation stops before
        for index, message in enumerate(new_messages):
            turn = _tool_turn(message) if message.get("role") == "tool" else _plain_turn(message)
            if turn is None:
                return None
            emit(turn, index)
        emit(f"{TURN_START}assistant\n", -1)
        return RenderedTokens(
            token_ids=previous + added,
            message_indices=[-1] * len(previous) + owners,
            sampled_mask=[False] * (len(previous) + len(added)),
            message_roles=[str(message.get("role") or "") for message in new_messages],
            message_tool_names=extract_message_tool_names(new_messages),
        )


def _tool_call(match: re.Match[str]) -> ParsedToolCall:
    raw = match.group(0)
    try:
        call = json.loads(match.group(1))
    except ValueError:
        return ParsedToolCall(raw=raw, status=ToolCallParseStatus.INVALID_JSON)
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return ParsedToolCall(raw=raw, status=ToolCallParseStatus.MISSING_NAME)
    return ParsedToolCall(raw=raw, name=call["name"], arguments=call.get("arguments") or {})


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")


def _tool_turn(message: dict[str, Any]) -> str:
    """A tool result as the Hermes template renders it: a user turn wrapping it in `<tool_response>`."""
    return f"{TURN_START}user\n<tool_response>\n{_text(message.get('content'))}\n</tool_response>{TURN_END}\n"


def _plain_turn(message: dict[str, Any]) -> str | None:
    role = message.get("role")
    if role not in ("user", "system"):
        return None
    return f"{TURN_START}{role}\n{_text(message.get('content'))}{TURN_END}\n"
