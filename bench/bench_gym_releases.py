"""nemo-gym 0.4 vs 0.7 as the Gym runtime, side by side in one process: warm stack start, and what the environment
server in front of a 0.7 agent costs a rollout.

    .venv/bin/python bench/bench_gym_releases.py [--env example_single_tool_call] [--repeats 3] [--rollouts 60]

Needs `.venv-gym07` (`bash .ci/setup-gym07`: test-only, nemo-gym 0.7.0 on Python 3.13.0 with resolution told
3.13.14). Start: the two runtimes alternate (same load for both); "head" = the process's first stack (it starts
the shared Ray head), "joined" = a second stack while a keeper holds the head (another env, or a restart).
Hop: the same recorded rollouts, one at a time (the replay policy answers at once), posted to the 0.7 stack's
environment server (as Gym's collector does) or straight to its agent (``agent_urls=``), alternating in rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import add_json_flag, write_json  # noqa: E402

from verifiers_nemo import NeMoGymHarness, NeMoGymTaskset, ReplayServer  # noqa: E402
from verifiers_nemo._gym import find_gym_runtime, get_environment  # noqa: E402
from verifiers_nemo._stack import GymStack, StackConfig  # noqa: E402

RUNTIMES = {"0.4": str(ROOT / ".venv" / "bin" / "python"), "0.7": str(ROOT / ".venv-gym07" / "bin" / "python")}


def _stack(env: str, gym_python: str) -> GymStack:
    config = get_environment(env, find_gym_runtime(gym_python).root).default_config
    assert config is not None
    return GymStack(StackConfig(env, (config.path,), "http://127.0.0.1:9", gym_python=gym_python))


def _start(env: str, gym_python: str) -> float:
    stack = _stack(env, gym_python)
    started = time.monotonic()
    stack.start()
    ready = time.monotonic() - started
    stack.stop()
    return ready


def starts(env: str, repeats: int) -> dict[str, dict[str, list[float]]]:
    times: dict[str, dict[str, list[float]]] = {v: {"head": [], "joined": []} for v in RUNTIMES}
    for python in RUNTIMES.values():
        _start(env, python)  # unmeasured: imports and bytecode warm
    for _ in range(repeats):
        for version, python in RUNTIMES.items():
            times[version]["head"].append(_start(env, python))
    keepers = [_stack(env, python) for python in RUNTIMES.values()]
    for keeper in keepers:
        keeper.start()
    try:
        for _ in range(repeats):
            for version, python in RUNTIMES.items():
                times[version]["joined"].append(_start(env, python))
    finally:
        for keeper in keepers:
            keeper.stop()
    return times


async def hop(env: str, rollouts: int) -> dict[str, list[float]]:
    python = RUNTIMES["0.7"]
    tasks = NeMoGymTaskset(env, recorded=True, root=find_gym_runtime(python).root)
    latencies: dict[str, list[float]] = {"environment server": [], "agent directly": []}
    with ReplayServer.from_tasks(tasks) as replay:
        relayed = NeMoGymHarness(env, gym_python=python)
        async with relayed:
            agent = relayed.stack.info().agent_names[0]
            direct = NeMoGymHarness(env, gym_python=python, agent_urls={agent: relayed.stack.agent_url(agent)})
            async with direct:
                for round_ in range(rollouts // len(tasks) + 1):
                    for name, harness in (("environment server", relayed), ("agent directly", direct)):
                        for task in tasks:
                            result = await harness.rollout(task, replay.endpoint_for(task))
                            assert result.error is None, result.error
                            if round_:  # the first round warms connections
                                latencies[name].append(result.timing["rollout_s"])
    return latencies


def _print_starts(env: str, repeats: int, times: dict[str, dict[str, list[float]]]) -> None:
    print(f"\nwarm stack start to ready (s), {env}, runtimes alternating, {repeats} each")
    print(f"{'nemo-gym':<10}{'start':<8}{'median':>8}{'min':>8}{'max':>8}")
    for version, kinds in times.items():
        for kind, values in kinds.items():
            print(f"{version:<10}{kind:<8}{statistics.median(values):>8.2f}{min(values):>8.2f}{max(values):>8.2f}")
    for kind in ("head", "joined"):
        ratio = statistics.median(times["0.7"][kind]) / statistics.median(times["0.4"][kind])
        print(f"{kind}: 0.7 / 0.4 = x{ratio:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="example_single_tool_call")
    parser.add_argument("--repeats", type=int, default=3, help="stack starts per runtime and kind (0: none)")
    parser.add_argument("--rollouts", type=int, default=60)
    add_json_flag(parser)
    args = parser.parse_args()
    if not Path(RUNTIMES["0.7"]).exists():
        sys.exit("bench_gym_releases: .venv-gym07 is missing; run `bash .ci/setup-gym07` first")

    times = starts(args.env, args.repeats) if args.repeats else {}
    if times:
        _print_starts(args.env, args.repeats, times)
    latencies = asyncio.run(hop(args.env, args.rollouts))
    print(f"\none rollout at a time on nemo-gym 0.7 ({args.env}, replay policy), ms")
    print(f"{'posted to':<22}{'n':>5}{'p50':>8}{'mean':>8}")
    for name, values in latencies.items():
        print(f"{name:<22}{len(values):>5}{statistics.median(values) * 1e3:>8.1f}{statistics.mean(values) * 1e3:>8.1f}")
    extra = statistics.median(latencies["environment server"]) - statistics.median(latencies["agent directly"])
    print(f"the environment server's hop: {extra * 1e3:+.1f} ms a rollout (p50 difference)")
    write_json(
        args.json,
        {
            "start_s": {v: {k: statistics.median(x) for k, x in kinds.items()} for v, kinds in times.items()},
            "hop_ms_p50": {k: statistics.median(v) * 1e3 for k, v in latencies.items()},
        },
    )


if __name__ == "__main__":
    main()
