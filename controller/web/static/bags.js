// The bags page: every bag the token may see, newest first, a page at a time, with its
// progress and its jobs by state, flagged when at risk of missing its deadline or held by
// a budget (plan.js); refreshed by polling GET /v1/bags.
import { api, countsText, el, percent, poll, progressBar, setStatus, when } from "/ui/static/api.js";
import { bagFlags } from "/ui/static/plan.js";

const REFRESH_MS = 2000;
const PAGE_SIZE = 50;
let offset = 0;
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
    el("td", {}, el("span", { class: `badge ${bag.state}` }, state),
      ...bagFlags(bag).map((flag) => [" ", el("span", { class: `badge flag ${flag === "at risk" ? "at-risk" : "held"}` }, flag)])),
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
  // One more than a page: whether there is a next page, without a count.
  const query = new URLSearchParams({ limit: String(PAGE_SIZE + 1), offset: String(offset) });
  if (stateSelect.value) query.set("state", stateSelect.value);
  try {
    const { bags } = await api(`/v1/bags?${query}`);
    if (!bags.length && offset > 0) {
      offset = Math.max(0, offset - PAGE_SIZE); // the page emptied (a filter, a purge)
      return refresh();
    }
    body.replaceChildren(...bags.slice(0, PAGE_SIZE).map(row));
    document.getElementById("empty").hidden = bags.length > 0;
    const page = offset / PAGE_SIZE + 1;
    document.getElementById("page-text").textContent =
      `page ${page} (bags ${offset + Math.min(1, bags.length)}–${offset + Math.min(bags.length, PAGE_SIZE)})`;
    document.getElementById("prev-page").disabled = offset === 0;
    document.getElementById("first-page").disabled = offset === 0;
    document.getElementById("next-page").disabled = bags.length <= PAGE_SIZE;
    setStatus(`Updated ${new Date().toLocaleTimeString()}`);
  } catch (error) {
    setStatus(`Cannot load the bags: ${error.message}`, true);
  }
}

const now = poll(refresh, REFRESH_MS);
function goTo(newOffset) {
  offset = Math.max(0, newOffset);
  now();
}
stateSelect.addEventListener("change", () => goTo(0));
document.getElementById("first-page").addEventListener("click", () => goTo(0));
document.getElementById("prev-page").addEventListener("click", () => goTo(offset - PAGE_SIZE));
document.getElementById("next-page").addEventListener("click", () => goTo(offset + PAGE_SIZE));
