"""The printed end-of-run summary, from a run's metadata."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._training.policy_versions import describe as describe_versions
from .gym_metrics import key_metric_lines
from .token_ids import describe_token_ids


def fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def fmt_seconds(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.2f}s" if value < 60 else f"{int(value // 60)}m{value % 60:04.1f}s"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


BY_REPEAT_SHOWN = 16
"""Repeats whose mean reward the summary prints one by one; more are summarised (all are in metadata.json)."""


def _by_repeat(means: list[float | None]) -> str:
    """Each repeat's mean reward; past ``BY_REPEAT_SHOWN`` repeats, the first and last few and their range."""
    if len(means) <= BY_REPEAT_SHOWN:
        return "[" + ", ".join(fmt(v) for v in means) + "]"
    known = [v for v in means if v is not None]
    head, tail = means[: BY_REPEAT_SHOWN - 4], means[-3:]
    shown = ", ".join(fmt(v) for v in head) + ", …, " + ", ".join(fmt(v) for v in tail)
    spread = f"min {fmt(min(known))}, max {fmt(max(known))}" if known else "none scored"
    return f"[{shown}] ({len(means):,} repeats: {spread}; each in metadata.json)"


def _sessions(timing: Mapping[str, Any]) -> str:
    """How many sessions ran the run and their time together (sessions killed before saving theirs said apart)."""
    text = f"{timing['sessions']} sessions, {fmt_seconds(timing['total_wall_s'])} in all"
    untimed = timing.get("sessions_untimed") or 0
    if untimed:
        text += f", not counting {untimed} that ended without saving its time (killed)"
    return text


def format_summary(metadata: Mapping[str, Any]) -> str:
    """The printed end-of-run summary."""
    s, settings, counts = metadata["summary"], metadata["settings"], metadata["counts"]
    rollouts, reward, timing = s["rollouts"], s["reward"], s["timing"]
    lines = ["", "=" * 72]

    def row(label: str, *parts: str) -> None:
        lines.append(f"{label:<13}" + " · ".join(parts))

    where = f"@ {settings['base_url']}" if settings.get("base_url") else f"(policy {settings['policy']})"
    sources = metadata.get("env_sources") or {}
    row("Environment", ", ".join(sources[e]["name"] if e in sources else e for e in metadata["env"].split(",")))
    for source in sources.values():
        versions = source.get("fingerprints") or [source["fingerprint"]]
        files = f"files {' → '.join(versions)}" + (
            f": the run mixes {len(versions)} versions of its code" if len(versions) > 1 else ""
        )
        row("", f"{source['name']}: your folder {source['path']} ({files})")
    row("Model", f"{metadata['model']} {where}")
    row(
        "Rollouts",
        f"{rollouts['total']:,} of {counts['expected']:,} "
        f"({plural(rollouts['examples'], 'example')} x {settings['rollouts_per_example']:,})",
        f"{rollouts['scored']:,} scored",
        f"{rollouts['errored']:,} errored",
        *([f"{rollouts['masked']:,} masked"] if rollouts.get("masked") else []),
    )
    gym_version = (metadata.get("versions") or {}).get("nemo-gym")
    if gym_version:
        row("nemo-gym", str(gym_version))
    row("Reward", *(f"{name} {fmt(reward[name])}" for name in ("avg", "std", "min", "max")))
    for position, (name, own) in enumerate((s.get("by_env") or {}).items()):
        own_errors = sum(own["errors_by_type"].values())
        first_pass = next(iter(own["pass_at_k"].items()), None)
        row(
            "  by env" if position == 0 else "",
            f"{name}: {own['rollouts']['total']} rollouts",
            f"reward avg {fmt(own['reward']['avg'])}",
            *([f"pass@{first_pass[0]} {fmt(first_pass[1])}"] if first_pass else []),
            f"{own_errors} errored",
            *([f"{own['rollouts']['masked']} masked"] if own["rollouts"].get("masked") else []),
        )
    if len(s["reward_by_rollout_index"]) > 1:
        row("  by repeat", _by_repeat(s["reward_by_rollout_index"]))
    if s["pass_at_k"]:
        row("pass@k", _wrap([f"pass@{k} {fmt(v)}" for k, v in s["pass_at_k"].items()], 13))
        row("pass^k", _wrap([f"pass^{k} {fmt(v)}" for k, v in s["pass_power_k"].items()], 13))
        partial = [f"k={k}: {n}" for k, n in s["pass_k_examples"].items() if n < rollouts["examples"]]
        note = f"; over examples with >= k scored rollouts ({', '.join(partial)})" if partial else ""
        row("", f"correct = reward >= {s['pass_threshold']:g}{note}")
    if s["metrics"]:
        row("Metrics", _wrap([f"{k} {fmt(v)}" for k, v in s["metrics"].items()], 13))
    for position, line in enumerate(key_metric_lines(s.get("gym_metrics") or {})):
        row("Gym metrics" if position == 0 else "", line)
    if s.get("gym_metrics"):
        row("", "the environment's own /aggregate_metrics, as gym eval run reports it (all: metadata.json)")
    errors = s["errors_by_type"]
    row("Errors", ", ".join(f"{k}: {v}" for k, v in errors.items()) if errors else "none")
    for kind, message in s.get("error_examples", {}).items():
        row("", f"{kind}, e.g.: {message}")
    masked = s.get("masked_by_kind") or {}
    if masked:
        row("Masked", f"{sum(masked.values())}: " + ", ".join(f"{k} {v}" for k, v in masked.items()))
        row("", "Gym marked them as no valid measurement (mask_sample): left out of reward, pass@k and metrics")
        for kind, message in (s.get("masked_examples") or {}).items():
            row("", f"{kind}, e.g.: {message}")
    for name, judge in (s.get("judges") or {}).items():
        row(
            "Judge",
            f"{name} → {judge['target']}",
            f"{judge['calls']} calls",
            f"{judge['failed']} failed",
            f"tokens in {judge.get('input_tokens', 0):,} out {judge.get('output_tokens', 0):,} (not in Tokens)",
        )
    for position, replica in enumerate(s.get("replicas") or ()):
        row(
            "Replicas" if position == 0 else "",
            f"{replica['replica']} out of the rotation {plural(replica['outages'], 'time')}, "
            f"{fmt_seconds(replica['seconds'])} in all"
            + (" (still down at the end)" if replica.get("still_down") else " (rejoined)"),
        )
    if s.get("replicas"):
        row("", "its rollouts' calls went to the live replicas (see Troubleshooting: a replica dies)")
    if s.get("token_ids"):
        figures, _, fix = describe_token_ids(s["token_ids"]).partition("; ")
        row("Token IDs", figures)
        if fix:
            row("", fix)
    usage = s["usage"]
    token_keys = ("input_tokens", "output_tokens", "total_tokens", "cached_tokens", "reasoning_tokens")
    if usage:
        row("Tokens", *(f"{k.removesuffix('_tokens')} {usage[k]:,}" for k in token_keys if k in usage))
    rate = timing.get("rollouts_per_s")
    sessions = timing.get("sessions", 1)
    row(
        "Timing",
        f"wall {fmt_seconds(timing.get('wall_s'))}",
        f"stack start {fmt_seconds(timing.get('stack_start_s'))}",
        f"{fmt(rate, 2) if rate else 'n/a'} rollouts/s",
        f"mean rollout {fmt_seconds(s['latency']['mean_rollout_s'])}",
        *([_sessions(timing)] if sessions > 1 else []),
    )
    replay = s.get("replay")
    if replay:
        verdict = "all reproduced" if replay["reproduced"] == replay["compared"] else "MISMATCH"
        row(
            "Replay",
            f"{replay['reproduced']:,}/{replay['compared']:,} rewards equal the recorded ones ({verdict})",
            *([f"{replay['masked']} masked (not compared)"] if replay.get("masked") else []),
        )
        for m in replay["mismatches"][:5]:
            row("", f"task {m['task_index']} rollout {m['rollout_index']}: reward {m['reward']}, "
                f"recorded {m['recorded_reward']}")  # fmt: skip
        known = replay.get("known_unreproducible") or []
        if known:
            tasks = replay.get("known_unreproducible_tasks") or sorted({k["task_index"] for k in known})
            count = replay.get("known_unreproducible_count") or len(known)
            row(
                "",
                f"left out: {plural(count, 'rollout')} of {'task' if len(tasks) == 1 else 'tasks'} "
                f"{', '.join(map(str, tasks))}, whose recording is known not to reproduce ({known[0]['reason']})",
            )
    if s.get("training"):
        _training_rows(row, settings, s)
    if metadata.get("path"):
        row("Results", metadata["path"])
    row("Status", _status_line(metadata))
    lines.append("=" * 72)
    return "\n".join(lines)


def _training_rows(row: Any, settings: Mapping[str, Any], summary: Mapping[str, Any]) -> None:
    """What the rollouts train on (``--client-type train``), per environment: samples a rollout makes, forks and
    their first place and cause, rewards reproduced (replay), failures and their cause, replayed turns the renderer
    could not carry."""
    training = summary["training"]
    renderer = settings.get("renderer") or "auto"
    model = settings.get("renderer_model") or settings.get("model")
    row("Training", f"verifiers' training client · renderer {renderer} ({model})", "one sample per rollout is what "
        "trains as sampled; a fork is one more sample")  # fmt: skip
    for position, (name, env) in enumerate(training["by_env"].items()):
        n = env["rollouts"]
        forked = env["forked"]
        row(
            "  by env" if position == 0 else "",
            f"{name}: {fmt(env['samples_per_rollout'], 2)} samples/rollout",
            f"{env['one_sample']:,}/{n:,} one sample",
            f"{forked:,} forked" + (f" ({forked / n:.0%})" if forked else ""),
            *([f"{env['untrainable']:,} untrainable (Gym masked)"] if env.get("untrainable") else []),
            *_reproduced(summary, name),
            *[
                f"{n:,} not carried ({what}: {NOT_CARRIED_SHORT.get(what, what)})"
                for what, n in (env.get("not_carried") or {}).items()
            ],
            *([f"{sum(env['failed'].values()):,} failed"] if env.get("failed") else []),
        )
        if env.get("policy_versions"):
            row("", describe_versions(env["policy_versions"], n))
        for kind, example in (env.get("failure_examples") or {}).items():
            row("", f"failed {kind} x{env['failed'][kind]:,}, e.g.: {example}")
        for example in env["fork_examples"]:
            row(
                "",
                f"first fork, e.g. task {example['task_index']}: turn {example['turn']}, message {example['message']} "
                f"({example['role']}), token {example['token']:,}: {example['cause']}: {example['detail']}",
            )
            if example.get("sampled") is not None:
                sampled, rendered = _around_difference(example["sampled"], example["rendered"])
                row("", f"sampled {sampled} · rendered again {rendered}")
        if env.get("replay_unfaithful"):
            row(
                "",
                f"{plural(env['replay_unfaithful'], 'rollout')} replayed a turn the renderer reads back differently, "
                f"e.g. {env['replay_unfaithful_example']}",
            )


NOT_CARRIED_SHORT = {"images": "a text renderer cannot carry them"}


def _reproduced(summary: Mapping[str, Any], env: str) -> list[str]:
    """``N/M reproduced`` of one environment's replayed rollouts (a mix's own verdict; one environment's: the run's)."""
    own = (summary.get("by_env") or {}).get(env)
    replay = own.get("replay") if own is not None else summary.get("replay")
    return [f"{replay['reproduced']:,}/{replay['compared']:,} reproduced"] if replay else []


def _around_difference(a: str, b: str, lead: int = 24, limit: int = 60) -> tuple[str, str]:
    """Two texts from a little before where they first differ, each at most ``limit`` characters, as reprs."""
    same = 0
    while same < min(len(a), len(b)) and a[same] == b[same]:
        same += 1
    start = max(0, same - lead)

    def shown(text: str) -> str:
        part = text[start : start + limit]
        return ("..." if start else "") + repr(part) + ("..." if start + limit < len(text) else "")

    return shown(a), shown(b)


def _status_line(metadata: Mapping[str, Any]) -> str:
    rollouts, counts = metadata["summary"]["rollouts"], metadata["counts"]
    status = metadata.get("status") or "finished"
    if rollouts["total"] and not rollouts["scored"] and not rollouts.get("masked"):
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
