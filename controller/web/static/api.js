// What every page shares: calls to the daemon's /v1 JSON API (the one the CLI uses),
// authenticated by the session cookie, with the CSRF token on state-changing calls;
// polling that pauses while the tab is hidden; small DOM helpers. Figures are printed
// by format.js (the twin of controller/formatting.py), re-exported here.
import { percent } from "/ui/static/format.js";

export { duration, number, percent, plural, signedPercent, usd } from "/ui/static/format.js";

const CSRF_COOKIE = "spotbag_csrf";

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function csrfToken() {
  for (const part of document.cookie.split(";")) {
    const [name, ...rest] = part.trim().split("=");
    if (name === CSRF_COOKIE) return rest.join("=");
  }
  return "";
}

// One API call: the parsed JSON (or the Response itself with {raw: true}).
// A 401 means the session ended (token revoked, logged out elsewhere): back to the login.
export async function api(path, { method = "GET", raw = false } = {}) {
  const headers = { Accept: "application/json" };
  if (method !== "GET" && method !== "HEAD") headers["X-CSRF-Token"] = csrfToken();
  const response = await fetch(path, { method, headers, credentials: "same-origin" });
  if (response.status === 401) {
    window.location.assign("/ui/login");
    throw new ApiError(401, "unauthorized", "not logged in");
  }
  if (!response.ok) {
    let code = "http_error";
    let message = `${response.status} ${response.statusText}`;
    try {
      const body = await response.json();
      code = body.error.code;
      message = body.error.message;
    } catch {
      // not one of the API's error bodies: keep the status line
    }
    throw new ApiError(response.status, code, message);
  }
  return raw ? response : response.json();
}

// Call `step` now and then every `intervalMs`, one call at a time, skipping while the
// tab is hidden. Returns a function that runs a step at once (after a user action).
export function poll(step, intervalMs) {
  let timer = null;
  let running = false;
  async function tick() {
    clearTimeout(timer);
    if (!document.hidden && !running) {
      running = true;
      try {
        await step();
      } finally {
        running = false;
      }
    }
    timer = setTimeout(tick, intervalMs);
  }
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) tick();
  });
  tick();
  return tick;
}

// An element: el("td", {class: "x"}, "text", child, ...). Text is always text (never HTML).
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

export function setStatus(text, isError = false) {
  const node = document.getElementById("status");
  node.textContent = text;
  node.classList.toggle("error", isError);
}

export function when(seconds) {
  if (seconds === null || seconds === undefined) return "";
  return new Date(seconds * 1000).toLocaleString();
}

// "succeeded 3 · running 2": the states that have jobs, in the API's order.
export function countsText(counts) {
  return Object.entries(counts)
    .filter(([, n]) => n > 0)
    .map(([state, n]) => `${state} ${n}`)
    .join(" · ");
}

export function progressBar(fraction, label) {
  return el("progress", { max: 1, value: fraction, "aria-label": label, title: percent(fraction) });
}
