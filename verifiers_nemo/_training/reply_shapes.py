"""The shapes of a ``/inference/v1/generate`` reply a training client reads, as the replay engine writes them.

The engines verifiers' training client samples from differ in one part of each choice: ``vllm-0.31`` (vLLM 0.26 to
0.31, and prime-rl's inference server) names each logprob's token ``"token_id:<id>"``; ``vllm-0.32`` gives an integer
``token_id``; ``vllm-0.33`` gives an integer ``token_id`` and the weight versions that sampled the completion
(``weight_versions: [{version, start, end}]``, completion token indexes ``[start, end)``; read from vLLM 0.33.0's
``entrypoints/scale_out/token_in_token_out/protocol.py``). renderers 0.1.12 (verifiers 0.4.0's) reads only the
first; 0.1.13.dev17 reads all three and passes the weight versions on to the trace."""

from __future__ import annotations

import json
from typing import Literal, get_args

GenerateShape = Literal["vllm-0.31", "vllm-0.32", "vllm-0.33"]
GENERATE_SHAPES: tuple[str, ...] = get_args(GenerateShape)
"""The shapes, oldest first; the first is the default: every ``renderers`` release reads it."""
READS_EVERY_SHAPE = "0.1.13.dev17"
"""The first ``renderers`` measured to read every shape (0.1.12 reads ``vllm-0.31`` only)."""


def logprob_entries(shape: GenerateShape, token_ids: list[int], logprob: float) -> str:
    """A completion's ``logprobs.content`` entries as ``shape`` writes them (JSON, without the brackets)."""
    if shape == "vllm-0.31":
        return ",".join(f'{{"token": "token_id:{t}", "logprob": {logprob}}}' for t in token_ids)
    return ",".join(f'{{"token_id": {t}, "logprob": {logprob}, "rank": 1, "top_logprobs": []}}' for t in token_ids)


def weight_versions_key(shape: GenerateShape, version: str, tokens: int) -> str:
    """The choice's ``weight_versions`` key (JSON, with its leading comma) where ``shape`` has one, else nothing:
    one span, ``version`` over the whole completion of ``tokens`` tokens."""
    if shape != "vllm-0.33":
        return ""
    spans = [{"version": version, "start": 0, "end": tokens}] if tokens else []
    return f', "weight_versions": {json.dumps(spans)}'
