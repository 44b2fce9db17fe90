"""The eval's live progress on stderr: the stack start step, then the rollout bar (plain lines when
stderr is not a terminal). It is the ``RunObserver`` the evaluation reports to; it keeps running counts,
nothing per rollout."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from .._eval import fmt
from .console import say

if TYPE_CHECKING:
    from tqdm import tqdm

    from .._result import RolloutResult


def _columns(stream: TextIO) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError):
        return 0


class Progress:
    """Draws the stack start step and the rollout progress bar on stderr (plain lines when not a TTY)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream = stream or sys.stderr
        self.tty = stream.isatty() and _columns(stream) > 0  # a 0-column pty draws no bar
        self._bar: tqdm | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._scored = 0
        self._reward_sum = 0.0
        self._errors = 0
        self._masked = 0
        self._finished = 0
        """Rollouts finished in this session."""
        self._last_line = 0.0
        self._total = 0
        self._done = 0
        self._started = 0.0
        self._model_waits: Callable[[], tuple[int, float]] | None = None
        self._waits = (0, 0.0)
        self._replicas_down: Callable[[], list[tuple[str, float]]] | None = None
        self._down: list[tuple[str, float]] = []

    def seed(self, scored: int, reward_sum: float, errors: int, masked: int = 0) -> None:
        """Include a resumed run's earlier rollouts in the running mean (``scored`` rewards summing to
        ``reward_sum``) and the error and masked counts."""
        self._scored, self._reward_sum, self._errors, self._masked = scored, reward_sum, errors, masked

    def watch_model(self, model_waits: Callable[[], tuple[int, float]]) -> None:
        """While rollouts run, show how many policy calls wait on the model and for how long (so a slow
        model is told apart from a slow Gym): ``model_waits()`` gives (calls waiting, oldest wait in s)."""
        self._model_waits = model_waits

    def watch_replicas(self, replicas_down: Callable[[], list[tuple[str, float]]]) -> None:
        """While rollouts run, show which replicas are out of the rotation and for how long:
        ``replicas_down()`` gives (label, seconds out) of each."""
        self._replicas_down = replicas_down

    async def _tick_waits(self) -> None:
        while self._model_waits is not None:
            await asyncio.sleep(2.0)
            self._waits = self._model_waits()
            was_down = {label for label, _ in self._down}
            self._down = self._replicas_down() if self._replicas_down is not None else []
            changed = {label for label, _ in self._down} != was_down  # a replica left or rejoined: said at once
            if self._bar is not None:
                self._bar.set_postfix_str(self._postfix())
            elif not self.tty and (changed or (self._waits[0] and time.monotonic() - self._last_line >= 30)):
                self._last_line = time.monotonic()
                say(f"rollouts {self._done}/{self._total} · {self._postfix()}")

    def stack_starting(self, what: str) -> None:
        from tqdm import tqdm

        self._started = time.monotonic()
        if not self.tty:
            say(f"Starting {what} ...")
            return
        self._bar = tqdm(
            total=None,
            desc=f"Starting {what}",
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
        say(f"Ready in {seconds:.1f}s")

    def rollouts_starting(self, total: int, done: int) -> None:
        from tqdm import tqdm

        self._total, self._done = total, done
        self._started = time.monotonic()
        if done:
            say(f"Resuming: {done} of {total} rollouts already done, {total - done} to run")
        if self._model_waits is not None:
            self._ticker = asyncio.get_running_loop().create_task(self._tick_waits())
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
        mean = self._reward_sum / self._scored if self._scored else None
        text = f"reward={fmt(mean)} errors={self._errors}"
        if self._masked:
            text += f" masked={self._masked}"
        waiting, oldest = self._waits
        if waiting:
            text += f" · {waiting} waiting on the model (oldest {oldest:.0f}s)"
        if self._down:
            text += " · replica down: " + ", ".join(f"{label} ({seconds:.0f}s)" for label, seconds in self._down)
        return text

    def rollout_finished(self, result: RolloutResult) -> None:
        self._done += 1
        self._finished += 1
        if result.error is None and result.masked:
            self._masked += 1
        elif result.error is None and result.reward is not None:
            self._scored += 1
            self._reward_sum += result.reward
        else:
            self._errors += 1
        if self._bar is not None:
            self._bar.set_postfix_str(self._postfix(), refresh=False)
            self._bar.update(1)
        elif not self.tty:
            now = time.monotonic()
            if now - self._last_line >= 5 or self._done == self._total:
                self._last_line = now
                rate = self._finished / max(now - self._started, 1e-9)
                say(f"rollouts {self._done}/{self._total} · {rate:.2f}/s · {self._postfix()}")

    def _close_bar(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None
        if self._bar is not None:
            bar, self._bar = self._bar, None
            bar.close()

    def close(self) -> None:
        self._model_waits = None
        self._close_bar()
