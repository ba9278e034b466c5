// The money page: for one account (the token's own; the daemon's token picks any from
// GET /v1/accounts), its ledger balance (GET /v1/accounts/{account}), the spot and
// on-demand cost of its bags so far (GET /v1/reports?account=...), and its last ledger
// entries (GET /v1/accounts/{account}/ledger, read incrementally: the API lists oldest
// first, so the page keeps a cursor and fetches only what is new).
import { api, el, number, percent, poll, setStatus, usd, when } from "/ui/static/api.js";

const REFRESH_MS = 2000;
const REPORT_EVERY = 5; // the cost report is the heaviest call: every 5th refresh (10 s)
const LAST_ENTRIES = 50;
const PAGE = 1000;
const $ = (id) => document.getElementById(id);
const select = $("account");

let ledger = { account: null, after: 0, entries: [] };
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

async function readLedger(account) {
  if (ledger.account !== account) ledger = { account, after: 0, entries: [] };
  const path = `/v1/accounts/${encodeURIComponent(account)}/ledger`;
  for (;;) {
    const page = await api(`${path}?after=${ledger.after}&limit=${PAGE}`);
    if (ledger.account !== account) return; // the selection changed meanwhile
    if (page.entries.length) ledger.after = page.entries.at(-1).id;
    ledger.entries = ledger.entries.concat(page.entries).slice(-LAST_ENTRIES);
    if (page.next_after === null) break;
  }
  $("ledger-section").hidden = false;
  $("ledger").tBodies[0].replaceChildren(
    ...ledger.entries
      .slice()
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
    if (report) showCost(report);
    setStatus(`Updated ${new Date().toLocaleTimeString()}`);
  } catch (error) {
    setStatus(`Cannot load the account: ${error.message}`, true);
  }
}

const now = poll(refresh, REFRESH_MS);
select.addEventListener("change", () => {
  const url = new URL(window.location.href);
  url.searchParams.set("account", select.value);
  window.history.replaceState(null, "", url);
  ticks = 0; // the new account's report at once
  now();
});
