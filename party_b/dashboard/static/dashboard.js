// Party B's operator dashboard: reads /dashboard/api/* with the operator credential and
// redraws every few seconds. Everything shown that came from party A (run names) is set as
// text, never as markup. Query ?every=SECONDS changes the refresh period (default 2 s).
"use strict";

const KEY = "fedlite-b-operator-credential";
const EVERY_MS = Math.max(500, 1000 * (Number(new URLSearchParams(location.search).get("every")) || 2));
const $ = (id) => document.getElementById(id);
let timer = null;
let generation = 0; // a refresh started later (hash change, sign-in) supersedes this one

class Refused extends Error {}

async function api(path) {
  const response = await fetch(path, {
    headers: { Authorization: `Bearer ${sessionStorage.getItem(KEY) || ""}` },
    cache: "no-store",
  });
  if (!response.ok) {
    // Read the problem body before the page reacts: a refusal leads to the sign-in form, and a
    // body still loading when the user (or a test) navigates on would be torn off mid-transfer.
    const problem = await response.json().catch(() => ({}));
    if (response.status === 401) throw new Refused("the server refused that credential");
    throw new Error(problem.detail || `HTTP ${response.status}`);
  }
  return response.json();
}

// ------------------------------------------------------------------ formatting

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "kB", "MB", "GB", "TB"];
  let i = 0;
  while (Math.abs(n) >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return `${i ? n.toPrecision(3) : Math.round(n)} ${units[i]}`;
}

function number(n, digits) {
  if (n === null || n === undefined || !isFinite(n)) return "–";
  return n.toLocaleString("en", { maximumFractionDigits: digits === undefined ? 0 : digits });
}

function ago(iso) {
  const seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (seconds < 90) return `${Math.round(seconds)} s ago`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 129600) return `${Math.round(seconds / 3600)} h ago`;
  return new Date(iso).toLocaleString();
}

function duration(seconds) {
  if (seconds < 120) return `${Math.round(seconds)} s`;
  if (seconds < 7200) return `${Math.round(seconds / 60)} min`;
  if (seconds < 172800) return `${(seconds / 3600).toFixed(1)} h`;
  return `${(seconds / 86400).toFixed(1)} days`;
}

// ------------------------------------------------------------------ DOM helpers

function node(tag, content, className) {
  const element = document.createElement(tag);
  if (content !== undefined && content !== null) element.textContent = String(content);
  if (className) element.className = className;
  return element;
}

function row(cells) {
  const tr = document.createElement("tr");
  for (const cell of cells) {
    if (cell instanceof Node) { const td = node("td"); td.appendChild(cell); tr.appendChild(td); }
    else tr.appendChild(node("td", cell));
  }
  return tr;
}

// The run's label privacy: its epsilon (or none), and what its token has spent of its budget.
function privacyCard(privacy) {
  const run = privacy.privacy;
  const owner = privacy.owner_privacy;
  const spent = owner.epsilon_spent === null ? "unbounded" : number(owner.epsilon_spent, 2);
  const budget = owner.epsilon_budget === null ? "no budget" : `budget ${number(owner.epsilon_budget, 2)}`;
  const drawn = run.randomized_labels ? `; labels drawn ${run.randomized_labels.drawn}` : "";
  return ["Label privacy", run.label_dp ? `ε ${number(run.epsilon, 2)}` : "no bound",
    `${run.policy}${drawn}; token spent ${spent}, ${budget}`];
}

function cards(container, items) {
  container.replaceChildren(...items.map(([label, value, note]) => {
    const card = node("div", null, "card");
    card.append(node("div", label, "label"), node("div", value, "value"));
    if (note) card.appendChild(node("div", note, "note"));
    return card;
  }));
}

// ------------------------------------------------------------------ the views

function showHealth(server) {
  const requests = server.latency.reduce((sum, r) => sum + r.requests, 0);
  cards($("health"), [
    ["Open runs", number(server.open_runs), `${number(server.runs_in_memory)} in memory`],
    ["Steps / s", number(server.steps_per_second, 2), "all runs, last minute"],
    ["Memory", bytes(server.memory_bytes), server.memory_kind],
    ["Requests", number(requests), "since start-up"],
    ["Uptime", duration(server.uptime_seconds), `since ${new Date(server.started_at).toLocaleString()}`],
  ]);
  const ms = (v) => (v === null ? "–" : `${number(v, v < 10 ? 2 : 1)} ms`);
  $("latency").tBodies[0].replaceChildren(...server.latency.slice(0, 14).map((r) =>
    row([r.route, number(r.requests), ms(r.mean_ms), ms(r.p50_ms), ms(r.p95_ms)])));
}

function selectedRun() {
  const match = location.hash.match(/^#run=([0-9a-f]+)$/);
  return match ? match[1] : null;
}

function showRuns(runs) {
  $("no-runs").hidden = runs.length > 0;
  const chosen = selectedRun();
  $("runs").tBodies[0].replaceChildren(...runs.map((run) => {
    const link = node("a", run.name);
    link.href = `#run=${run.id}`;
    const name = node("span");
    name.append(link, " ", node("span", run.id.slice(0, 8), "id"));
    const progress = node("span");
    const bar = document.createElement("progress");
    bar.max = Math.max(1, run.steps);
    bar.value = run.step;
    progress.append(`${number(run.step)} / ${number(run.steps)} `, bar);
    const aligned = run.aligned === null ? "–"
      : `${number(run.aligned)} (${number(run.train)} / ${number(run.eval)})`;
    const tr = row([name, run.owner, node("span", run.status, `badge ${run.status}`), progress,
      ago(run.last_activity), run.checkpoint === null ? "–" : number(run.checkpoint), aligned,
      `${run.model} · ${run.mode}`]);
    tr.dataset.runId = run.id;
    if (run.id === chosen) tr.className = "selected";
    tr.addEventListener("click", () => { location.hash = `run=${run.id}`; });
    return tr;
  }));
}

function metricsText(metrics) {
  return Object.entries(metrics).map(([k, v]) => `${k} ${number(v, 4)}`).join(", ");
}

function evaluationSeries(evaluations, pick) {
  const names = new Map();
  for (const e of evaluations) {
    for (const [name, value] of pick(e)) {
      const key = `${e.split} ${name}`;
      if (!names.has(key)) names.set(key, []);
      names.get(key).push([e.step, value]);
    }
  }
  return [...names].map(([name, points]) => ({ name, points, dots: true }));
}

function showRun(report) {
  const run = report.run;
  const traffic = report.traffic;
  $("run").hidden = false;
  $("run-title").textContent = `Run ${run.name} (${run.id}) of ${run.owner}`;
  const last = report.evaluations[report.evaluations.length - 1];
  const labelDp = report.privacy.privacy.label_dp;
  // under label DP party A's evaluations are on randomized labels: the card shows the truth
  const lastMetrics = !last ? "none yet" : labelDp && last.true_metrics
    ? `true labels: ${metricsText(last.true_metrics)}` : metricsText(last.metrics);
  cards($("run-cards"), [
    ["State", run.status, run.in_memory ? "model in memory" : "not in memory"],
    ["Step", `${number(run.step)} / ${number(run.steps)}`,
      run.checkpoint === null ? "no checkpoint" : `checkpoint at ${number(run.checkpoint)}`],
    ["Steps / s", number(report.steps_per_second, 2), "newest 50 steps"],
    ["Uplink / step", bytes(traffic.up_per_step), `${bytes(traffic.up_total)} in all`],
    ["Downlink / step", bytes(traffic.down_per_step), `${bytes(traffic.down_total)} in all`],
    ["Compression", traffic.compression === null ? "–" : `${number(traffic.compression, 1)}×`,
      traffic.raw_per_step === null ? "clients schedule: not shown"
        : `raw float32: ${bytes(traffic.raw_per_step)} / step`],
    ["Aligned", number(run.aligned), run.aligned === null ? "not aligned yet"
      : `${number(run.train)} train / ${number(run.eval)} eval`],
    ["Last evaluation", last ? `step ${number(last.step)}` : "–", lastMetrics],
    privacyCard(report.privacy),
  ]);
  const at = (p) => (p.first + p.last) / 2;
  const evalsLoss = evaluationSeries(report.evaluations, (e) => [["loss", e.loss]]);
  const evalsMetrics = evaluationSeries(report.evaluations, (e) => [
    ...Object.entries(e.metrics).filter(([k]) => k !== "label_rate")
      .map(([k, v]) => [labelDp ? `${k} (randomized labels)` : k, v]),
    ...(labelDp && e.true_metrics ? Object.entries(e.true_metrics)
      .map(([k, v]) => [`${k} (true labels)`, v]) : []),
  ]);
  Charts.draw($("chart-loss"), { empty: "no steps yet", series: [
    { name: "train batch loss", points: report.points.map((p) => [at(p), p.loss]) },
    ...evalsLoss.map((s, i) => ({ ...s, color: (i + 1) % 6 })),
  ] });
  Charts.draw($("chart-metrics"), { empty: "no steps yet", series: [
    { name: "batch accuracy", points: report.points.map((p) => [at(p), p.accuracy]) },
    ...evalsMetrics.map((s, i) => ({ ...s, color: (i + 1) % 6 })),
  ] });
  Charts.draw($("chart-bytes"), { logY: true, format: (v) => bytes(v), empty: "no steps yet",
    series: [
      { name: "uplink", points: report.points.map((p) => [at(p), p.up_bytes]) },
      { name: "downlink", points: report.points.map((p) => [at(p), p.down_bytes]) },
    ] });
  Charts.draw($("chart-compression"), { fromZero: true, empty: traffic.raw_per_step === null
    ? "not shown under the clients schedule" : "no steps yet", series: [
    { name: "raw / sent", points: report.points.map((p) => [at(p), p.compression]), color: 2 },
  ] });
  Charts.draw($("chart-time"), { fromZero: true, empty: "no steps yet", series: [
    { name: "ms per step", points: report.points.map((p) => [at(p), p.step_ms]), color: 3 },
  ] });
  $("parties").hidden = report.parties.length === 0;  // a run with several feature parties
  $("party-traffic").tBodies[0].replaceChildren(...report.parties.map((p) =>
    row([p.name, number(p.cut_dim), p.quantizer, p.downlink, number(p.steps),
      bytes(p.up_per_step), bytes(p.down_per_step), bytes(p.up_total), bytes(p.down_total)])));
  $("evaluations").tBodies[0].replaceChildren(...report.evaluations.slice().reverse().map((e) =>
    row([number(e.step), e.split, number(e.n), number(e.loss, 4), metricsText(e.metrics),
      e.true_metrics ? `loss ${number(e.true_loss, 4)}, ${metricsText(e.true_metrics)}` : "–",
      ago(e.created_at)])));
}

// ------------------------------------------------------------------ refresh and sign-in

async function refresh() {
  const mine = ++generation;
  clearTimeout(timer);
  try {
    const overview = await api("api/overview");
    showHealth(overview.server);
    let chosen = selectedRun();
    if (!chosen && overview.runs.length) {
      const training = overview.runs.find((r) => r.status === "training");
      chosen = (training || overview.runs[0]).id;
      history.replaceState(null, "", `#run=${chosen}`);
    }
    showRuns(overview.runs);
    if (chosen) showRun(await api(`api/runs/${chosen}?points=300`));
    else $("run").hidden = true;
    $("status").textContent = `updated ${new Date().toLocaleTimeString()}, every ${EVERY_MS / 1000} s`;
  } catch (error) {
    if (mine !== generation) return;
    if (error instanceof Refused) return signOut(`Refused: ${error.message}.`);
    $("status").textContent = `party B did not answer: ${error.message}`;
  }
  if (mine === generation) timer = setTimeout(refresh, EVERY_MS);
}

function signIn(credential) {
  sessionStorage.setItem(KEY, credential);
  $("login").hidden = true;
  $("board").hidden = false;
  $("sign-out").hidden = false;
  refresh();
}

function signOut(message) {
  generation++;
  clearTimeout(timer);
  sessionStorage.removeItem(KEY);
  $("board").hidden = true;
  $("sign-out").hidden = true;
  $("login").hidden = false;
  $("status").textContent = "";
  $("login-error").textContent = message || "";
  $("credential").value = "";
  $("credential").focus();
}

$("login-form").addEventListener("submit", (event) => {
  event.preventDefault();
  signIn($("credential").value.trim());
});
$("sign-out").addEventListener("click", () => signOut("Signed out."));
window.addEventListener("hashchange", refresh);
if (sessionStorage.getItem(KEY)) signIn(sessionStorage.getItem(KEY));
else signOut();
