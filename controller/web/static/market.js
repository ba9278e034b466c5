// The market page: per VM type its spot price samples, per unit of size, beside the
// cloud index (GET /v1/hopping/prices, computed by the daemon with policies/index.py),
// drawn with uPlot (vendored; the global `uPlot`) with the hopper's moves marked; the
// market now and every move with its reason (GET /v1/hopping). Refreshed by polling;
// charts are updated in place.
import { ApiError, api, el, number, poll, setStatus, signedPercent, usd, when } from "/ui/static/api.js";

const REFRESH_MS = 5000; // prices change once per hopper round (minutes on a real cloud)
const $ = (id) => document.getElementById(id);
const charts = new Map(); // vm_type -> {section, chart}

const perUnit = (x) => number(x, 0, 3);

function sinceOf(nowS) {
  const range = $("range").value;
  return range === "all" ? 0 : Math.max(0, Math.floor(nowS - Number(range)));
}

// The value of a series (aligned on `xs`) in effect at time t: the last sample at or before.
function valueAt(xs, ys, t) {
  let found = null;
  for (let i = 0; i < xs.length && xs[i] <= t; i++) if (ys[i] !== null) found = ys[i];
  return found;
}

function chartData(type, index, moves) {
  // One x axis: the sampling times and the times of this type's moves.
  const own = new Map(type.at.map((t, i) => [t, type.normalized[i]]));
  const idx = new Map(index.at.map((t, i) => [t, index.value[i]]));
  const away = moves.filter((m) => m.from_type === type.vm_type);
  const here = moves.filter((m) => m.to_type === type.vm_type);
  const xs = [...new Set([...index.at, ...away.map((m) => m.at), ...here.map((m) => m.at)])].sort((a, b) => a - b);
  const prices = xs.map((t) => (own.has(t) ? own.get(t) : null));
  const at = (list) => {
    const times = new Set(list.map((m) => m.at));
    return xs.map((t) => (times.has(t) ? valueAt(type.at, type.normalized, t) : null));
  };
  return [xs, prices, xs.map((t) => (idx.has(t) ? idx.get(t) : null)), at(away), at(here)];
}

function makeChart(container, title) {
  const marker = (color) => ({ show: true, size: 11, fill: color, stroke: color });
  const steps = uPlot.paths.stepped({ align: 1 }); // a price holds until the next sample
  const options = {
    title,
    width: Math.max(320, Math.min(container.clientWidth || 760, 1000)),
    height: 220,
    scales: { x: { time: true } },
    axes: [{}, { label: "USD/h per unit", size: 70 }],
    series: [
      {},
      { label: "price / unit", stroke: "#1f6feb", width: 2, spanGaps: true, paths: steps },
      { label: "index", stroke: "#9a6700", width: 2, dash: [6, 4], spanGaps: true, paths: steps },
      { label: "moved away ▼", stroke: "#c62828", paths: () => null, points: marker("#c62828") },
      { label: "moved here ▲", stroke: "#1a7f37", paths: () => null, points: marker("#1a7f37") },
    ],
  };
  return new uPlot(options, [[], [], [], [], []], container);
}

function typeSection(vmType) {
  const box = el("div", { class: "chart" });
  const section = el("section", { class: "market-type", "data-type": vmType },
    el("h2", {}, vmType, " ", el("span", { class: "counts" })), box);
  $("types").append(section);
  return { section, box, chart: null };
}

function renderCharts(prices, moves) {
  const shown = new Set();
  for (const type of prices.types) {
    if (!type.at.length) continue;
    shown.add(type.vm_type);
    const entry = charts.get(type.vm_type) || typeSection(type.vm_type);
    charts.set(type.vm_type, entry);
    entry.section.querySelector(".counts").textContent =
      `${type.cpus} vCPUs · ${type.memory_gb} GB · unit ${number(type.size, 0, 3)} · ${type.at.length} samples`;
    if (!entry.chart) entry.chart = makeChart(entry.box, `${type.vm_type}: price per unit and the index`);
    entry.chart.setData(chartData(type, prices.index, moves));
  }
  for (const [vmType, entry] of charts) {
    if (!shown.has(vmType)) {
      entry.chart?.destroy();
      entry.section.remove();
      charts.delete(vmType);
    }
  }
  return shown.size;
}

function versusIndex(normalized, index) {
  if (normalized === null || index === null || index === undefined) return "";
  const diff = normalized / index - 1;
  const change = signedPercent(diff);
  if (change === "0 %") return "at the index";
  return `${diff < 0 ? "below" : "above"} (${change})`;
}

function renderNow(rows, indexNow) {
  $("now-section").hidden = rows.length === 0;
  $("market-now").tBodies[0].replaceChildren(...rows.map((r) => el(
    "tr",
    { "data-type": r.vm_type },
    el("td", {}, r.vm_type),
    el("td", { class: "number" }, usd(r.price_now)),
    el("td", { class: "number" }, usd(r.price_mean)),
    el("td", { class: "number" }, usd(r.price_std)),
    el("td", { class: "number" }, usd(r.on_demand)),
    el("td", { class: "number" }, perUnit(r.normalized_now)),
    el("td", {}, versusIndex(r.normalized_now, indexNow)),
  )));
}

function jobsText(jobs) {
  try {
    const list = JSON.parse(jobs);
    return list.length === 1 ? `${list[0][0]}-${list[0][1]}` : `${list.length} jobs`;
  } catch {
    return "";
  }
}

function renderMoves(moves, configured) {
  $("moves").hidden = moves.length === 0;
  $("moves").tBodies[0].replaceChildren(...moves.map((m) => el(
    "tr",
    { "data-move": m.id },
    el("td", {}, when(m.at)),
    el("td", {}, el("code", {}, m.vm_id)),
    el("td", {}, m.from_type),
    el("td", {}, m.to_type),
    el("td", {}, m.policy),
    el("td", { class: "number" }, usd(m.price_from)),
    el("td", { class: "number" }, usd(m.price_to)),
    el("td", { class: "number" }, perUnit(m.index_price)),
    el("td", {}, jobsText(m.jobs)),
    el("td", { class: "reason" }, m.reason),
  )));
  $("no-moves").hidden = moves.length > 0;
  $("no-moves").textContent = !configured.enabled
    ? "No moves: spot hopping is off."
    : configured.migrate
      ? "No moves yet: the hopper moves checkpointable jobs when another type's saving pays for the move."
      : "No moves: migration is off ([hopping] migrate = false); the policy only chooses the type of new VMs.";
}

async function refresh() {
  try {
    const hopping = await api("/v1/hopping");
    const nowS = Date.now() / 1000;
    const prices = await api(`/v1/hopping/prices?since=${sinceOf(nowS)}`);
    const moves = hopping.migrations; // newest first
    const drawn = renderCharts(prices, moves);
    const index = prices.index.value.filter((v) => v !== null);
    const indexNow = index.length ? index[index.length - 1] : null;
    renderNow(hopping.market, indexNow);
    renderMoves(moves, hopping.configured);
    const noData = drawn === 0 && hopping.market.length === 0;
    $("no-market").hidden = !noData;
    $("market-hint").hidden = noData;
    $("no-market").textContent = !prices.enabled
      ? "No market data: spot hopping is off ([hopping] enabled = false), so the daemon samples no prices."
      : "No market data yet: the hopper has recorded no price in this range (it samples every [hopping] interval_s).";
    const c = hopping.configured;
    const facts = [
      ["Hopping", c.enabled ? `on, policy ${c.policy}` : "off"],
      ["Migration", c.enabled && c.migrate ? "on" : "off"],
      ["Index now", indexNow === null ? "none" : `${perUnit(indexNow)} USD/h per unit`],
      ["Moves", moves.length],
    ];
    $("market-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
    setStatus(`Updated ${new Date().toLocaleTimeString()}${prices.truncated ? " (the oldest samples of this range are left out)" : ""}`);
  } catch (error) {
    if (error instanceof ApiError && error.status === 403) {
      setStatus("The market is shown to the daemon's token only: an account token may not see it.", true);
    } else {
      setStatus(`Cannot load the market: ${error.message}`, true);
    }
  }
}

const now = poll(refresh, REFRESH_MS);
$("range").addEventListener("change", now);
