"""`nemo-gym-env` served the way prime-rl serves an environment: verifiers 0.4.0's env server (`serve_env`,
its elastic `EnvServerPool` of spawned worker processes, one Gym stack each) and, in another process, the
orchestrator's side (an `EnvClient` that loads the taskset itself and sends each episode its task's data).

Everything verifiers runs in `.venv-vf` (no nemo-gym); the Gym runtime is this interpreter. The model is the
replay policy on 127.0.0.1 (recorded rows, so every recorded reward must come back). The module's server is
grown to two workers under load, then has one worker's Gym agent killed, then one worker killed, then is
stopped: the tests run in that order on it (pytest's file order).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.env_server_harness import (
    MARK_VAR,
    EpisodeClient,
    ServedEnv,
    env_config,
    in_sessions,
    stdin_writers,
    wait_for,
)
from tests.e2e.test_verifiers_env import VERIFIERS_RELEASES, VF_PYTHON, _environ, verifiers_python
from verifiers_nemo._replay.serve import replay_server

pytestmark = pytest.mark.e2e

NEMO_ENV = "example_multi_step"
LOAD_EPISODES = 120
MULTIPLEX = 8  # the pool's scale-up trigger: a second worker once 90% of 1 x 8 episodes are in flight
BATCH_S = 900  # a busy 2-core machine: starting a worker (verifiers' import + a Gym stack) can take minutes
HUNG_AFTER_S = 20.0
"""The client-side bound on an episode in the worker-death test: far above any episode a live worker serves
here (measured: the slowest 1 s, on a busy CI machine a few), so an episode not back by then was lost with its
worker (verifiers 0.4.0 never answers it). The test waits this long for those, idle: it was 120 s, then 45 s."""


def docs_eval_source() -> dict[str, Any]:
    """The env config of the first `[[eval.source]]` of prime-rl's `eval.toml` in docs/guides/verifiers.md, as
    prime-rl's launcher hands it to the source's env server."""
    import re
    import tomllib

    guide = (Path(__file__).resolve().parents[2] / "docs" / "guides" / "verifiers.md").read_text()
    [block] = [b for b in re.findall(r"```toml\n(.*?)```", guide, re.DOTALL) if "[[eval.source]]" in b]
    env = tomllib.loads(block)["eval"]["source"][0]["env"]
    return {"taskset": env["taskset"], "agent": env["agent"]}


@pytest.fixture(scope="module")
def vf_python() -> Path:
    if not VF_PYTHON.exists():
        pytest.fail(f"{VF_PYTHON} is missing: `bash .ci/setup-tests` builds the verifiers venv these tests run in")
    return VF_PYTHON


@pytest.fixture(scope="module")
def replay_url() -> Iterator[str]:
    server = replay_server(NEMO_ENV)
    server.start()
    try:
        yield f"{server.url}/v1"
    finally:
        server.stop()


@dataclass
class Grown:
    served: ServedEnv
    client: EpisodeClient
    load: list[dict[str, Any]]
    load_s: float
    workers: list[int]
    footprints: dict[int, dict[str, set]]
    sessions: dict[int, set[int]] = field(default_factory=dict)


@pytest.fixture(scope="module")
def grown(vf_python: Path, replay_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Grown]:
    """An elastic pool (at most 2 workers, multiplex 8) grown under 120 episodes in flight at once, serving the env
    config of prime-rl's eval source in docs/guides/verifiers.md (the replay server as its model)."""
    tmp = tmp_path_factory.mktemp("env-server")
    config = docs_eval_source()
    assert config == env_config(NEMO_ENV, recorded=True)
    served = ServedEnv(tmp, config, pool="elastic", workers=2, multiplex=MULTIPLEX)
    client = None
    try:
        client = EpisodeClient(tmp, served.address, config, replay_url)
        sent = client.send("load", LOAD_EPISODES)  # no client-side timeout: prime-rl sets none
        load = client.wait_episodes("load", LOAD_EPISODES, BATCH_S)
        load_s = time.monotonic() - sent
        workers = served.workers()
        run = Grown(served, client, load, load_s, workers, {w: served.footprint(w) for w in workers})
        run.sessions = {w: served.stack_sessions(w) for w in workers}
        yield run
    finally:
        if client is not None:
            client.close()
        served.kill()


def _by_worker(grown: Grown, episodes: list[dict[str, Any]]) -> dict[int | None, list[dict[str, Any]]]:
    ids = {w: grown.served.trace_ids(w) for w in grown.workers}
    out: dict[int | None, list[dict[str, Any]]] = {}
    for episode in episodes:
        worker = next((w for w, seen in ids.items() if episode.get("trace_id") in seen), None)
        out.setdefault(worker, []).append(episode)
    return out


def _recorded_reward_back(episode: dict[str, Any]) -> bool:
    return episode["outcome"] == "ok" and episode["reward"] == pytest.approx(episode["recorded_reward"])


# -- the orchestrator's side ----------------------------------------------------------------------------


@pytest.mark.parametrize("release", VERIFIERS_RELEASES)
def test_orchestrator_loads_the_taskset_without_starting_anything(release: str, tmp_path: Path) -> None:
    """prime-rl's orchestrator imports the environment package and loads its taskset itself: no Gym
    stack, no Ray, no process of any kind, and nemo-gym is never imported (it is not in this venv). With verifiers
    0.4.0 and with the pre-release (whose ``verifiers.v1`` imports its parts when first named)."""
    import json
    import subprocess

    from tests.faults.helpers import pids_with_env

    marker = os.urandom(8).hex()
    script = (
        "import json, sys, time\n"
        "t0 = time.monotonic()\n"
        "import verifiers.v1 as vf\n"
        "vf.resolve_env_config, vf.load_taskset  # the pre-release imports them here, 0.4.0 above\n"
        "t1 = time.monotonic()\n"
        "config = vf.resolve_env_config(json.loads(sys.argv[1]))\n"
        "tasks = list(vf.load_taskset(config.taskset))\n"
        "t2 = time.monotonic()\n"
        "print(json.dumps({'tasks': len(tasks), 'verifiers_import_s': t1 - t0, 'load_s': t2 - t1,\n"
        "  'modules': sorted(m for m in sys.modules if m.split('.')[0] in ('nemo_gym', 'ray', 'verifiers_nemo'))}),"
        " flush=True)\n"
        "sys.stdin.read()\n"
    )
    config = env_config(NEMO_ENV, recorded=True)
    proc = subprocess.Popen(
        [str(verifiers_python(release)), "-c", script, json.dumps(config)],
        env=_environ({MARK_VAR: marker}),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        loaded = json.loads(line)
        # Still running, having loaded: the only process with its marker is itself.
        assert [pid for pid in pids_with_env(marker) if pid != proc.pid] == []
    finally:
        proc.kill()
        proc.wait()
    assert loaded["tasks"] == 5
    assert not [m for m in loaded["modules"] if m.split(".")[0] in ("nemo_gym", "ray")], loaded["modules"]
    # How long resolving the config and loading the rows took is printed, not asserted (a busy machine makes it 30 s
    # and more: seen with 8 busy loops on 2 cores, under both releases).
    print(f"orchestrator side: verifiers import {loaded['verifiers_import_s']:.1f}s, load {loaded['load_s']:.2f}s")


# -- the elastic pool under load ------------------------------------------------------------------------


def test_elastic_pool_grows_to_two_workers_and_every_recorded_reward_comes_back(grown: Grown) -> None:
    assert len(grown.load) == LOAD_EPISODES
    assert all(_recorded_reward_back(e) for e in grown.load), [
        (e["i"], e["outcome"], e.get("errors")) for e in grown.load if not _recorded_reward_back(e)
    ][:5]
    broker_log = grown.served.log(grown.served.pid)
    assert "EnvServerPool scaled up to 2/2 workers" in broker_log, grown.served.tail()
    assert len(grown.workers) == 2, grown.workers
    by_worker = _by_worker(grown, grown.load)
    assert None not in by_worker, "an episode whose trace no worker logged"
    assert sorted(len(by_worker.get(w, [])) for w in grown.workers)[0] > 0, "one worker ran no episode"
    print(
        f"{LOAD_EPISODES} episodes in {grown.load_s:.0f}s over workers "
        f"{ {w: len(by_worker.get(w, [])) for w in grown.workers} }"
    )


def test_each_worker_has_its_own_gym_stack_on_the_machine_s_one_ray_head(grown: Grown) -> None:
    """Ports, run folders and log folders: each worker's own, none shared; the Ray head: one, the machine's, joined
    by both (the pool grew without starting a second one)."""
    first, second = (grown.footprints[w] for w in grown.workers)
    for what in ("ports", "run_dirs", "log_dirs"):
        assert first[what] and second[what], (what, first[what], second[what])
        assert not first[what] & second[what], (what, first[what] & second[what])
    assert len(first["ray_heads"]) == 1 and first["ray_heads"] == second["ray_heads"], (first, second)
    for worker in grown.workers:
        assert all(f"-{worker}-" in d for d in grown.footprints[worker]["run_dirs"]), grown.footprints[worker]
        # Each stack is its worker's alone: its supervisor reads a pipe no other process but the worker holds.
        assert [stdin_writers(leader) for leader in grown.sessions[worker]] == [{worker}], grown.sessions[worker]
    assert grown.sessions[grown.workers[0]] and not grown.sessions[grown.workers[0]] & grown.sessions[grown.workers[1]]


# -- two environments, two servers, at once -------------------------------------------------------------


def test_two_environments_are_served_by_two_servers_at_once(grown: Grown, tmp_path: Path) -> None:
    """A training mix: a second server (prime-rl's default pool) for example_single_tool_call runs beside
    the module's example_multi_step server; both serve at the same time and each reproduces its rewards."""
    other = "example_single_tool_call"
    config = env_config(other, recorded=True)
    replay = replay_server(other)
    replay.start()
    served = ServedEnv(tmp_path / "second", config, pool="elastic", workers=None)
    client = None
    try:
        client = EpisodeClient(tmp_path, served.address, config, f"{replay.url}/v1", name="second")
        grown.client.send("mix", 20)
        client.send("mix", 20)
        mine = grown.client.wait_episodes("mix", 20, BATCH_S)
        theirs = client.wait_episodes("mix", 20, BATCH_S)
        assert all(_recorded_reward_back(e) for e in mine + theirs), [
            (e["outcome"], e.get("errors")) for e in mine + theirs if not _recorded_reward_back(e)
        ][:5]
        assert len(served.workers()) == 1
        ours = {d for w in grown.workers for d in grown.served.footprint(w)["ports"]}
        assert not ours & served.footprint(served.workers()[0])["ports"]
    finally:
        if client is not None:
            client.close()
        served.stop()
        replay.stop()
    assert wait_for(lambda: not served.left_behind(), 60, "the second server's processes gone") is True


# -- failures come back --------------------------------------------------------------------------------


def test_killed_gym_agent_loses_no_episode_and_later_ones_succeed(grown: Grown) -> None:
    """SIGKILL the Gym agent of one worker's stack while 40 episodes are in flight: every episode comes back
    (none hangs, none lost). A `/run` the death dropped is resubmitted once after the restart (measured: 0 of 40
    failed); one that failed anyway carries the typed reason `gym_server_down`. The other worker is untouched;
    the stack restarts and a later batch reproduces every recorded reward."""
    victim, bystander = grown.workers
    agent = grown.served.agent_pid(victim)
    assert agent is not None, "no Gym agent process found under the worker"
    grown.client.send("agent-kill", 40)
    grown.client.wait_episodes("agent-kill", 2, BATCH_S)
    os.kill(agent, signal.SIGKILL)
    episodes = grown.client.wait_episodes("agent-kill", 40, BATCH_S)

    by_worker = _by_worker(grown, episodes)
    failed = [e for e in episodes if e["outcome"] != "ok"]
    said = [(e["i"], e["outcome"], e.get("gym_error"), e.get("errors") or e.get("error")) for e in failed]
    assert all(e["outcome"] == "failed" and e["gym_error"] == "gym_server_down" for e in failed), said
    assert all(any("gym_server_down" in error for error in e["errors"]) for e in failed), said
    assert all(_recorded_reward_back(e) for e in by_worker.get(bystander, [])), "the other worker was disturbed"
    assert all(_recorded_reward_back(e) for e in episodes if e["outcome"] == "ok")

    # The stack restarts when a rollout finds it dead: one in flight at the kill, or (when every episode the
    # victim held was answered before the agent died, as happens on a quiet machine) the first later one.
    grown.client.send("after-agent-kill", 20)
    later = grown.client.wait_episodes("after-agent-kill", 20, BATCH_S)
    assert all(_recorded_reward_back(e) for e in later), [(e["outcome"], e.get("errors")) for e in later][:3]
    assert _by_worker(grown, later).get(victim), "the restarted worker ran none of the later episodes"
    restarted = grown.served.agent_pid(victim)
    assert restarted not in (None, agent), f"the victim's Gym agent was not restarted (agent pid {restarted})"
    print(f"agent {agent} killed: {len(failed)}/40 failed (each gym_server_down), none lost; restarted as {restarted}")


@dataclass
class WorkerDeath:
    victim: int
    survivor: int
    killed_at: float
    stack_gone_s: float
    in_flight: list[dict[str, Any]]
    after: list[dict[str, Any]]


@pytest.fixture(scope="module")
def worker_death(grown: Grown) -> WorkerDeath:
    """SIGKILL one worker while 40 episodes are in flight, then send 60 more; every episode is bounded
    on the client side by HUNG_AFTER_S (prime-rl bounds none)."""
    survivor, victim = grown.workers
    sessions = grown.served.stack_sessions(victim)
    assert sessions, "the worker has no Gym stack"
    grown.client.send("worker-kill", 40, timeout=HUNG_AFTER_S)
    grown.client.wait_episodes("worker-kill", 2, BATCH_S)
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(lambda: not in_sessions(sessions), 120, "the killed worker's Gym stack and Ray head gone")
    stack_gone_s = time.monotonic() - killed_at
    grown.client.send("after-worker-kill", 60, timeout=HUNG_AFTER_S)
    in_flight = grown.client.wait_episodes("worker-kill", 40, BATCH_S + HUNG_AFTER_S)
    after = grown.client.wait_episodes("after-worker-kill", 60, BATCH_S + HUNG_AFTER_S)
    return WorkerDeath(victim, survivor, killed_at, stack_gone_s, in_flight, after)


def test_killed_worker_takes_its_gym_stack_down(worker_death: WorkerDeath, grown: Grown) -> None:
    """No orphan: every process of the dead worker's Gym stack and Ray head (their sessions) is gone,
    and so are its run and Ray folders."""
    assert worker_death.stack_gone_s < 120
    footprint = grown.footprints[worker_death.victim]
    assert not [d for d in footprint["run_dirs"] if Path(d).exists()], footprint["run_dirs"]
    print(f"killed worker's Gym stack gone {worker_death.stack_gone_s:.1f}s after SIGKILL")


def test_killed_worker_episodes_never_come_back_and_only_a_client_timeout_ends_them(
    worker_death: WorkerDeath, grown: Grown
) -> None:
    """What the orchestrator sees when a worker dies (verifiers 0.4.0: no restart-on-death, verifiers
    #2131): no error and no reply, ever, for the episodes the dead worker held, nor for new episodes the
    broker keeps handing it (its in-flight count never drops, so it is still a least-busy choice); only the
    client's own timeout ends them. The live worker keeps serving and reproduces every recorded reward."""
    episodes = worker_death.in_flight + worker_death.after
    outcomes = {e["outcome"] for e in episodes}
    assert outcomes <= {"ok", "timeout"}, outcomes  # never an error: the client is told nothing
    hung = [e for e in episodes if e["outcome"] == "timeout"]
    assert hung, "no episode was lost with the worker: has verifiers learnt to restart a dead worker?"
    assert all(e["elapsed_s"] >= HUNG_AFTER_S for e in hung)
    assert [e for e in worker_death.after if e["outcome"] == "timeout"], "no new episode was routed to the dead worker"
    ok = [e for e in episodes if e["outcome"] == "ok"]
    assert all(_recorded_reward_back(e) for e in ok)
    assert [e for e in worker_death.after if e["outcome"] == "ok"], "the live worker served nothing after the death"
    survivor_ids = grown.served.trace_ids(worker_death.survivor)
    assert all(e["trace_id"] in survivor_ids for e in worker_death.after if e["outcome"] == "ok")
    slowest_ok = max(e["elapsed_s"] for e in ok)
    print(
        f"worker killed: {len(hung)}/{len(episodes)} episodes never answered (ended by the {HUNG_AFTER_S:g}s "
        f"client timeout: {sum(e in hung for e in worker_death.after)}/60 sent after the death); slowest answered "
        f"episode {slowest_ok:.0f}s"
    )


def test_stopped_server_leaves_no_gym_process(grown: Grown, worker_death: WorkerDeath) -> None:
    """SIGTERM to the server (how prime-rl's launcher stops it): the broker stops its workers, each worker's
    env stops its Gym stack; nothing started by the server is left, Gym's and Ray's processes included."""
    grown.client.close()
    took = grown.served.stop()
    left = wait_for(lambda: not grown.served.left_behind() or None, 120, "every process of the server gone")
    assert left is True
    print(f"server stopped in {took:.1f}s")


# -- nemo-gym 0.7's own names --------------------------------------------------------------------------------


def test_an_env_server_serves_a_gym_0_7_environment_by_the_name_gym_gives_it(vf_python: Path, tmp_path: Path) -> None:
    """prime-rl's env server (its default pool) with `nemo_env = "arc_agi"`, 0.7's `environments/arc_agi` (0.4 has
    no environment of that name), the orchestrator loading the same rows: every recorded reward comes back, and each
    trace says the release that ran it."""
    from tests.e2e.test_gym07 import gym07_runtime

    gym07 = gym07_runtime()
    runtime = {"VERIFIERS_NEMO_GYM_PYTHON": gym07}
    config = env_config("arc_agi", recorded=True)
    replay = replay_server("arc_agi", gym_python=gym07)
    replay.start()
    served = ServedEnv(tmp_path / "server", config, pool="elastic", workers=None, environ=runtime)
    client = None
    try:
        client = EpisodeClient(tmp_path, served.address, config, f"{replay.url}/v1", environ=runtime)
        client.send("arc", 5, traces=str(tmp_path / "arc.jsonl"))
        episodes = client.wait_episodes("arc", 5, BATCH_S)
        assert all(_recorded_reward_back(e) for e in episodes), [(e["outcome"], e.get("errors")) for e in episodes]
        traces = [json.loads(line) for line in (tmp_path / "arc.jsonl").open()]
        assert {t["info"]["nemo_gym"]["nemo_gym_version"] for t in traces} == {"0.7.0"}
    finally:
        if client is not None:
            client.close()
        served.stop()
        replay.stop()
