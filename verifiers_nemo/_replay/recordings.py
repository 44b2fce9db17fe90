"""The recorded rollouts the replay policy plays back, and which of them cannot reproduce (and why).

Each packaged environment ships ``data/example_rollouts.jsonl``: task inputs, the full
``response.output`` a real model produced, and the reward Gym gave it. Serving those outputs step
by step through the real stack (routing proxy, Gym agent, resources server, ``/verify``) must
reproduce each recorded reward: a check of the whole pipeline against data nobody here wrote,
with no GPU.

A step is the recorded output items from where the agent is (the outputs it already sends back)
up to the next ``function_call_output`` (which the agent produces itself by calling the tool).
Each route's endpoint names its recorded row in a header; without it, the row is found by the
request's original input and the outputs so far.

The server that plays them is ``server.ReplayServer``; judge calls are answered from the judge I/O the
recordings carry (``judge_book``), matched on what the judge is asked.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from .._gym.releases import series_of

logger = logging.getLogger(__name__)

ROW_HEADER = "X-Verifiers-Nemo-Replay-Row"

_NOT_SHIPPED = (
    "its recordings are of tasks that are not in any shipped dataset file, and recordings do not "
    "keep the ground truth /verify needs ({fields})"
)
KNOWN_UNREPRODUCIBLE: dict[str, str] = {
    # Measured on nemo-gym 0.4.0 over every environment the catalogue marks as needing nothing
    # beyond nemo-gym (no judge, no external service). Keyed by environment, or "env#row".
    "blackjack": "an unseeded card game: replayed actions meet different cards, so episodes differ",
    "gymnasium": "a base class for gymnasium-style servers, not a runnable environment (it exits at start)",
    "indirect_prompt_injection": _NOT_SHIPPED.format(fields="environment, injection, verifier_config"),
    "math_advanced_calculations": _NOT_SHIPPED.format(fields="ground_truth"),
    "ruler": _NOT_SHIPPED.format(fields="outputs"),
    "workplace_assistant": _NOT_SHIPPED.format(fields="ground_truth"),
    "equivalence_rule#2": (
        "the recording ends in a reasoning item with no message and no incomplete_details, so the "
        "agent asks for another step the recording does not have"
    ),
}
"""Recordings that cannot reproduce their reward from the packaged data, and why."""

_NO_JUDGE_IO = "its recordings keep no judge I/O ({what}), so the judge calls cannot be answered"
_OLD_JUDGE_PROMPT = (
    "its recorded judge requests were built from an older judge prompt than the shipped one, so no "
    "replayed judge request matches a recording"
)
JUDGE_UNREPRODUCIBLE: dict[str, str] = {
    # Measured on nemo-gym 0.4.0 over every environment whose default config needs a judge and ships
    # recordings: each recorded row's /verify run with its judge calls answered by judge_endpoint().
    "arena_judge": (
        "its recordings keep the two judgements only as texts (judgement_gen_base, judgement_base_gen), "
        "whose prompts differ only in the order of the two answers, so they are not matched"
    ),
    "finance_sec_search": _NO_JUDGE_IO.format(what="only the judge's text, and not its retrieval model's calls"),
    "gdpval": _NO_JUDGE_IO.format(what="judge_response is null"),
    "omniscience": (
        "its recordings are of tasks that are not in any shipped dataset file, and the recorded rows "
        "carry verify outputs (verdict, is_correct, ...) that its /verify rejects when sent back"
    ),
    "proof_judge": _NO_JUDGE_IO.format(what="only the response and reward"),
    "proof_verification": _NO_JUDGE_IO.format(what="only the response and reward"),
    "terminus_judge": _OLD_JUDGE_PROMPT,
    "text_to_sql": _OLD_JUDGE_PROMPT,
    "verifif": _NO_JUDGE_IO.format(what="only each validator's verdict; its judge is called by its own client"),
    "simpleqa#3": (
        "the recorded judge text ('After reviewing ..., the grade is B.') reads as grade A to the shipped "
        "parser (it takes the first letter), so the replayed reward is 1, not the recorded 0"
    ),
    "simpleqa#4": "the recorded judge text reads as grade A to the shipped parser (see simpleqa#3)",
}
"""Judge environments whose recordings cannot reproduce their reward with the judge replayed, and why."""


_UNSEEDED_LEVELS = (
    "its recordings keep no seed and match no shipped row (the dataset's {fields} are not in them), so /reset "
    "draws another level and the recorded moves run out (the replay answers 409)"
)
PACKAGES_UNREPRODUCIBLE: dict[str, str] = {
    # Measured on nemo-gym 0.4.0 over every environment that needs extra packages (and no external
    # service) and ships recordings, each replayed through the real stack with its packages installed.
    "grl_sokoban": _UNSEEDED_LEVELS.format(fields="seed, level_id"),
    "grl_tetris": _UNSEEDED_LEVELS.format(fields="seed, game_id"),
    "structured_outputs": _NOT_SHIPPED.format(fields="schema_str"),
    "scicode": "its Gym agent answers HTTP 500 from a server it calls itself on every recorded row (not investigated)",
    "math_with_judge#1": (
        "the recording says its symbolic check passed (library_reward 1.0, no judge call) on an answer with "
        "powers up to 4033; the shipped check scores the replayed answer 0 here (cause not investigated)"
    ),
}
"""Environments with extra packages whose recordings do not reproduce their reward, and why."""


RELEASE_DIFFERENCES: dict[str, dict[str, str | None]] = {
    # Measured on nemo-gym 0.7.0 (every offline environment replayed row by row against 0.7.0's recordings):
    # where a release differs from the tables above (measured on 0.4.0). None: it reproduces there.
    "0.7": {
        "equivalence_rule#2": None,
        "lc_niah": (
            "its recordings were scored with the overlap_lcs metric; nemo-gym 0.7.0's config scores with NGRAM16, "
            "so the replayed rewards differ (with ++lc_niah.resources_servers.lc_niah.overlap_metric_rule=lcs "
            "they reproduce)"
        ),
        "openair_congestion": (
            "its recordings come from a scripted policy: response.output holds one noop call while the episode's "
            "actions are in a trajectory field, so the replay runs out after the first step (409)"
        ),
        "aegis_v4_safety": (
            "its recordings keep the judge's I/O under judge_evaluation, which matches no replayed judge request: "
            "Gym masks every row (judge_failed)"
        ),
        "longmemeval": "replayed with its judge, every row scores 0.0 against its recorded reward (not investigated)",
        "toolsandbox": (
            "replayed, its agent asks for a model turn after the recording's last on every row (the replay answers "
            "409): the conversation its resources server's user simulator drives is not the recorded one (not "
            "investigated further)"
        ),
        "conversational_tool_use_simulation": (
            "its recordings keep no I/O of its simulator model (the simulated user and tools that answer the agent "
            "every turn: the judge-like simulator_model), so the replay cannot answer those calls"
        ),
    },
}
"""Per nemo-gym release series, how its replay differs from the tables above (measured on 0.4.0)."""


def unreproducible_reason(env: str, row: int | None = None, gym_version: str | None = None) -> str | None:
    """Why ``env`` (or one recorded row of it) cannot be replayed on nemo-gym ``gym_version`` (default: the
    Gym runtime's), if it is known not to. (A resources server named explicitly, ``resources_servers/NAME``, is
    known by its name.)"""
    env = env.removeprefix("resources_servers/")
    keys = [env] if row is None else [f"{env}#{row}", env]
    differences = RELEASE_DIFFERENCES.get(series_of(gym_version or _runtime_version()) or "", {})
    tables = (KNOWN_UNREPRODUCIBLE, JUDGE_UNREPRODUCIBLE, PACKAGES_UNREPRODUCIBLE)
    for key in keys:
        if key in differences:
            if differences[key] is not None:
                return differences[key]
            continue
        for known in tables:
            if key in known:
                return known[key]
    return None


def _runtime_version() -> str | None:
    from .._exceptions import GymRuntimeError
    from .._gym import find_gym_runtime

    try:
        return find_gym_runtime(build=False).nemo_gym_version
    except GymRuntimeError:
        return None


REPLAY_MODEL = "replay"
ZERO_USAGE = {
    "input_tokens": 0,
    "output_tokens": 0,
    "total_tokens": 0,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens_details": {"reasoning_tokens": 0},
}


def as_items(value: Any) -> list[Any]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return list(value or [])


def written_by_agent(item: dict[str, Any]) -> bool:
    """Items the Gym agent adds itself: tool results, and observations sent back as user messages."""
    return item.get("type") == "function_call_output" or (
        item.get("type", "message") == "message" and item.get("role") in ("user", "system", "developer")
    )


@dataclass(frozen=True)
class Recording:
    """One recorded rollout: the original input, the model's full output, how the last call ended."""

    input: list[Any]
    output: list[dict[str, Any]]
    incomplete_details: dict[str, Any] | None = None

    def step(self, done: int) -> tuple[list[dict[str, Any]], bool] | None:
        """The items the model produced after ``done`` output items, up to what the agent adds
        next (a tool result or an observation), and whether this is the recording's last step."""
        if done >= len(self.output):
            return None
        end = done
        while end < len(self.output) and not written_by_agent(self.output[end]):
            end += 1
        if end == done:
            return None
        return self.output[done:end], end == len(self.output)
