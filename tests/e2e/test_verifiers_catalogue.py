"""Every packaged environment's tasks load in the real verifiers (as prime-rl's orchestrator loads them), on both
Gym releases: a clear one-line refusal at most, never a crash. No stack starts."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.test_gym07 import GYM07_PYTHON
from tests.e2e.test_verifiers_env import VF_PYTHON

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def _load_catalogue(gym_python: Path) -> dict[str, list[list]]:
    if not VF_PYTHON.exists():
        pytest.fail(f"{VF_PYTHON} is missing: `bash .ci/setup-tests` builds the verifiers venv")
    if not gym_python.exists():
        pytest.fail(f"{gym_python} is missing: `bash .ci/setup-tests` builds the Gym runtimes")
    env = {**os.environ, "VERIFIERS_NEMO_GYM_PYTHON": str(gym_python), "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [str(VF_PYTHON), str(ROOT / "tests" / "e2e" / "vf_load_catalogue.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


@pytest.mark.parametrize(
    ("release", "gym_python", "at_least"),
    [("0.4", ROOT / ".venv" / "bin" / "python", 180), ("0.7", GYM07_PYTHON, 240)],
)
def test_every_packaged_environment_loads_in_verifiers_or_is_refused_in_one_line(
    release: str, gym_python: Path, at_least: int
) -> None:
    result = _load_catalogue(gym_python)

    assert result["crashed"] == [], result["crashed"][:3]
    assert len(result["loaded"]) >= at_least, (release, len(result["loaded"]))
    assert all(count > 0 for _, _, count in result["loaded"])
    for name, _, kind, message in result["refused"]:
        assert kind in ("TasksetError", "ConfigurationError", "UnknownEnvironmentError"), (name, kind)
        assert "\n" not in message.strip() and name in message and "Fix" in message, (name, message)
    # the rows that crashed vf-eval before: tool outputs without their call id (shown with a placeholder id)
    assert "single_step_tool_use_with_argument_comparison" in {name for name, _, _ in result["loaded"]}
