"""How a Gym policy call reaches an inference endpoint: the ``Upstream`` seam and its implementations.

Every reply is read for token data, stripped of what a Gym agent cannot carry, and checked against
the schema nemo-gym 0.4.0 validates (``_protocol``) before it can reach the agent. Every HTTP call
is bounded in time and retried with backoff on 408/429/5xx and connection errors (``http``).
"""

from .base import ChatPassthrough, RetryPolicy, Upstream, UpstreamReply
from .chat import ChatCompletionsUpstream, chat_to_responses_reply
from .function import FunctionUpstream, ResponseHandler
from .responses import ResponsesUpstream

__all__ = [
    "ChatCompletionsUpstream",
    "ChatPassthrough",
    "FunctionUpstream",
    "ResponseHandler",
    "ResponsesUpstream",
    "RetryPolicy",
    "Upstream",
    "UpstreamReply",
    "chat_to_responses_reply",
]
