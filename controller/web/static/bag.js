// A bag's page: its progress and usage, its jobs (paged, by state, searched by parameter
// value: GET /v1/bags/{id}/jobs?param=name=value), one job's attempts and its log (the
// tail, then followed), and a cancel button; refreshed by polling the same /v1 API the
// CLI uses. A waiting job says why it waits (the API's `waiting`, from the scheduler); the
// bag's pace and ETA come with the bag. The job shown has its own address
// (?job=<id>&attempt=<n>), and its log a raw one (/v1/jobs/<id>/log?attempt=<n>).
import {
  ApiError,
  api,
  countsText,
  duration,
  el,
  number,
  percent,
  plural,
  poll,
  setStatus,
  usd,
  when,
} from "/ui/static/api.js";
import { budgetFacts, deadlineFacts } from "/ui/static/plan.js";

const REFRESH_MS = 2000;
const PAGE_SIZE = 50;
const TAIL_BYTES = 64 * 1024;
const LOG_MAX_CHARS = 512 * 1024; // what the page keeps of a followed log
const SEARCH_EVERY = 5; // refreshes (10 s) between two reads of a search's page at most
const SEARCH_CHANGED_EVERY = 2; // ... and at least, while the bag's counts change (4 s)

const bagId = decodeURIComponent(window.location.pathname.split("/").pop());
const $ = (id) => document.getElementById(id);
const enc = encodeURIComponent;

let bag = null;
// Job pages by cursor: afters[i] is the `after` of page i (the API pages by index).
let afters = [-1];
let nextAfter = null;
let jobs = [];
let jobsWanted = true; // read the jobs' page at the next refresh, search or not
let searchTicks = 0;
let countsSeen = ""; // the bag's counts when the jobs' page was last read
// The job shown below the table, and where its log was read to.
let shown = { jobId: null, attempt: null, pinned: false, offset: 0 };

// --- the bag ---------------------------------------------------------------------------

// Recent jobs per hour while the bag runs (the API's pace); once it has ended, its mean.
function throughputText(bag, pace) {
  if (pace) return `${number(pace.jobs_per_hour, 0, 3)} jobs/h (its last ${plural(pace.over_jobs, "job")})`;
  const finished = bag.job_count * bag.progress;
  if (bag.state !== "active" && finished > 0 && bag.elapsed_s > 0) {
    return `${number((3600 * finished) / bag.elapsed_s, 0, 3)} jobs/h (whole bag)`;
  }
  return "not yet known";
}

function renderBag() {
  document.title = `spotbag · ${bag.name}`;
  $("bag-name").textContent = bag.name;
  $("bag-id").textContent = bag.id;
  $("timeline-link").href = `/ui/bags/${enc(bag.id)}/timeline`;
  $("progress").value = bag.progress;
  $("progress-text").textContent = `${percent(bag.progress)} of ${bag.job_count} jobs finished`;
  const state = bag.cancel_requested && bag.state === "active" ? "cancelling" : bag.state;
  $("bag-state").textContent = state;
  $("bag-state").className = `badge ${bag.state}`;
  $("cancel").hidden = bag.state !== "active" || bag.cancel_requested;
  $("counts").textContent = countsText(bag.counts);
  const u = bag.usage;
  const pace = bag.pace;
  const facts = [
    ["Account", bag.account],
    ["Created", when(bag.created_at)],
    ["Elapsed", duration(bag.elapsed_s)],
    ["Throughput", throughputText(bag, pace)],
    ["ETA", bag.state !== "active" ? "done" : pace ? `${duration(pace.eta_s)} (${plural(pace.open_jobs, "open job")})` : "not yet known"],
    ["Attempts", `${u.attempts} (${u.interrupted_attempts} preempted)`],
    ["Attempts ran", duration(u.attempt_hours * 3600)],
    ["Work lost", duration(u.lost_hours * 3600)],
    ["Checkpoints", u.checkpoints],
    ["Spot cost", usd(u.spot_cost_usd)],
    ["On demand", usd(u.on_demand_cost_usd)],
  ];
  $("facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  renderPlan();
}

// --- the deadline and the budget --------------------------------------------------------

// The bag's now: the API's own clock (created + elapsed), not the browser's.
function bagNow() {
  return bag.created_at + bag.elapsed_s;
}

function renderPlan() {
  const facts = deadlineFacts(bag, bagNow());
  const budget = budgetFacts(bag);
  if (budget && budget.held) facts.push(["Waiting", budget.held]);
  $("plan").hidden = !facts.length && !budget;
  $("at-risk").hidden = !(bag.deadline && bag.deadline.at_risk);
  $("plan-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  $("budget-line").hidden = !budget;
  if (!budget) return;
  $("budget-text").textContent = `Budget: ${budget.text}`;
  const bar = $("budget-bar");
  bar.hidden = !budget.bar;
  if (budget.bar) {
    const [charged, reserved, available] = bar.children;
    charged.style.width = `${100 * budget.bar.charged}%`;
    reserved.style.width = `${100 * budget.bar.reserved}%`;
    available.style.width = `${100 * Math.max(0, 1 - budget.bar.charged - budget.bar.reserved)}%`;
    bar.setAttribute("aria-label", `budget: ${budget.text}`);
  }
}

// --- the bag's events ---------------------------------------------------------------------

const EVENTS_EVERY = 3; // refreshes (6 s) between two reads of the bag's events

function eventWhat(event) {
  const p = event.payload || {};
  if (event.kind === "finished" || event.kind === "failed") {
    return `${p.state ?? ""}${p.failed_jobs ? `, ${plural(p.failed_jobs, "failed job")}` : ""}`;
  }
  if (event.kind === "budget_reached") return p.held ?? "";
  if (event.kind === "deadline_at_risk" && p.p_meet != null) return `p = ${percent(p.p_meet, 3)} of meeting it`;
  return JSON.stringify(p).slice(0, 200);
}

function deliveryCell(event) {
  if (!event.deliveries.length) return el("td", { class: "hint" }, "none");
  return el("td", {}, ...event.deliveries.map((d) => el(
    "div", {},
    el("span", { class: `badge delivery ${d.state}`, title: d.last_error || null }, `${d.state} (${plural(d.attempts, "try", "tries")})`),
    " ", el("code", {}, d.url),
  )));
}

function eventRow(event) {
  return el(
    "tr", { "data-event": event.id },
    el("td", {}, when(event.created_at)),
    el("td", {}, el("span", { class: `badge ${event.kind}` }, event.kind.replaceAll("_", " "))),
    el("td", {}, eventWhat(event)),
    deliveryCell(event),
  );
}

async function loadEvents() {
  const { events } = await api(`/v1/events?bag=${enc(bagId)}&limit=1000`);
  $("events").querySelector("tbody").replaceChildren(...events.map(eventRow));
  $("no-events").hidden = events.length > 0;
}

async function cancelBag() {
  if (!window.confirm(`Cancel bag ${bag.name} (${bag.id})? Queued jobs are cancelled, running ones stopped.`)) {
    return;
  }
  $("cancel").disabled = true;
  try {
    bag = await api(`/v1/bags/${enc(bagId)}/cancel`, { method: "POST" });
    renderBag();
    setStatus("Cancellation requested.");
  } catch (error) {
    setStatus(`Cannot cancel: ${error.message}`, true);
  } finally {
    $("cancel").disabled = false;
  }
}

// --- the jobs ----------------------------------------------------------------------------

function paramsText(params) {
  return Object.entries(params)
    .map(([k, v]) => `${k}=${typeof v === "string" ? v : JSON.stringify(v)}`)
    .join(" ");
}

// The search box's terms: name=value, separated by spaces (each must hold).
function paramTerms() {
  return $("param-filter").value.trim().split(/\s+/).filter(Boolean);
}

// A job that succeeded after a VM preemption cut an attempt short: marked in its row.
function preemptedMark(job) {
  if (!job.preempted_attempts) return null;
  const text = job.state === "succeeded"
    ? `after ${plural(job.preempted_attempts, "preemption")}`
    : plural(job.preempted_attempts, "preemption");
  return el("span", { class: "badge preempted", title: "attempts a VM preemption cut short" }, text);
}

function reasonCell(job) {
  if (job.waiting) {
    return el("td", { class: "waiting" }, el("span", { class: "why" }, job.waiting),
      job.reason ? el("span", { class: "hint" }, ` (${job.reason})`) : null);
  }
  return el("td", {}, job.reason);
}

function jobRow(job) {
  const open = el("button", { type: "button", class: "link", onclick: () => showJob(job.id, null) }, job.id);
  return el(
    "tr",
    { "data-job": job.id, class: job.id === shown.jobId ? "selected" : null },
    el("td", {}, open),
    el("td", {}, el("span", { class: `badge ${job.state}` }, job.state), " ", preemptedMark(job)),
    el("td", { class: "params" }, paramsText(job.params)),
    el("td", {}, job.attempts),
    el("td", {}, job.exit_code ?? ""),
    el("td", {}, duration(job.runtime_s)),
    reasonCell(job),
  );
}

function renderJobs() {
  $("jobs").querySelector("tbody").replaceChildren(...jobs.map(jobRow));
  $("no-jobs").hidden = jobs.length > 0;
  const page = afters.length;
  $("page-text").textContent = `page ${page}`;
  $("prev-page").disabled = page === 1;
  $("first-page").disabled = page === 1;
  $("next-page").disabled = nextAfter === null;
}

async function loadJobs() {
  const query = new URLSearchParams({ limit: String(PAGE_SIZE), after: String(afters.at(-1)) });
  if ($("job-state").value) query.set("state", $("job-state").value);
  for (const term of paramTerms()) query.append("param", term);
  const page = await api(`/v1/bags/${enc(bagId)}/jobs?${query}`);
  countsSeen = JSON.stringify(bag ? bag.counts : null);
  jobs = page.jobs;
  nextAfter = page.next_after;
  renderJobs();
}

// --- one job: its attempts and log ------------------------------------------------------

function attemptRow(job, attempt) {
  const view = el(
    "button",
    { type: "button", class: "link", onclick: () => showJob(job.id, attempt.number) },
    "show",
  );
  return el(
    "tr",
    { class: attempt.number === shown.attempt ? "selected" : null },
    el("td", {}, attempt.number),
    el("td", {}, attempt.vm_id ?? ""),
    el("td", {}, attempt.vm_type),
    el("td", {}, attempt.state ?? ""),
    el("td", {}, when(attempt.started_at)),
    el("td", {}, when(attempt.ended_at)),
    el("td", {}, attempt.exit_code ?? ""),
    el("td", {}, attempt.reason ?? ""),
    el("td", {}, attempt.log_path ? view : ""),
    el("td", {}, attempt.log_path
      ? el("a", { href: `/v1/jobs/${enc(job.id)}/log?attempt=${attempt.number}`, target: "_blank", rel: "noopener" }, "raw")
      : ""),
  );
}

async function readLog() {
  if (shown.attempt === null) {
    $("log").textContent = "(no attempt yet: the job has not started)";
    return;
  }
  const base = `/v1/jobs/${enc(shown.jobId)}/log?attempt=${shown.attempt}`;
  let response;
  try {
    if (shown.offset === null) {
      // First read: learn the size, then start at the tail.
      const probe = await api(`${base}&limit=1`, { raw: true });
      const size = Number(probe.headers.get("X-Spotbag-Log-Size"));
      shown.offset = Math.max(0, size - TAIL_BYTES);
      $("log").textContent = shown.offset > 0 ? `(… ${shown.offset} earlier bytes not shown)\n` : "";
    }
    response = await api(`${base}&offset=${shown.offset}`, { raw: true });
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) {
      $("log").textContent = `(${error.message})`;
      return;
    }
    throw error;
  }
  const text = await response.text();
  shown.offset = Number(response.headers.get("X-Spotbag-Next-Offset"));
  $("log-size").textContent = `${response.headers.get("X-Spotbag-Log-Size")} bytes`;
  if (text) {
    const log = $("log");
    const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    log.textContent = (log.textContent + text).slice(-LOG_MAX_CHARS);
    if (atBottom || $("follow").checked) log.scrollTop = log.scrollHeight;
  }
}

async function refreshJob() {
  const job = await api(`/v1/jobs/${enc(shown.jobId)}`);
  const latest = job.attempt_list.length ? job.attempt_list.at(-1).number : null;
  if (!shown.pinned && latest !== shown.attempt) {
    // A new attempt started (a retry after a preemption): show its log.
    shown.attempt = latest;
    shown.offset = null;
    $("log").textContent = "";
  }
  $("job").hidden = false;
  $("job-id").textContent = job.id;
  // The row of the job in the table agrees with its panel (a search's page is read less often).
  const i = jobs.findIndex((j) => j.id === job.id);
  if (i >= 0 && (jobs[i].state !== job.state || jobs[i].attempts !== job.attempts)) {
    jobs[i] = job;
    renderJobs();
  }
  $("job-link").href = jobAddress(job.id, shown.pinned ? shown.attempt : null);
  if (shown.attempt !== null) {
    $("raw-log").href = `/v1/jobs/${enc(job.id)}/log?attempt=${shown.attempt}`;
  }
  $("raw-log").hidden = shown.attempt === null;
  $("log-attempt").textContent = shown.attempt === null ? "" : `(attempt ${shown.attempt})`;
  const facts = [
    ["State", job.state],
    ...(job.waiting ? [["Waiting", job.waiting]] : []),
    ...(job.preempted_attempts ? [["Preempted", plural(job.preempted_attempts, "attempt")]] : []),
    ["Parameters", paramsText(job.params)],
    ["Started", when(job.started_at)],
    ["Ended", when(job.ended_at)],
    ["Runtime", duration(job.runtime_s)],
    ["Checkpoints", job.checkpoints],
  ];
  $("job-facts").replaceChildren(...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  $("attempts").querySelector("tbody").replaceChildren(...job.attempt_list.map((a) => attemptRow(job, a)));
  if (shown.offset === null || $("follow").checked) await readLog();
}

function jobAddress(jobId, attempt) {
  const query = new URLSearchParams({ job: jobId });
  if (attempt !== null) query.set("attempt", String(attempt));
  return `/ui/bags/${enc(bagId)}?${query}`;
}

async function showJob(jobId, attempt) {
  shown = { jobId, attempt, pinned: attempt !== null, offset: null };
  $("log").textContent = "";
  window.history.replaceState(null, "", jobAddress(jobId, attempt)); // its own address
  renderJobs();
  try {
    await refreshJob();
    $("job").scrollIntoView({ block: "start" });
  } catch (error) {
    setStatus(`Cannot load job ${jobId}: ${error.message}`, true);
  }
}

// --- the loop ---------------------------------------------------------------------------

async function refresh() {
  try {
    bag = await api(`/v1/bags/${enc(bagId)}`);
    renderBag();
    // A search may scan the whole bag (parameters are not indexed): while one is shown,
    // its page is read again every SEARCH_EVERY refreshes, or at once after a user action.
    ++searchTicks;
    const changed = JSON.stringify(bag.counts) !== countsSeen && searchTicks % SEARCH_CHANGED_EVERY === 0;
    if (jobsWanted || !paramTerms().length || changed || searchTicks % SEARCH_EVERY === 0) {
      jobsWanted = false;
      await loadJobs();
    }
    if (shown.jobId !== null) await refreshJob();
    if (searchTicks % EVENTS_EVERY === 1) await loadEvents();
    setStatus(`Updated ${new Date().toLocaleTimeString()}`);
  } catch (error) {
    if (error instanceof ApiError && error.code === "invalid_query") {
      setStatus(`Search: ${error.message}`, true);
      return;
    }
    setStatus(
      error instanceof ApiError && error.status === 404
        ? `Bag ${bagId} does not exist, or this token may not see it.`
        : `Cannot load the bag: ${error.message}`,
      true,
    );
  }
}

// A job's own address: open it at once (and its attempt's log, when one is named).
const asked = new URLSearchParams(window.location.search);
if (asked.get("job")) {
  const attempt = Number(asked.get("attempt"));
  shown = { jobId: asked.get("job"), attempt: attempt > 0 ? attempt : null, pinned: attempt > 0, offset: null };
}
const poke = poll(refresh, REFRESH_MS);
function now() {
  jobsWanted = true;
  poke();
}
$("cancel").addEventListener("click", cancelBag);
$("job-state").addEventListener("change", () => {
  afters = [-1];
  now();
});
let searchTimer = null;
$("param-filter").addEventListener("input", () => {
  // Search once typing pauses; from the first page of matches.
  clearTimeout(searchTimer);
  searchTimer = setTimeout(() => {
    afters = [-1];
    now();
  }, 300);
});
$("next-page").addEventListener("click", () => {
  if (nextAfter !== null) {
    afters.push(nextAfter);
    now();
  }
});
$("prev-page").addEventListener("click", () => {
  if (afters.length > 1) {
    afters.pop();
    now();
  }
});
$("first-page").addEventListener("click", () => {
  afters = [-1];
  now();
});
