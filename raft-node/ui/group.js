// One group: its counts and settings, its tasks (GET /group/{name}, paged by the
// TIMESPEC:ID cursor) and its jobs (GET /jobs, paged by key, filtered by state and
// key prefix), one task's or job's detail, pause/resume, retry and cancel. It follows
// the group's changes through GET /watch and re-reads only the page on screen.

import { useEffect, useRef, useState } from "./vendor/preact/hooks.module.js";
import { api, watchGroup, keyBefore } from "./api.js";
import {
  html, fmtNum, fmtTime, fmtDuration, truncate, firstLine, usePoll, useTick, ErrorLine, ActionButton,
  runAction, Stat, Pager, Payload, StateBadge, Chart, href, setQuery,
} from "./ui.js";
import { togglePause, settingsSummary, useSamples, rememberGroups } from "./groups.js";

export const PER_PAGE = 100;
const STATES = ["waiting", "running", "failed", "dead", "succeeded", "cancelled"];

export async function retryJobs(group, keys) {
  return runAction({
    title: keys.length === 1 ? `Retry job ${keys[0]}` : `Retry ${keys.length} jobs`,
    message: `Re-drive ${keys.length === 1 ? "this dead job" : "these dead jobs"} of group "${group}" with a fresh attempt budget: ${truncate(keys.join(", "), 300)}`,
    confirm: "Retry",
    action: () => api.retry(group, keys),
    done: `${keys.length} job${keys.length === 1 ? "" : "s"} retried`,
  });
}

export async function cancelJobs(group, keys) {
  return runAction({
    title: keys.length === 1 ? `Cancel job ${keys[0]}` : `Cancel ${keys.length} jobs`,
    message: `Cancel ${keys.length === 1 ? "this job" : "these jobs"} of group "${group}" (a running one's worker is refused on its next write; jobs waiting for it are cancelled too): ${truncate(keys.join(", "), 300)}`,
    confirm: "Cancel jobs",
    danger: true,
    action: () => api.cancel(group, keys),
    done: `${keys.length} job${keys.length === 1 ? "" : "s"} cancelled`,
  });
}

function leaseText(task, now) {
  const left = task.timespec - now;
  if (left > 0) return html`<span class="leased">owned by ${String(task.ownerid)} · ${fmtDuration(left)} left</span>`;
  return html`<span class="available">available</span>`;
}

/** Re-reads at most once per `ms` after bursts of changes. */
function useThrottle(fn, ms) {
  const state = useRef({ timer: null, last: 0 });
  const fnRef = useRef(fn);
  fnRef.current = fn;
  useEffect(() => () => clearTimeout(state.current.timer), []);
  return () => {
    const s = state.current;
    if (s.timer) return;
    const wait = Math.max(0, s.last + ms - Date.now());
    s.timer = setTimeout(() => {
      s.timer = null;
      s.last = Date.now();
      fnRef.current();
    }, wait);
  };
}

export function GroupPage({ config, name, query }) {
  useTick(1000);
  const tab = query.q ? "jobs" : query.tab === "jobs" ? "jobs" : "tasks";
  const state = STATES.includes(query.state) ? query.state : "";
  const prefix = query.q || "";
  const availableOnly = query.available === "1";
  const selected = query.sel || "";
  const filterKey = [name, tab, state, prefix, availableOnly].join("\u0000");

  // Cursor stack: cursors[i] is the `after` of page i + 1.
  // Kept per filter, so that a new filter starts at its first page at once.
  const [pager, setPager] = useState({ key: filterKey, cursors: [undefined] });
  const cursors = pager.key === filterKey ? pager.cursors : [undefined];
  const setCursors = (c) => setPager({ key: filterKey, cursors: c });
  const page = cursors.length;
  const after = cursors[cursors.length - 1];

  useEffect(() => rememberGroups([name]), [name]);

  const head = usePoll(
    async () => {
      const [stats, settings] = await Promise.all([api.stats(name), api.settings(name)]);
      return { stats, settings };
    },
    5000,
    [name],
  );

  const list = usePoll(
    async () => {
      if (tab === "tasks") {
        const rows = await api.tasks(name, { limit: PER_PAGE + 1, after, owned: !availableOnly });
        const more = rows.length > PER_PAGE;
        const shown = rows.slice(0, PER_PAGE);
        const last = shown[shown.length - 1];
        return { kind: "tasks", rows: shown, next: more && last ? `${last.timespec}:${last.id}` : null };
      }
      const from = page === 1 && prefix ? keyBefore(prefix) : after;
      const answer = await api.jobs(name, { state: state || undefined, after: from, limit: PER_PAGE });
      let rows = answer.jobs;
      let next = answer.next;
      if (prefix) {
        const cut = rows.findIndex((j) => !j.key.startsWith(prefix));
        if (cut >= 0) {
          rows = rows.slice(0, cut);
          next = null;
        }
      }
      return { kind: "jobs", rows, next };
    },
    10000, // the watch re-reads at once; this only covers a watch that cannot run
    [filterKey, page, after],
  );

  const detail = usePoll(
    async () => {
      if (!selected) return null;
      if (selected.startsWith("t:")) {
        const task = await api.task(selected.slice(2));
        const job = task.key ? await api.job(name, task.key).catch(() => null) : null;
        return { task, job };
      }
      const job = await api.job(name, selected.slice(2));
      const task = job.task ? await api.task(job.task).catch(() => null) : null;
      return { task, job };
    },
    0,
    [name, selected],
  );

  const refresh = () => {
    head.reload();
    list.reload();
    if (selected) detail.reload();
  };
  // The page on screen is cheap to re-read; the counts cost O(tasks) on the node, so
  // a busy group re-reads them at most every 3 s.
  const refreshPage = useThrottle(() => {
    list.reload();
    if (selected) detail.reload();
  }, 1000);
  const refreshCounts = useThrottle(() => head.reload(), 3000);
  useEffect(
    () =>
      watchGroup(name, () => {
        refreshPage();
        refreshCounts();
      }),
    [name],
  );

  const setFilter = (changes) => setQuery({ ...query, sel: undefined, ...changes });
  const select = (sel) => setQuery({ ...query, sel });

  const st = head.data && head.data.stats;
  const se = head.data && head.data.settings;
  const j = (st && st.jobs) || {};
  const onPause = async () => {
    if (se && (await togglePause(name, !se.paused))) head.reload();
  };

  return html`<section class="page" id="group-page" data-group=${name}>
    <p class="crumbs"><a href="#/groups">Groups</a> ›</p>
    <div class="title-row">
      <h1>${name}${se && se.paused ? html` <span class="badge paused" id="paused-badge">paused</span>` : null}</h1>
      <span class="title-actions">
        ${se && html`<${ActionButton} config=${config} id="pause-toggle" action=${se.paused ? "resume" : "pause"} danger=${!se.paused} onClick=${onPause}>${se.paused ? "Resume group" : "Pause group"}<//>`}
      </span>
    </div>
    ${se && html`<p class="muted small" id="group-settings">${settingsSummary(se)} · running now ${fmtNum(se.running)}</p>`}
    <${ErrorLine} error=${head.error} what="reading the group" />
    <div class="stats">
      <${Stat} label="tasks" value=${st && st.tasks} id="stat-tasks" onClick=${() => setFilter({ tab: "tasks", available: undefined, state: undefined, q: undefined })} active=${tab === "tasks" && !availableOnly} />
      <${Stat} label="available" value=${st && st.available} id="stat-available" onClick=${() => setFilter({ tab: "tasks", available: "1", state: undefined, q: undefined })} active=${tab === "tasks" && availableOnly} />
      <${Stat} label="leased" value=${st && st.owned} id="stat-owned" />
      <span class="stats-sep"></span>
      ${STATES.map(
        (s) => html`<${Stat} key=${s} label=${s} value=${st && j[s]} id=${`stat-${s}`} kind=${s}
          onClick=${() => setFilter({ tab: "jobs", state: s, q: undefined, available: undefined })} active=${tab === "jobs" && state === s} />`,
      )}
    </div>

    <${GroupCharts} group=${name} />

    <div class="toolbar">
      <div class="tabs" role="tablist">
        <button type="button" role="tab" id="tab-tasks" class=${`tab${tab === "tasks" ? " tab-active" : ""}`} onClick=${() => setFilter({ tab: "tasks", state: undefined, q: undefined })}>Tasks</button>
        <button type="button" role="tab" id="tab-jobs" class=${`tab${tab === "jobs" ? " tab-active" : ""}`} onClick=${() => setFilter({ tab: "jobs", available: undefined })}>Jobs</button>
      </div>
      ${tab === "tasks"
        ? html`<label class="filter">Show
            <select id="task-filter" value=${availableOnly ? "1" : ""} onChange=${(e) => setFilter({ available: e.target.value || undefined })}>
              <option value="">all tasks</option>
              <option value="1">available only (not leased)</option>
            </select></label>`
        : html`<label class="filter">State
            <select id="state-filter" value=${state} onChange=${(e) => setFilter({ state: e.target.value || undefined })}>
              <option value="">any</option>
              ${STATES.map((s) => html`<option key=${s} value=${s}>${s}</option>`)}
            </select></label>`}
      <${KeySearch} value=${prefix} onSearch=${(q) => setFilter({ q: q || undefined, tab: q ? "jobs" : tab, state: undefined, available: undefined })} />
    </div>

    <div class="split">
      <div class="split-main">
        <${ErrorLine} error=${list.error} what="reading the page" />
        ${list.data
          ? list.data.kind === "tasks"
            ? html`<${TaskTable} rows=${list.data.rows} selected=${selected} onSelect=${select} />`
            : html`<${JobTable} rows=${list.data.rows} selected=${selected} onSelect=${select} />`
          : html`<p class="muted">Loading…</p>`}
        ${list.data &&
        html`<${Pager}
          page=${page}
          perPage=${PER_PAGE}
          count=${list.data.rows.length}
          hasNext=${!!list.data.next}
          onFirst=${() => setCursors([undefined])}
          onPrev=${() => setCursors(cursors.slice(0, -1))}
          onNext=${() => setCursors([...cursors, list.data.next])}
        />`}
      </div>
      ${selected &&
      html`<aside class="split-side" id="detail">
        <button type="button" class="btn btn-small close" id="detail-close" onClick=${() => select(undefined)}>Close</button>
        <${ErrorLine} error=${detail.error} what=${selected.startsWith("t:") ? `task ${selected.slice(2)}` : `job ${selected.slice(2)}`} />
        ${detail.data && html`<${Detail} config=${config} group=${name} data=${detail.data} onDone=${refresh} />`}
      </aside>`}
    </div>
  </section>`;
}

function KeySearch({ value, onSearch }) {
  const [text, setText] = useState(value);
  useEffect(() => setText(value), [value]);
  // A value set without an input event (autofill, a script's clear()) still fires
  // change; without it the next re-render (one a second) would put the old text back.
  const keep = (e) => setText(e.target.value);
  const submit = (e) => {
    e.preventDefault();
    onSearch(text.trim());
  };
  return html`<form class="search" onSubmit=${submit} role="search">
    <input type="search" id="key-search" placeholder="job key or prefix" value=${text} onInput=${keep} onChange=${keep} />
    <button type="submit" class="btn btn-small" id="key-search-go">Search</button>
    ${value ? html`<button type="button" class="btn btn-small" onClick=${() => onSearch("")}>Clear</button>` : null}
  </form>`;
}

function GroupCharts({ group }) {
  const s = useSamples();
  return html`<div class="charts">
    <${Chart} id="chart-group-tasks" title=${`Tasks in ${group} (rota_group_tasks)`} labels=${["tasks"]} data=${s.groupTasks(group)} />
    <${Chart} id="chart-node-claims" title="Claims and finishes per second on this node (all groups)" labels=${["claim", "finish"]} data=${s.rates([["POST /claim"], ["POST /finish"]])} />
  </div>`;
}

function TaskTable({ rows, selected, onSelect }) {
  const now = Date.now();
  if (!rows.length) return html`<p class="muted" id="no-rows">No tasks on this page.</p>`;
  return html`<table class="table rows" id="task-table">
    <thead><tr><th class="num">Id</th><th>Key</th><th>Data</th><th>Owner / lease</th><th class="num">Attempt</th><th class="num">Priority</th></tr></thead>
    <tbody>
      ${rows.map((t) => {
        // A job is selected by key: its record outlives the task version (a claim or
        // renewal replaces the id); a task without a key only by its id.
        const sel = t.key !== undefined && t.key !== null ? `j:${t.key}` : `t:${t.id}`;
        return html`<tr key=${t.id} data-id=${t.id} class=${`clickable${selected === sel ? " row-selected" : ""}`} onClick=${() => onSelect(sel)}>
          <td class="num mono">${t.id}</td>
          <td class="mono">${t.key ?? html`<span class="muted">—</span>`}</td>
          <td class="data-cell">${truncate(t.data, 80)}</td>
          <td>${leaseText(t, now)}</td>
          <td class="num">${t.attempt ?? ""}</td>
          <td class="num">${t.priority ?? ""}</td>
        </tr>`;
      })}
    </tbody>
  </table>`;
}

function JobTable({ rows, selected, onSelect }) {
  if (!rows.length) return html`<p class="muted" id="no-rows">No jobs on this page.</p>`;
  return html`<table class="table rows" id="job-table">
    <thead><tr><th>Key</th><th>State</th><th class="num">Attempts</th><th>Data</th><th>Last error or reason</th><th>Created</th></tr></thead>
    <tbody>
      ${rows.map((jb) => {
        const last = jb.history.length ? jb.history[jb.history.length - 1] : null;
        return html`<tr key=${jb.key} data-key=${jb.key} data-state=${jb.state} class=${`clickable${selected === `j:${jb.key}` ? " row-selected" : ""}`} onClick=${() => onSelect(`j:${jb.key}`)}>
          <td class="mono">${jb.key}</td>
          <td><${StateBadge} state=${jb.state} /></td>
          <td class="num">${jb.attempts}${jb.max_attempts ? ` / ${jb.max_attempts}` : ""}</td>
          <td class="data-cell">${truncate(jb.data, 60)}</td>
          <td class="data-cell">${truncate(firstLine(jb.reason || (last && last.error) || ""), 80)}</td>
          <td class="small">${fmtTime(jb.created_at)}</td>
        </tr>`;
      })}
    </tbody>
  </table>`;
}

function Detail({ config, group, data, onDone }) {
  const { task, job } = data;
  const now = Date.now();
  const act = async (f) => {
    if (await f()) onDone();
  };
  return html`<div class="detail">
    ${job
      ? html`<h2>Job <span class="mono" id="detail-key">${job.key}</span> <${StateBadge} state=${job.state} /></h2>
          <div class="detail-actions">
            ${job.state === "dead" && html`<${ActionButton} config=${config} id="detail-retry" action="retry" small=${true} onClick=${() => act(() => retryJobs(group, [job.key]))}>Retry<//>`}
            ${["waiting", "running", "failed", "dead"].includes(job.state) &&
            html`<${ActionButton} config=${config} id="detail-cancel" action="cancel" small=${true} danger=${true} onClick=${() => act(() => cancelJobs(group, [job.key]))}>Cancel<//>`}
          </div>`
      : html`<h2>Task <span class="mono">${task.id}</span></h2>`}
    ${task &&
    html`<dl class="facts" id="task-facts">
      <dt>Task id</dt><dd class="mono">${task.id}</dd>
      <dt>Owner</dt><dd class="mono" id="detail-owner">${String(task.ownerid)}</dd>
      <dt>${task.timespec > now ? "Lease left" : "Available since"}</dt>
      <dd id="detail-lease">${task.timespec > now ? `${fmtDuration(task.timespec - now)} (until ${fmtTime(task.timespec)})` : fmtTime(task.timespec)}</dd>
      ${task.attempt !== undefined && html`<dt>Attempt</dt><dd>${task.attempt}</dd>`}
      ${task.priority !== undefined && html`<dt>Priority</dt><dd>${task.priority}</dd>`}
    </dl>`}
    ${job &&
    html`<dl class="facts" id="job-facts">
      <dt>Run / attempts</dt><dd>run ${job.run}, ${job.attempts} attempt${job.attempts === 1 ? "" : "s"}${job.max_attempts ? ` of ${job.max_attempts}` : " (group's limit)"}</dd>
      <dt>Created</dt><dd>${fmtTime(job.created_at)}</dd>
      ${job.finished_at && html`<dt>Finished</dt><dd>${fmtTime(job.finished_at)}</dd>`}
      ${job.expires_at && html`<dt>Record expires</dt><dd>${fmtTime(job.expires_at)}</dd>`}
      ${job.reason && html`<dt>Reason</dt><dd id="detail-reason">${job.reason}</dd>`}
      ${job.priority ? html`<dt>Priority</dt><dd>${job.priority}</dd>` : null}
      ${job.every_ms && html`<dt>Recurs every</dt><dd>${fmtDuration(job.every_ms)}</dd>`}
      ${job.after.length > 0 && html`<dt>Waits for</dt><dd class="mono">${job.after.join(", ")}</dd>`}
      ${job.dependants.length > 0 && html`<dt>Dependants</dt><dd class="mono">${job.dependants.join(", ")}</dd>`}
      ${job.resubmitted && html`<dt>Resubmitted</dt><dd>runs once more after this run succeeds</dd>`}
    </dl>`}
    <h3>Data</h3>
    <${Payload} id="detail-data" text=${task ? task.data : job && job.data} />
    ${job && job.result !== null && job.result !== undefined && html`<h3>Result</h3><${Result} result=${job.result} />`}
    ${job &&
    html`<h3>Attempts</h3>
      ${job.history.length === 0
        ? html`<p class="muted">No attempt yet.</p>`
        : html`<ol class="attempts" id="attempts">
            ${job.history.map(
              (a) => html`<li key=${`${a.run}.${a.attempt}`}>
                <div>
                  <strong>run ${a.run} attempt ${a.attempt}</strong> <${StateBadge} state=${a.outcome} /> by <span class="mono">${String(a.owner)}</span>
                  <span class="muted">${`, ${fmtTime(a.started_at)}${a.ended_at ? ` → ${fmtTime(a.ended_at)} (${fmtDuration(a.ended_at - a.started_at)})` : " (running)"}`}</span>
                </div>
                ${a.error && html`<${Payload} text=${a.error} />`}
              </li>`,
            )}
          </ol>`}`}
    <p><a href=${href(["group", group])}>back to ${group}</a></p>
  </div>`;
}

function Result({ result }) {
  if (result && typeof result === "object" && ("stdout" in result || "stderr" in result)) {
    return html`<dl class="facts">
        ${"exit" in result && html`<dt>Exit</dt><dd>${String(result.exit)}</dd>`}
        ${"duration_ms" in result && html`<dt>Duration</dt><dd>${fmtDuration(result.duration_ms)}</dd>`}
      </dl>
      <h4>stdout (end)</h4><${Payload} text=${result.stdout || ""} />
      <h4>stderr (end)</h4><${Payload} text=${result.stderr || ""} />`;
  }
  return html`<${Payload} id="detail-result" text=${typeof result === "string" ? result : JSON.stringify(result, null, 2)} />`;
}
