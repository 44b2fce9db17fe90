"""`verifiers-nemo report` on real runs, opened in headless Chromium.

Two real runs of example_multi_step, started side by side: our CLI with the replay policy (`eval -s
--save-trace --report`: every rollout reproduces its recorded reward 1), and `vf-eval nemo-gym-env`
(verifiers 0.4.0, `.venv-vf`) against a scripted policy that solves some tasks, fails others, and
answers HTTP 400 on the rest (typed upstream errors). The reports built from them are opened in
Chromium over the DevTools protocol: no console errors, plots drawn, every rollout listed, a
transcript with its tool calls, the error-type filter, the per-task comparison; screenshots are kept
under the test's tmp dir. Also: the inspect-ai export read back by inspect-ai's own reader, and a
10,000-rollout report's size and filter speed.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from tests.e2e.browser import Browser, Page, find_chromium
from tests.e2e.policies import DualApiPolicy
from tests.e2e.test_verifiers_env import _run as run_command
from tests.unit.report_runs import write_run

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("verifiers-nemo"))
VF_EVAL = ROOT / ".venv-vf" / "bin" / "vf-eval"
INSPECT_PYTHON = ROOT / ".venv-inspect" / "bin" / "python"
RUN_LIMIT_S = 420  # two cold stack starts at once on a busy 2-core machine


class SometimesRefusingPolicy(DualApiPolicy):
    """The scripted synonym policy, but a request whose user question has a length divisible by 5 is
    refused (400): those rollouts end in a typed upstream error (one task of the five)."""

    async def _responses(self, request: web.Request) -> web.Response:
        body = await request.json()
        user = next(
            (i.get("content") for i in body.get("input") or [] if isinstance(i, dict) and i.get("role") == "user"), ""
        )
        if isinstance(user, str) and len(user) % 5 == 0:
            return web.json_response({"error": {"message": "request refused by the test policy"}}, status=400)
        return await super()._responses(request)


async def _run(argv: list[str], cwd: Path, extra_env: dict[str, str] | None = None) -> tuple[int, str]:
    return await run_command(argv, cwd, extra_env, limit=RUN_LIMIT_S)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def real_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Our replay run (with its --report) and a vf-eval run with failures, made at the same time."""
    assert find_chromium(), "no chromium on PATH: `bash .ci/setup-tests` installs Debian's chromium"
    assert VF_EVAL.exists(), f"{VF_EVAL} is missing: `bash .ci/setup-tests` builds the verifiers venv"
    base = tmp_path_factory.mktemp("report-runs")
    async with SometimesRefusingPolicy() as policy:
        ours, theirs = await asyncio.gather(
            _run(
                [CLI, "eval", "example_multi_step", "-r", "2", "--save-trace", "--report", "-o", str(base / "ours")],
                base,
            ),
            _run(
                [
                    str(VF_EVAL),
                    "nemo-gym-env",
                    "--no-push",
                    "-m",
                    "m",
                    "--client.base-url",
                    policy.base_url,
                    "--client.api-key-var",
                    "POLICY_KEY",
                    "-o",
                    str(base / "vf"),
                    "--env.taskset.nemo-env",
                    "example_multi_step",
                    "-n",
                    "5",
                    "-r",
                    "2",
                    "-c",
                    "8",
                ],
                base,
                {"VERIFIERS_NEMO_GYM_PYTHON": sys.executable, "POLICY_KEY": "sk-test"},
            ),
        )
    assert ours[0] == 0, ours[1][-3000:]
    assert theirs[0] == 0, theirs[1][-3000:]
    (ours_dir,) = (p.parent for p in (base / "ours").glob("*/*/metadata.json"))
    (vf_dir,) = (p.parent for p in (base / "vf").glob("*/traces.jsonl"))
    return {"base": base, "ours": ours_dir, "vf": vf_dir, "ours_output": ours[1]}


def _results(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines() if line.strip()]


def _episodes(folder: Path) -> list[dict[str, Any]]:
    return [
        trace
        for line in (folder / "traces.jsonl").read_text().splitlines()
        if line.strip()
        for trace in json.loads(line)["traces"]
    ]


async def _open(browser: Browser, html: Path) -> Page:
    page = await browser.new_page()
    await page.goto(html.resolve().as_uri())
    await page.evaluate("window.verifiersNemoReport.ready")
    return page


async def _set(page: Page, selector: str, value: str) -> None:
    await page.evaluate(
        f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.value = {json.dumps(value)};"
        " e.dispatchEvent(new Event('change')); e.dispatchEvent(new Event('input')); })()"
    )


async def _rows(page: Page) -> list[dict[str, str]]:
    """The rows shown, each as {column key: text} (keys: run, task, rollout, reward, status, kind, ...)."""
    return await page.evaluate(
        "(() => { const keys = [...document.querySelectorAll('#rollout-table th')].map(th => th.dataset.sort || '#');"
        " return [...document.querySelectorAll('#rollout-table tbody tr')]"
        ".map(tr => Object.fromEntries([...tr.cells].map((td, i) => [keys[i], td.textContent]))); })()"
    )


async def test_eval_report_of_a_replay_run_shows_every_rollout_and_its_tool_calls(real_runs: dict[str, Any]) -> None:
    report = real_runs["ours"] / "report.html"
    assert report.exists(), "eval --report writes report.html next to the results"
    assert report.resolve().as_uri() in real_runs["ours_output"], "the command tells the path to open"
    records = _results(real_runs["ours"])
    assert len(records) == 10 and all(r["reward"] == 1.0 for r in records)

    async with Browser() as browser:
        page = await _open(browser, report)
        drawn = await page.evaluate("document.querySelectorAll('#figs .fig .main-svg').length")
        plotted = await page.evaluate(
            "[...document.querySelectorAll('#figs .fig')].filter(d => d.data && d.data.length).length"
        )
        assert drawn >= 6 and plotted >= 6, (drawn, plotted)
        summary = await page.evaluate("document.querySelector('#summary').innerText")
        assert "10/10 reproduced" in summary
        await page.screenshot(real_runs["base"] / "ours-overview.png")

        await page.evaluate("document.querySelector('#tabs [data-tab=rollouts]').click()")
        rows = await _rows(page)
        assert len(rows) == 10
        assert sorted((r["task"], r["rollout"]) for r in rows) == sorted(
            (str(x["task_index"]), str(x["rollout_index"])) for x in records
        )

        chosen = next(r for r in records if (r["task_index"], r["rollout_index"]) == (2, 1))
        rows = await _rows(page)
        position = next(i for i, r in enumerate(rows) if (r["task"], r["rollout"]) == ("2", "1"))
        await page.evaluate(f"document.querySelectorAll('#rollout-table tbody tr')[{position}].click()")
        await page.wait_for("document.querySelector('#transcript [data-part=verify]')")
        shown = await page.evaluate(
            "[...document.querySelectorAll('#transcript [data-part=tool-call] strong')].map(e => e.textContent)"
        )
        expected = [f"→ {c['function']['name']}" for m in chosen["completion"] for c in m.get("tool_calls") or []]
        assert shown == expected and len(expected) >= 3
        heads = await page.evaluate("document.querySelectorAll('#transcript .call-head').length")
        assert heads == len(chosen["trace"]), "one header per recorded policy call"
        text = await page.evaluate("document.querySelector('#transcript').innerText")
        first_output = next(m["content"] for m in chosen["completion"] if m["role"] == "tool")
        assert first_output in text and "reward 1.000" in text
        await page.screenshot(real_runs["base"] / "ours-transcript.png")
        assert page.errors == []


async def test_vf_eval_traces_and_our_run_compared_in_one_report(real_runs: dict[str, Any]) -> None:
    traces = _episodes(real_runs["vf"])
    failed = [t for t in traces if not t["ok"]]
    scored = [t for t in traces if t["ok"]]
    assert len(traces) == 10 and failed and scored, [t.get("errors") for t in traces]
    kinds = {t["info"]["nemo_gym"]["error"]["type"] for t in failed}
    assert len(kinds) == 1, kinds
    (kind,) = kinds
    html = real_runs["base"] / "compared.html"
    proc = subprocess.run(
        [CLI, "report", str(real_runs["ours"]), str(real_runs["vf"].parent), "-o", str(html)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == html.resolve().as_uri()

    async with Browser() as browser:
        page = await _open(browser, html)
        summary = await page.evaluate("document.querySelector('#summary').innerText")
        assert f"\t{len(failed)}\t" in summary, summary  # B's errored count, apart from its scored rollouts

        await page.evaluate("document.querySelector('#tabs [data-tab=rollouts]').click()")
        assert len(await _rows(page)) == 20
        await _set(page, "#filter-kind", kind)
        rows = await _rows(page)
        assert len(rows) == len(failed) and {r["run"] for r in rows} == {"B"} and {r["kind"] for r in rows} == {kind}
        await page.evaluate("document.querySelector('#rollout-table tbody tr').click()")
        await page.wait_for("document.querySelector('#transcript [data-part=error]')")
        error_text = await page.evaluate("document.querySelector('#transcript [data-part=error]').innerText")
        assert kind in error_text and "400" in error_text
        await page.screenshot(real_runs["base"] / "compared-errors.png")

        await _set(page, "#filter-kind", "")
        await _set(page, "#filter-status", "scored")
        await _set(page, "#filter-run", "1")
        rows = await _rows(page)
        assert len(rows) == len(scored)
        await page.evaluate("document.querySelector('#rollout-table tbody tr').click()")
        await page.wait_for("document.querySelector('#transcript [data-part=verify]')")
        assert await page.evaluate("document.querySelectorAll('#transcript [data-part=tool-call]').length") >= 2

        await page.evaluate("document.querySelector('#tabs [data-tab=compare]').click()")
        await page.wait_for("document.querySelector('#tab-compare .fig .main-svg')")
        compare_text = await page.evaluate("document.querySelector('#tab-compare').innerText")
        by_task: dict[str, list[float]] = {}
        for t in scored:
            by_task.setdefault(t["task"]["data"]["id"], []).append(t["info"]["nemo_gym"]["reward"])
        broken = sum(1 for rewards in by_task.values() if sum(r >= 0.5 for r in rewards) / len(rewards) < 0.5)
        assert f"{broken} broken" in compare_text, compare_text[:2000]
        assert "mean reward, B \u2212 A" in compare_text
        await page.screenshot(real_runs["base"] / "compared-runs.png")
        assert page.errors == []


def test_inspect_export_is_read_back_by_inspect_ai(real_runs: dict[str, Any], tmp_path: Path) -> None:
    if not INSPECT_PYTHON.exists():
        pytest.fail(f"{INSPECT_PYTHON} is missing: `bash .ci/setup-tests` builds the venv with verifiers-nemo[inspect]")
    exporter = INSPECT_PYTHON.with_name("verifiers-nemo")
    logs = {"whole": tmp_path / "logs" / "run.eval", "bounded": tmp_path / "bounded" / "run.eval"}
    for name, extra in (("whole", []), ("bounded", ["--max-rollouts", "4"])):
        proc = subprocess.run(
            [str(exporter), "export", str(real_runs["vf"]), "--inspect", "-o", str(logs[name]), *extra],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        assert ("the log's samples are" in proc.stderr) == (name == "bounded"), proc.stderr
    check = """
import json, sys
from inspect_ai.log import read_eval_log
def figures(path):
    log = read_eval_log(path)
    return {
        "status": log.status, "samples": len(log.samples), "total": log.results.total_samples,
        "errors": sorted(s.error.message.split(":")[0] for s in log.samples if s.error),
        "scored": sum(1 for s in log.samples if s.scores),
        "tools": sorted({c.function for s in log.samples for m in s.messages if m.role == "assistant"
                         for c in m.tool_calls or []}),
        "tool_outputs": sum(1 for s in log.samples for m in s.messages if m.role == "tool"),
        "mean": log.results.scores[0].metrics["mean"].value,
    }
print(json.dumps([figures(path) for path in sys.argv[1:]]))
"""
    read = subprocess.run(
        [str(INSPECT_PYTHON), "-c", check, str(logs["whole"]), str(logs["bounded"])],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert read.returncode == 0, read.stderr
    got, bounded = json.loads(read.stdout)
    traces = _episodes(real_runs["vf"])
    failed = [t for t in traces if not t["ok"]]
    rewards = [t["info"]["nemo_gym"]["reward"] for t in traces if t["ok"]]
    assert got["samples"] == got["total"] == 10 and got["scored"] == len(rewards)
    assert got["errors"] == sorted(t["info"]["nemo_gym"]["error"]["type"] for t in failed)
    assert got["tools"] == ["extract_synonym_values", "get_synonym_value"] and got["tool_outputs"] > 0
    assert got["mean"] == pytest.approx(sum(rewards) / len(rewards))
    # --max-rollouts 4: two whole tasks (2 rollouts each) and every failed rollout as samples; scores over all 10
    assert bounded["total"] == 10 and bounded["mean"] == got["mean"]
    assert bounded["errors"] == got["errors"] and 4 <= bounded["samples"] <= min(10, 4 + len(failed))


async def test_a_10000_rollout_report_stays_small_and_filters_fast(tmp_path: Path) -> None:
    run = write_run(tmp_path / "big", tasks=2500, repeats=4, seed=7)
    html = tmp_path / "big.html"
    started = time.monotonic()
    proc = subprocess.run([CLI, "report", str(run), "-o", str(html)], capture_output=True, text=True, timeout=600)
    built = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    size = html.stat().st_size
    assert size < 25_000_000, size
    async with Browser() as browser:
        page = await _open(browser, html)
        await page.evaluate("document.querySelector('#tabs [data-tab=rollouts]').click()")
        timing = await page.evaluate("""(() => {
            const t0 = performance.now();
            const kind = document.querySelector('#filter-kind');
            kind.value = 'timeout'; kind.dispatchEvent(new Event('change'));
            const t1 = performance.now();
            const shown = document.querySelectorAll('#rollout-table tbody tr').length;
            kind.value = ''; kind.dispatchEvent(new Event('change'));
            document.querySelector('#rollout-table th[data-sort=reward]').click();
            const t2 = performance.now();
            const count = document.querySelector('#match-count').textContent;
            return {filter_ms: t1 - t0, sort_ms: t2 - t1, shown, count};
        })()""")
        assert timing["filter_ms"] < 500 and timing["sort_ms"] < 1000, timing
        assert timing["count"] == "10,000 matching of 10,000 rollouts"
        timeouts = sum(1 for line in (run / "results.jsonl").open() if '"type": "timeout"' in line)
        assert timing["shown"] == min(100, timeouts) and timeouts > 0
        await page.evaluate("document.querySelector('#rollout-table tbody tr').click()")
        await page.wait_for("document.querySelector('#transcript [data-part=verify]')", timeout_s=60)
        assert page.errors == []
    print(f"10,000 rollouts: {size / 1e6:.1f} MB, built in {built:.1f}s; {timing}")


async def test_figures_read_right_in_chromium_titles_clear_of_the_toolbar_counts_on_whole_ticks(
    tmp_path: Path,
) -> None:
    """Drawn by Chromium (a synthetic run: no stack): no title runs under the plot toolbar (pass@k's did),
    the count histograms' tick labels are whole numbers (policy calls read 1.6 ... 2.4), and the summary's
    interval is inside [0, 1] with its method named."""
    run = write_run(tmp_path / "run", tasks=5, repeats=2, seed=4)
    html = tmp_path / "r.html"
    proc = subprocess.run([CLI, "report", str(run), "-o", str(html)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    async with Browser() as browser:
        page = await _open(browser, html)
        drawn = await page.evaluate("""(() => [...document.querySelectorAll('#figs .fig')].map((div) => {
            const box = (e) => {
              if (!e) return null;
              const r = e.getBoundingClientRect();
              return [r.left, r.top, r.right, r.bottom];
            };
            const title = div.querySelector('.gtitle');
            const bar = div.querySelector('.modebar');
            if (bar) bar.style.opacity = 1;  // shown on hover: measured where it is drawn
            return {title: title ? title.textContent : '', titleBox: box(title), barBox: box(bar),
                    xticks: [...div.querySelectorAll('.xtick text')].map((t) => t.textContent),
                    yticks: [...div.querySelectorAll('.ytick text')].map((t) => t.textContent)};
        }))()""")
        summary = await page.evaluate("document.querySelector('#summary').innerText")
        assert page.errors == []
    assert len(drawn) >= 6
    for fig in drawn:
        (l1, t1, r1, b1), (l2, t2, r2, b2) = fig["titleBox"], fig["barBox"]
        assert r1 <= l2 or r2 <= l1 or b1 <= t2 or b2 <= t1, f"{fig['title']!r} runs under the toolbar"
        if not fig["title"].startswith(("pass@k", "Metric means")):
            assert all(t.replace(",", "").isdigit() for t in fig["yticks"]), (fig["title"], fig["yticks"])
    calls = next(f for f in drawn if f["title"] == "Policy calls per rollout")
    assert calls["xticks"] and all(t.replace(",", "").isdigit() for t in calls["xticks"]), calls["xticks"]
    low, high = (float(x) for x in summary.split("[", 1)[1].split("]", 1)[0].split(","))
    assert 0.0 <= low <= high <= 1.0 and ("Wilson" in summary or "bootstrap" in summary), summary
