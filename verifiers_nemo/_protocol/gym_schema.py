"""What nemo-gym 0.4.0 accepts as a policy reply, whatever openai this process has installed.

A Gym agent validates every policy answer with ``NeMoGymResponse.model_validate``
(``nemo_gym/openai_utils.py``): openai 2.7.2's ``Response`` (the newest openai nemo-gym 0.4.0
allows) with its output items and usage narrowed by nemo-gym. That contract belongs to the Gym
runtime, which may live in another interpreter; it is not the ``Response`` of the openai installed
here (openai >= 2.54 requires ``usage.input_tokens_details.cache_write_tokens``, which neither Gym
nor vLLM's Chat API sends). The models below mirror nemo-gym's schema with plain pydantic, in the
same lax mode, so a reply that passes ``validate_policy_reply`` is one a Gym agent accepts.

Where nemo-gym's union accepts more than a policy ever produces, these models are stricter (they
never accept what Gym refuses):

- ``output`` holds only ``message`` (role ``assistant``, output text or refusal parts),
  ``function_call`` and ``reasoning`` items, each with its ``type``; Gym's union also takes
  input-style items (user messages, ``function_call_output``) and untyped items.
- Training fields (``prompt_token_ids``, ``generation_token_ids``, ``generation_log_probs``) must be
  well-typed when present; Gym silently drops malformed ones.
- ``instructions`` is a string (Gym also takes a list of input items), ``prompt.variables`` holds
  strings only, and logprob entries are lists (Gym accepts any iterable, lazily).

Hosted (non-function) tools in the echoed ``tools`` are checked by type and required fields only.
``drop_uncarried_fields`` removes what Gym's agent accepts but cannot send on (vLLM's
``output_text.logprobs``: nemo-gym 0.4.0 answers 500, ``SerializationIterator`` is not JSON
serializable).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# Output item types a Gym agent can use from its policy.
GYM_OUTPUT_ITEM_TYPES = frozenset({"message", "function_call", "reasoning"})
# Fields nemo-gym's "ForTraining" output items carry (prompt and generation token data).
TRAINING_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs", "routed_experts")


class GymSchemaError(ValueError):
    """A reply nemo-gym's agent would refuse; ``summary`` names the first few problems."""

    def __init__(self, summary: str) -> None:
        super().__init__(summary)
        self.summary = summary


class _OpenAIModel(BaseModel):
    """openai's models keep unknown keys."""

    model_config = ConfigDict(extra="allow", protected_namespaces=())


class _GymModel(BaseModel):
    """nemo-gym's own item models ignore unknown keys (vLLM adds ``async``, ``caller``, ``phase``...)."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())


# -- output text parts -------------------------------------------------------------------------


class _FileCitation(_GymModel):
    file_id: str
    filename: str
    index: int
    type: Literal["file_citation"]


class _URLCitation(_GymModel):
    end_index: int
    start_index: int
    title: str
    type: Literal["url_citation"]
    url: str


class _ContainerFileCitation(_GymModel):
    container_id: str
    end_index: int
    file_id: str
    filename: str
    start_index: int
    type: Literal["container_file_citation"]


class _FilePath(_GymModel):
    file_id: str
    index: int
    type: Literal["file_path"]


_Annotation = Annotated[_FileCitation | _URLCitation | _ContainerFileCitation | _FilePath, Field(discriminator="type")]


class _TopLogprob(_GymModel):
    token: str
    bytes: list[int]
    logprob: float


class _Logprob(_GymModel):
    token: str
    bytes: list[int]
    logprob: float
    top_logprobs: list[_TopLogprob]


class _OutputText(_GymModel):
    annotations: list[_Annotation]
    text: str
    type: Literal["output_text"]
    logprobs: list[_Logprob] | None = None


class _Refusal(_GymModel):
    refusal: str
    type: Literal["refusal"]


_Content = Annotated[_OutputText | _Refusal, Field(discriminator="type")]

# -- output items ------------------------------------------------------------------------------

_ItemStatus = Literal["in_progress", "completed", "incomplete"]


class _TrainingFields(_GymModel):
    prompt_token_ids: list[int] | None = None
    generation_token_ids: list[int] | None = None
    generation_log_probs: list[float] | None = None
    routed_experts: list[list[list[int]]] | None = None


class _OutputMessage(_TrainingFields):
    id: str
    content: list[_Content]
    role: Literal["assistant"] = "assistant"
    status: _ItemStatus = "completed"
    type: Literal["message"]


class _FunctionCall(_TrainingFields):
    arguments: str
    call_id: str
    name: str
    type: Literal["function_call"]
    id: str | None = None
    status: _ItemStatus | None = None


class _Summary(_OpenAIModel):
    text: str
    type: Literal["summary_text"]


class _Reasoning(_TrainingFields):
    id: str
    summary: list[_Summary]
    type: Literal["reasoning"]
    encrypted_content: str | None = None


_OutputItem = Annotated[_OutputMessage | _FunctionCall | _Reasoning, Field(discriminator="type")]

# -- tools and tool choice (echoed from the request) ---------------------------------------------


class _FunctionTool(_OpenAIModel):
    name: str
    type: Literal["function"]
    parameters: dict[str, object] | None = None
    strict: bool | None = None
    description: str | None = None


class _FileSearchTool(_OpenAIModel):
    type: Literal["file_search"]
    vector_store_ids: list[str]


class _ComputerTool(_OpenAIModel):
    display_height: int
    display_width: int
    environment: Literal["windows", "mac", "linux", "ubuntu", "browser"]
    type: Literal["computer_use_preview"]


class _WebSearchTool(_OpenAIModel):
    type: Literal["web_search", "web_search_2025_08_26"]


class _McpTool(_OpenAIModel):
    server_label: str
    type: Literal["mcp"]


class _CodeInterpreterAuto(_OpenAIModel):
    type: Literal["auto"]
    file_ids: list[str] | None = None


class _CodeInterpreterTool(_OpenAIModel):
    container: str | _CodeInterpreterAuto
    type: Literal["code_interpreter"]


class _ImageGenerationTool(_OpenAIModel):
    type: Literal["image_generation"]


class _LocalShellTool(_OpenAIModel):
    type: Literal["local_shell"]


class _CustomTool(_OpenAIModel):
    name: str
    type: Literal["custom"]


class _WebSearchPreviewTool(_OpenAIModel):
    type: Literal["web_search_preview", "web_search_preview_2025_03_11"]


_Tool = (
    _FunctionTool
    | _FileSearchTool
    | _ComputerTool
    | _WebSearchTool
    | _McpTool
    | _CodeInterpreterTool
    | _ImageGenerationTool
    | _LocalShellTool
    | _CustomTool
    | _WebSearchPreviewTool
)


class _ToolChoiceAllowed(_OpenAIModel):
    mode: Literal["auto", "required"]
    tools: list[dict[str, object]]
    type: Literal["allowed_tools"]


class _ToolChoiceTypes(_OpenAIModel):
    type: Literal[
        "file_search",
        "web_search_preview",
        "computer_use_preview",
        "web_search_preview_2025_03_11",
        "image_generation",
        "code_interpreter",
    ]


class _ToolChoiceFunction(_OpenAIModel):
    name: str
    type: Literal["function"]


class _ToolChoiceMcp(_OpenAIModel):
    server_label: str
    type: Literal["mcp"]
    name: str | None = None


class _ToolChoiceCustom(_OpenAIModel):
    name: str
    type: Literal["custom"]


_ToolChoice = (
    Literal["none", "auto", "required"]
    | _ToolChoiceAllowed
    | _ToolChoiceTypes
    | _ToolChoiceFunction
    | _ToolChoiceMcp
    | _ToolChoiceCustom
)

# -- the rest of a Response ----------------------------------------------------------------------


class _InputTokensDetails(_OpenAIModel):
    cached_tokens: int


class _OutputTokensDetails(_OpenAIModel):
    reasoning_tokens: int


class _Usage(_OpenAIModel):
    input_tokens: int
    input_tokens_details: _InputTokensDetails
    output_tokens: int
    output_tokens_details: _OutputTokensDetails
    total_tokens: int


class _FormatText(_OpenAIModel):
    type: Literal["text"]


class _FormatJsonSchema(_OpenAIModel):
    name: str
    schema_: dict[str, object] = Field(alias="schema")
    type: Literal["json_schema"]
    description: str | None = None
    strict: bool | None = None


class _FormatJsonObject(_OpenAIModel):
    type: Literal["json_object"]


class _TextConfig(_OpenAIModel):
    format: _FormatText | _FormatJsonSchema | _FormatJsonObject | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class _ReasoningConfig(_OpenAIModel):
    effort: Literal["minimal", "low", "medium", "high"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class _Error(_OpenAIModel):
    code: Literal[
        "server_error",
        "rate_limit_exceeded",
        "invalid_prompt",
        "vector_store_timeout",
        "invalid_image",
        "invalid_image_format",
        "invalid_base64_image",
        "invalid_image_url",
        "image_too_large",
        "image_too_small",
        "image_parse_error",
        "image_content_policy_violation",
        "invalid_image_mode",
        "image_file_too_large",
        "unsupported_image_media_type",
        "empty_image_file",
        "failed_to_download_image",
        "image_file_not_found",
    ]
    message: str


class _IncompleteDetails(_OpenAIModel):
    reason: Literal["max_output_tokens", "content_filter"] | None = None


class _Prompt(_OpenAIModel):
    id: str
    variables: dict[str, str] | None = None
    version: str | None = None


class _Conversation(_OpenAIModel):
    id: str


class _PolicyReply(_OpenAIModel):
    """nemo-gym 0.4.0's ``NeMoGymResponse`` (openai 2.7.2's ``Response``), field for field."""

    id: str
    created_at: float
    error: _Error | None = None
    incomplete_details: _IncompleteDetails | None = None
    instructions: str | None = None
    metadata: dict[str, str] | None = None
    model: str
    object: Literal["response"]
    output: list[_OutputItem]
    parallel_tool_calls: bool
    temperature: float | None = None
    tool_choice: _ToolChoice
    tools: list[_Tool]
    top_p: float | None = None
    background: bool | None = None
    conversation: _Conversation | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    previous_response_id: str | None = None
    prompt: _Prompt | None = None
    prompt_cache_key: str | None = None
    reasoning: _ReasoningConfig | None = None
    safety_identifier: str | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    status: Literal["completed", "failed", "in_progress", "cancelled", "queued", "incomplete"] | None = None
    text: _TextConfig | None = None
    top_logprobs: int | None = None
    truncation: Literal["auto", "disabled"] | None = None
    usage: _Usage | None = None
    user: str | None = None


def summarize(exc: ValidationError, limit: int = 3) -> str:
    """The first few errors of ``exc`` as ``loc: message``; union members named by their tag."""
    errors = exc.errors(include_url=False, include_input=False)
    shown = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errors[:limit])
    more = f" (+{len(errors) - limit} more)" if len(errors) > limit else ""
    return shown + more


def validate_policy_reply(data: Any) -> None:
    """Raise ``GymSchemaError`` unless nemo-gym 0.4.0's agent accepts ``data`` as a policy reply."""
    if not isinstance(data, dict):
        raise GymSchemaError(f"a policy reply is a JSON object, not a JSON {type(data).__name__}")
    output = data.get("output")
    if isinstance(output, list):
        kinds = {str(item.get("type")) if isinstance(item, dict) else type(item).__name__ for item in output}
        unusable = sorted(kinds - GYM_OUTPUT_ITEM_TYPES)
        if unusable:
            raise GymSchemaError(f"output items Gym cannot use: {', '.join(unusable)}")
    try:
        _PolicyReply.model_validate(data)
    except ValidationError as exc:
        raise GymSchemaError(summarize(exc)) from None


def drop_uncarried_fields(response: dict[str, Any]) -> None:
    """Remove, in place, what a Gym agent accepts but cannot send on: ``logprobs`` of output text
    parts (nemo-gym 0.4.0 validates them into lazy iterators it then fails to serialize)."""
    for item in response.get("output") or ():
        if not isinstance(item, dict) or item.get("type") != "message":
            continue
        for part in item.get("content") or ():
            if isinstance(part, dict) and "logprobs" in part:
                del part["logprobs"]
