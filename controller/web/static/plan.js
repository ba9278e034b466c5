// A bag's deadline and budget as the pages show them (the bag page's "Deadline and
// budget", the bags page's flags): pure functions of the API's JSON, no DOM, so that a
// test runs them on realistic answers. GET /v1/bags/{id} gives `options` (the deadline
// as kept), `budget` (dollars against the caps) and, from the deadline policy,
// `deadline`: {at, confidence, p_meet, finish: {p50, p90, p95}, at_risk,
// on_demand_slots, on_demand_share}; absent from a daemon without the policy, p_meet and
// finish null until first projected. Figures are printed by format.js.
import { duration, percent, plural, usd, when } from "/ui/static/api.js";

// The deadline's facts: [label, text] pairs, [] without a deadline. `now`: the API's
// clock (created_at + elapsed_s), not the browser's.
export function deadlineFacts(view, now) {
  const options = view.options || {};
  const d = view.deadline || null;
  const at = d && d.at != null ? d.at : options.deadline_at;
  if (at === null || at === undefined) return [];
  const facts = [["Deadline", `${when(at)} (${options.deadline ?? ""}, on-demand ${options.on_demand})`]];
  if (view.state === "active") {
    const left = at - now;
    facts.push(["Time left", left >= 0 ? duration(left) : `passed ${duration(-left)} ago`]);
  }
  if (!d) return facts;
  if (d.finish && d.finish.p50 != null) {
    facts.push(["Projected finish", when(d.finish.p50)]);
    if (d.finish.p90 != null && d.finish.p95 != null) {
      facts.push(["Spread (p90 – p95)", `${when(d.finish.p90)} – ${when(d.finish.p95)}`]);
    }
  } else if (view.state === "active") {
    facts.push(["Projected finish", "not yet known"]);
  }
  if (d.p_meet != null) {
    facts.push(["Meets it", `p = ${percent(d.p_meet, 3)} (wanted ${percent(d.confidence ?? options.deadline_confidence, 3)})`]);
  }
  if (d.on_demand_slots != null || d.on_demand_share != null) {
    const share = d.on_demand_share != null ? `, share so far ${percent(d.on_demand_share)}` : "";
    facts.push(["On-demand", `${plural(d.on_demand_slots ?? 0, "slot")} now${share}`]);
  }
  return facts;
}

// Budget used against the caps (the API's `budget`): text, and the bar's fractions.
export function budgetFacts(view) {
  const b = view.budget || {};
  const cap = b.budget_usd ?? null;
  const accountCap = b.account_budget_usd ?? null;
  if (cap === null && accountCap === null && !b.held) return null;
  const charged = b.charged_usd ?? 0;
  const reserved = b.reserved_usd ?? 0;
  let text = `${usd(charged)} charged + ${usd(reserved)} reserved of ${cap === null ? "no cap" : usd(cap)}`;
  if (cap) text += ` (${percent((charged + reserved) / cap)} used)`;
  if (accountCap !== null) {
    text += `; account: ${usd(b.account_month_charged_usd ?? 0)} of ${usd(accountCap)} this month`;
  }
  const bar = cap
    ? { charged: Math.min(1, charged / cap), reserved: Math.min(1 - Math.min(1, charged / cap), reserved / cap) }
    : null;
  return { text, bar, held: b.held || null };
}

// What needs a look on the bags page: ["at risk", "held: budget"], either, or neither.
export function bagFlags(bag) {
  const flags = [];
  if (bag.deadline && bag.deadline.at_risk) flags.push("at risk");
  if (bag.budget && bag.budget.held) flags.push("held: budget");
  return flags;
}
