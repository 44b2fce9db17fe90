"""The ``verifiers-nemo`` command: ``eval`` (a ``prime eval run``-style evaluation) and ``envs``.

The CLI owns the console: progress and messages go to stderr, the summary to stdout. Library code
only logs. Heavy modules are imported after the arguments are checked, so bad input fails fast.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from .._exceptions import ConfigurationError, VerifiersNemoError

if TYPE_CHECKING:
    from tqdm import tqdm

    from .._eval.evaluation import EvalSettings, Evaluation, ResultsFolder
    from .._result import RolloutResult

PROG = "verifiers-nemo"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
_DEFAULTS: dict[str, Any] = {
    "rollouts_per_example": 1,
    "max_concurrent": 32,
    "timeout": 600.0,
    "api": "responses",
    "pass_threshold": 0.5,
}

EVAL_DESCRIPTION = """\
Evaluate a model on a NeMo Gym environment: run its tasks as rollouts through the real Gym stack,
print a summary (reward, pass@k, metrics, errors, tokens, timing) and, with -s, save every rollout.

Policies:
  replay    (default without -b) the environment's recorded rollouts (data/example_rollouts.jsonl)
            answer as the model; no GPU or API key needed, and the rewards must match the recorded ones.
  endpoint  (default with -b) an OpenAI-compatible server at -b serving -m, spoken to with --api.
"""

EVAL_EPILOG = """\
API key: -k names the environment variable holding the key (default OPENAI_API_KEY). A variable named
with -k must be set. When -k is not given and OPENAI_API_KEY is unset, requests go without a key (as a
local vLLM needs); a server that then refuses them fails the preflight with a message naming the variable.
The key is never written to disk or logged.

Before anything starts, the endpoint is checked (GET <base>/models within 5 s: reachable, key accepted,
model served; with one model served, -m may be left out).

Results (-s): <output-dir>/<env>--<model>/<run id>/results.jsonl (one rollout a line, written as each
finishes) and metadata.json (settings without secrets, counts, summary). -R <run folder> runs only the
(task, rollout) pairs missing there, with the saved settings; the summary covers all of them.
Errored rollouts are kept in results.jsonl, counted by type, and left out of reward and pass@k.

Exit status: 0 when the run finished (also when some rollouts failed: the output says so), 1 when
it could not start or every rollout failed, 2 for bad arguments, 130/143 when interrupted.

Examples:
  verifiers-nemo eval example_multi_step                       # replay, no GPU
  verifiers-nemo eval example_multi_step -m Qwen/Qwen3-8B -b http://gpu-node:8000/v1 -n 100 -r 4 -c 64 -s
  verifiers-nemo eval nemo-gym-env -a '{"nemo_env": "example_single_tool_call"}' -s
  verifiers-nemo eval -R outputs/evals/example_multi_step--replay/20250101-120000-a1b2c3
"""


# ---------------------------------------------------------------------------------------------
# Argument parsing


class _Parser(argparse.ArgumentParser):
    """One line of error and where to find help; exit 2 (no usage dump, no traceback)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\nSee '{self.prog} --help'.\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, not {text}")
    return value


def _any_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, not {text}")
    return value


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object like '{{\"key\": 1}}', not {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Run NVIDIA NeMo Gym environments: evaluate models, list environments.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    ev = commands.add_parser(
        "eval",
        help="evaluate a model (or replay recorded rollouts) on a Gym environment",
        description=EVAL_DESCRIPTION,
        epilog=EVAL_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ev.add_argument(
        "env",
        nargs="?",
        metavar="ENV",
        help="a packaged Gym environment (see `verifiers-nemo envs`), or nemo-gym-env with "
        "-a '{\"nemo_env\": NAME}'; optional with -R",
    )
    model = ev.add_argument_group("model endpoint")
    model.add_argument("-m", "--model", help="model to evaluate (default: the only model the server serves)")
    model.add_argument(
        "-b",
        "--api-base-url",
        dest="base_url",
        metavar="URL",
        help="OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1 (implies --policy endpoint)",
    )
    model.add_argument(
        "-k",
        "--api-key-var",
        dest="api_key_var",
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
        choices=("replay", "endpoint"),
        help="who answers the policy calls (default: endpoint with -b, else replay)",
    )

    run = ev.add_argument_group("what to run")
    run.add_argument(
        "-n",
        "--num-examples",
        dest="num_examples",
        type=_positive_int,
        metavar="N",
        help="first N examples of the dataset (default: all)",
    )
    run.add_argument(
        "-r",
        "--rollouts-per-example",
        dest="rollouts_per_example",
        type=_positive_int,
        metavar="R",
        help="rollouts per example (default 1)",
    )
    run.add_argument(
        "-c",
        "--max-concurrent",
        dest="max_concurrent",
        type=_positive_int,
        metavar="C",
        help="rollouts in flight at once (default 32)",
    )
    run.add_argument(
        "--timeout", type=_positive_float, metavar="SECONDS", help="time limit of one rollout (default 600)"
    )
    run.add_argument(
        "-a",
        "--env-args",
        dest="env_args",
        type=_json_object,
        metavar="JSON",
        help="JSON object of environment args: dataset, jsonl_path, shuffle, seed, agent, max_steps, "
        "gym_python, ... (and nemo_env with ENV nemo-gym-env)",
    )

    sampling = ev.add_argument_group("sampling")
    sampling.add_argument(
        "-t",
        "--max-tokens",
        dest="max_tokens",
        type=_positive_int,
        metavar="N",
        help="max output tokens per model call",
    )
    sampling.add_argument("-T", "--temperature", type=_non_negative_float, metavar="T", help="sampling temperature")
    sampling.add_argument(
        "-S",
        "--sampling-args",
        dest="sampling_args",
        type=_json_object,
        metavar="JSON",
        help="more sampling args as a JSON object, e.g. '{\"top_p\": 0.95}' (-t/-T win over the same keys)",
    )
    sampling.add_argument(
        "--return-tokens",
        dest="return_tokens",
        action="store_true",
        help="ask the vLLM server for prompt/completion token IDs and logprobs (either --api), recorded "
        "in each policy call of the trace (--save-trace); vLLM-only request fields",
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
        "-o",
        "--output-dir",
        dest="output_dir",
        type=Path,
        metavar="DIR",
        help="where run folders go (default outputs/evals; implies -s)",
    )
    out.add_argument(
        "-R",
        "--resume",
        dest="resume",
        type=Path,
        metavar="DIR",
        help="resume the run saved in DIR: run only its missing rollouts with its settings",
    )
    out.add_argument(
        "--save-trace",
        dest="save_trace",
        action="store_true",
        default=None,
        help="also save each rollout's policy calls (requests, responses, token ids; implies -s)",
    )
    out.add_argument(
        "--pass-threshold",
        dest="pass_threshold",
        type=_any_float,
        metavar="X",
        help="a rollout is correct when its reward >= X, for pass@k (default 0.5)",
    )
    out.add_argument("-v", "--verbose", action="count", default=0, help="log more (-vv for debug)")
    ev.set_defaults(handler=_cmd_eval)

    en = commands.add_parser(
        "envs",
        help="list the packaged Gym environments and what they need",
        description="List the NeMo Gym environments packaged with nemo-gym and what running each needs.",
    )
    en.add_argument("filter", nargs="?", metavar="TEXT", help="only names containing TEXT")
    en.add_argument(
        "--runnable",
        action="store_true",
        help="only environments that need nothing beyond nemo-gym (no extra packages, judge model or external service)",
    )
    en.add_argument(
        "--recorded",
        action="store_true",
        help="only environments with recorded rollouts (what the replay policy runs)",
    )
    en.add_argument("--json", action="store_true", help="print JSON instead of a table")
    en.add_argument("-v", "--verbose", action="count", default=0, help="log more")
    en.set_defaults(handler=_cmd_envs)

    rs = commands.add_parser(
        "replay-server",
        help="serve an environment's recorded rollouts as an OpenAI-compatible model (for vf-eval)",
        description=(
            "Serve the recorded rollouts of a packaged Gym environment as a Responses-API model on 127.0.0.1, "
            "until interrupted: a GPU-free check of a verifiers chain. Point vf-eval at the printed URL "
            "with --env.taskset.recorded true; each rollout then reproduces its recorded reward."
        ),
    )
    rs.add_argument("env", nargs="?", metavar="ENV", help="a packaged Gym environment with recorded rollouts")
    rs.add_argument("--jsonl-path", metavar="FILE", help="a recorded-rollouts file instead of the packaged one")
    rs.add_argument("--port-file", metavar="FILE", help="also write the base URL to FILE")
    rs.add_argument("-v", "--verbose", action="count", default=0, help="log more")
    rs.set_defaults(handler=_cmd_replay_server)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``verifiers-nemo`` console script."""
    args = build_parser().parse_args(argv)
    _setup_logging(args.verbose)
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        _say("interrupted")
        return 130
    except BrokenPipeError:  # e.g. `verifiers-nemo envs | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


# ---------------------------------------------------------------------------------------------
# Console helpers


def _say(message: str) -> None:
    """A message for the user on stderr (safe while a progress bar is drawn)."""
    try:
        from tqdm import tqdm

        tqdm.write(message, file=sys.stderr)
    except ImportError:  # pragma: no cover
        print(message, file=sys.stderr)


def _fail(message: str, code: int = EXIT_USAGE) -> int:
    _say(f"{PROG}: error: {message}")
    return code


class _TqdmHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            _say(self.format(record))
        except Exception:  # pragma: no cover - logging must never raise
            self.handleError(record)


def _setup_logging(verbose: int) -> None:
    handler = _TqdmHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.getLogger("verifiers_nemo").setLevel(level)


def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _fmt_s(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.2f}s" if value < 60 else f"{int(value // 60)}m{value % 60:04.1f}s"


# ---------------------------------------------------------------------------------------------
# eval


def _explicit(args: argparse.Namespace) -> dict[str, Any]:
    """The eval flags the user gave (argparse defaults are None so absence is visible)."""
    names = (
        "model",
        "base_url",
        "api_key_var",
        "api",
        "policy",
        "num_examples",
        "rollouts_per_example",
        "max_concurrent",
        "timeout",
        "env_args",
        "sampling_args",
        "save_trace",
        "pass_threshold",
    )
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def _sampling_args(args: argparse.Namespace) -> dict[str, Any]:
    sampling = dict(args.sampling_args or {})
    if args.max_tokens is not None:
        sampling.pop("max_output_tokens", None)
        sampling["max_tokens"] = args.max_tokens
    if args.temperature is not None:
        sampling["temperature"] = args.temperature
    if getattr(args, "return_tokens", False):
        sampling["return_tokens"] = True  # Endpoint.return_tokens, as a sampling arg
    return sampling


def _new_settings(args: argparse.Namespace) -> EvalSettings:
    """Settings of a fresh run from the flags (raises ConfigurationError on a bad combination)."""
    from .._eval.evaluation import REPLAY_MODEL, EvalSettings, resolve_nemo_env

    if not args.env:
        raise ConfigurationError("name the environment to evaluate (ENV), or resume a run with -R DIR.")
    policy = args.policy or ("endpoint" if args.base_url else "replay")
    if policy == "replay":
        if args.base_url:
            raise ConfigurationError(
                "--policy replay answers with recorded rollouts; drop -b (or use --policy endpoint)."
            )
        if args.model:
            raise ConfigurationError(
                "-m needs an endpoint: add -b URL (without -b the recorded rollouts are replayed)."
            )
        if args.api_key_var:
            raise ConfigurationError("-k needs an endpoint: add -b URL (the replay policy needs no key).")
    elif not args.base_url:
        raise ConfigurationError("--policy endpoint needs -b URL (the OpenAI-compatible base URL).")
    env_args = dict(args.env_args or {})
    return EvalSettings(
        env=args.env,
        nemo_env=resolve_nemo_env(args.env, env_args),
        policy=policy,
        model=REPLAY_MODEL if policy == "replay" else (args.model or ""),
        base_url=args.base_url,
        api=args.api or _DEFAULTS["api"],
        api_key_var=args.api_key_var,
        num_examples=args.num_examples,
        rollouts_per_example=args.rollouts_per_example or _DEFAULTS["rollouts_per_example"],
        max_concurrent=args.max_concurrent or _DEFAULTS["max_concurrent"],
        sampling_args=_sampling_args(args),
        env_args=env_args,
        timeout=args.timeout or _DEFAULTS["timeout"],
        pass_threshold=_DEFAULTS["pass_threshold"] if args.pass_threshold is None else args.pass_threshold,
        save_trace=bool(args.save_trace),
    )


def _resumed_settings(args: argparse.Namespace, saved: EvalSettings) -> EvalSettings:
    """The saved settings with the flags that may change between sessions applied; others must agree."""
    from dataclasses import replace

    from .._eval.evaluation import RUN_DEFINING

    given = _explicit(args)
    if (
        args.sampling_args is not None
        or args.max_tokens is not None
        or args.temperature is not None
        or getattr(args, "return_tokens", False)
    ):
        given["sampling_args"] = _sampling_args(args)
    if args.env is not None:
        given["env"] = args.env
    if args.output_dir is not None:
        raise ConfigurationError("-o has no effect with -R: the run's folder is DIR itself.")
    flags = {"env": "ENV", "model": "-m", "api": "--api", "policy": "--policy", "num_examples": "-n"}
    flags |= {
        "rollouts_per_example": "-r",
        "sampling_args": "-S/-t/-T",
        "env_args": "-a",
        "save_trace": "--save-trace",
    }
    for name in RUN_DEFINING:
        if name in given and given[name] != getattr(saved, name):
            raise ConfigurationError(
                f"{flags.get(name, name)} {given[name]!r} differs from the resumed run's "
                f"{_saved_value(name, getattr(saved, name))}; a resumed run keeps its settings "
                "(start a new run to change it)."
            )
    if saved.policy == "replay" and args.base_url:
        raise ConfigurationError("the resumed run replays recorded rollouts; drop -b.")
    changes = {k: v for k, v in given.items() if k not in RUN_DEFINING}
    return replace(saved, **changes)


def _saved_value(name: str, value: Any) -> str:
    """A saved setting as the user would say it (None and empty values mean the default)."""
    if value is None or value == {}:
        return {"num_examples": "(all examples)", "model": "(no model)"}.get(name, "(not set)")
    return repr(value)


def _columns(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError):
        return 0


class _Progress:
    """Draws the stack start step and the rollout progress bar on stderr (plain lines when not a TTY)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream = stream or sys.stderr
        self.tty = stream.isatty() and _columns(stream) > 0  # a 0-column pty draws no bar
        self._bar: tqdm | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._rewards: list[float] = []
        self._errors = 0
        self._last_line = 0.0
        self._total = 0
        self._done = 0
        self._started = 0.0
        self._previous_rewards: list[float] = []
        self._previous_errors = 0

    def seed(self, rewards: list[float], errors: int) -> None:
        """Include a resumed run's earlier rollouts in the running mean and error count."""
        self._previous_rewards, self._previous_errors = rewards, errors

    def stack_starting(self, env: str) -> None:
        from tqdm import tqdm

        self._started = time.monotonic()
        if not self.tty:
            _say(f"Starting the Gym stack for {env} ...")
            return
        self._bar = tqdm(
            total=None,
            desc=f"Starting the Gym stack for {env}",
            bar_format="{desc} {elapsed}",
            file=self.stream,
            leave=False,
        )
        self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        while self._bar is not None:
            self._bar.refresh()
            await asyncio.sleep(0.5)

    def stack_ready(self, seconds: float) -> None:
        self._close_bar()
        _say(f"Gym stack ready in {seconds:.1f}s")

    def rollouts_starting(self, total: int, done: int) -> None:
        from tqdm import tqdm

        self._total, self._done = total, done
        self._started = time.monotonic()
        if done:
            _say(f"Resuming: {done} of {total} rollouts already done, {total - done} to run")
        if self.tty:
            self._bar = tqdm(
                total=total,
                initial=done,
                desc="rollouts",
                unit="rollout",
                file=self.stream,
                dynamic_ncols=True,
            )
            self._bar.set_postfix_str(self._postfix())

    def _postfix(self) -> str:
        rewards = self._previous_rewards + self._rewards
        mean = math.fsum(rewards) / len(rewards) if rewards else None
        return f"reward={_fmt(mean)} errors={self._previous_errors + self._errors}"

    def rollout_finished(self, result: RolloutResult) -> None:
        self._done += 1
        if result.error is None and result.reward is not None:
            self._rewards.append(result.reward)
        else:
            self._errors += 1
        if self._bar is not None:
            self._bar.set_postfix_str(self._postfix(), refresh=False)
            self._bar.update(1)
        elif not self.tty:
            now = time.monotonic()
            if now - self._last_line >= 5 or self._done == self._total:
                self._last_line = now
                rate = (len(self._rewards) + self._errors) / max(now - self._started, 1e-9)
                _say(f"rollouts {self._done}/{self._total} · {rate:.2f}/s · {self._postfix()}")

    def _close_bar(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        if self._bar is not None:
            bar, self._bar = self._bar, None
            bar.close()

    def close(self) -> None:
        self._close_bar()


def _cmd_eval(args: argparse.Namespace) -> int:
    wall_start = time.monotonic()
    if args.output_dir is not None or args.save_trace:
        args.save = True
    try:
        settings, folder, metadata = _prepare_settings(args)
    except VerifiersNemoError as exc:
        return _fail(str(exc))
    try:
        return _run_eval(args, settings, folder, metadata, wall_start)
    finally:
        if folder is not None:
            folder.close()


def _prepare_settings(args: argparse.Namespace) -> tuple[EvalSettings, ResultsFolder | None, dict[str, Any]]:
    from .._eval.evaluation import EvalSettings, ResultsFolder

    if args.resume is not None:
        folder = ResultsFolder.existing(args.resume)
        metadata = folder.read_metadata()
        settings = _resumed_settings(args, EvalSettings.from_dict(metadata["settings"]))
        return settings, folder, metadata
    return _new_settings(args), None, {}


def _check_environment(settings: EvalSettings) -> None:
    """The Gym environment exists and can run this policy (else a refusal, before anything starts or is
    written)."""
    from .._gym.catalogue import get_environment

    env = get_environment(settings.nemo_env)
    own_recordings = "jsonl_path" in settings.env_args
    if settings.policy == "replay" and not env.has_example_rollouts and not own_recordings:
        raise ConfigurationError(
            f"{env.name} has no recorded rollouts to replay ({env.example_rollouts_path} is missing or "
            "empty); evaluate a model with -b URL -m MODEL instead."
        )
    reason = _replay_note(env.name)
    if settings.policy == "replay" and reason and not own_recordings:
        raise ConfigurationError(
            f"{env.name}'s recorded rollouts cannot be replayed: {reason} (marked † in `{PROG} envs`). "
            "Evaluate a model on it instead: -b URL -m MODEL."
        )


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _run_eval(
    args: argparse.Namespace,
    settings: EvalSettings,
    folder: ResultsFolder | None,
    metadata: dict[str, Any],
    wall_start: float,
) -> int:
    from .._eval.evaluation import Evaluation, dedupe_records, read_results
    from .._eval.preflight import PreflightError, check_base_url, preflight, resolve_api_key
    from .._exceptions import MissingRequirementsError

    resuming = folder is not None
    previous: list[dict[str, Any]] = []
    notes: list[str] = []
    try:
        if settings.policy == "endpoint":
            assert settings.base_url is not None
            settings.base_url = check_base_url(settings.base_url)
            key = resolve_api_key(settings.api_key_var) if not resuming else None
        _check_environment(settings)
        if settings.policy == "endpoint" and key is not None:
            settings.model = preflight(settings.base_url, settings.model or None, key)
        evaluation = Evaluation(settings)
        tasks = evaluation.load()
        expected = evaluation.expected_pairs
        examples = len(expected) // settings.rollouts_per_example
        if not resuming and settings.num_examples and settings.num_examples > examples:
            source = evaluation.env.taskset.path.name if evaluation.env is not None else "the dataset"
            _say(f"note: -n {settings.num_examples}, but {source} has {_plural(examples, 'example')}; running all.")
        if folder is not None:  # resume: what is done already (read only, so a finished run needs no write)
            records, truncated = read_results(folder.results_path)
            previous, duplicates, unexpected = dedupe_records(records, set(expected))
            done = {(int(r["task_index"]), int(r["rollout_index"])) for r in previous}
            if not truncated and all(pair in done for pair in expected):
                return _show_finished(settings, folder, metadata, previous, len(expected))
            if settings.policy == "endpoint":
                assert settings.base_url is not None
                key = resolve_api_key(settings.api_key_var)
                settings.model = preflight(settings.base_url, settings.model or None, key)
        external = evaluation.check()  # judge-scored environment, missing packages: refused before anything starts
        if external:
            notes.insert(0, f"note: {settings.nemo_env} needs more than this machine: {'; '.join(external)}.")
        if settings.policy == "endpoint":
            evaluation.use_api_key(key.value)
        if folder is not None:
            folder.open_for_append()
            records, truncated = read_results(folder.results_path, repair=True)
            previous, duplicates, unexpected = dedupe_records(records, set(expected))
            if truncated:
                notes.append(
                    "note: the last line of results.jsonl was cut off (the run was killed while writing it); "
                    "that rollout runs again"
                )
            if duplicates or unexpected:
                notes.append(
                    f"note: ignoring {duplicates} duplicate and {unexpected} unexpected lines in results.jsonl"
                )
        elif args.save:
            from .._eval.evaluation import DEFAULT_OUTPUT_DIR, ResultsFolder

            folder = ResultsFolder.create(args.output_dir or DEFAULT_OUTPUT_DIR, settings.env, settings.model)
            folder.open_for_append()
    except PreflightError as exc:
        return _fail(str(exc), EXIT_USAGE if exc.usage else EXIT_FAILED)
    except MissingRequirementsError as exc:
        env_args = {**settings.env_args, "isolated_venvs": True}
        return _fail(exc.describe(f"add -a '{json.dumps(env_args)}'"), EXIT_FAILED)
    except VerifiersNemoError as exc:
        return _fail(str(exc))

    for note in notes:
        _say(note)
    done = {(int(r["task_index"]), int(r["rollout_index"])) for r in previous}
    pending = [t for t in tasks if (t.task_index, t.rollout_index) not in done]
    if settings.policy == "replay":
        header = f"{settings.nemo_env} with the replay policy (its recorded rollouts answer)"
    else:
        header = f"{settings.nemo_env} with {settings.model} @ {settings.base_url} ({settings.api} API)"
    _say(
        f"Evaluating {header}: {_plural(examples, 'example')} x {_plural(settings.rollouts_per_example, 'rollout')}"
        f" = {len(expected)}"
        + (f" ({len(pending)} to run)" if previous else "")
        + (f"; saving to {folder.path}" if folder else "")
    )
    if settings.policy == "replay":
        known = sorted({t.task_index for t in pending if _replay_note(settings.nemo_env, t.task_index)})
        for task_index in known:
            _say(
                f"note: the recording of task {task_index} is known not to reproduce "
                f"({_replay_note(settings.nemo_env, task_index)}); it is left out of the replay verdict."
            )
    return asyncio.run(_execute(evaluation, pending, previous, folder, metadata, wall_start))


def _show_finished(
    settings: EvalSettings,
    folder: ResultsFolder,
    metadata: dict[str, Any],
    records: list[dict[str, Any]],
    expected: int,
) -> int:
    """``-R`` of a run with nothing left to run: its summary as saved (no endpoint check, no stack, and its
    sessions' real timings), writing nothing unless its status was not ``finished`` yet."""
    sessions = list(metadata.get("sessions", []))
    updated = _metadata(metadata, settings, folder, expected, [_slim(r) for r in records], sessions)
    updated["status"] = "finished"
    if metadata.get("status") != "finished":
        with contextlib.suppress(OSError):
            folder.write_metadata(updated)
    _say(f"Nothing to run: every rollout of {folder.path} is done ({len(records)} of {expected}).")
    print(format_summary(updated), flush=True)
    return _exit_status(updated)


def _exit_status(metadata: Mapping[str, Any]) -> int:
    rollouts = metadata["summary"]["rollouts"]
    if rollouts["total"] and rollouts["scored"] == 0:
        _say(f"{PROG}: every rollout failed ({rollouts['errored']}); see Errors in the summary.")
        return EXIT_FAILED
    return EXIT_OK


def _slim(record: Mapping[str, Any]) -> dict[str, Any]:
    keep = ("task_index", "rollout_index", "reward", "metrics", "usage", "timing", "error", "recorded_reward")
    return {k: record[k] for k in keep if k in record}


async def _execute(
    evaluation: Evaluation,
    pending: list[Any],
    previous: list[dict[str, Any]],
    folder: ResultsFolder | None,
    metadata: dict[str, Any],
    wall_start: float,
) -> int:
    settings = evaluation.settings
    records = [_slim(r) for r in previous]
    progress = _Progress()
    progress.seed(
        [float(r["reward"]) for r in previous if r.get("reward") is not None and not r.get("error")],
        sum(1 for r in previous if r.get("error") or r.get("reward") is None),
    )
    session = {"started_at": evaluation.timing.started_at}
    sessions = [*metadata.get("sessions", []), session]
    metadata = _metadata(metadata, settings, folder, len(evaluation.expected_pairs), records, sessions)
    if folder is not None:
        metadata["status"] = "running"
        folder.write_metadata(metadata)

    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    assert main_task is not None
    received: list[int] = []

    def interrupt(sig: int) -> None:
        if received:  # a second signal: stop now (the stack's supervisor cleans up after us)
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
        received.append(sig)
        _say(f"\n{signal.Signals(sig).name}: stopping (finished rollouts are kept; again to force) ...")
        main_task.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, interrupt, sig)
    failure: str | None = None
    try:
        if not pending:
            _say(f"All {len(previous)} rollouts are already done; nothing to run.")
        else:
            await evaluation.start(progress)
            async for result in evaluation.run(pending, progress, done=len(previous)):
                record = evaluation.record_of(result)
                if folder is not None:
                    folder.append(record)
                records.append(_slim(record))
    except asyncio.CancelledError:
        if not received:
            raise
        main_task.uncancel()
    except VerifiersNemoError as exc:  # the stack could not start, a requirement is missing ...
        failure = str(exc)
    finally:
        progress.close()
        with contextlib.suppress(Exception):
            await asyncio.shield(evaluation.aclose())
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)

    timing = evaluation.timing
    session.update(
        wall_s=time.monotonic() - wall_start,
        stack_start_s=timing.stack_start_s,
        rollouts=timing.rollouts,
        rollouts_s=timing.rollouts_s,
    )
    metadata = _metadata(metadata, settings, folder, len(evaluation.expected_pairs), records, sessions)
    missing = metadata["counts"]["missing"]
    status = "interrupted" if received else "failed" if failure else "finished" if not missing else "incomplete"
    metadata["status"] = status
    if folder is not None:
        folder.write_metadata(metadata)

    if failure is not None:
        _say(f"{PROG}: error: {failure}")
    if records:
        print(format_summary(metadata), flush=True)
    if received:
        hint = f" Resume with: {PROG} eval -R {folder.path}" if folder is not None else " (use -s to be able to resume)"
        _say(f"Interrupted: {len(records)} of {metadata['counts']['expected']} rollouts done.{hint}")
        return 128 + received[0]
    if failure is not None:
        return EXIT_FAILED
    return _exit_status(metadata)


def _metadata(
    base: Mapping[str, Any],
    settings: EvalSettings,
    folder: ResultsFolder | None,
    expected: int,
    records: list[dict[str, Any]],
    sessions: list[dict[str, Any]],
) -> dict[str, Any]:
    from .._eval.evaluation import replay_agreement, summarize, timing_summary

    now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    summary = summarize(
        records, rollouts_per_example=settings.rollouts_per_example, pass_threshold=settings.pass_threshold
    )
    current = sessions[-1] if sessions else {}
    summary["timing"] = timing_summary(sessions, current.get("wall_s") or 0.0)
    agreement = replay_agreement(records, known=lambda row: _replay_note(settings.nemo_env, row))
    if agreement is not None:
        summary["replay"] = agreement
    return {
        "run_id": folder.run_id if folder else None,
        "path": str(folder.path) if folder else None,
        "env": settings.nemo_env,
        "model": settings.model,
        "status": base.get("status"),
        "created_at": base.get("created_at") or now,
        "updated_at": now,
        "versions": base.get("versions") or _versions(),
        "settings": settings.to_dict(),
        "counts": {"expected": expected, "done": len(records), "missing": max(0, expected - len(records))},
        "sessions": sessions,
        "summary": summary,
    }


def _versions() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in ("verifiers-nemo", "nemo-gym"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def format_summary(metadata: Mapping[str, Any]) -> str:
    """The printed end-of-run summary."""
    s, settings, counts = metadata["summary"], metadata["settings"], metadata["counts"]
    rollouts, reward, timing = s["rollouts"], s["reward"], s["timing"]
    lines = ["", "=" * 72]

    def row(label: str, *parts: str) -> None:
        lines.append(f"{label:<13}" + " · ".join(parts))

    where = f"@ {settings['base_url']}" if settings.get("base_url") else f"(policy {settings['policy']})"
    row("Environment", metadata["env"])
    row("Model", f"{metadata['model']} {where}")
    row(
        "Rollouts",
        f"{rollouts['total']} of {counts['expected']} "
        f"({_plural(rollouts['examples'], 'example')} x {settings['rollouts_per_example']})",
        f"{rollouts['scored']} scored",
        f"{rollouts['errored']} errored",
    )
    row("Reward", *(f"{name} {_fmt(reward[name])}" for name in ("avg", "std", "min", "max")))
    if len(s["reward_by_rollout_index"]) > 1:
        row("  by repeat", "[" + ", ".join(_fmt(v) for v in s["reward_by_rollout_index"]) + "]")
    if s["pass_at_k"]:
        row("pass@k", *(f"pass@{k} {_fmt(v)}" for k, v in s["pass_at_k"].items()))
        row("pass^k", *(f"pass^{k} {_fmt(v)}" for k, v in s["pass_power_k"].items()))
        partial = [f"k={k}: {n}" for k, n in s["pass_k_examples"].items() if n < rollouts["examples"]]
        note = f"; over examples with >= k scored rollouts ({', '.join(partial)})" if partial else ""
        row("", f"correct = reward >= {s['pass_threshold']:g}{note}")
    if s["metrics"]:
        row("Metrics", _wrap([f"{k} {_fmt(v)}" for k, v in s["metrics"].items()], 13))
    errors = s["errors_by_type"]
    row("Errors", ", ".join(f"{k}: {v}" for k, v in errors.items()) if errors else "none")
    for kind, message in s.get("error_examples", {}).items():
        row("", f"{kind}, e.g.: {message}")
    usage = s["usage"]
    token_keys = ("input_tokens", "output_tokens", "total_tokens", "cached_tokens", "reasoning_tokens")
    if usage:
        row("Tokens", *(f"{k.removesuffix('_tokens')} {usage[k]:,}" for k in token_keys if k in usage))
    rate = timing.get("rollouts_per_s")
    sessions = timing.get("sessions", 1)
    row(
        "Timing",
        f"wall {_fmt_s(timing.get('wall_s'))}",
        f"stack start {_fmt_s(timing.get('stack_start_s'))}",
        f"{_fmt(rate, 2) if rate else 'n/a'} rollouts/s",
        f"mean rollout {_fmt_s(s['latency']['mean_rollout_s'])}",
        *([f"{sessions} sessions, {_fmt_s(timing['total_wall_s'])} in all"] if sessions > 1 else []),
    )
    replay = s.get("replay")
    if replay:
        verdict = "all reproduced" if replay["reproduced"] == replay["compared"] else "MISMATCH"
        row(
            "Replay",
            f"{replay['reproduced']}/{replay['compared']} rewards equal the recorded ones ({verdict})",
        )
        for m in replay["mismatches"][:5]:
            row("", f"task {m['task_index']} rollout {m['rollout_index']}: reward {m['reward']}, "
                f"recorded {m['recorded_reward']}")  # fmt: skip
        known = replay.get("known_unreproducible") or []
        if known:
            tasks = sorted({k["task_index"] for k in known})
            row(
                "",
                f"left out: {_plural(len(known), 'rollout')} of {'task' if len(tasks) == 1 else 'tasks'} "
                f"{', '.join(map(str, tasks))}, whose recording is known not to reproduce ({known[0]['reason']})",
            )
    if metadata.get("path"):
        row("Results", metadata["path"])
    row("Status", _status_line(metadata))
    lines.append("=" * 72)
    return "\n".join(lines)


def _status_line(metadata: Mapping[str, Any]) -> str:
    rollouts, counts = metadata["summary"]["rollouts"], metadata["counts"]
    status = metadata.get("status") or "finished"
    if rollouts["total"] and not rollouts["scored"]:
        return f"FAILED: all {rollouts['total']} rollouts failed"
    text = {"interrupted": "INTERRUPTED", "failed": "FAILED", "incomplete": "INCOMPLETE"}.get(status, "finished")
    if counts["missing"]:
        text += f", {counts['missing']} of {counts['expected']} rollouts not run"
    if rollouts["errored"]:
        text += f"; PARTIAL FAILURE: {rollouts['errored']} of {rollouts['total']} rollouts failed"
        text += " (counted under Errors, left out of reward and pass@k)"
    return text


def _wrap(items: list[str], indent: int, width: int = 100) -> str:
    lines, current = [], ""
    for item in items:
        candidate = f"{current} · {item}" if current else item
        if current and indent + len(candidate) > width:
            lines.append(current)
            current = item
        else:
            current = candidate
    lines.append(current)
    return ("\n" + " " * indent).join(lines)


# ---------------------------------------------------------------------------------------------
# envs


def _cmd_replay_server(args: argparse.Namespace) -> int:
    from .._upstreams.replay_server import replay_upstream, serve_forever

    if not args.env and not args.jsonl_path:
        return _fail("name the environment whose recorded rollouts to serve (ENV), or pass --jsonl-path FILE.")
    try:
        upstream = replay_upstream(args.env, jsonl_path=args.jsonl_path)
    except VerifiersNemoError as exc:
        return _fail(str(exc))
    return serve_forever(upstream, nemo_env=args.env, port_file=args.port_file)


def _cmd_envs(args: argparse.Namespace) -> int:
    from .._gym.catalogue import list_environments

    try:
        environments = list_environments()
    except VerifiersNemoError as exc:
        return _fail(str(exc), EXIT_FAILED)
    total = len(environments)
    runnable_count = sum(e.runs_offline_with_nemo_gym_only for e in environments)
    if args.filter:
        environments = [e for e in environments if args.filter.lower() in e.name.lower()]
    if args.runnable:
        environments = [e for e in environments if e.runs_offline_with_nemo_gym_only]
    if args.recorded:
        environments = [e for e in environments if e.has_example_rollouts]
    rows = [_env_row(e) for e in environments]
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    columns = [  # title, key, widest it may get
        ("NAME", "name", 48),
        ("AGENT", "agent", 24),
        ("DATASETS", "datasets", 36),
        ("EXTRA DEPS", "extra_deps", 32),
        ("NEEDS", "needs", 15),
        ("RECORDED", "recorded", 8),
    ]
    table = [[_cell(row[key]) + _dagger(row, key) for _, key, _ in columns] for row in rows]
    widths = [min(cap, max([len(title), *(len(r[i]) for r in table)])) for i, (title, _, cap) in enumerate(columns)]
    print("  ".join(title.ljust(w) for (title, _, _), w in zip(columns, widths, strict=True)).rstrip())
    for r in table:
        print("  ".join(_clip(cell, w).ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    print(
        f"\n{len(rows)} shown of {total} environments ({PROG} envs --json for all details); "
        f"{runnable_count} need nothing beyond nemo-gym (--runnable).\n"
        "* not shipped: nemo-gym downloads it. NEEDS: judge = scores with a model server; "
        "external = a service, credential or download.\n"
        "† its recordings cannot reproduce their rewards (why: --json, replay_not_reproducible).\n"
        f"Run one: {PROG} eval NAME (replays its recorded rollouts; add -b URL -m MODEL for a model)"
    )
    return EXIT_OK


def _env_row(env: Any) -> dict[str, Any]:
    needs = [n for n, flag in (("judge", env.needs_judge), ("external", env.needs_external)) if flag]
    agent = env.default_agent
    return {
        "name": env.name,
        "agent": agent.type if agent else None,
        "datasets": _dataset_names(env.datasets),
        "extra_deps": list(env.requirements),
        "needs": needs,
        "recorded": env.has_example_rollouts,
        "replay_not_reproducible": _replay_note(env.name),
        "runnable": env.runs_offline_with_nemo_gym_only,
        "judge_models": list(env.judge_models),
        "external_reasons": list(env.external_reasons),
    }


def _dagger(row: dict[str, Any], key: str) -> str:
    return "†" if key == "recorded" and row["recorded"] and row["replay_not_reproducible"] else ""


def _replay_note(name: str, row: int | None = None) -> str | None:
    """Why the recordings of ``name`` (all of them; with ``row``, also that one's) cannot reproduce."""
    from .._upstreams.replay import unreproducible_reason

    return unreproducible_reason(name, row)


def _dataset_names(datasets: Sequence[Any]) -> list[str]:
    """Dataset names, ``*`` marking those not shipped with nemo-gym (it downloads them)."""
    shipped: dict[str, bool] = {}
    for dataset in datasets:
        shipped[dataset.name] = shipped.get(dataset.name, False) or dataset.exists
    return [name if present else f"{name}*" for name, present in shipped.items()]


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "-"
    if isinstance(value, list):
        return ", ".join(str(v) for v in dict.fromkeys(value)) or "-"
    return "-" if value is None else str(value)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


if __name__ == "__main__":
    sys.exit(main())
