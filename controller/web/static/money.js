// The money page: for one account (the token's own; the daemon's token picks any from
// GET /v1/accounts), its ledger balance (GET /v1/accounts/{account}), the spot and
// on-demand cost of its bags so far (GET /v1/reports?account=...), and its last ledger
// entries (GET /v1/accounts/{account}/ledger, read incrementally: the API lists oldest
// first, so the page keeps a cursor and fetches only what is new), with the CPU-hours
// charged and the spot cost of its bags over time (uPlot, vendored: the global `uPlot`).
import { api, el, number, percent, poll, setStatus, usd, when } from "/ui/static/api.js";

const REFRESH_MS = 2000;
const REPORT_EVERY = 5; // the cost report is the heaviest call: every 5th refresh (10 s)
const LAST_ENTRIES = 50;
const PAGE = 1000;
const $ = (id) => document.getElementById(id);
const select = $("account");

const MAX_POINTS = 4000; // of the charged-over-time series (halved when it is reached)
const LAST_BY_KIND = 200; // entries kept per kind, for the kind filter

let ledger = { account: null, after: 0, entries: [], charged: 0, at: [], total: [] };
let lastReport = null;
let chart = null;
let ticks = 0;

const hours = (x) => number(x);

function facts(id, pairs) {
  $(id).replaceChildren(...pairs.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

async function pickAccount() {
  const { accounts } = await api("/v1/accounts");
  const names = accounts.map((a) => a.account);
  const wanted = new URLSearchParams(window.location.search).get("account");
  const current = select.value || wanted;
  const options = names.map((n) => el("option", { value: n }, n));
  if (select.options.length !== names.length || names.some((n, i) => select.options[i].value !== n)) {
    select.replaceChildren(...options);
  }
  if (names.includes(current)) select.value = current;
  $("account-picker").hidden = names.length < 2; // an account token sees only its own
  $("no-accounts").hidden = names.length > 0;
  return select.value || null;
}

function showBalance(b) {
  $("balance-section").hidden = false;
  const total = Math.max(b.allocation_cpu_h, b.charged_cpu_h + b.reserved_cpu_h + b.available_cpu_h, 1e-9);
  const bar = $("ledger-bar");
  for (const [part, value] of [["charged", b.charged_cpu_h], ["reserved", b.reserved_cpu_h], ["available", b.available_cpu_h]]) {
    const span = bar.querySelector(`.${part}`);
    span.style.width = b.unlimited ? "0" : `${(100 * value) / total}%`; // CSSOM: allowed by the CSP
    span.title = `${part} ${hours(value)} CPU-h`;
  }
  bar.hidden = b.unlimited;
  facts("balance", [
    ["Allocation", b.unlimited ? "unlimited" : hours(b.allocation_cpu_h)],
    ["Charged", hours(b.charged_cpu_h)],
    ["Reserved", hours(b.reserved_cpu_h)],
    ["Available", b.unlimited ? "unlimited" : hours(b.available_cpu_h)],
    ["Held jobs", b.held_jobs],
    ["Used", b.unlimited
      ? `${hours(b.charged_cpu_h)} CPU-h (no limit)`
      : percent(b.charged_cpu_h / Math.max(b.allocation_cpu_h, 1e-9))],
  ]);
}

function showCost(report) {
  $("cost-section").hidden = false;
  const t = report.totals;
  facts("cost", [
    ["Spot (paid)", usd(t.spot_cost_usd)],
    ["On-demand (same VM-hours)", usd(t.on_demand_cost_usd)],
    ["Saved", `${usd(t.savings_usd)} (${percent(t.savings_pct / 100)})`],
    ["VM-hours", hours(t.vm_h)],
    ["Preemptions", t.preemptions],
    ["Hours lost to preemption", hours(t.lost_h)],
  ]);
  $("cost-by-bag").tBodies[0].replaceChildren(
    ...report.by_bag.map((b) =>
      el(
        "tr",
        { "data-bag": b.bag_id },
        el("td", {}, el("a", { href: `/ui/bags/${encodeURIComponent(b.bag_id)}` }, b.bag_id)),
        el("td", {}, b.name),
        el("td", {}, el("span", { class: `badge ${b.state}` }, b.state)),
        el("td", {}, hours(b.vm_h)),
        el("td", {}, usd(b.spot_cost_usd)),
        el("td", {}, usd(b.on_demand_cost_usd)),
        el("td", {}, usd(b.savings_usd)),
      ),
    ),
  );
}

// Every charge read so far, summed: the CPU-hours charged over time.
function addCharges(entries) {
  for (const e of entries) {
    if (e.kind !== "charge") continue;
    ledger.charged += e.cpu_h;
    ledger.at.push(e.at);
    ledger.total.push(ledger.charged);
  }
  if (ledger.at.length > MAX_POINTS) { // keep every other point (and the last)
    const keep = (_, i, all) => i % 2 === 0 || i === all.length - 1;
    ledger.at = ledger.at.filter(keep);
    ledger.total = ledger.total.filter(keep);
  }
}

function drawOverTime() {
  const nowS = Date.now() / 1000;
  // The spot cost of the account's bags, each counted at its end (a running one's now).
  const ends = (lastReport ? lastReport.by_bag : [])
    .map((b) => [b.finished_at ?? nowS, b.spot_cost_usd])
    .sort((a, b) => a[0] - b[0]);
  const times = [...new Set([...ledger.at, ...ends.map(([t]) => t)])].sort((a, b) => a - b);
  if (!times.length) return;
  $("over-time-section").hidden = false;
  const charged = [];
  const cost = [];
  let i = 0;
  let j = 0;
  let c = 0;
  let spent = 0;
  for (const t of times) {
    while (i < ledger.at.length && ledger.at[i] <= t) c = ledger.total[i++];
    while (j < ends.length && ends[j][0] <= t) spent += ends[j++][1];
    charged.push(c);
    cost.push(spent);
  }
  const data = [times, charged, cost];
  if (!chart) {
    const box = $("over-time");
    chart = new uPlot({
      width: Math.max(280, Math.min(box.clientWidth || 760, 900)),
      height: 220,
      scales: { x: { time: true }, h: { auto: true }, usd: { auto: true } },
      axes: [
        {},
        { scale: "h", label: "CPU-h charged", size: 72, values: (u, ticks) => ticks.map((v) => number(v)) },
        { scale: "usd", side: 1, label: "spot cost", size: 80, grid: { show: false }, values: (u, ticks) => ticks.map((v) => usd(v)) },
      ],
      series: [
        {},
        { label: "CPU-h charged", scale: "h", stroke: "#c62828", width: 2, paths: uPlot.paths.stepped({ align: 1 }), value: (u, v) => number(v) },
        { label: "spot cost of its bags", scale: "usd", stroke: "#1f6feb", width: 2, paths: uPlot.paths.stepped({ align: 1 }), value: (u, v) => usd(v) },
      ],
    }, data, box);
  } else {
    chart.setData(data);
  }
}

async function readLedger(account) {
  if (ledger.account !== account) {
    ledger = { account, after: 0, entries: [], charged: 0, at: [], total: [] };
    lastReport = null;
    chart?.destroy();
    chart = null;
  }
  const path = `/v1/accounts/${encodeURIComponent(account)}/ledger`;
  for (;;) {
    const page = await api(`${path}?after=${ledger.after}&limit=${PAGE}`);
    if (ledger.account !== account) return; // the selection changed meanwhile
    if (page.entries.length) ledger.after = page.entries.at(-1).id;
    addCharges(page.entries);
    // The newest of each kind, so that filtering by kind finds some.
    const kept = ledger.entries.concat(page.entries);
    const seen = {};
    ledger.entries = kept
      .reverse()
      .filter((e) => (seen[e.kind] = (seen[e.kind] || 0) + 1) <= LAST_BY_KIND)
      .reverse();
    if (page.next_after === null) break;
  }
  renderLedger();
  drawOverTime();
}

function renderLedger() {
  $("ledger-section").hidden = false;
  const kind = $("kind").value;
  $("ledger").tBodies[0].replaceChildren(
    ...ledger.entries
      .filter((e) => !kind || e.kind === kind)
      .slice(-LAST_ENTRIES)
      .reverse()
      .map((e) =>
        el(
          "tr",
          { "data-entry": e.id },
          el("td", {}, e.id),
          el("td", {}, when(e.at)),
          el("td", {}, el("span", { class: `badge ${e.kind}` }, e.kind)),
          el("td", { class: "number" }, number(e.cpu_h)),
          el("td", {}, el("code", {}, e.key)),
          el("td", {}, e.note),
        ),
      ),
  );
}

async function refresh() {
  try {
    const account = await pickAccount();
    $("account-name").textContent = account || "";
    if (!account) return;
    const name = encodeURIComponent(account);
    const reportDue = ticks++ % REPORT_EVERY === 0;
    const [balance, report] = await Promise.all([
      api(`/v1/accounts/${name}`),
      reportDue ? api(`/v1/reports?account=${name}`) : null,
      readLedger(account),
    ]);
    if (select.value !== account && select.options.length > 1) return; // changed meanwhile
    showBalance(balance);
    if (report) {
      lastReport = report;
      showCost(report);
      drawOverTime();
    }
    setStatus(`Updated ${new Date().toLocaleTimeString()}`);
  } catch (error) {
    setStatus(`Cannot load the account: ${error.message}`, true);
  }
}

const now = poll(refresh, REFRESH_MS);
$("kind").addEventListener("change", renderLedger);
select.addEventListener("change", () => {
  const url = new URL(window.location.href);
  url.searchParams.set("account", select.value);
  window.history.replaceState(null, "", url);
  ticks = 0; // the new account's report at once
  now();
});
