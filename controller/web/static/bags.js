// The bags page: every bag the token may see, newest first, with its progress and its
// jobs by state; refreshed by polling GET /v1/bags.
import { api, countsText, el, percent, poll, progressBar, setStatus, when } from "/ui/static/api.js";

const REFRESH_MS = 2000;
const stateSelect = document.getElementById("state");
const body = document.querySelector("#bags tbody");

function row(bag) {
  const link = el("a", { href: `/ui/bags/${encodeURIComponent(bag.id)}` }, bag.id);
  const state = bag.cancel_requested && bag.state === "active" ? "cancelling" : bag.state;
  return el(
    "tr",
    { "data-bag": bag.id },
    el("td", {}, link),
    el("td", {}, bag.name),
    el("td", {}, bag.account),
    el("td", {}, el("span", { class: `badge ${bag.state}` }, state)),
    el(
      "td",
      { class: "progress-cell" },
      progressBar(bag.progress, `progress of ${bag.id}`),
      el("span", { class: "progress-text" }, ` ${percent(bag.progress)} of ${bag.job_count}`),
    ),
    el("td", { class: "counts" }, countsText(bag.counts)),
    el("td", {}, when(bag.created_at)),
  );
}

async function refresh() {
  const query = new URLSearchParams({ limit: "200" });
  if (stateSelect.value) query.set("state", stateSelect.value);
  try {
    const { bags } = await api(`/v1/bags?${query}`);
    body.replaceChildren(...bags.map(row));
    document.getElementById("empty").hidden = bags.length > 0;
    setStatus(`Updated ${new Date().toLocaleTimeString()}`);
  } catch (error) {
    setStatus(`Cannot load the bags: ${error.message}`, true);
  }
}

const now = poll(refresh, REFRESH_MS);
stateSelect.addEventListener("change", now);
