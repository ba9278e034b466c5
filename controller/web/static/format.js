// One way to print money, quantities, percentages and durations: the twin of
// controller/formatting.py (the CLI's, the reports' and the plots'), with the same rules,
// checked against it value by value in tests/integration/test_web_ui.py.
//
// A quantity keeps at least `places` decimals and at least `significant` significant
// digits, trailing zeros beyond `places` dropped ($12.35, $0.50, $0.000836): a non-zero
// amount never prints as 0.00 and nothing is in scientific notation. Magnitudes below
// NOISE are zero and a zero has no sign (no -0). toFixed and toExponential round the
// exact binary value, half away from zero, as the Python side does with Decimal.

export const NOISE = 1e-9;

function digits(magnitude, places, significant) {
  // The decimal exponent after rounding to `significant` digits (0.0009996 -> 1.00e-3).
  const exponent = Number(magnitude.toExponential(significant - 1).split("e")[1]);
  const decimals = Math.max(places, significant - 1 - exponent);
  let text = magnitude.toFixed(Math.min(decimals, 100));
  if (decimals > places) {
    const [whole, fraction = ""] = text.split(".");
    const kept = fraction.replace(/0+$/, "").padEnd(places, "0");
    text = kept ? `${whole}.${kept}` : whole;
  }
  const [whole, fraction] = text.split(".");
  const grouped = whole.replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  return fraction === undefined ? grouped : `${grouped}.${fraction}`;
}

// A quantity: 1,234.57, 0.50, 0.000836, 0.00; "" for null.
export function number(value, places = 2, significant = 3) {
  if (value === null || value === undefined) return "";
  if (Number.isNaN(value)) return "n/a";
  if (!Number.isFinite(value)) return value > 0 ? "∞" : "-∞";
  if (Math.abs(value) < NOISE) return places ? `0.${"0".repeat(places)}` : "0";
  return (value < 0 ? "-" : "") + digits(Math.abs(value), places, significant);
}

// US dollars, the sign before the $: $1,234.57, $0.50, $0.000836, -$0.0213.
export function usd(value) {
  const text = number(value);
  if (!text || text === "n/a") return text;
  return text.startsWith("-") ? `-$${text.slice(1)}` : `$${text}`;
}

// A fraction as a percentage: 46 %, 5.3 %, 0.31 %, 0 %.
export function percent(fraction, significant = 2) {
  if (fraction === null || fraction === undefined) return "";
  const text = number(100 * fraction, 0, significant);
  return text === "n/a" ? text : `${text} %`;
}

// A change with its sign: +12 %, -0.31 %, 0 % (a zero has none).
export function signedPercent(fraction) {
  const text = percent(fraction);
  return text.startsWith("-") || text.startsWith("0 ") || text.startsWith("n/a") ? text : `+${text}`;
}

const UNITS = [[90, 1, "s"], [90 * 60, 60, "min"], [72 * 3600, 3600, "h"]];

// A duration in the unit its size calls for: 350 ms, 27.2 s, 12.5 min, 3.2 h, 4.1 d.
export function duration(seconds) {
  if (seconds === null || seconds === undefined) return "";
  if (Number.isNaN(seconds)) return "n/a";
  const magnitude = Math.abs(seconds);
  if (magnitude < NOISE) return "0 s";
  const sign = seconds < 0 ? "-" : "";
  if (!Number.isFinite(magnitude)) return `${sign}∞`;
  if (magnitude < 1) return `${sign}${digits(magnitude * 1000, 0, 3)} ms`;
  for (const [below, unitS, unit] of UNITS) {
    if (magnitude < below) return `${sign}${digits(magnitude / unitS, 1, 3)} ${unit}`;
  }
  return `${sign}${digits(magnitude / 86400, 1, 3)} d`;
}

// "1 VM type", "2 VM types".
export function plural(count, noun, nouns = null) {
  return `${count.toLocaleString("en-US")} ${count === 1 ? noun : nouns || `${noun}s`}`;
}
