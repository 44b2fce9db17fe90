"""The wire formats: Responses objects for Gym, Chat Completions conversion, token data, JSON codec."""

from .chat import (
    chat_completion_to_response,
    input_to_messages,
    output_to_messages,
    responses_to_chat_request,
    to_chat_messages,
    to_chat_tools,
)
from .codec import dumps, loads
from .gym_schema import GymSchemaError, drop_uncarried_fields, validate_policy_reply
from .responses import finish_response, incomplete_response, prepare_responses_reply
from .usage import responses_usage, sum_usage

__all__ = [
    "GymSchemaError",
    "chat_completion_to_response",
    "drop_uncarried_fields",
    "dumps",
    "finish_response",
    "incomplete_response",
    "input_to_messages",
    "loads",
    "output_to_messages",
    "prepare_responses_reply",
    "responses_to_chat_request",
    "responses_usage",
    "sum_usage",
    "to_chat_messages",
    "to_chat_tools",
    "validate_policy_reply",
]
