"""Convert the GGUF SmolLM2 checkpoint to a Hugging Face folder vLLM can serve (run once by .ci/setup-real-model).

`save_pretrained` refuses a GGUF-quantized model, so the dequantized weights are copied into a fresh
`LlamaForCausalLM` built from the same config without its quantization entry, and saved with the tokenizer.
Usage: python convert_smollm2.py MODEL.gguf OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path


def convert(gguf_path: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float32)
    config = quantized.config.to_dict()
    config.pop("quantization_config", None)
    model = LlamaForCausalLM(LlamaConfig(**config))
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
    # Tied embeddings: lm_head.weight may be absent from the GGUF state dict and is then tied to the embeddings.
    missing = [key for key in missing if not (key == "lm_head.weight" and model.config.tie_word_embeddings)]
    if missing or unexpected:
        raise SystemExit(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    model = model.to(torch.float32).eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)

    # A sanity check that the weights survived: the greedy answer to a plain question names Paris.
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, tokenize=False
    )
    ids = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=20, do_sample=False)
    answer = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    print(f"converted {gguf_path.name} -> {out_dir} (greedy check: {answer.strip()!r})", file=sys.stderr)
    if "paris" not in answer.lower():
        raise SystemExit(f"the converted model does not answer sensibly: {answer!r}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    convert(Path(sys.argv[1]), Path(sys.argv[2]))
