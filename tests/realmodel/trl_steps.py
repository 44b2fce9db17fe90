"""Run by tests/realmodel/test_training_data_real.py in ``.venv-trl`` (TRL, transformers, torch on CPU; not this
package): the consumer side of the training-data export, as a user runs it.

1. ``datasets`` loads each exported file;
2. the model's tokenizer decodes every ``sft-tokens`` row (its prompt, then its completion in runs of equal mask) and
   every policy call's completion tokens in the saved ``results.jsonl``, so the test can hold the rows to the saved
   transcript;
3. one optimisation step of TRL's ``SFTTrainer`` on the ``sft-tokens`` rows (``input_ids`` / ``labels`` as they are)
   and one of ``DPOTrainer`` on the ``preferences`` rows (the conversational pairs with their tools, rendered by the
   tier's chat template), each on the real model; the loss and whether the weights moved.

Prints one JSON object on its last line."""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

MAX_LENGTH = 128
"""Tokens of each sequence trained on, its end kept (the completion; the tools' system prompt alone is ~200 tokens):
what keeps one step of the 135M model at a few CPU seconds."""


def _segments(row: dict[str, Any], decode: Any) -> list[dict[str, Any]]:
    """The completion in runs of equal mask: ``{"sampled", "tokens", "text"}``."""
    out: list[dict[str, Any]] = []
    for token, mask in zip(row["completion_token_ids"], row["completion_mask"], strict=True):
        if not out or out[-1]["sampled"] != bool(mask):
            out.append({"sampled": bool(mask), "tokens": []})
        out[-1]["tokens"].append(token)
    for segment in out:
        segment["text"] = decode(segment["tokens"])
    return out


def _moved(model: Any, before: dict[str, Any]) -> bool:
    params = dict(model.named_parameters())
    return any(not params[name].detach().equal(value) for name, value in before.items())


def _snapshot(model: Any) -> dict[str, Any]:
    """A few parameter tensors (the last layer's), to see the step change them."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return {name: p.detach().clone() for name, p in named[-4:]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--chat-template", required=True)
    parser.add_argument("--results", required=True, help="the run's results.jsonl")
    parser.add_argument("--exports", required=True, help="a folder with FORMAT.parquet / FORMAT.jsonl files")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    started, cpu = time.monotonic(), time.process_time()

    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

    imported, import_cpu = time.monotonic() - started, time.process_time() - cpu
    torch.manual_seed(0)
    # One thread: the suite's other processes share the 2 cores, and torch's OpenMP threads spin while they wait for
    # each other (measured under load: a step took 4x the CPU with 2 threads as with 1).
    torch.set_num_threads(1)
    exports = Path(args.exports)
    report: dict[str, Any] = {"import_s": imported, "import_cpu_s": import_cpu, "loaded": {}}
    for path in sorted(exports.iterdir()):
        if path.suffix in (".parquet", ".jsonl"):
            kind = "parquet" if path.suffix == ".parquet" else "json"
            loaded = load_dataset(kind, data_files=str(path), split="train", cache_dir=str(Path(args.out) / "hf"))
            report["loaded"][path.name] = {"rows": len(loaded), "columns": loaded.column_names}

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokenizer.chat_template = Path(args.chat_template).read_text()
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    sft = load_dataset("parquet", data_files=str(exports / "sft-tokens.parquet"), split="train")
    report["decoded"] = [
        {
            "task_index": row["task_index"],
            "rollout_index": row["rollout_index"],
            "calls": row["calls"],
            "prompt": decode(row["prompt_token_ids"]),
            "segments": _segments(row, decode),
        }
        for row in sft
    ]
    report["calls"] = {}
    for line in Path(args.results).read_text().splitlines():
        record = json.loads(line)
        key = f"{record['task_index']}/{record['rollout_index']}"
        report["calls"][key] = [decode(call["completion_token_ids"] or []) for call in record.get("trace") or ()]

    def step(trainer_class: Any, config_class: Any, dataset: Any, batch: int, **extra: Any) -> dict[str, Any]:
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
        before = _snapshot(model)
        config = config_class(
            output_dir=str(Path(args.out) / trainer_class.__name__),
            max_steps=1,
            per_device_train_batch_size=min(len(dataset), batch),
            learning_rate=1e-4,
            report_to=[],
            save_strategy="no",
            logging_steps=1,
            use_cpu=True,
            dataloader_num_workers=0,
            max_length=MAX_LENGTH,
            truncation_mode="keep_end",
            **extra,
        )
        t0, c0 = time.monotonic(), time.process_time()
        trainer = trainer_class(model=model, args=config, train_dataset=dataset, processing_class=tokenizer)
        output = trainer.train()
        return {
            "loss": output.training_loss,
            "finite": math.isfinite(output.training_loss),
            "steps": output.global_step,
            "moved": _moved(model, before),
            "rows": len(dataset),
            "seconds": time.monotonic() - t0,
            "cpu_s": time.process_time() - c0,
        }

    report["sft"] = step(SFTTrainer, SFTConfig, sft.select_columns(["input_ids", "labels"]), batch=2)
    pairs = load_dataset("parquet", data_files=str(exports / "preferences.parquet"), split="train")
    conversations = pairs.select_columns(["prompt", "chosen", "rejected", "tools"])
    report["dpo"] = step(DPOTrainer, DPOConfig, conversations, batch=1)
    report["total_s"], report["total_cpu_s"] = time.monotonic() - started, time.process_time() - cpu
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
