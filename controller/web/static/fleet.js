// The fleet page: live VMs (GET /v1/vms) grouped by type, with age, state, jobs and cost
// so far, and per type the preemption model the scheduler assumes (GET /v1/models): its
// survival and hazard curves (computed by the daemon) drawn with uPlot (vendored; the
// global `uPlot`), each live VM placed on the curve at its age. Refreshed by polling; a chart is updated in place.
// The range selector adds the VMs that ended (GET /v1/vms?all=true, as `spotbag vms --all`):
// in the last hour, the last day, or all of the newest 1,000; kept in the address (?range=).
import { ApiError, api, duration, el, number, percent, poll, setStatus, usd, when } from "/ui/static/api.js";

const REFRESH_MS = 2000;
const ALL_LIMIT = 1000;
const types = new Map(); // vm_type -> {section, chart, table}
const range = document.getElementById("range");
range.value = new URLSearchParams(window.location.search).get("range") || "live";
if (!range.value) range.value = "live"; // an unknown value in the address

// The curves come from the API (GET /v1/models: `curves` per model key, and per VM its
// survival to now and expected remaining life), computed by policies/preemption.py: the
// page draws them and computes none.

// --- the page ----------------------------------------------------------------------------

function ageHours(vm, inUse, nowS) {
  const view = inUse.get(vm.id);
  if (view) return view.age_h; // model hours (the driver's time scale applied)
  const end = vm.ended_at ?? nowS; // an ended VM: the age it reached
  return (Math.max(0, end - vm.requested_at) * (vm.time_scale || 1)) / 3600;
}

const LIVE = new Set(["pending", "running"]);

function isHotSpare(vm, view) {
  // The planner keeps an idle VM past its risky start as a hot spare (docs/design.md#reuse); the API
  // gives "stable" per VM and its running jobs, not the planner's decision itself.
  return Boolean(view && view.stable) && vm.state === "running" && vm.jobs === 0 && !vm.terminating;
}

function verdict(view) {
  if (!view || view.stable === null || view.stable === undefined) return "no reuse table (reused while jobs fit)";
  return view.stable ? "stable: kept as a hot spare when idle" : "early phase: released when idle";
}

function chartData(curve, vms) {
  // The curve's ages and the VMs' own ages on one x axis: a VM's dot sits at its survival.
  const points = curve.age_h.map((t, i) => ({ t, s: curve.survival[i], h: curve.hazard[i], vms: [] }));
  for (const v of vms) points.push({ t: v.age, s: v.view.survival, h: null, vms: [v] });
  points.sort((a, b) => a.t - b.t);
  const dot = (spare) => points.map((p) => (p.vms.some((v) => v.spare === spare) ? p.s : null));
  return [points.map((p) => p.t), points.map((p) => p.s), points.map((p) => p.h), dot(false), dot(true)];
}

function makeChart(container, title) {
  const dots = (color) => ({ show: true, size: 9, fill: color, stroke: color });
  const options = {
    title,
    width: Math.max(280, Math.min(container.clientWidth || 760, 900)),
    height: 240,
    scales: { x: { time: false }, S: { range: [0, 1.02] }, h: { auto: true } },
    axes: [
      { label: "age (h)" },
      { scale: "S", label: "survival S(t)" },
      { scale: "h", side: 1, label: "hazard (per h)", grid: { show: false } },
    ],
    series: [
      { label: "age", value: (u, v) => (v === null ? "" : duration(v * 3600)) },
      { label: "S(t)", scale: "S", stroke: "#1f6feb", width: 2 },
      { label: "h(t)", scale: "h", stroke: "#9a6700", width: 1, dash: [5, 4] },
      { label: "VMs", scale: "S", stroke: "#c62828", paths: () => null, points: dots("#c62828") },
      { label: "hot spares", scale: "S", stroke: "#1a7f37", paths: () => null, points: dots("#1a7f37") },
    ],
  };
  return new uPlot(options, [[0], [null], [null], [null], [null]], container);
}

function vmRow(vm) {
  const view = vm.view;
  const remaining = !view || !view.model ? "" : view.expected_remaining_h === null
    ? "unbounded" : duration(view.expected_remaining_h * 3600);
  return el(
    "tr",
    { "data-vm": vm.id, "data-state": vm.state, class: LIVE.has(vm.state) ? null : "ended" },
    el("td", {}, el("code", {}, vm.id)),
    el("td", {}, vm.zone),
    el("td", {}, el("span", { class: `badge ${vm.state}` }, vm.terminating ? "terminating" : vm.state),
      vm.spare ? el("span", { class: "badge spare" }, "hot spare") : null,
      // A preemption notice: the provider takes it by then (it takes no new job).
      LIVE.has(vm.state) && vm.notice_until
        ? el("span", { class: "badge notice", title: "preemption notice" },
          `notice: ends by ${when(vm.notice_until)}`)
        : null),
    // An on-demand VM (the deadline policy's, or a bag's `on_demand: always`): marked.
    el("td", {}, (vm.on_demand ?? !vm.spot)
      ? el("span", { class: "badge on-demand", title: "on-demand: never preempted, full price" }, "on-demand")
      : "spot"),
    el("td", {}, duration(vm.age * 3600)),
    el("td", {}, vm.jobs),
    el("td", {}, usd(vm.cost_usd)),
    el("td", {}, view && view.survival !== null ? percent(view.survival) : ""),
    el("td", {}, remaining),
    el("td", {}, LIVE.has(vm.state) ? verdict(vm.view) : vm.reason || `${vm.state}`),
  );
}

function typeSection(vmType) {
  const chart = el("div", { class: "chart" });
  const table = el(
    "table",
    { class: "vms" },
    el("thead", {}, el("tr", {}, ...["VM", "Zone", "State", "Market", "Age", "Jobs", "Cost so far",
      "Survives to now", "Expected remaining life", "Reuse policy (live) or how it ended"].map((h) => el("th", {}, h)))),
    el("tbody"),
  );
  const section = el("section", { class: "vm-type", "data-type": vmType },
    el("h2", {}, vmType, " ", el("span", { class: "counts" })), el("p", { class: "hint model" }), chart, table);
  document.getElementById("types").append(section);
  return { section, chartBox: chart, chart: null, table, modelKey: null };
}

function modelText(view) {
  if (!view) return "No model in use for this type (no live VM the scheduler tracks).";
  const params = Object.entries(view.parameters || {})
    .map(([k, v]) => `${k} = ${number(Number(v), 0, 3)}`)
    .join(", ");
  return `Model: ${view.model}${params ? ` (${params})` : ""} · key ${view.key} · from ${view.source}`;
}

function render(vms, models, usage) {
  const nowS = Date.now() / 1000;
  const inUse = new Map(models.in_use.map((m) => [m.vm_id, m]));
  const groups = new Map();
  for (const raw of vms) {
    const view = inUse.get(raw.id);
    const vm = { ...raw, view, age: ageHours(raw, inUse, nowS), spare: isHotSpare(raw, view) };
    groups.set(vm.vm_type, [...(groups.get(vm.vm_type) || []), vm]);
  }
  for (const [vmType, entry] of types) {
    if (!groups.has(vmType)) {
      if (entry.chart) entry.chart.destroy();
      entry.section.remove();
      types.delete(vmType);
    }
  }
  for (const [vmType, group] of [...groups].sort(([a], [b]) => a.localeCompare(b))) {
    const entry = types.get(vmType) || typeSection(vmType);
    types.set(vmType, entry);
    const view = group.map((v) => v.view).find(Boolean);
    const spares = group.filter((v) => v.spare).length;
    const live = group.filter((v) => LIVE.has(v.state)).length;
    const ended = group.length - live;
    const preempted = group.filter((v) => v.state === "preempted").length;
    entry.section.querySelector("h2 .counts").textContent =
      `${live} live${spares ? ` · ${spares} hot spare${spares > 1 ? "s" : ""}` : ""}` +
      (ended ? ` · ${ended} ended${preempted ? ` (${preempted} preempted)` : ""}` : "");
    entry.section.querySelector("p.model").textContent = modelText(view);
    // Live VMs first, oldest first; then the ended ones, the last to end first.
    const order = (v) => (LIVE.has(v.state) ? [0, -v.age] : [1, -(v.ended_at || 0)]);
    group.sort((a, b) => {
      const [x, y] = [order(a), order(b)];
      return x[0] - y[0] || x[1] - y[1];
    });
    entry.table.tBodies[0].replaceChildren(...group.map(vmRow));
    const curve = view ? models.curves[view.key] : null;
    if (curve) {
      const key = `${view.model}:${JSON.stringify(view.parameters)}`;
      if (!entry.chart || entry.modelKey !== key) {
        if (entry.chart) entry.chart.destroy();
        entry.chart = makeChart(entry.chartBox, `${vmType}: ${view.model} model`);
        entry.modelKey = key;
      }
      const onCurve = group.filter((v) => v.view && v.view.key === view.key);
      entry.chart.setData(chartData(curve, onCurve));
    }
  }
  document.getElementById("empty").hidden = vms.length > 0;
  document.getElementById("empty").textContent =
    range.value === "live" ? "No live VMs." : "No VMs in this range.";
  const liveCount = vms.filter((v) => LIVE.has(v.state)).length;
  document.getElementById("ended-hint").hidden = liveCount === vms.length;
  const total = usage.total;
  const c = models.configured;
  const facts = [
    ["Live VMs", liveCount],
    ["Preempted (all)", total.vms_preempted],
    ["VM-hours (all)", number(total.vm_hours)],
    ["Spot cost (all)", usd(total.spot_cost_usd)],
    ["On-demand equivalent", usd(total.on_demand_cost_usd)],
    ["Configured model", c.model],
    ["Reuse policy", c.reuse_policy],
  ];
  document.getElementById("fleet-facts")
    .replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

async function refresh() {
  try {
    const all = range.value !== "live";
    const [{ vms, usage }, models] = await Promise.all([
      api(all ? `/v1/vms?all=true&limit=${ALL_LIMIT}` : "/v1/vms"),
      api("/v1/models"),
    ]);
    const since = range.value === "live" || range.value === "all" ? null : Date.now() / 1000 - Number(range.value);
    const shown = since === null ? vms : vms.filter((v) => LIVE.has(v.state) || (v.ended_at ?? Infinity) >= since);
    render(shown, models, usage);
    setStatus(`Updated ${new Date().toLocaleTimeString()}`);
  } catch (error) {
    if (error instanceof ApiError && error.status === 403) {
      setStatus("The fleet is shown to the daemon's token only: an account token may not list VMs.", true);
    } else {
      setStatus(`Cannot load the fleet: ${error.message}`, true);
    }
  }
}

const now = poll(refresh, REFRESH_MS);
range.addEventListener("change", () => {
  const url = new URL(window.location.href);
  url.searchParams.set("range", range.value);
  window.history.replaceState(null, "", url);
  now();
});
