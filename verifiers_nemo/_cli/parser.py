"""The ``verifiers-nemo`` argument parser: commands, flags, help texts and value checks (one line of
error and exit 2 on bad input, before anything heavy is imported)."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from .._export.options import DEFAULT_MIN_GAP, DEFAULT_PAIRING, FORMATS, PAIRINGS
from .._report.selection import DEFAULT_MAX_ROLLOUTS
from .._training.reply_shapes import GENERATE_SHAPES
from .console import EXIT_USAGE, PROG
from .envs import cmd_envs
from .eval import cmd_eval
from .export import EXPORTS_FOLDER, INSPECT, cmd_export
from .prepare import cmd_prepare
from .ps import cmd_ps
from .replay_server import cmd_replay_server
from .report import cmd_report

EVAL_DESCRIPTION = """\
Evaluate a model on a NeMo Gym environment: run its tasks as rollouts through the real Gym stack,
print a summary (reward, pass@k, metrics, errors, tokens, timing) and, with -s, save every rollout.

Policies:
  replay    (default without -b) the environment's recorded rollouts (data/example_rollouts.jsonl)
            answer as the model; no GPU or API key needed, and the rewards must match the recorded ones.
  endpoint  (default with -b) an OpenAI-compatible server at -b serving -m, spoken to with --api.
  script    (with --policy-script FILE.py[:NAME]) a Python function of yours answers as the model: the
            conversation and tools in, text or tool calls out; a first run of a new environment, no GPU.
"""

EVAL_EPILOG = """\
API key: -k names the environment variable holding the key (default OPENAI_API_KEY). A variable named
with -k must be set. When -k is not given and OPENAI_API_KEY is unset, requests go without a key (as a
local vLLM needs); a server that then refuses them fails the preflight with a message naming the variable.
The key is never written to disk or logged.

Before anything starts, the endpoint is checked (GET <base>/models within 5 s: reachable, key accepted,
model served; with one model served, -m may be left out).

Results (-s): <output-dir>/<env>--<model>/<run id>/results.jsonl (one rollout a line, written as each
finishes) and metadata.json (settings without secrets, counts, summary). Errored rollouts are kept in
results.jsonl, counted by type, and left out of reward and pass@k.

Resume: -R <run folder> runs only the (task, rollout) pairs with no line there, with the saved settings;
the summary covers all of them. Every saved line counts as done, errored ones (timeout, worker_lost, ...)
included: delete those lines to run them again. -b, -k, -c, --timeout, --pass-threshold, the judges and
the Ray flags may change; ENV, -m, --api, --policy, --policy-script, -n, -r, the sampling flags, -a,
--save-trace and --exact-tokens may not (a different value is refused).

Exit status: 0 when the run finished (also when some rollouts failed: the output says so), 1 when
it could not start or every rollout failed, 2 for bad arguments, 130/143 when interrupted.

Examples:
  verifiers-nemo eval example_multi_step                       # replay, no GPU
  verifiers-nemo eval example_multi_step,example_single_tool_call   # a mix: one Gym stack each
  verifiers-nemo eval example_multi_step -m Qwen/Qwen3-8B -b http://gpu-node:8000/v1 -n 100 -r 4 -c 64 -s
  verifiers-nemo eval nemo-gym-env -a '{"nemo_env": "example_single_tool_call"}' -s
  verifiers-nemo eval ./resources_servers/my_env --policy-script my_policy.py:policy --save-trace  # scripted
  verifiers-nemo eval -R outputs/evals/example_multi_step--replay/20250101-120000-a1b2c3
"""

COMMAND_TEXTS: dict[str, tuple[str, str]] = {
    "report": (
        "one self-contained HTML report of saved runs: plots, the rollouts and their transcripts, runs compared",
        (
            "Write one HTML file (it opens with no network) from saved eval runs: our run folders (results.jsonl + "
            "metadata.json, from `eval -s`) and verifiers' eval folders (traces.jsonl, from vf-eval nemo-gym-env or a"
            " prime-rl eval). Overview per environment (reward, pass@k and pass^k, metrics with confidence intervals,"
            " errors, latency, tokens) over every rollout, the rollouts with their transcripts (all of them up to "
            "--max-rollouts per run; of a larger run that many, whole tasks picked at random, plus examples of each "
            "failure), and with several runs their per-task comparison against the first. Runs of any size: the "
            "files are read streaming. Needs verifiers-nemo[report]."
        ),
    ),
    "export": (
        "export a saved run as training data (SFT, preferences, rollout groups: JSONL or Parquet) or an inspect-ai log",
        (
            "Write a saved run (a folder of `eval -s`) as training data, a file a trainer loads (JSONL or Parquet; "
            "docs/reference/training-data.md has each format's columns): sft-tokens (one row per training sample: the "
            "exact prompt and completion token IDs, a loss mask on the sampled tokens, logprobs; needs a run saved "
            "with --save-trace and --return-tokens or --exact-tokens), sft-messages (each rollout's conversation, tool "
            "calls and results included, for trainers that tokenize themselves), preferences (chosen/rejected pairs "
            "of a task's rollouts by reward, for DPO) or rollout-groups (each task's rollouts with their group's "
            "statistics and GRPO advantages, for offline RL). Rollouts that failed or that Gym masked are left out "
            "unless asked for (then as typed rows). The file is written as the run is read, in bounded memory, and "
            "describes itself (Parquet metadata, or FILE.schema.json beside a JSONL file). --format inspect writes an "
            "inspect-ai log for `inspect view` instead (either kind of folder; needs verifiers-nemo[inspect])."
        ),
    ),
    "envs": (
        "list the Gym environments, benchmarks and resources servers, and what they need",
        (
            "List what nemo-gym ships and your trees hold, by kind: on nemo-gym 0.7, its environments "
            "(environments/NAME) and benchmarks (benchmarks/NAME[/VARIANT]) as Gym's own catalogue lists them, then "
            "the resources-server configs (every release); a resources server whose name an environment or "
            "benchmark claims is shown as resources_servers/NAME, the name that runs it. And what running each "
            "needs."
        ),
    ),
    "ps": (
        "what verifiers-nemo runs for you on this machine (stacks, shared helpers, their processes, ports and folders)",
        (
            "List what this package runs for the current user on this machine: every Gym stack (its run id, the "
            "process that owns it, its processes and ports, its run and log folders), the shared Ray head and warm "
            "parents (who holds them), the local Ray clusters of --ray, and where each folder lives. A stack whose "
            "owner is gone, or a helper no process holds, is left over (a run killed with its supervisors, e.g. by "
            "kill -9 of every process); --clean stops those and removes their folders. Only your own processes are "
            "read or touched, never those of a live run or of another user."
        ),
    ),
    "prepare": (
        "install what environments need before their first run (extra packages, the Gym runtime)",
        (
            "Do now what the first start of each ENV would do before its servers run: build the Gym runtime if there "
            "is none, install the packages its servers need beyond nemo-gym, and list the modules the runtime's warm "
            "start preloads (cached, shared by later runs). Run it on every node before a Ray run, in an image, or "
            "in CI."
        ),
    ),
    "replay-server": (
        "serve an environment's recorded rollouts as an OpenAI-compatible model (for vf-eval)",
        (
            "Serve the recorded rollouts of a packaged Gym environment as a Responses-API model on 127.0.0.1, until "
            "interrupted: a GPU-free check of a verifiers chain. Point vf-eval at the printed URL with "
            "--env.taskset.recorded true; each rollout then reproduces its recorded reward."
        ),
    ),
}
"""Each command's one-line help (in ``verifiers-nemo --help``) and its description (in its own ``--help``)."""


class _Parser(argparse.ArgumentParser):
    """One line of error and where to find help; exit 2 (no usage dump, no traceback). A flag is spelled out: no
    prefix of a long flag is taken for it (``--rollouts 4`` would silently be ``--rollouts-per-example 4``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\nSee '{self.prog} --help'.\n")


def _number(
    convert: Callable[[str], float], noun: str, accept: Callable[[float], bool], requirement: str
) -> Callable[[str], Any]:
    """An argparse type: ``convert`` the text, then require ``accept`` (messages name the rule broken)."""

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"must be {requirement}, not {text}")
        return value

    return parse


_positive_int = _number(int, "a whole number", lambda v: v >= 1, "at least 1")
_non_negative_int = _number(int, "a whole number", lambda v: v >= 0, "0 or more")
_positive_float = _number(float, "a number", lambda v: math.isfinite(v) and v > 0, "a positive number")
_non_negative_float = _number(float, "a number", lambda v: math.isfinite(v) and v >= 0, "a number >= 0")
_any_float = _number(float, "a number", math.isfinite, "a finite number")


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object like '{{\"key\": 1}}', not {text!r}")
    return value


def _command(
    commands: argparse._SubParsersAction, name: str, handler: Callable[[argparse.Namespace], int], **kwargs: Any
) -> argparse.ArgumentParser:
    """A subcommand that runs ``handler``, with the ``-v`` every command takes; its texts are in
    ``COMMAND_TEXTS`` unless given."""
    if name in COMMAND_TEXTS:
        kwargs.update(zip(("help", "description"), COMMAND_TEXTS[name], strict=True))
    command = commands.add_parser(name, **kwargs)
    command.add_argument("-v", "--verbose", action="count", default=0, help="log more (-vv for debug)")
    command.set_defaults(handler=handler)
    return command


def _gym_root_option(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--gym-root",
        action="append",
        metavar="DIR",
        help="a folder of your own environments (one holding resources_servers/: a Gym clone, your project), "
        "searched by name before the packaged ones; repeatable; sets VERIFIERS_NEMO_GYM_ROOT for what it starts",
    )


def _offline_dir_option(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--offline-dir",
        metavar="DIR",
        help="run offline from a folder gathered by `prepare --gather DIR` on a connected machine: every install "
        "comes from its wheels, benchmark data from its copy, and nothing reaches the network; sets "
        "VERIFIERS_NEMO_OFFLINE_DIR for what it starts",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Run NVIDIA NeMo Gym environments: evaluate models, list environments.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    ev = _command(
        commands,
        "eval",
        cmd_eval,
        help="evaluate a model (or replay recorded rollouts) on a Gym environment",
        description=EVAL_DESCRIPTION,
        epilog=EVAL_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ev.add_argument(
        "env",
        nargs="?",
        metavar="ENV",
        help="a Gym environment: a packaged name (see `verifiers-nemo envs`), the path of a folder of your own "
        "(./resources_servers/NAME) or of one of its config YAMLs, or a name under --gym-root; several separated by "
        "commas, a mix run together (ENV1,ENV2); or nemo-gym-env with -a '{\"nemo_env\": NAME}'; optional with -R",
    )
    _gym_root_option(ev)
    _offline_dir_option(ev)
    model = ev.add_argument_group("model endpoint")
    model.add_argument("-m", "--model", help="model to evaluate (default: the only model the server serves)")
    model.add_argument(
        "-b",
        "--api-base-url",
        dest="base_url",
        metavar="URL",
        help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1 (implies --policy endpoint); several "
        "replicas of one model: URL1,URL2 (each rollout goes to the one with the fewest in flight)",
    )
    model.add_argument(
        "-k",
        "--api-key-var",
        metavar="VAR",
        help="NAME of the environment variable holding the API key (default OPENAI_API_KEY; see below)",
    )
    model.add_argument(
        "--api",
        choices=("responses", "chat"),
        help="protocol the endpoint speaks: Responses passthrough, or Chat Completions with conversion "
        "(default responses)",
    )
    model.add_argument(
        "--policy",
        choices=("replay", "endpoint", "script"),
        help="who answers the policy calls (default: endpoint with -b, script with --policy-script, else replay)",
    )
    model.add_argument(
        "--policy-script",
        metavar="FILE.py[:NAME]",
        help="a Python function answers as the model: NAME(messages, tools) returns the assistant's text, a tool "
        "call {'name': TOOL, 'arguments': {...}} or a list of them (NAME defaults to policy; implies --policy "
        "script)",
    )

    judge = ev.add_argument_group(
        "judge model (for environments that score with one; `verifiers-nemo envs` shows which)"
    )
    judge.add_argument("--judge-base-url", metavar="URL", help="OpenAI-compatible base URL of the judge")
    judge.add_argument("--judge-model", metavar="MODEL", help="the judge's model name")
    judge.add_argument(
        "--judge-api-key-var",
        metavar="VAR",
        help="NAME of the environment variable holding the judge's API key (default OPENAI_API_KEY)",
    )
    judge.add_argument(
        "--judge-api", choices=("responses", "chat"), help="protocol the judge speaks (default responses)"
    )
    judge.add_argument(
        "--judge",
        action="append",
        metavar="NAME=URL,MODEL",
        help="a judge for one judge name of the env's config (e.g. genrm_model=http://127.0.0.1:8001/v1,"
        "Qwen/Qwen3-8B); repeatable; --judge-base-url/--judge-model serve the names not given here. "
        "Without any judge, replay answers judge calls from the recordings and a judge that is the "
        "policy (policy_model) is the policy endpoint",
    )

    run = ev.add_argument_group("what to run")
    run.add_argument(
        "-n",
        "--num-examples",
        type=_positive_int,
        metavar="N",
        help="first N examples of the dataset (default: all). The packaged example datasets have 5 rows; for more, "
        '-a \'{"dataset": "validation"}\' or -a \'{"jsonl_path": FILE}\'',
    )
    run.add_argument(
        "-r", "--rollouts-per-example", type=_positive_int, metavar="R", help="rollouts per example (default 1)"
    )
    run.add_argument(
        "-c", "--max-concurrent", type=_positive_int, metavar="C", help="rollouts in flight at once (default 32)"
    )
    run.add_argument(
        "--timeout", type=_positive_float, metavar="SECONDS", help="time limit of one rollout (default 600)"
    )
    run.add_argument(
        "-a",
        "--env-args",
        type=_json_object,
        metavar="JSON",
        help="JSON object of environment args: dataset, jsonl_path, shuffle, seed, agent, gym_python, gym_version, "
        "max_steps (Gym's step bound for simple agents whose config sets none; default 100), start_timeout (seconds "
        "the Gym stack's start may take; default 600), ... (and nemo_env with ENV nemo-gym-env)",
    )

    scale = ev.add_argument_group("scale out on Ray (each actor owns one Gym stack; needs verifiers-nemo[ray])")
    scale.add_argument(
        "--ray",
        nargs="?",
        const="local",
        metavar="ADDRESS",
        help="run the rollouts on Ray actors: with no ADDRESS start a Ray cluster on this machine for the run; "
        "with one (HOST:PORT, or auto) join that cluster",
    )
    scale.add_argument(
        "--workers",
        type=_positive_int,
        metavar="N",
        help="Ray actors, i.e. Gym stacks, per environment (default: the cluster's CPUs / --cpus-per-stack "
        "when that is given, else one per live node)",
    )
    scale.add_argument(
        "--cpus-per-stack",
        type=_positive_float,
        metavar="X",
        help="CPUs each actor reserves, which is how Ray packs stacks onto nodes (default 1); without "
        "--workers it also sets how many: the cluster's CPUs / X",
    )

    sampling = ev.add_argument_group("sampling")
    sampling.add_argument(
        "-t", "--max-tokens", type=_positive_int, metavar="N", help="max output tokens per model call"
    )
    sampling.add_argument("-T", "--temperature", type=_non_negative_float, metavar="T", help="sampling temperature")
    sampling.add_argument(
        "-S",
        "--sampling-args",
        type=_json_object,
        metavar="JSON",
        help="more sampling args as a JSON object, e.g. '{\"top_p\": 0.95}' (-t/-T win over the same keys)",
    )
    sampling.add_argument(
        "--exact-tokens",
        action="store_true",
        default=None,
        help="training-exact tokens from a stock vLLM started with --enable-scale-out: every turn is generated "
        "from the exact token IDs already sampled plus what is new (render / generate / derender); each policy "
        "call records them (--save-trace)",
    )
    sampling.add_argument(
        "--return-tokens",
        action="store_true",
        help="ask the vLLM server for prompt/completion token IDs and logprobs (either --api), recorded "
        "in each policy call of the trace (--save-trace); vLLM-only request fields",
    )

    train = ev.add_argument_group(
        "training client (check an environment the way prime-rl trains on it; needs verifiers-nemo[verifiers])"
    )
    train.add_argument(
        "--client-type",
        choices=("eval", "train"),
        help="train: run every rollout as a verifiers episode under its training client (client.type = train): a "
        "renderer renders each prompt to token IDs, the engine's /inference/v1/generate samples (the replay "
        "policy: the recorded turns as tokens; with -b: a vLLM --enable-scale-out or prime-rl inference server), "
        "the turns become training samples; the summary says per environment how many samples a rollout makes and "
        "where it forked (default eval: calls go to the endpoint as they are)",
    )
    train.add_argument(
        "--renderer",
        metavar="NAME|FILE.py:Class",
        help="the training client's renderer: a typed one (qwen3, llama-3, ...; default auto: by the model) or a "
        "custom class (verifiers' [client.renderer] name / import_path)",
    )
    train.add_argument(
        "--renderer-model",
        metavar="NAME_OR_DIR",
        help="the model whose tokenizer the renderer uses: a Hugging Face name or a local folder with its "
        "tokenizer files (renderer_model_name; default -m; required with the replay policy)",
    )
    train.add_argument(
        "--renderer-config",
        type=_json_object,
        metavar="JSON",
        help='more [client.renderer] keys as a JSON object, e.g. \'{"thinking_retention": "all"}\' or a custom '
        "renderer's chat_template",
    )
    train.add_argument(
        "--generate-shape",
        choices=GENERATE_SHAPES,
        help="the replay engine's /inference/v1/generate reply shape: vllm-0.31 (logprob tokens as "
        '"token_id:N", as vLLM 0.26-0.31 and prime-rl\'s inference server answer; every renderers reads it; the '
        "default), vllm-0.32 (integer token_id) or vllm-0.33 (integer token_id and the weight versions that sampled "
        "each completion: the results record each rollout's policy versions); the newer two need renderers >= "
        "0.1.13.dev17",
    )

    out = ev.add_argument_group("results")
    out.add_argument(
        "-s",
        "--save-results",
        dest="save",
        action="store_true",
        help="save results.jsonl and metadata.json in a run folder",
    )
    out.add_argument(
        "-o", "--output-dir", type=Path, metavar="DIR", help="where run folders go (default outputs/evals; implies -s)"
    )
    out.add_argument(
        "-R",
        "--resume",
        type=Path,
        metavar="DIR",
        help="resume the run saved in DIR: run only its missing rollouts with its settings",
    )
    out.add_argument(
        "--save-trace",
        action="store_true",
        default=None,
        help="also save each rollout's policy calls (requests, responses, token ids) and Gym's own record of it "
        "(gym_result: its results.jsonl then replays as recordings, -a jsonl_path=; implies -s)",
    )
    out.add_argument(
        "--pass-threshold",
        type=_any_float,
        metavar="X",
        help="a rollout is correct when its reward >= X, for pass@k (default 0.5)",
    )
    out.add_argument(
        "--report",
        action="store_true",
        help="at the end, write report.html next to the results (plots, the rollouts; implies -s; "
        "needs verifiers-nemo[report])",
    )

    rp = _command(commands, "report", cmd_report)
    rp.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR", help="run folders (the first is the baseline)")
    rp.add_argument(
        "-o", "--output", type=Path, metavar="FILE",
        help="where to write it (default: report.html in the run folder, or here for several runs)",
    )  # fmt: skip
    rp.add_argument("--title", help="the report's title (default: the runs' names)")
    rp.add_argument(
        "--max-rollouts", type=_non_negative_int, default=DEFAULT_MAX_ROLLOUTS, metavar="N",
        help=f"rollouts of each run shown in the table, with transcripts (default {DEFAULT_MAX_ROLLOUTS:,}; a larger "
        "run shows N of whole tasks picked at random plus examples of each failure; 0: none; every figure counts all)",
    )  # fmt: skip

    ex = _command(commands, "export", cmd_export)
    ex.add_argument("run", type=Path, metavar="RUN_DIR", help="a run folder")
    ex.add_argument(
        "--format",
        choices=(*FORMATS, INSPECT),
        help="sft-tokens, sft-messages, preferences or rollout-groups (training data), or inspect (an inspect-ai log)",
    )
    ex.add_argument("--inspect", action="store_true", help="the same as --format inspect")
    ex.add_argument(
        "-o", "--output", type=Path, metavar="FILE",
        help="the file to write: .parquet or .jsonl for training data (default: "
        f"RUN_DIR/{EXPORTS_FOLDER}/FORMAT.parquet), .eval for inspect (default: "
        "RUN_DIR/inspect/<timestamp>_<env>_<run>.eval)",
    )  # fmt: skip
    rows = ex.add_argument_group("which rollouts (training data)")
    rows.add_argument(
        "--min-reward", type=_any_float, metavar="X",
        help="only rollouts with a reward of at least X (rejection sampling; preferences: the chosen one)",
    )  # fmt: skip
    rows.add_argument("--max-reward", type=_any_float, metavar="X", help="only rollouts with a reward of at most X")
    rows.add_argument(
        "--include-masked", action="store_true",
        help="also the rollouts Gym masked (mask_sample: their reward is no valid measurement), as rows with status "
        "masked",
    )  # fmt: skip
    rows.add_argument(
        "--include-errors", action="store_true",
        help="also the rollouts that failed, as rows with status error, their error_type and no reward",
    )  # fmt: skip
    pairs = ex.add_argument_group("preference pairs (--format preferences)")
    pairs.add_argument(
        "--pairs", choices=PAIRINGS,
        help=f"which pairs of a task's scored rollouts (default {DEFAULT_PAIRING}): best-worst, its best against its "
        "worst; best-rest, its best against each one enough below; all, every two enough apart",
    )  # fmt: skip
    pairs.add_argument(
        "--min-gap", type=_non_negative_float, metavar="X",
        help=f"the chosen reward is at least X above the rejected one (default {DEFAULT_MIN_GAP}; never a tie)",
    )  # fmt: skip
    pairs.add_argument("--max-pairs", type=_positive_int, metavar="N", help="at most N pairs of each task")
    ex.add_argument(
        "--max-rollouts", type=_non_negative_int, metavar="N",
        help=f"--format inspect: rollouts written as samples (default {DEFAULT_MAX_ROLLOUTS:,}; of a larger run, N "
        "chosen as the report chooses them; the log's scores count every rollout)",
    )  # fmt: skip

    en = _command(commands, "envs", cmd_envs)
    en.add_argument(
        "filter",
        nargs="?",
        metavar="TEXT",
        help="only names containing TEXT; an explicit form (resources_servers/NAME) or a folder's path: that one",
    )
    en.add_argument(
        "--runnable",
        action="store_true",
        help="only environments that need nothing beyond nemo-gym (no extra packages, judge model or external service)",
    )
    en.add_argument(
        "--recorded", action="store_true", help="only environments with recorded rollouts (what the replay policy runs)"
    )
    en.add_argument(
        "--kind",
        choices=("environment", "benchmark", "resources-server"),
        help="only entries of this kind: nemo-gym 0.7's environments (environments/NAME) and benchmarks "
        "(benchmarks/NAME), or resources-server configs (every release)",
    )
    en.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _gym_root_option(en)

    pr = _command(commands, "prepare", cmd_prepare)
    pr.add_argument("envs", nargs="+", metavar="ENV", help="Gym environments: packaged names, or paths of your own")
    pr.add_argument("--gym-python", metavar="PYTHON", help="the Gym runtime's interpreter (default: found or built)")
    pr_mode = pr.add_mutually_exclusive_group()
    pr_mode.add_argument(
        "--gather",
        metavar="DIR",
        help="then copy what they installed and downloaded (the Gym runtime's and every server environment's "
        "packages as wheels, benchmark data) into DIR, for a machine without internet (--offline-dir DIR there)",
    )
    pr_mode.add_argument(
        "--check",
        action="store_true",
        help="install nothing: say whether each ENV would start here (packages, data, runtime) and what it still "
        "needs (a judge endpoint, a variable, an external service); exit 1 when one would not",
    )
    _gym_root_option(pr)
    _offline_dir_option(pr)

    ps = _command(commands, "ps", cmd_ps)
    ps_mode = ps.add_mutually_exclusive_group()
    ps_mode.add_argument(
        "--clean",
        action="store_true",
        help="stop what runs that are gone left (their stacks, unheld helpers, --ray clusters) and remove their "
        "folders; logs stay",
    )
    ps_mode.add_argument("--json", action="store_true", help="print JSON instead of text")

    rs = _command(commands, "replay-server", cmd_replay_server)
    rs.add_argument(
        "env", nargs="?", metavar="ENV", help="a Gym environment with recorded rollouts (a packaged name or a path)"
    )
    rs.add_argument(
        "--jsonl-path",
        metavar="FILE",
        help="a recorded-rollouts file instead of the packaged one (without ENV, its rows must name their agent, "
        "agent_ref, which the packaged recordings do not)",
    )
    rs.add_argument("--port-file", metavar="FILE", help="also write the base URL to FILE")
    _gym_root_option(rs)
    return parser
