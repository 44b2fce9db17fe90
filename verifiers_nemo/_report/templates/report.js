/* verifiers-nemo report: overview plots, every rollout (filter, sort, page, transcript), runs compared.
   Everything it shows is in this file; nothing is fetched. */
(() => {
  "use strict";
  const DATA = JSON.parse(document.getElementById("report-data").textContent);
  const COL = Object.fromEntries(DATA.columns.map((name, i) => [name, i]));
  const ROWS = DATA.rows;
  const MULTI_RUN = DATA.runs.length > 1;
  const TOTAL = DATA.runs.reduce((sum, run) => sum + run.rollouts, 0);
  const ALL_SHOWN = ROWS.length === TOTAL;

  // -- small helpers ------------------------------------------------------------------------------
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value == null || value === false) continue;
      if (key === "class") node.className = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : value);
    }
    for (const child of children.flat()) {
      if (child == null || child === false) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }
  const fmt = (v, digits = 3) => (v == null ? "n/a" : typeof v === "number" ? v.toFixed(digits) : String(v));
  const count = (v) => (v == null ? "n/a" : Number(v).toLocaleString("en"));
  const signed = (v, digits = 3) => (v == null ? "n/a" : (v > 0 ? "+" : "") + v.toFixed(digits));
  const ci = (low, high, digits = 3) => (low == null ? "" : ` [${fmt(low, digits)}, ${fmt(high, digits)}]`);
  // An interval and the method that gave it (stats.py: Wilson where every task's value is 0 or 1, else bootstrap).
  const ciWith = (x) => (x.low == null ? "n/a" : `${ci(x.low, x.high).trim()} ${x.method}`);
  const CI_NOTE = "95% CIs are over tasks (a task's rollouts are not independent draws) and stay within what they estimate can be: the Wilson score interval where every task's value is 0 or 1, else a percentile bootstrap over tasks (2,000 resamples, fixed seed), which never leaves the range of the values observed. No interval for a single task.";
  const showError = (message) => {
    const box = document.getElementById("report-error");
    box.textContent = message;
    box.hidden = false;
  };

  async function unpack(id) {
    if (typeof DecompressionStream === "undefined") {
      throw new Error("This browser cannot unpack the report's data (it needs DecompressionStream: Chrome 80+, Firefox 113+, Safari 16.4+).");
    }
    const text = atob(document.getElementById(id).textContent.trim());
    const bytes = new Uint8Array(text.length);
    for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return await new Response(stream).text();
  }
  let plotlyLoading = null;
  function loadPlotly() {
    plotlyLoading ||= unpack("plotly-packed").then((code) => {
      const script = document.createElement("script");
      script.textContent = code;
      document.head.appendChild(script);
      if (!window.Plotly) throw new Error("plotly.js did not load");
      return window.Plotly;
    });
    return plotlyLoading;
  }
  let detailsLoading = null;
  const loadDetails = () => (detailsLoading ||= unpack("report-details").then((text) => JSON.parse(text)));

  // -- tabs ----------------------------------------------------------------------------------------
  const tabs = ["overview", "rollouts", "compare"];
  function showTab(name) {
    for (const tab of tabs) document.getElementById(`tab-${tab}`).hidden = tab !== name;
    for (const button of document.querySelectorAll("#tabs button")) button.classList.toggle("active", button.dataset.tab === name);
    if (name === "compare") drawCompareFigures();
  }
  for (const button of document.querySelectorAll("#tabs button")) button.addEventListener("click", () => showTab(button.dataset.tab));

  // -- overview ------------------------------------------------------------------------------------
  document.getElementById("run-list").append(
    ...DATA.runs.map((run, i) => el("div", {}, `${MULTI_RUN ? String.fromCharCode(65 + i) + ": " : ""}${run.label} · ${run.source} · ${count(run.rollouts)} rollouts`
      + (run.shown < run.rollouts ? ` (${count(run.shown)} in the rollout table)` : ""))),
  );
  const scopeSelect = document.getElementById("scope");
  for (const scope of DATA.scopes) scopeSelect.append(el("option", { value: scope }, scope));
  document.getElementById("scope-bar").hidden = DATA.scopes.length < 2;

  function table(head, rows, numeric = []) {
    return el(
      "table",
      {},
      el("thead", {}, el("tr", {}, head.map((h, i) => el("th", { class: numeric.includes(i) ? "num" : null }, h)))),
      el("tbody", {}, rows.map((row) => el("tr", {}, row.map((cell, i) => el("td", { class: numeric.includes(i) ? "num" : null }, cell))))),
    );
  }

  async function renderOverview(scope) {
    const view = DATA.overview[scope];
    const summary = document.getElementById("summary");
    summary.replaceChildren(
      el("h2", {}, scope),
      table(
        ["run", "rollouts", "tasks", "scored", "errored", "masked", "mean reward", "95% CI over tasks", "pass@1", "replay"],
        view.stats.map((s, i) => [
          view.labels[i],
          count(s.rollouts), count(s.tasks), count(s.scored),
          el("span", { class: s.errored ? "status-error" : null }, count(s.errored)),
          el("span", { class: s.masked ? "status-masked" : null }, count(s.masked)),
          fmt(s.reward.mean), ciWith(s.reward),
          fmt(s.pass.pass_at[0]),
          s.replay ? `${count(s.replay.reproduced)}/${count(s.replay.compared)} reproduced` : "",
        ]),
        [1, 2, 3, 4, 5, 6, 8],
      ),
      el("p", { class: "muted" }, "Errored rollouts (a typed failure, no reward) and masked ones (Gym's mask_sample: the reward is no valid measurement) are counted apart: never as reward 0, and left out of reward, pass@k and metric means. " + CI_NOTE),
    );
    const tables = document.getElementById("overview-tables");
    const metricNames = [...new Set(view.stats.flatMap((s) => s.metrics.map((m) => m.name)))];
    const parts = [];
    if (metricNames.length) {
      parts.push(el("h2", {}, "Metric means (95% CI over tasks)"), el("p", { class: "muted" }, CI_NOTE), table(
        ["metric", ...view.labels],
        metricNames.map((name) => [name, ...view.stats.map((s) => {
          const m = s.metrics.find((x) => x.name === name);
          return m ? `${fmt(m.mean)}${m.low == null ? "" : " " + ciWith(m)}` : "";
        })]),
      ));
    }
    const kinds = [...new Set(view.stats.flatMap((s) => [...Object.keys(s.errors).map((k) => `error: ${k}`), ...Object.keys(s.masked_by_kind).map((k) => `masked: ${k}`)]))];
    if (kinds.length) {
      parts.push(el("h2", {}, "Failures by kind"), table(
        ["kind", ...view.labels, "example message"],
        kinds.map((kind) => {
          const [what, name] = [kind.slice(0, kind.indexOf(":")), kind.slice(kind.indexOf(":") + 2)];
          const counts = view.stats.map((s) => count((what === "error" ? s.errors : s.masked_by_kind)[name] || 0));
          const example = view.stats.map((s) => s.examples[name]).find(Boolean) || "";
          const link = el("button", { type: "button", class: "link", onclick: () => filterTo({ kind: name }) }, kind);
          return [link, ...counts, el("pre", {}, example)];
        }),
        view.labels.map((_, i) => i + 1),
      ));
    }
    if (view.stats.some((s) => s.training)) {
      const example = view.stats.map((s) => s.training && s.training.fork_example).find(Boolean);
      parts.push(el("h2", {}, "Training samples"), el("p", { class: "muted" }, "Under verifiers' training client each branch of a rollout's message graph is one training sample: one per rollout when every turn continued what was sampled, more where a turn forked (the agent restated a sampled turn, or it was rendered again to other tokens)."), table(
        ["run", "rollouts", "samples / rollout", "one sample", "forked"],
        view.stats.map((s, i) => s.training ? [view.labels[i], count(s.training.rollouts), fmt(s.training.samples_per_rollout), count(s.training.one_sample), el("span", { class: s.training.forked ? "status-error" : null }, count(s.training.forked))] : [view.labels[i], "", "", "", ""]),
        [1, 2, 3, 4],
      ));
      const versions = view.stats.map((s, i) => [view.labels[i], s.training && s.training.policy_versions]).filter(([, v]) => v);
      if (versions.length) {
        parts.push(el("p", { "data-part": "policy-versions" }, "Policy versions the engine reported (its weight_versions): " + versions.map(([label, v]) => `${label}: ${v.oldest === v.newest ? v.oldest : v.oldest + ".." + v.newest} (${count(v.labelled)} rollouts labelled, ${count(v.across_versions)} across versions)`).join("; ") + "."));
      }
      if (example) {
        parts.push(el("p", {}, `First fork, e.g. task ${example.task}: turn ${example.turn}, message ${example.message} (${example.role}), token ${example.token}: ${example.cause}: ${example.detail}`));
      }
    }
    const dist = [["rollout latency (s)", "latency"], ["policy call latency (s)", "call_latency"], ["output tokens / rollout", "output_tokens"], ["policy calls / rollout", "turns"]];
    const sampled = new Set();
    parts.push(el("h2", {}, "Latency and tokens"), table(
      ["", "run", "mean", "p50", "p90", "p99", "max"],
      dist.flatMap(([name, key]) => view.stats.map((s, i) => {
        const q = s[key];
        if (q && q.sample) sampled.add(q.sample);
        const mark = q && q.sample ? " *" : "";
        return [i === 0 ? name : "", view.labels[i], ...(q ? [q.mean, q.p50, q.p90, q.p99, q.max].map((v, j) => fmt(v, 2) + (j >= 1 && j <= 3 ? mark : "")) : ["n/a", "", "", "", ""])];
      })),
      [2, 3, 4, 5, 6],
    ));
    if (sampled.size) parts.push(el("p", { class: "muted", "data-part": "sampled" }, `* from a uniform sample of ${[...sampled].map(count).join(", ")} of the values (a seeded reservoir, as in the plots that say so); mean and max are over all of them.`));
    const judges = DATA.runs.flatMap((run) => Object.entries(run.judges || {}).map(([name, j]) => [run.label, name, j.target || "", count(j.calls), count(j.failed), count(j.input_tokens || 0), count(j.output_tokens || 0)]));
    parts.push(el("h2", {}, "Judge calls (apart from the policy's; not in its tokens)"));
    if (judges.length) parts.push(table(["run", "judge", "target", "calls", "failed", "tokens in", "tokens out"], judges, [3, 4, 5, 6]));
    if (DATA.judge_note) parts.push(el("p", { class: "muted" }, DATA.judge_note));
    tables.replaceChildren(...parts);

    const figs = document.getElementById("figs");
    const order = ["reward", "pass", "metrics", "failures", "latency", "call_latency", "tokens", "turns"];
    const divs = order.filter((name) => view.figs[name]).map((name) => el("div", { class: "fig", "data-fig": name }));
    figs.replaceChildren(...divs);
    const Plotly = await loadPlotly();
    for (const div of divs) {
      const fig = view.figs[div.dataset.fig];
      await Plotly.newPlot(div, fig.data, fig.layout, { displaylogo: false, responsive: true, displayModeBar: "hover" });
    }
  }
  scopeSelect.addEventListener("change", () => renderOverview(scopeSelect.value).catch((e) => showError(String(e))));

  document.getElementById("run-info").append(...DATA.runs.map((run, i) => el("div", {},
    el("h3", {}, `${MULTI_RUN ? String.fromCharCode(65 + i) + ": " : ""}${run.label}`),
    el("table", { class: "kv" }, el("tbody", {}, Object.entries(run.info).map(([k, v]) =>
      el("tr", {}, el("td", {}, k), el("td", {}, typeof v === "object" ? JSON.stringify(v) : String(v)))))),
    run.notes.length ? el("ul", { class: "notes" }, run.notes.map((n) => el("li", {}, n))) : null,
  )));

  // -- rollouts: filter, sort, page ------------------------------------------------------------------
  const state = { filters: {}, sort: null, desc: false, page: 0, pageSize: 100, view: [], selected: null };
  const headers = [["#", null], ["run", "run"], ["env", "env"], ["task", "task"], ["rollout", "rollout"], ["reward", "reward"],
    ["status", "status"], ["kind", "kind"], ["calls", "turns"], ["tool calls", "tools"], ["tok in", "tokens_in"], ["tok out", "tokens_out"], ["latency s", "latency"]]
    .filter(([, key]) => (key !== "run" || MULTI_RUN) && (key !== "env" || DATA.scopes.length > 1));
  const NUMERIC = new Set(["rollout", "reward", "turns", "tools", "tokens_in", "tokens_out", "latency"]);
  const thead = document.querySelector("#rollout-table thead");
  thead.append(el("tr", {}, headers.map(([label, key]) => el("th", {
    "data-sort": key, class: NUMERIC.has(key) ? "num" : null,
    onclick: () => { if (!key) return; state.desc = state.sort === key ? !state.desc : false; state.sort = key; state.page = 0; refresh(); },
  }, label))));

  function fillSelect(id, values, label) {
    const select = document.getElementById(id);
    select.replaceChildren(el("option", { value: "" }, "any"), ...values.map(([value, text]) => el("option", { value }, text ?? value)));
    if (label && values.length < 2) document.getElementById(label).hidden = true;
  }
  fillSelect("filter-run", DATA.runs.map((run, i) => [String(i), `${String.fromCharCode(65 + i)}: ${run.label}`]), "filter-run-label");
  document.getElementById("shown-note").replaceChildren(...DATA.runs.filter((run) => run.choice).map((run) =>
    el("p", { class: "muted", "data-part": "shown" }, `${MULTI_RUN ? run.label + ": " : ""}Showing ${run.choice}. Every figure and table of the overview counts all of them; verifiers-nemo report --max-rollouts N shows more.`)));
  fillSelect("filter-env", [...new Set(ROWS.map((r) => r[COL.env]))].sort().map((e) => [e]), "filter-env-label");
  fillSelect("filter-kind", [...new Set(ROWS.map((r) => r[COL.kind]).filter(Boolean))].sort().map((k) => [k]));

  function readFilters() {
    const value = (id) => document.getElementById(id).value.trim();
    state.filters = { run: value("filter-run"), env: value("filter-env"), status: value("filter-status"), kind: value("filter-kind"),
      task: value("filter-task"), rmin: value("filter-rmin"), rmax: value("filter-rmax") };
    state.page = 0;
    refresh();
  }
  for (const id of ["filter-run", "filter-env", "filter-status", "filter-kind"]) document.getElementById(id).addEventListener("change", readFilters);
  for (const id of ["filter-task", "filter-rmin", "filter-rmax"]) document.getElementById(id).addEventListener("input", readFilters);
  document.getElementById("filter-reset").addEventListener("click", () => {
    for (const id of ["filter-run", "filter-env", "filter-status", "filter-kind", "filter-task", "filter-rmin", "filter-rmax"]) document.getElementById(id).value = "";
    readFilters();
  });
  document.getElementById("page-size").addEventListener("change", (e) => { state.pageSize = Number(e.target.value); state.page = 0; refresh(); });
  document.getElementById("page-prev").addEventListener("click", () => { state.page = Math.max(0, state.page - 1); refresh(); });
  document.getElementById("page-next").addEventListener("click", () => { state.page += 1; refresh(); });

  function filterTo(filters) {
    document.getElementById("filter-reset").click();
    for (const [key, value] of Object.entries(filters)) document.getElementById(`filter-${key}`).value = value;
    readFilters();
    showTab("rollouts");
  }

  function matches(row, f) {
    if (f.run !== "" && f.run != null && String(row[COL.run]) !== f.run) return false;
    if (f.env && row[COL.env] !== f.env) return false;
    if (f.status && row[COL.status] !== f.status) return false;
    if (f.kind && row[COL.kind] !== f.kind) return false;
    if (f.task && row[COL.task] !== f.task && !String(row[COL.task]).includes(f.task)) return false;
    const reward = row[COL.reward];
    if (f.rmin !== "" && f.rmin != null && !(reward != null && reward >= Number(f.rmin))) return false;
    if (f.rmax !== "" && f.rmax != null && !(reward != null && reward <= Number(f.rmax))) return false;
    return true;
  }

  function refresh() {
    const f = state.filters;
    let view = [];
    for (let i = 0; i < ROWS.length; i++) if (matches(ROWS[i], f)) view.push(i);
    if (state.sort) {
      const c = COL[state.sort], sign = state.desc ? -1 : 1;
      const key = (v) => (v == null ? null : v);
      view.sort((a, b) => {
        const x = key(ROWS[a][c]), y = key(ROWS[b][c]);
        if (x === y) return a - b;
        if (x == null) return 1;
        if (y == null) return -1;
        if (state.sort === "task" && !isNaN(x) && !isNaN(y)) return sign * (Number(x) - Number(y));
        return sign * (x < y ? -1 : 1);
      });
    }
    state.view = view;
    const pages = Math.max(1, Math.ceil(view.length / state.pageSize));
    state.page = Math.min(state.page, pages - 1);
    const start = state.page * state.pageSize;
    const tbody = document.querySelector("#rollout-table tbody");
    const fragment = document.createDocumentFragment();
    for (const i of view.slice(start, start + state.pageSize)) {
      const row = ROWS[i];
      const cells = headers.map(([, key]) => {
        if (!key) return el("td", { class: "num" }, i + 1);
        let value = row[COL[key]];
        if (key === "run") value = String.fromCharCode(65 + value);
        if (key === "reward" || key === "latency") value = value == null ? "" : fmt(value);
        if (key === "status") return el("td", { class: `status-${value}` }, value);
        return el("td", { class: NUMERIC.has(key) ? "num" : null }, value ?? "");
      });
      fragment.append(el("tr", { "data-index": i, class: state.selected === i ? "selected" : null, onclick: () => openRollout(i) }, cells));
    }
    tbody.replaceChildren(fragment);
    for (const th of thead.querySelectorAll("th")) {
      const key = th.dataset.sort;
      th.textContent = headers.find(([, k]) => String(k) === key)?.[0] ?? th.textContent;
      if (key && key === state.sort) th.textContent += state.desc ? " ▼" : " ▲";
    }
    document.getElementById("match-count").textContent = `${count(view.length)} matching of ${count(ROWS.length)} rollouts` + (ALL_SHOWN ? "" : ` shown (of ${count(TOTAL)})`);
    document.getElementById("page-info").textContent = `page ${state.page + 1} of ${pages}`;
  }

  // -- transcript ----------------------------------------------------------------------------------
  let STRINGS = [];
  const text = (value) => (typeof value === "number" ? STRINGS[value] : value ?? "");
  function longText(value, limit = 2000) {
    const full = text(value);
    if (full.length <= limit) return el("pre", {}, full);
    const pre = el("pre", {}, full.slice(0, limit) + " …");
    const more = el("button", { type: "button", class: "link", onclick: () => { pre.textContent = full; more.remove(); } }, `show all ${count(full.length)} characters`);
    return el("div", {}, pre, more);
  }
  function callHead(number, call) {
    const parts = [`Policy call ${number + 1}`];
    if (call) {
      if (call.lat != null) parts.push(`${fmt(call.lat, 3)} s`);
      if (call.in != null || call.out != null) parts.push(`tokens in ${count(call.in)} · out ${count(call.out)}`);
      if (call.fin) parts.push(`finish ${call.fin}`);
      if (call.att) parts.push(`${call.att} attempts`);
      if (call.tok) parts.push(`token IDs: prompt ${count(call.tok[0])}, completion ${count(call.tok[1])}` + (call.tok[2] != null ? `, logprob mean ${fmt(call.tok[2])} min ${fmt(call.tok[3])}` : ""));
    }
    return el("div", { class: "call-head" }, parts.join(" · "), call && call.p != null ? el("div", { class: "muted" }, "request: " + text(call.p)) : null,
      call && call.err != null ? el("div", { class: "status-error" }, text(call.err)) : null);
  }

  async function openRollout(index) {
    state.selected = index;
    for (const tr of document.querySelectorAll("#rollout-table tbody tr")) tr.classList.toggle("selected", Number(tr.dataset.index) === index);
    const pane = document.getElementById("transcript");
    pane.replaceChildren(el("p", { class: "hint" }, "unpacking the transcripts ..."));
    const details = await loadDetails();
    STRINGS = details.S;
    const d = details.D[index], row = ROWS[index], run = DATA.runs[row[COL.run]];
    const position = state.view.indexOf(index);
    const nav = el("div", {},
      el("button", { type: "button", disabled: position <= 0, onclick: () => openRollout(state.view[position - 1]) }, "◀ previous"), " ",
      el("button", { type: "button", disabled: position < 0 || position >= state.view.length - 1, onclick: () => openRollout(state.view[position + 1]) }, "next ▶"));
    const badges = el("div", {},
      el("span", { class: `badge status-${row[COL.status]}` }, row[COL.status]),
      el("span", { class: "badge" }, `reward ${fmt(row[COL.reward])}`),
      row[COL.kind] ? el("span", { class: "badge" }, row[COL.kind]) : null,
      el("span", { class: "badge" }, `${count(row[COL.turns])} policy calls`),
      el("span", { class: "badge" }, `${count(row[COL.tools])} tool calls`),
      row[COL.latency] != null ? el("span", { class: "badge" }, `${fmt(row[COL.latency], 2)} s`) : null,
      row[COL.tokens_out] != null ? el("span", { class: "badge" }, `tokens in ${count(row[COL.tokens_in])} · out ${count(row[COL.tokens_out])}`) : null);
    const body = [el("h2", {}, `${MULTI_RUN ? String.fromCharCode(65 + row[COL.run]) + " · " : ""}${row[COL.env]} · task ${row[COL.task]} · rollout ${row[COL.rollout]}`),
      el("div", { class: "muted" }, run.label), badges, nav];
    if (row[COL.status] === "error") body.push(el("div", { class: "error-box", "data-part": "error" }, el("strong", {}, `Error: ${row[COL.kind]}`), el("pre", {}, d.msg || "")));
    if (row[COL.status] === "masked") body.push(el("div", { class: "masked-box" }, el("strong", {}, `Masked by Gym: ${row[COL.kind] || ""}`), el("pre", {}, d.msg || ""),
      el("div", { class: "muted" }, "Gym marked this reward as no valid measurement; it is left out of every statistic.")));
    if (d.tools && d.tools.length) body.push(el("div", { class: "muted" }, `tools offered: ${d.tools.join(", ")}`));
    if (!d.c.length) body.push(el("p", { class: "muted" }, "Policy calls were not saved with this run (verifiers-nemo eval --save-trace records each call's request, reply, latency and tokens); the messages follow."));
    const seen = new Set();
    for (const m of d.m) {
      if (m.k != null && !seen.has(m.k)) { seen.add(m.k); body.push(callHead(m.k, d.c[m.k])); }
      const parts = [el("div", {}, el("span", { class: "role" }, m.r), m.id ? el("span", { class: "muted" }, ` · output of ${m.id}`) : null)];
      if (m.rs != null) parts.push(el("details", {}, el("summary", {}, "reasoning"), longText(m.rs)));
      if (m.t != null) parts.push(longText(m.t));
      for (const [name, args, id] of m.tc || []) parts.push(el("div", { class: "tool-call", "data-part": "tool-call" }, el("strong", {}, `→ ${name}`), el("span", { class: "muted" }, id ? ` (${id})` : ""), longText(args, 800)));
      body.push(el("div", { class: `msg msg-${m.r}` }, parts));
    }
    d.c.forEach((call, k) => { if (!seen.has(k)) body.push(callHead(k, call)); });
    const verdict = [el("strong", {}, "Gym's verdict: "), row[COL.status] === "scored" ? `reward ${fmt(row[COL.reward])}` : row[COL.status] === "masked" ? `masked (reward ${fmt(row[COL.reward])} not counted)` : "no reward (the rollout failed)"];
    if (d.rec != null) verdict.push(` · recorded reward ${fmt(d.rec)}`);
    const metrics = Object.entries(d.met || {});
    body.push(el("div", { class: "verify", "data-part": "verify" }, verdict,
      metrics.length ? table(["metric", "value"], metrics.map(([k, v]) => [k, fmt(v, 4)]), [1]) : null));
    pane.replaceChildren(...body);
    pane.scrollTop = 0;
  }

  // -- runs compared -------------------------------------------------------------------------------
  const compareFigs = [];
  function renderCompare() {
    if (!DATA.compare.length) return;
    document.getElementById("tab-button-compare").hidden = false;
    const section = document.getElementById("tab-compare");
    for (const [n, c] of DATA.compare.entries()) {
      const letter = String.fromCharCode(66 + n);
      if (c.error) {
        section.append(el("h2", {}, `${letter}: ${c.b}  vs  A: ${c.a}`), el("p", { class: "error-box", "data-part": "compare-error" }, c.error));
        continue;
      }
      const verdict = (d) => (d.low == null ? "" : d.low > 0 ? `${letter} is better (the interval excludes 0)` : d.high < 0 ? `${letter} is worse (the interval excludes 0)` : "no difference shown (the interval includes 0)");
      const delta = (d) => el("span", { class: d.low > 0 ? "delta-good" : d.high < 0 ? "delta-bad" : null }, `${signed(d.mean)}${ci(d.low, d.high)}`);
      const onlyFlips = el("input", { type: "checkbox" });
      const tbody = el("tbody");
      const fill = () => {
        const tasks = c.tasks.filter((t) => !onlyFlips.checked || t.flip);
        tbody.replaceChildren(...tasks.map((t) => el("tr", {},
          el("td", {}, t.env), el("td", {}, el("button", { type: "button", class: "link", onclick: () => filterTo({ task: t.task, env: DATA.scopes.length > 1 ? t.env : "" }) }, t.task)),
          el("td", { class: "num" }, fmt(t.a)), el("td", { class: "num" }, fmt(t.b)),
          el("td", { class: "num" }, t.a != null && t.b != null ? signed(t.b - t.a) : "n/a"),
          el("td", { class: "num" }, fmt(t.a_pass)), el("td", { class: "num" }, fmt(t.b_pass)),
          el("td", { class: "num" }, `${t.a_n} / ${t.b_n}`),
          el("td", { class: t.flip === "fixed" ? "delta-good" : t.flip === "broken" ? "delta-bad" : null }, t.flip || ""))));
      };
      onlyFlips.addEventListener("change", fill);
      fill();
      const fig = el("div", { class: "fig" });
      compareFigs.push([fig, c.fig]);
      section.append(...[
        el("h2", {}, `${letter}: ${c.b}  vs  A: ${c.a}`),
        el("table", { class: "kv" }, el("tbody", {},
          el("tr", {}, el("td", {}, "mean reward, B − A"), el("td", {}, delta(c.reward_diff), ` over ${c.paired_tasks} tasks (paired, 95% ${c.reward_diff.method || ""} CI over tasks) · ${verdict(c.reward_diff)}`)),
          el("tr", {}, el("td", {}, "pass@1, B − A"), el("td", {}, delta(c.pass1_diff), ` (paired, 95% ${c.pass1_diff.method || ""} CI over tasks) · ${verdict(c.pass1_diff)}`)),
          el("tr", {}, el("td", {}, "flipped tasks"), el("td", {}, `${c.fixed} fixed (wrong in A, right in B), ${c.broken} broken (right in A, wrong in B); right = at least half of its rollouts correct`)))),
        c.notes.length ? el("ul", { class: "notes" }, c.notes.map((x) => el("li", {}, x))) : null,
        el("div", { class: "grid" }, fig),
        el("h3", {}, "Per task ", el("label", { class: "muted" }, onlyFlips, " only flipped tasks")),
        el("div", { class: "table-wrap" }, el("table", { "data-compare": n },
          el("thead", {}, el("tr", {}, ["env", "task", "A reward", `${letter} reward`, "Δ", "A pass@1", `${letter} pass@1`, "scored A / " + letter, "flip"].map((h) => el("th", {}, h)))),
          tbody)),
      ].filter(Boolean));
    }
  }
  async function drawCompareFigures() {
    const Plotly = await loadPlotly();
    while (compareFigs.length) {
      const [div, fig] = compareFigs.shift();
      await Plotly.newPlot(div, fig.data, fig.layout, { displaylogo: false, responsive: true, displayModeBar: "hover" });
    }
  }

  // -- start ---------------------------------------------------------------------------------------
  renderCompare();
  readFilters();
  const ready = renderOverview(DATA.scopes[0]).catch((e) => { showError(String(e)); throw e; });
  window.verifiersNemoReport = { ready, state, showTab, openRollout, loadDetails };
})();
