// Shared pieces: the html tag, formatting, charts, the confirmation dialog, notices,
// the pager. Everything from the cluster is rendered as text (Preact escapes text and
// attribute values); nothing here ever parses a string as markup, so a payload stays a payload.

import { h } from "./vendor/preact/preact.module.js";
import { useEffect, useRef, useState } from "./vendor/preact/hooks.module.js";
import htm from "./vendor/htm/htm.module.js";

export const html = htm.bind(h);

// ---------- formatting ----------

export const fmtNum = (n) => (n === null || n === undefined ? "—" : typeof n === "number" ? n.toLocaleString("en-US") : String(n));

export function fmtTime(ms) {
  if (ms === null || ms === undefined) return "—";
  const d = new Date(ms);
  const p = (x) => String(x).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

export function fmtDuration(ms) {
  if (ms === null || ms === undefined) return "—";
  const neg = ms < 0;
  if (Math.abs(ms) < 1000) return `${Math.round(ms)} ms`;
  let s = Math.round(Math.abs(ms) / 1000);
  let out;
  if (s < 60) out = `${s} s`;
  else if (s < 3600) out = `${Math.floor(s / 60)} min ${s % 60} s`;
  else if (s < 86400) out = `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  else out = `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
  return neg ? `-${out}` : out;
}

export const fmtAgo = (ms) => (ms === null || ms === undefined ? "—" : `${fmtDuration(Date.now() - ms)} ago`);

export function truncate(text, n = 80) {
  if (text === null || text === undefined) return "";
  const s = String(text);
  return s.length > n ? s.slice(0, n) + "…" : s;
}

export function firstLine(text) {
  if (!text) return "";
  const s = String(text);
  const i = s.indexOf("\n");
  return i < 0 ? s : s.slice(0, i) + " …";
}

// ---------- hooks ----------

/** Re-renders every `ms` (for clocks such as "lease left"). */
export function useTick(ms) {
  const [, set] = useState(0);
  useEffect(() => {
    const t = setInterval(() => set((x) => x + 1), ms);
    return () => clearInterval(t);
  }, [ms]);
}

/**
 * Calls `load()` now and every `ms`, and whenever `deps` change; returns
 * {data, error, loading, reload}. An answer to an older load never overwrites a newer one.
 */
export function usePoll(load, ms, deps) {
  const [state, setState] = useState({ data: null, error: null, loading: true });
  const seq = useRef(0);
  const loadRef = useRef(load);
  loadRef.current = load;
  const reload = useRef(null);
  const busy = useRef(false);
  reload.current = async () => {
    const mine = ++seq.current;
    busy.current = true;
    try {
      const data = await loadRef.current();
      if (mine === seq.current) setState({ data, error: null, loading: false });
    } catch (e) {
      if (mine === seq.current) setState((s) => ({ data: s.data, error: e, loading: false }));
    } finally {
      if (mine === seq.current) busy.current = false;
    }
  };
  useEffect(() => {
    setState({ data: null, error: null, loading: true });
    reload.current();
    if (!ms) return undefined;
    // A node slower than the period is not asked again before it has answered.
    const t = setInterval(() => busy.current || reload.current(), ms);
    return () => {
      clearInterval(t);
      seq.current++;
    };
  }, deps);
  return { ...state, reload: () => reload.current() };
}

// ---------- notices and confirmation ----------

let noticeHost = null;
let confirmHost = null;

export function notify(text, kind = "ok") {
  if (noticeHost) noticeHost(text, kind);
}

/** Asks before an action: resolves true when the operator confirms. */
export function confirmAction({ title, message, confirm = "Confirm", danger = false }) {
  return new Promise((resolve) => {
    if (!confirmHost) return resolve(window.confirm(`${title}\n\n${message}`));
    confirmHost({ title, message, confirm, danger, resolve });
  });
}

/** Confirm, run `action`, report how it went; returns its answer or null. */
export async function runAction({ title, message, confirm, danger, action, done }) {
  if (!(await confirmAction({ title, message, confirm, danger }))) return null;
  try {
    const answer = await action();
    notify(done || `${title}: done`, "ok");
    return answer || true;
  } catch (e) {
    notify(`${title}: ${e.message}`, "error");
    return null;
  }
}

export function Overlays() {
  const [notices, setNotices] = useState([]);
  const [dialog, setDialog] = useState(null);
  const confirmButton = useRef(null);
  useEffect(() => {
    let n = 0;
    noticeHost = (text, kind) => {
      const id = ++n;
      setNotices((list) => [...list.slice(-3), { id, text, kind }]);
      setTimeout(() => setNotices((list) => list.filter((x) => x.id !== id)), kind === "error" ? 10000 : 4000);
    };
    confirmHost = (d) => setDialog(d);
    return () => {
      noticeHost = null;
      confirmHost = null;
    };
  }, []);
  useEffect(() => {
    if (dialog && confirmButton.current) confirmButton.current.focus();
  }, [dialog]);
  const close = (ok) => {
    const d = dialog;
    setDialog(null);
    d.resolve(ok);
  };
  const onKey = (e) => {
    if (e.key === "Escape") close(false);
  };
  return html`
    <div class="notices" aria-live="polite">
      ${notices.map((n) => html`<div key=${n.id} class=${`notice notice-${n.kind}`}>${n.text}</div>`)}
    </div>
    ${dialog &&
    html`<div class="modal-backdrop" onKeyDown=${onKey}>
      <div class="modal" role="dialog" aria-modal="true" aria-labelledby="modal-title" id="confirm-dialog">
        <h2 id="modal-title">${dialog.title}</h2>
        <p class="modal-message">${dialog.message}</p>
        <div class="modal-buttons">
          <button type="button" class="btn" id="confirm-no" onClick=${() => close(false)}>Keep as is</button>
          <button
            type="button"
            ref=${confirmButton}
            class=${`btn ${dialog.danger ? "btn-danger" : "btn-primary"}`}
            id="confirm-yes"
            onClick=${() => close(true)}
          >
            ${dialog.confirm}
          </button>
        </div>
      </div>
    </div>`}
  `;
}

// ---------- small components ----------

/** An action button: disabled, with the reason, when the node allows no actions. */
export function ActionButton({ config, onClick, children, danger, id, small, testKey, action, disabled }) {
  const allowed = config && config.actions;
  const cls = `btn action ${danger ? "btn-danger" : "btn-primary"}${small ? " btn-small" : ""}`;
  return html`<button
    type="button"
    class=${cls}
    id=${id}
    data-key=${testKey}
    data-action=${action}
    disabled=${!allowed || !!disabled}
    title=${allowed ? "" : "Read-only: start the node with --ui-actions to allow this"}
    onClick=${allowed ? onClick : undefined}
  >
    ${children}
  </button>`;
}

export function StateBadge({ state }) {
  return html`<span class=${`badge state-${state}`}>${state}</span>`;
}

export function ErrorLine({ error, what }) {
  if (!error) return null;
  return html`<div class="error-line" role="alert">${what ? `${what}: ` : ""}${error.message || String(error)}</div>`;
}

export function Stat({ label, value, id, onClick, active, kind }) {
  const cls = `stat${onClick ? " stat-link" : ""}${active ? " stat-active" : ""}${kind ? ` stat-${kind}` : ""}`;
  const inner = html`<span class="stat-value" id=${id}>${fmtNum(value)}</span><span class="stat-label">${label}</span>`;
  return onClick
    ? html`<button type="button" class=${cls} onClick=${onClick}>${inner}</button>`
    : html`<div class=${cls}>${inner}</div>`;
}

/** Cursor pager: pages are kept as a stack of cursors, nothing more. */
export function Pager({ page, hasNext, onFirst, onPrev, onNext, count, perPage }) {
  const start = (page - 1) * perPage + (count ? 1 : 0);
  return html`<div class="pager">
    <button type="button" class="btn btn-small" id="page-first" disabled=${page <= 1} onClick=${onFirst}>« First</button>
    <button type="button" class="btn btn-small" id="page-prev" disabled=${page <= 1} onClick=${onPrev}>‹ Previous</button>
    <span class="pager-info" id="page-info">page ${page} · ${fmtNum(start)}–${fmtNum(start + count - (count ? 1 : 0))}</span>
    <button type="button" class="btn btn-small" id="page-next" disabled=${!hasNext} onClick=${onNext}>Next ›</button>
  </div>`;
}

/** Pre-formatted untrusted text, escaped like every other text. */
export function Payload({ text, id }) {
  if (text === null || text === undefined) return html`<span class="muted">none</span>`;
  return html`<pre class="payload" id=${id}>${String(text)}</pre>`;
}

// ---------- charts ----------

const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"];

/** A small uPlot chart of `data` ([times in s, ...series]). */
export function Chart({ title, labels, data, id }) {
  const el = useRef(null);
  const plot = useRef(null);
  useEffect(() => {
    const uPlot = window.uPlot;
    if (!uPlot || !el.current) return undefined;
    const width = Math.max(200, el.current.clientWidth || 400);
    const opts = {
      width,
      height: 150,
      legend: { show: true, live: false },
      cursor: { show: true, drag: { x: false, y: false } },
      scales: { x: { time: true }, y: { range: (_u, min, max) => [0, Math.max(max || 0, 1) * 1.1] } },
      axes: [
        { stroke: "#555", grid: { stroke: "#eee" }, size: 30 },
        { stroke: "#555", grid: { stroke: "#eee" }, size: 46, values: (_u, ticks) => ticks.map(fmtAxis) },
      ],
      series: [{}, ...labels.map((label, i) => ({ label, stroke: PALETTE[i % PALETTE.length], width: 1.5, spanGaps: true }))],
    };
    plot.current = new uPlot(opts, data[0].length >= 2 ? data : data.map(() => []), el.current);
    const ro = new ResizeObserver(() => {
      if (plot.current && el.current) plot.current.setSize({ width: Math.max(200, el.current.clientWidth), height: 150 });
    });
    ro.observe(el.current);
    return () => {
      ro.disconnect();
      plot.current.destroy();
      plot.current = null;
    };
  }, [labels.join("|")]);
  // One point draws no line and makes uPlot guess a silly time range: wait for two.
  const enough = data[0].length >= 2;
  useEffect(() => {
    if (plot.current) plot.current.setData(enough ? data : data.map(() => []));
  }, [data]);
  return html`<figure class="chart" id=${id}>
    <figcaption>${title}</figcaption>
    <div class="chart-body" ref=${el}></div>
    ${enough ? null : html`<p class="chart-empty muted">collecting samples…</p>`}
  </figure>`;
}

function fmtAxis(v) {
  if (v === 0) return "0";
  if (Math.abs(v) >= 1000) return `${(v / 1000).toFixed(v >= 10000 ? 0 : 1)}k`;
  if (Math.abs(v) >= 10) return v.toFixed(0);
  if (Math.abs(v) >= 1) return v.toFixed(1);
  return v.toPrecision(2);
}

// ---------- routing ----------

/** The current route: `#/group/NAME?tab=jobs` -> {parts: ["group", "NAME"], query}. */
export function parseHash() {
  const raw = location.hash.replace(/^#\/?/, "");
  const q = raw.indexOf("?");
  const path = q < 0 ? raw : raw.slice(0, q);
  const query = Object.fromEntries(new URLSearchParams(q < 0 ? "" : raw.slice(q + 1)));
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  return { parts, query };
}

export function href(parts, query) {
  const path = "#/" + parts.map(encodeURIComponent).join("/");
  const qs = new URLSearchParams(Object.entries(query || {}).filter(([, v]) => v !== undefined && v !== null && v !== "")).toString();
  return qs ? `${path}?${qs}` : path;
}

/** Changes the query of the current route without adding a history entry per keystroke. */
export function setQuery(query, replace = true) {
  const { parts } = parseHash();
  const target = href(parts, query);
  if (replace) history.replaceState(null, "", target);
  else location.hash = target;
  window.dispatchEvent(new Event("rota-route"));
}
