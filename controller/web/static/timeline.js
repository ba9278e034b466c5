// A bag's timeline: its attempts per VM over time as a Gantt chart in plain SVG (rows are
// VMs, bars attempts), with preemptions, checkpoints and retries marked, and what each
// preemption lost since the last checkpoint. Data: GET /v1/bags/{id}/timeline, first the
// whole bag (its newest attempts, bounded by the API), then, while the bag runs, only
// what changed since the previous answer (`since`), merged here.
import { ApiError, api, duration, el, poll, setStatus, when } from "/ui/static/api.js";

const REFRESH_MS = 2000;
const SINCE_MARGIN_S = 30; // re-read this much before the last answer: commits lag a little
const LABEL_W = 190;
const LANE_H = 16;
const ROW_GAP = 8;
const AXIS_H = 24;
const SVG_NS = "http://www.w3.org/2000/svg";
const ENDED_BADLY = new Set(["preempted", "lost"]);
const MAX_ATTEMPTS = 4000; // kept by the page: a long watch of a big bag drops the oldest
const MAX_ROWS = 200; // interrupted attempts listed, newest first

const parts = window.location.pathname.split("/");
const bagId = decodeURIComponent(parts[parts.length - 2]);
const $ = (id) => document.getElementById(id);

const attempts = new Map(); // "job#number" -> attempt
const checkpoints = new Map(); // id -> checkpoint
const vms = new Map(); // id -> VM
let lastNow = null; // the daemon's clock at the last answer
let clockOffset = 0; // the daemon's clock minus this browser's, at the last answer
let lastSignature = null; // what of the bag changes when its timeline does
let truncated = false;
let finishedRead = false; // the bag ended and its final timeline was read

// An SVG element; `tip`: its tooltip (a <title>); `text`: its text (for <text>).
function svg(tag, attrs = {}, tip = null, text = null) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value !== undefined && value !== null) node.setAttribute(key, String(value));
  }
  if (text !== null) node.textContent = text;
  if (tip !== null) {
    const title = document.createElementNS(SVG_NS, "title");
    title.textContent = tip;
    node.append(title);
  }
  return node;
}

const keyOf = (a) => `${a.job}#${a.number}`;

function merge(answer) {
  for (const a of answer.attempts) attempts.set(keyOf(a), a);
  for (const c of answer.checkpoints) checkpoints.set(c.id, c);
  for (const vm of answer.vms) vms.set(vm.id, vm);
  lastNow = answer.now;
  clockOffset = answer.now - Date.now() / 1000;
  if (attempts.size > MAX_ATTEMPTS) {
    const ended = [...attempts.values()].filter((a) => a.ended_at).sort((x, y) => x.started_at - y.started_at);
    for (const a of ended.slice(0, attempts.size - MAX_ATTEMPTS)) attempts.delete(keyOf(a));
    truncated = true;
    const shown = new Set(attempts.keys());
    for (const [id, c] of checkpoints) if (!shown.has(`${c.job}#${c.attempt}`)) checkpoints.delete(id);
  }
}

// The bag's counts of jobs per state, ended attempts and checkpoints change whenever an
// attempt starts or ends or a checkpoint is written: while they stay the same, the
// timeline has nothing new (and the daemon is not asked to scan the bag's attempts).
function signature(bag) {
  return JSON.stringify([bag.counts, bag.usage.attempts, bag.usage.checkpoints, bag.state]);
}

// The last written checkpoint of each attempt: where its saved work ends.
function lastCheckpoints() {
  const last = new Map();
  for (const c of checkpoints.values()) {
    const key = `${c.job}#${c.attempt}`;
    if (c.ok && (!last.has(key) || last.get(key).at < c.at)) last.set(key, c);
  }
  return last;
}

// Attempts of one VM in lanes, so that attempts running side by side do not overlap.
function lanes(list, nowS) {
  const ends = [];
  for (const a of list.sort((x, y) => x.started_at - y.started_at)) {
    let lane = ends.findIndex((end) => end <= a.started_at);
    if (lane < 0) lane = ends.length;
    ends[lane] = a.ended_at ?? nowS;
    a.lane = lane;
  }
  return Math.max(1, ends.length);
}

function niceStep(spanS, targetTicks) {
  const raw = spanS / targetTicks;
  const steps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400];
  return steps.find((s) => s >= raw) || 86400 * Math.ceil(raw / 86400);
}

function clock(seconds) {
  return new Date(seconds * 1000).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

function draw(nowS, active) {
  const byVm = new Map();
  for (const a of attempts.values()) byVm.set(a.vm_id, [...(byVm.get(a.vm_id) || []), a]);
  const rows = [...byVm.keys()].map((id) => ({
    id,
    vm: vms.get(id),
    list: byVm.get(id),
    first: Math.min(...byVm.get(id).map((a) => a.started_at)),
  }));
  rows.sort((x, y) => (x.vm?.requested_at ?? x.first) - (y.vm?.requested_at ?? y.first));
  $("empty").hidden = rows.length > 0;
  if (!rows.length) {
    $("gantt").replaceChildren();
    return;
  }
  let t0 = Math.min(...rows.map((r) => r.first));
  let t1 = active ? nowS : Math.max(...[...attempts.values()].map((a) => a.ended_at ?? nowS));
  t1 = Math.max(t1, t0 + 1);
  t0 -= (t1 - t0) * 0.01;
  const width = Math.max(640, $("gantt").clientWidth || 1100);
  const plotW = width - LABEL_W - 10;
  const x = (t) => LABEL_W + ((Math.min(Math.max(t, t0), t1) - t0) / (t1 - t0)) * plotW;
  const last = lastCheckpoints();
  const chart = svg("svg", { width, role: "img", "aria-label": "attempts per VM over time" });
  const axis = svg("g", { class: "axis" });
  const step = niceStep(t1 - t0, Math.max(3, Math.floor(plotW / 110)));
  let y = AXIS_H;
  const bars = svg("g");
  const marks = svg("g");
  const centers = new Map(); // "job#number" -> [x start, x end, y center]
  for (const row of rows) {
    const laneCount = lanes(row.list, nowS);
    const height = laneCount * LANE_H;
    const vm = row.vm;
    const label = vm ? `${vm.id} · ${vm.vm_type}` : row.id;
    const g = svg("g", { class: "vm-row", "data-vm": row.id });
    g.append(svg("text", { x: 4, y: y + Math.min(height, LANE_H) / 2 + 4, class: "vm-label" }, label, label.length > 30 ? `${label.slice(0, 29)}…` : label));
    if (vm) {
      const from = vm.running_at ?? vm.requested_at;
      const to = vm.ended_at ?? nowS;
      const life = `${vm.id} (${vm.vm_type}, ${vm.spot ? "spot" : "on-demand"}): ${vm.state}${vm.reason ? `, ${vm.reason}` : ""}; up ${clock(from)}${vm.ended_at ? ` to ${clock(vm.ended_at)}` : ""}`;
      g.append(svg("line", { x1: x(from), x2: x(to), y1: y + height / 2, y2: y + height / 2, class: "vm-life" }, life));
      if (vm.state === "preempted" && vm.ended_at) {
        const px = x(vm.ended_at);
        const cy = y + height / 2;
        g.append(svg("path", {
          d: `M${px - 5},${cy - 5}L${px + 5},${cy + 5}M${px - 5},${cy + 5}L${px + 5},${cy - 5}`,
          class: "preemption",
          "data-vm": vm.id,
        }, `${vm.id} preempted at ${clock(vm.ended_at)}${vm.reason ? ` (${vm.reason})` : ""}`));
      }
      if (vm.notice_until) {
        // A preemption notice: a flag where the cloud said it would take the VM (its jobs
        // checkpointed and moved at the notice; the VM may have ended sooner, drained).
        const nx = x(vm.notice_until);
        const top = y + height / 2 - 9;
        g.append(svg("path", {
          d: `M${nx},${top + 12}L${nx},${top}L${nx + 8},${top + 3}L${nx},${top + 6}`,
          class: "notice",
          "data-vm": vm.id,
        }, `${vm.id}: preemption notice, its cloud takes it by ${clock(vm.notice_until)}`));
      }
    }
    for (const a of row.list) {
      const top = y + a.lane * LANE_H + 2;
      const end = a.ended_at ?? nowS;
      const x0 = x(a.started_at);
      const x1 = Math.max(x(end), x0 + 2);
      const key = keyOf(a);
      centers.set(key, [x0, x1, top + (LANE_H - 4) / 2]);
      const title = `${a.job} attempt ${a.number}: ${a.state}${a.reason ? ` (${a.reason})` : ""}, ${clock(a.started_at)}–${a.ended_at ? clock(a.ended_at) : "now"} (${duration(end - a.started_at)})`;
      const bar = svg("g", { class: `attempt ${a.state}${a.number > 1 ? " retry" : ""}`, "data-attempt": key, "data-state": a.state });
      if (ENDED_BADLY.has(a.state)) {
        // Saved up to the last checkpoint written in this attempt; lost after it.
        const ck = last.get(key);
        const mark = ck ? Math.min(Math.max(ck.at, a.started_at), end) : a.started_at;
        if (mark > a.started_at) bar.append(svg("rect", { x: x0, y: top, width: Math.max(1, x(mark) - x0), height: LANE_H - 4, class: "saved" }, `${title}; saved ${duration(ck.work_s)} of work by its last checkpoint`));
        bar.append(svg("rect", { x: x(mark), y: top, width: Math.max(2, x1 - x(mark)), height: LANE_H - 4, class: "lost" }, `${title}; lost ${duration(end - mark)} since ${ck ? "its last checkpoint" : "it started"}`));
      } else {
        bar.append(svg("rect", { x: x0, y: top, width: x1 - x0, height: LANE_H - 4, class: "bar" }, title));
      }
      if (x1 - x0 > 46) {
        const text = `${a.job.split("-").pop()}#${a.number}`;
        bar.append(svg("text", { x: x0 + 3, y: top + LANE_H - 7, class: "bar-label" }, null, text));
      }
      bars.append(bar);
    }
    bars.append(g);
    y += height + ROW_GAP;
  }
  // Checkpoints: a tick on their attempt's bar; a retry: a dashed line from the end of
  // the attempt it replaces.
  for (const c of checkpoints.values()) {
    const at = centers.get(`${c.job}#${c.attempt}`);
    if (!at) continue;
    const cx = x(c.at);
    marks.append(svg("line", { x1: cx, x2: cx, y1: at[2] - 7, y2: at[2] + 7, class: `checkpoint${c.ok ? "" : " failed"}`, "data-job": c.job },
      `checkpoint of ${c.job} attempt ${c.attempt} at ${clock(c.at)}: ${c.ok ? `saved ${duration(c.work_s)} of work` : "not written in time"} (took ${duration(c.at - c.requested_at)})`));
  }
  for (const a of attempts.values()) {
    if (a.number < 2) continue;
    const before = centers.get(`${a.job}#${a.number - 1}`);
    const now = centers.get(keyOf(a));
    if (!before || !now) continue;
    marks.append(svg("path", { d: `M${before[1]},${before[2]}L${now[0]},${now[2]}`, class: "retry-link", "data-job": a.job },
      `${a.job}: attempt ${a.number} retries attempt ${a.number - 1}`));
  }
  const height = y + 4;
  for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) {
    axis.append(svg("line", { x1: x(t), x2: x(t), y1: AXIS_H - 6, y2: height, class: "grid" }));
    axis.append(svg("text", { x: x(t), y: AXIS_H - 10, class: "tick" }, null, clock(t)));
  }
  if (active) axis.append(svg("line", { x1: x(nowS), x2: x(nowS), y1: AXIS_H - 6, y2: height, class: "now" }, "now"));
  chart.setAttribute("height", height);
  chart.append(axis, bars, marks);
  $("gantt").replaceChildren(chart);
}

function interruptionRow(a, last, retries) {
  const ck = last.get(keyOf(a));
  const end = a.ended_at;
  const mark = ck ? Math.max(ck.at, a.started_at) : a.started_at;
  const retry = retries.get(`${a.job}#${a.number + 1}`);
  return el(
    "tr",
    { "data-attempt": keyOf(a) },
    el("td", {}, el("code", {}, a.job)),
    el("td", {}, a.number),
    el("td", {}, el("code", {}, a.vm_id)),
    el("td", {}, when(end)),
    el("td", {}, el("span", { class: `badge ${a.state}` }, a.state), a.reason ? ` ${a.reason}` : ""),
    el("td", {}, ck ? duration(ck.work_s) : "nothing"),
    el("td", {}, duration(Math.max(0, end - mark))),
    el("td", {}, retry ? `as #${retry.number} on ${retry.vm_id} at ${clock(retry.started_at)}` : ""),
  );
}

function summarize(bag) {
  const last = lastCheckpoints();
  const list = [...attempts.values()];
  const interrupted = list.filter((a) => ENDED_BADLY.has(a.state) && a.ended_at);
  const lost = interrupted.reduce((sum, a) => {
    const ck = last.get(keyOf(a));
    return sum + Math.max(0, a.ended_at - (ck ? Math.max(ck.at, a.started_at) : a.started_at));
  }, 0);
  const written = [...checkpoints.values()].filter((c) => c.ok).length;
  const facts = [
    ["Attempts shown", list.length],
    ["Running", list.filter((a) => !a.ended_at).length],
    ["VMs", new Set(list.map((a) => a.vm_id)).size],
    ["Preempted", list.filter((a) => a.state === "preempted").length],
    ["Retries", list.filter((a) => a.number > 1).length],
    ["Checkpoints written", written],
    ["Work lost (shown)", duration(lost)],
    ["Work lost (bag)", duration(bag.usage.lost_hours * 3600)],
    ["Elapsed", duration(bag.elapsed_s)],
  ];
  $("facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  const retries = new Map(list.map((a) => [keyOf(a), a]));
  interrupted.sort((x, y) => y.ended_at - x.ended_at);
  $("interruptions").tBodies[0].replaceChildren(
    ...interrupted.slice(0, MAX_ROWS).map((a) => interruptionRow(a, last, retries)),
  );
  $("interruptions-section").hidden = interrupted.length === 0;
}

async function refresh() {
  try {
    const bag = await api(`/v1/bags/${encodeURIComponent(bagId)}`);
    document.title = `spotbag · timeline of ${bag.name}`;
    $("bag-link").textContent = `${bag.name} (${bag.id})`;
    $("bag-link").href = `/ui/bags/${encodeURIComponent(bag.id)}`;
    $("bag-state").textContent = bag.state;
    $("bag-state").className = `badge ${bag.state}`;
    const active = bag.state === "active";
    if (!finishedRead && signature(bag) !== lastSignature) {
      const since = lastNow === null ? 0 : Math.max(0, Math.floor(lastNow - SINCE_MARGIN_S));
      const answer = await api(`/v1/bags/${encodeURIComponent(bagId)}/timeline?since=${since}`);
      if (lastNow === null) truncated = answer.truncated;
      merge(answer); // may set `truncated` when it drops the oldest
      lastSignature = signature(bag);
      finishedRead = !active;
    }
    // Running attempts grow with the daemon's clock, read between answers.
    const nowS = active ? Date.now() / 1000 + clockOffset : lastNow;
    $("truncated").hidden = !truncated;
    $("truncated").textContent = truncated
      ? `A big bag: the chart shows its newest ${attempts.size} attempts, not its older ones.`
      : "";
    summarize(bag);
    draw(nowS, active);
    setStatus(`Updated ${new Date().toLocaleTimeString()}`);
  } catch (error) {
    setStatus(
      error instanceof ApiError && error.status === 404
        ? `Bag ${bagId} does not exist, or this token may not see it.`
        : `Cannot load the timeline: ${error.message}`,
      true,
    );
  }
}

poll(refresh, REFRESH_MS);
window.addEventListener("resize", () => {
  if (lastNow !== null) draw(finishedRead ? lastNow : Date.now() / 1000 + clockOffset, !finishedRead);
});
