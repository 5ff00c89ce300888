// The dashboard's only way to the cluster: the node's own HTTP API, the same one the
// CLI and the workers use. Reads are this node's applied state (consistency=stale)
// unless asked fresh; writes carry this browser session's client id and a fresh
// request id, and are retried under that id when their outcome is unknown.

function randomU32s(n) {
  const a = new Uint32Array(n);
  crypto.getRandomValues(a);
  return a;
}

/** This session's client id: a random positive integer below 2^53 (exact in JSON). */
export const clientId = (() => {
  const saved = Number(sessionStorage.getItem("rota.clientid"));
  if (Number.isSafeInteger(saved) && saved > 0) return saved;
  const [hi, lo] = randomU32s(2);
  const id = (hi & 0x1fffff) * 0x100000000 + lo || 1;
  sessionStorage.setItem("rota.clientid", String(id));
  return id;
})();

/** A fresh request id: 128 random bits in hex. */
export function requestId() {
  return "ui-" + Array.from(randomU32s(4), (x) => x.toString(16).padStart(8, "0")).join("");
}

// A node with --auth=tokens answers 401 without a bearer token: the page asks for one
// once and keeps it for this browser session only (sessionStorage, never a cookie, so
// no other site can make the browser send it).
const TOKEN_KEY = "rota.token";

function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: `Bearer ${token}` } : {};
}

let asking = null;

/** Asks for a token after a 401 (one prompt for all requests that met it); whether one was given. */
function askForToken(why) {
  if (!asking) {
    asking = new Promise((resolve) => {
      const token = window.prompt(
        `${why || "This node requires a token."}\n\nPaste a Rota token: a reader token for a read-only view, an admin token for actions.`,
      );
      const given = (token || "").trim();
      if (given) sessionStorage.setItem(TOKEN_KEY, given);
      resolve(Boolean(given));
      setTimeout(() => (asking = null), 0);
    });
  }
  return asking;
}

/** fetch() with this session's token, asking for one once if the node wants it. */
async function authorizedFetch(url, init = {}) {
  for (let attempt = 0; ; attempt++) {
    const response = await fetch(url, { ...init, headers: { ...(init.headers || {}), ...authHeaders() } });
    if (response.status !== 401 || attempt > 0) return response;
    let why = null;
    try {
      why = (await response.clone().json()).error;
    } catch {
      // Not JSON: the generic question will do.
    }
    if (!(await askForToken(why))) return response;
  }
}

export class ApiError extends Error {
  constructor(status, message, body) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

// Client ids are 64-bit: keep integers JSON cannot hold exactly as their decimal text.
function reviver(_key, value, context) {
  if (typeof value === "number" && !Number.isSafeInteger(value) && Number.isInteger(value) && context && context.source) {
    return context.source;
  }
  return value;
}

async function parse(response) {
  const text = await response.text();
  if (!text) return null;
  try {
    return JSON.parse(text, reviver);
  } catch {
    return text;
  }
}

function withQuery(path, query) {
  const params = new URLSearchParams();
  for (const [k, v] of Object.entries(query || {})) {
    if (v !== undefined && v !== null && v !== "") params.append(k, String(v));
  }
  const qs = params.toString();
  return qs ? `${path}${path.includes("?") ? "&" : "?"}${qs}` : path;
}

// For a few seconds after this page wrote something, reads are linearizable, so that
// the page shows its own action at once even when this node has not applied it yet.
const FRESH_AFTER_WRITE_MS = 3000;
let freshUntil = 0;

/** GET a JSON answer; throws ApiError on anything but 200. */
export async function get(path, query, { fresh = false, signal } = {}) {
  const q = { ...(query || {}) };
  if (!fresh && Date.now() >= freshUntil) q.consistency = "stale";
  return getRaw(withQuery(path, q), { signal });
}

export async function getRaw(url, { signal, timeoutMs = 15000 } = {}) {
  let response;
  const deadline = AbortSignal.timeout(timeoutMs);
  try {
    response = await authorizedFetch(url, {
      headers: { Accept: "application/json" },
      cache: "no-store",
      signal: signal ? AbortSignal.any([signal, deadline]) : deadline,
    });
  } catch (e) {
    if (e.name === "AbortError" && signal && signal.aborted) throw e;
    throw new ApiError(0, e.name === "TimeoutError" ? "the node did not answer in time" : "the node does not answer", null);
  }
  const body = await parse(response);
  if (!response.ok) {
    throw new ApiError(response.status, (body && body.error) || `${response.status} ${response.statusText}`, body);
  }
  return body;
}

export async function getText(url) {
  const response = await authorizedFetch(url, { cache: "no-store", signal: AbortSignal.timeout(15000) });
  if (!response.ok) throw new ApiError(response.status, `${response.status} ${response.statusText}`, null);
  return response.text();
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * A write through the API: POST/PUT `body` plus clientid and a fresh requestid. A 503
 * or a lost answer is retried under the same request id (applied once); an answer
 * with `errors` (refused, nothing changed) throws them.
 */
export async function write(method, path, body) {
  const payload = JSON.stringify({ clientid: clientId, requestid: requestId(), ...body });
  let last;
  for (let attempt = 0; attempt < 5; attempt++) {
    if (attempt) await sleep(300 * attempt);
    let response;
    try {
      response = await authorizedFetch(path, {
        signal: AbortSignal.timeout(30000),
        method,
        headers: { "Content-Type": "application/json", Accept: "application/json" },
        body: payload,
        cache: "no-store",
      });
    } catch {
      last = new ApiError(0, "the node does not answer", null);
      continue;
    }
    const answer = await parse(response);
    if (response.status === 503 || response.status === 408 || response.status === 429) {
      last = new ApiError(response.status, (answer && answer.error) || "unavailable", answer);
      continue;
    }
    if (!response.ok) {
      throw new ApiError(response.status, (answer && answer.error) || `${response.status}`, answer);
    }
    freshUntil = Date.now() + FRESH_AFTER_WRITE_MS;
    if (answer && Array.isArray(answer.errors)) {
      throw new ApiError(200, answer.errors.join("; "), answer);
    }
    return answer;
  }
  throw last;
}

const enc = encodeURIComponent;

export const api = {
  config: () => getRaw("/ui/config"),
  cluster: () => getRaw("/cluster"),
  ready: async () => {
    const r = await fetch("/ready", { cache: "no-store", signal: AbortSignal.timeout(5000) });
    return { ok: r.ok, status: r.status };
  },
  groups: (opts) => get("/groups", {}, opts),
  stats: (group, opts) => get(`/groups/${enc(group)}/stats`, {}, opts),
  settings: (group, opts) => get(`/groups/${enc(group)}/settings`, {}, opts),
  tasks: (group, { limit = 100, after, owned = true } = {}, opts) =>
    get(`/group/${enc(group)}`, { limit, owned: owned ? 1 : 0, after }, opts),
  jobs: (group, { state, after, limit = 100 } = {}, opts) => get("/jobs", { group, state, after, limit }, opts),
  dead: (group, { after, limit = 100 } = {}, opts) => get("/dead", { group, after, limit }, opts),
  job: (group, key, opts) => get("/job", { group, key }, opts),
  task: (id, opts) => get(`/task/${enc(id)}`, {}, opts),
  retry: (group, keys) => write("POST", "/retry", { group, keys }),
  cancel: (group, keys) => write("POST", "/cancel", { group, keys }),
  setPaused: (group, paused) => write("PUT", `/groups/${enc(group)}/settings`, { paused }),
};

/**
 * Follows a group's changes with GET /watch (long polls), calling onChange(changes)
 * for each non-empty page. A 410 (revision forgotten) calls onChange(null): re-read
 * everything, then go on from the revision given. Returns a stop function.
 */
export function watchGroup(group, onChange) {
  const controller = new AbortController();
  let stopped = false;
  (async () => {
    let after;
    let failures = 0;
    while (!stopped) {
      try {
        // The first call only learns the current revision; the page was just read.
        const first = after === undefined;
        const page = await getRaw(withQuery("/watch", { group, after, wait_ms: first ? 0 : 25000, limit: 1000 }), {
          signal: controller.signal,
          timeoutMs: 40000,
        });
        failures = 0;
        after = page.revision;
        if (!first && page.changes.length) onChange(page.changes);
      } catch (e) {
        if (stopped || e.name === "AbortError") return;
        if (e instanceof ApiError && e.status === 410 && e.body && e.body.revision !== undefined) {
          after = e.body.revision;
          onChange(null);
          continue;
        }
        failures++;
        await sleep(Math.min(5000, 500 * failures));
      }
    }
  })();
  return () => {
    stopped = true;
    controller.abort();
  };
}

/** The smallest string after which /jobs lists every key that starts with `prefix`. */
export function keyBefore(prefix) {
  if (!prefix) return undefined;
  const chars = Array.from(prefix);
  const last = chars.pop().codePointAt(0);
  if (last === 0) return chars.join("");
  // Keys between this and `prefix` would have to start with it: none in practice.
  let prev = last - 1;
  if (prev >= 0xd800 && prev <= 0xdfff) prev = 0xd7ff;
  return chars.join("") + String.fromCodePoint(prev) + "\u{10FFFF}".repeat(8);
}
