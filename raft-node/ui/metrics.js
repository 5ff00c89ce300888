// Samples this node's GET /metrics (Prometheus text) every few seconds while the
// dashboard is open and keeps the last minutes in memory: request rates and claim
// latency come from the differences between samples, as Prometheus' rate() and
// histogram_quantile() would compute them. The node keeps counters, not history, so
// the charts start when the page is opened.

import { getText } from "./api.js";

export const SAMPLE_MS = 2000;
const KEEP_MS = 10 * 60 * 1000;
const RATE_WINDOW_MS = 10000;

/** Parses Prometheus text exposition into [{name, labels, value}]. */
export function parsePrometheus(text) {
  const out = [];
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    if (!line || line[0] === "#") continue;
    let i = 0;
    while (i < line.length && line[i] !== "{" && line[i] !== " ") i++;
    const name = line.slice(0, i);
    const labels = {};
    if (line[i] === "{") {
      i++;
      while (i < line.length && line[i] !== "}") {
        let j = i;
        while (line[j] !== "=") j++;
        const key = line.slice(i, j).trim();
        j += 2; // ="
        let value = "";
        while (j < line.length && line[j] !== '"') {
          if (line[j] === "\\") {
            j++;
            value += line[j] === "n" ? "\n" : line[j];
          } else value += line[j];
          j++;
        }
        labels[key] = value;
        i = j + 1;
        if (line[i] === ",") i++;
      }
      i++;
    }
    const rest = line.slice(i).trim().split(/\s+/);
    const value = Number(rest[0]);
    if (name) out.push({ name, labels, value });
  }
  return out;
}

function digest(t, series) {
  const s = { t, requests: {}, claim: [], claimCount: 0, groups: {}, gauges: {} };
  for (const { name, labels, value } of series) {
    if (name === "rota_http_requests_total") {
      s.requests[labels.endpoint] = (s.requests[labels.endpoint] || 0) + value;
    } else if (name === "rota_http_request_seconds_bucket" && labels.endpoint === "POST /claim") {
      s.claim.push([labels.le === "+Inf" ? Infinity : Number(labels.le), value]);
    } else if (name === "rota_group_tasks") {
      s.groups[labels.group] = value;
    } else if (!name.endsWith("_bucket") && Object.keys(labels).length === 0) {
      s.gauges[name] = value;
    }
  }
  s.claim.sort((a, b) => a[0] - b[0]);
  return s;
}

/** histogram_quantile over the difference of two cumulative bucket lists. */
export function quantile(q, newer, older) {
  if (!newer.length) return null;
  // A series the older sample lacks did not exist yet: its counts were 0.
  const before = new Map((older || []).map(([le, c]) => [le, c]));
  const d = newer.map(([le, c]) => [le, c - (before.get(le) || 0)]);
  const total = d[d.length - 1][1];
  if (!(total > 0) || d.some(([, c]) => c < 0)) return null;
  const rank = q * total;
  let prevLe = 0;
  let prevCount = 0;
  for (const [le, count] of d) {
    if (count >= rank) {
      if (le === Infinity) return prevLe;
      if (count === prevCount) return le;
      return prevLe + ((le - prevLe) * (rank - prevCount)) / (count - prevCount);
    }
    prevLe = le;
    prevCount = count;
  }
  return prevLe;
}

// Samples survive a reload of the page (not the tab): sessionStorage, bounded.
const STORE_KEY = "rota.metrics";
const STORED_GROUPS = 50;

function restore() {
  try {
    const v = JSON.parse(sessionStorage.getItem(STORE_KEY) || "[]");
    if (!Array.isArray(v)) return [];
    return v
      .filter((x) => x && typeof x.t === "number" && x.t > Date.now() - KEEP_MS)
      .map((x) => ({ ...x, claim: (x.claim || []).map(([le, c]) => [le === null ? Infinity : le, c]) }));
  } catch {
    return [];
  }
}

function persist(samples) {
  try {
    const slim = samples.map((x) => {
      const groups = {};
      for (const k of Object.keys(x.groups).slice(0, STORED_GROUPS)) groups[k] = x.groups[k];
      return { ...x, groups };
    });
    sessionStorage.setItem(STORE_KEY, JSON.stringify(slim)); // Infinity becomes null
  } catch {
    // storage full or disabled: history lasts as long as the page
  }
}

class Sampler {
  constructor() {
    this.samples = restore();
    this.listeners = new Set();
    this.error = null;
    this.timer = null;
  }

  start() {
    if (this.timer) return;
    const tick = async () => {
      try {
        const text = await getText("/metrics");
        const now = Date.now();
        this.samples.push(digest(now, parsePrometheus(text)));
        while (this.samples.length && this.samples[0].t < now - KEEP_MS) this.samples.shift();
        persist(this.samples);
        this.error = null;
      } catch (e) {
        this.error = e.message || String(e);
      }
      for (const f of this.listeners) f();
    };
    tick();
    this.timer = setInterval(tick, SAMPLE_MS);
  }

  subscribe(f) {
    this.listeners.add(f);
    return () => this.listeners.delete(f);
  }

  /** For each sample, the one about RATE_WINDOW_MS earlier (or the first). */
  pairs() {
    const out = [];
    let j = 0;
    for (let i = 1; i < this.samples.length; i++) {
      const s = this.samples[i];
      while (j < i - 1 && this.samples[j + 1].t <= s.t - RATE_WINDOW_MS) j++;
      out.push([s, this.samples[j]]);
    }
    return out;
  }

  /** Requests per second for each endpoint list in `sets`: [times, ...series]. */
  rates(sets) {
    const pairs = this.pairs();
    const times = pairs.map(([s]) => s.t / 1000);
    const series = sets.map((endpoints) =>
      pairs.map(([s, o]) => {
        let d = 0;
        for (const e of endpoints) d += (s.requests[e] || 0) - (o.requests[e] || 0);
        const dt = (s.t - o.t) / 1000;
        return d < 0 || dt <= 0 ? null : d / dt;
      }),
    );
    return [times, ...series];
  }

  /** Claim latency quantiles in milliseconds: [times, ...one series per q]. */
  claimLatency(qs) {
    const pairs = this.pairs();
    const times = pairs.map(([s]) => s.t / 1000);
    const series = qs.map((q) =>
      pairs.map(([s, o]) => {
        const v = quantile(q, s.claim, o.claim);
        return v === null ? null : v * 1000;
      }),
    );
    return [times, ...series];
  }

  /** A group's live tasks (rota_group_tasks) over time. */
  groupTasks(group) {
    return [this.samples.map((s) => s.t / 1000), this.samples.map((s) => (group in s.groups ? s.groups[group] : 0))];
  }

  latest() {
    return this.samples[this.samples.length - 1] || null;
  }
}

export const sampler = new Sampler();
