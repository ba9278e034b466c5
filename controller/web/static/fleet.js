// The fleet page: live VMs (GET /v1/vms) grouped by type, with age, state, jobs and cost
// so far, and per type the preemption model the scheduler assumes (GET /v1/models): its
// survival and hazard curves drawn with uPlot (vendored; the global `uPlot`), each live VM
// placed on the curve at its age. Refreshed by polling; a chart is updated in place.
import { ApiError, api, duration, el, percent, poll, setStatus, usd } from "/ui/static/api.js";

const REFRESH_MS = 2000;
const POINTS = 240;
const BATHTUB_L_H = 24; // the deadline of SPEC §2 (the API's parameters leave L out)
const types = new Map(); // vm_type -> {section, chart, table}

// --- the models (SPEC §2): F(t) and f(t) from the parameters the API gives --------------

// A lifetime model as {cdf, pdf, end}: end is its deadline (hours) or null.
function lifetimeModel(name, p) {
  const clip = (x) => Math.min(1, Math.max(0, x));
  switch (name) {
    case "none":
      return { cdf: () => 0, pdf: () => 0, end: null };
    case "exponential":
      return { cdf: (t) => -Math.expm1(-t / p.mttf_h), pdf: (t) => Math.exp(-t / p.mttf_h) / p.mttf_h, end: null };
    case "weibull":
      return {
        cdf: (t) => -Math.expm1(-((t / p.lam) ** p.k)),
        pdf: (t) => {
          const z = (Math.max(t, 1e-9) / p.lam) ** p.k;
          return (p.k / Math.max(t, 1e-9)) * z * Math.exp(-z);
        },
        end: null,
      };
    case "gompertz_makeham": {
      const cumhaz = (t) => p.lam * t + (p.alpha / p.beta) * Math.expm1(p.beta * t);
      return {
        cdf: (t) => -Math.expm1(-cumhaz(t)),
        pdf: (t) => (p.lam + p.alpha * Math.exp(p.beta * t)) * Math.exp(-cumhaz(t)),
        end: null,
      };
    }
    case "bathtub": {
      // Paper eq. 1, shifted so that F(0) = 0, clipped to [0, 1]; every VM alive at L dies there.
      const offset = p.A * Math.exp(-p.b / p.tau2);
      const raw = (t) => p.A * (-Math.expm1(-t / p.tau1) + Math.exp((t - p.b) / p.tau2));
      return {
        cdf: (t) => (t >= BATHTUB_L_H ? 1 : clip(raw(t) - offset)),
        pdf: (t) =>
          t >= BATHTUB_L_H || raw(t) - offset >= 1
            ? 0
            : p.A * (Math.exp(-t / p.tau1) / p.tau1 + Math.exp((t - p.b) / p.tau2) / p.tau2),
        end: BATHTUB_L_H,
      };
    }
    default:
      return null; // a model this page does not know: no curve
  }
}

// Where to stop drawing: the deadline, else where 99 % of VMs have died (24 h if never).
function horizon(model, oldest) {
  let end = model.end;
  if (end === null) {
    end = 1;
    while (end < 1e4 && model.cdf(end) < 0.99) end *= 2;
    if (model.cdf(end) < 0.99) end = 24;
  }
  return Math.max(end, oldest * 1.1);
}

const survival = (model, t) => (model.end !== null && t >= model.end ? 0 : 1 - model.cdf(t));

// E[remaining life | alive at age s] = ∫_s^end S(t) dt / S(s), by the trapezoid rule.
function expectedRemaining(model, s) {
  if (model.cdf(1e6) === 0 && model.end === null) return Infinity;
  let end = model.end;
  if (end === null) {
    end = Math.max(1, s);
    while (end < 1e6 && model.cdf(end) < 1 - 1e-6) end *= 2;
  }
  if (s >= end) return 0;
  const atS = survival(model, s);
  if (!(atS > 0)) return 0;
  const n = 2000;
  const step = (end - s) / n;
  let area = 0;
  for (let i = 0; i < n; i++) {
    const a = s + i * step;
    area += ((survival(model, a) + survival(model, Math.min(a + step, end - 1e-9))) / 2) * step;
  }
  return area / atS;
}

// --- the page ----------------------------------------------------------------------------

function ageHours(vm, inUse, nowS) {
  const view = inUse.get(vm.id);
  if (view) return view.age_h; // model hours (the driver's time scale applied)
  return (Math.max(0, nowS - vm.requested_at) * (vm.time_scale || 1)) / 3600;
}

function isHotSpare(vm, view) {
  // The planner keeps an idle VM past its risky start as a hot spare (SPEC §3); the API
  // gives "stable" per VM and its running jobs, not the planner's decision itself.
  return Boolean(view && view.stable) && vm.state === "running" && vm.jobs === 0 && !vm.terminating;
}

function verdict(view) {
  if (!view || view.stable === null || view.stable === undefined) return "no reuse table (reused while jobs fit)";
  return view.stable ? "stable: kept as a hot spare when idle" : "early phase: released when idle";
}

function chartData(model, vms) {
  const oldest = Math.max(0, ...vms.map((v) => v.age));
  const end = horizon(model, oldest);
  const xs = new Set();
  for (let i = 0; i <= POINTS; i++) xs.add((end * i) / POINTS);
  for (const v of vms) xs.add(v.age);
  const x = [...xs].sort((a, b) => a - b);
  const byAge = new Map();
  for (const v of vms) byAge.set(v.age, [...(byAge.get(v.age) || []), v]);
  const s = x.map((t) => survival(model, t));
  const h = x.map((t, i) => {
    const value = s[i] > 1e-3 ? model.pdf(t) / s[i] : null;
    return Number.isFinite(value) ? value : null;
  });
  const point = (spare) =>
    x.map((t, i) => ((byAge.get(t) || []).some((v) => v.spare === spare) ? s[i] : null));
  return [x, s, h, point(false), point(true)];
}

function makeChart(container, title) {
  const dots = (color) => ({ show: true, size: 9, fill: color, stroke: color });
  const options = {
    title,
    width: Math.max(320, Math.min(container.clientWidth || 760, 900)),
    height: 240,
    scales: { x: { time: false }, S: { range: [0, 1.02] }, h: { auto: true } },
    axes: [
      { label: "age (h)" },
      { scale: "S", label: "survival S(t)" },
      { scale: "h", side: 1, label: "hazard (per h)", grid: { show: false } },
    ],
    series: [
      { label: "age (h)", value: (u, v) => (v === null ? "" : v.toFixed(2)) },
      { label: "S(t)", scale: "S", stroke: "#1f6feb", width: 2 },
      { label: "h(t)", scale: "h", stroke: "#9a6700", width: 1, dash: [5, 4] },
      { label: "VMs", scale: "S", stroke: "#c62828", paths: () => null, points: dots("#c62828") },
      { label: "hot spares", scale: "S", stroke: "#1a7f37", paths: () => null, points: dots("#1a7f37") },
    ],
  };
  return new uPlot(options, [[0], [null], [null], [null], [null]], container);
}

function vmRow(vm) {
  const remaining = vm.model ? expectedRemaining(vm.model, vm.age) : null;
  return el(
    "tr",
    { "data-vm": vm.id },
    el("td", {}, el("code", {}, vm.id)),
    el("td", {}, vm.zone),
    el("td", {}, el("span", { class: `badge ${vm.state}` }, vm.terminating ? "terminating" : vm.state),
      vm.spare ? el("span", { class: "badge spare" }, "hot spare") : null),
    el("td", {}, vm.spot ? "spot" : "on-demand"),
    el("td", {}, duration(vm.age * 3600)),
    el("td", {}, vm.jobs),
    el("td", {}, usd(vm.cost_usd)),
    el("td", {}, vm.model ? percent(survival(vm.model, vm.age)) : ""),
    el("td", {}, remaining === null ? "" : remaining === Infinity ? "unbounded" : duration(remaining * 3600)),
    el("td", {}, verdict(vm.view)),
  );
}

function typeSection(vmType) {
  const chart = el("div", { class: "chart" });
  const table = el(
    "table",
    { class: "vms" },
    el("thead", {}, el("tr", {}, ...["VM", "Zone", "State", "Market", "Age", "Jobs", "Cost so far",
      "Survives to now", "Expected remaining life", "Reuse policy"].map((h) => el("th", {}, h)))),
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
    .map(([k, v]) => `${k} = ${Number(v).toPrecision(3)}`)
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
    vm.model = view ? lifetimeModel(view.model, view.parameters || {}) : null;
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
    entry.section.querySelector("h2 .counts").textContent =
      `${group.length} live${spares ? ` · ${spares} hot spare${spares > 1 ? "s" : ""}` : ""}`;
    entry.section.querySelector("p.model").textContent = modelText(view);
    entry.table.tBodies[0].replaceChildren(...group.sort((a, b) => b.age - a.age).map(vmRow));
    const model = view ? lifetimeModel(view.model, view.parameters || {}) : null;
    if (model) {
      const key = `${view.model}:${JSON.stringify(view.parameters)}`;
      if (!entry.chart || entry.modelKey !== key) {
        if (entry.chart) entry.chart.destroy();
        entry.chart = makeChart(entry.chartBox, `${vmType}: ${view.model} model`);
        entry.modelKey = key;
      }
      const onCurve = group.filter((v) => v.view && v.view.key === view.key);
      entry.chart.setData(chartData(model, onCurve));
    }
  }
  document.getElementById("empty").hidden = vms.length > 0;
  const total = usage.total;
  const c = models.configured;
  const facts = [
    ["Live VMs", vms.length],
    ["VM-hours (all)", total.vm_hours.toFixed(2)],
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
    const [{ vms, usage }, models] = await Promise.all([api("/v1/vms"), api("/v1/models")]);
    render(vms, models, usage);
    setStatus(`Updated ${new Date().toLocaleTimeString()}`);
  } catch (error) {
    if (error instanceof ApiError && error.status === 403) {
      setStatus("The fleet is shown to the daemon's token only: an account token may not list VMs.", true);
    } else {
      setStatus(`Cannot load the fleet: ${error.message}`, true);
    }
  }
}

poll(refresh, REFRESH_MS);
