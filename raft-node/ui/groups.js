// The groups page: every group's counts and settings (GET /groups, then
// /groups/{g}/stats and /settings per group, polled), this node's throughput and claim
// latency from its own /metrics, and pause/resume.

import { useEffect, useState } from "./vendor/preact/hooks.module.js";
import { api } from "./api.js";
import { sampler } from "./metrics.js";
import { html, fmtNum, fmtDuration, usePoll, ErrorLine, ActionButton, runAction, Chart, href } from "./ui.js";

const POLL_MS = 2000;
const PER_PAGE = 50;

// Groups seen in this browser: /groups lists only groups that hold tasks, so a group
// whose jobs are all dead (or which is paused and empty) would otherwise vanish.
const KNOWN_KEY = "rota.groups";
export function rememberGroups(names) {
  const known = knownGroups();
  let changed = false;
  for (const n of names) {
    if (!known.includes(n)) {
      known.push(n);
      changed = true;
    }
  }
  if (changed) localStorage.setItem(KNOWN_KEY, JSON.stringify(known.slice(-200)));
}
export function knownGroups() {
  try {
    const v = JSON.parse(localStorage.getItem(KNOWN_KEY) || "[]");
    return Array.isArray(v) ? v.filter((x) => typeof x === "string") : [];
  } catch {
    return [];
  }
}
export function forgetGroup(name) {
  localStorage.setItem(KNOWN_KEY, JSON.stringify(knownGroups().filter((g) => g !== name)));
}

export async function togglePause(group, paused) {
  return runAction({
    title: `${paused ? "Pause" : "Resume"} group ${group}`,
    message: paused
      ? `Claims on "${group}" will answer empty until it is resumed. Adds are still accepted and running tasks keep their leases.`
      : `Claims on "${group}" will take its tasks again.`,
    confirm: paused ? "Pause" : "Resume",
    danger: paused,
    action: () => api.setPaused(group, paused),
    done: `${group} ${paused ? "paused" : "resumed"}`,
  });
}

export function useSamples() {
  const [, set] = useState(0);
  useEffect(() => sampler.subscribe(() => set((x) => x + 1)), []);
  return sampler;
}

export function NodeCharts({ nodeId }) {
  const s = useSamples();
  const rates = s.rates([["POST /claim"], ["POST /finish"], ["POST /fail"], ["POST /update"]]);
  const latency = s.claimLatency([0.5, 0.99]);
  return html`<div class="charts">
    <${Chart}
      id="chart-throughput"
      title=${`Requests per second on node ${nodeId ?? ""} (all groups)`}
      labels=${["claim", "finish", "fail", "update"]}
      data=${rates}
    />
    <${Chart} id="chart-claim-latency" title="Claim latency on this node (ms; blocking claims count their wait)" labels=${["p50", "p99"]} data=${latency} />
    ${s.error ? html`<p class="muted small">metrics: ${s.error}</p>` : null}
  </div>`;
}

async function loadGroups() {
  const listed = await api.groups();
  rememberGroups(listed);
  const extra = knownGroups().filter((g) => !listed.includes(g));
  const names = [...listed, ...extra];
  return { names, listed };
}

export function GroupsPage({ config }) {
  const list = usePoll(loadGroups, POLL_MS, []);
  const [page, setPage] = useState(1);
  const names = list.data ? list.data.names : [];
  const pages = Math.max(1, Math.ceil(names.length / PER_PAGE));
  const shown = names.slice((page - 1) * PER_PAGE, page * PER_PAGE);
  const key = shown.join("\u0000");
  const rows = usePoll(
    async () => {
      const out = await Promise.all(
        shown.map(async (g) => {
          const [stats, settings] = await Promise.all([api.stats(g), api.settings(g)]);
          const empty = stats.tasks === 0 && Object.values(stats.jobs).every((n) => n === 0) && !settings.paused;
          if (empty && list.data && !list.data.listed.includes(g)) forgetGroup(g);
          return { group: g, stats, settings };
        }),
      );
      return out;
    },
    POLL_MS,
    [key],
  );
  const byGroup = new Map((rows.data || []).map((r) => [r.group, r]));

  const onToggle = async (g, paused) => {
    if (await togglePause(g, paused)) rows.reload();
  };

  return html`<section class="page" id="groups-page">
    <h1>Groups</h1>
    <${NodeCharts} nodeId=${config && config.node_id} />
    <${ErrorLine} error=${list.error || rows.error} what="reading the groups" />
    ${list.data && names.length === 0
      ? html`<p class="muted" id="no-groups">No group holds tasks yet. Add one: <code>rota job add --group NAME --key KEY --data DATA</code>.</p>`
      : html`<table class="table" id="groups-table">
          <thead>
            <tr>
              <th>Group</th><th class="num">Tasks</th><th class="num">Available</th><th class="num">Leased</th>
              <th class="num">Waiting</th><th class="num">Running</th><th class="num">Failed</th><th class="num">Dead</th>
              <th class="num">Succeeded</th><th class="num">Cancelled</th><th>Settings</th><th></th>
            </tr>
          </thead>
          <tbody>
            ${shown.map((g) => {
              const r = byGroup.get(g);
              const st = r && r.stats;
              const se = r && r.settings;
              const j = (st && st.jobs) || {};
              return html`<tr key=${g} data-group=${g}>
                <td><a href=${href(["group", g])} class="group-link">${g}</a>${list.data && !list.data.listed.includes(g) ? html` <span class="tag" title="not in GET /groups: it holds no task">no tasks</span>` : null}
                  ${se && se.paused ? html` <span class="badge paused">paused</span>` : null}</td>
                <td class="num" data-stat="tasks">${st ? fmtNum(st.tasks) : "…"}</td>
                <td class="num" data-stat="available">${st ? fmtNum(st.available) : "…"}</td>
                <td class="num" data-stat="owned">${st ? fmtNum(st.owned) : "…"}</td>
                <td class="num" data-stat="waiting">${st ? fmtNum(j.waiting) : "…"}</td>
                <td class="num" data-stat="running">${st ? fmtNum(j.running) : "…"}</td>
                <td class="num" data-stat="failed">${st ? fmtNum(j.failed) : "…"}</td>
                <td class=${`num${j.dead ? " num-bad" : ""}`} data-stat="dead">${st ? (j.dead ? html`<a href=${href(["dead"], { group: g })}>${fmtNum(j.dead)}</a>` : fmtNum(j.dead)) : "…"}</td>
                <td class="num" data-stat="succeeded">${st ? fmtNum(j.succeeded) : "…"}</td>
                <td class="num" data-stat="cancelled">${st ? fmtNum(j.cancelled) : "…"}</td>
                <td class="small">${se ? settingsSummary(se) : "…"}</td>
                <td>${se
                  ? html`<${ActionButton} config=${config} small=${true} danger=${!se.paused} testKey=${g} action=${se.paused ? "resume" : "pause"} onClick=${() => onToggle(g, !se.paused)}>${se.paused ? "Resume" : "Pause"}<//>`
                  : null}</td>
              </tr>`;
            })}
          </tbody>
        </table>`}
    ${pages > 1 &&
    html`<div class="pager">
      <button type="button" class="btn btn-small" disabled=${page <= 1} onClick=${() => setPage(page - 1)}>‹ Previous</button>
      <span class="pager-info">groups ${(page - 1) * PER_PAGE + 1}–${Math.min(names.length, page * PER_PAGE)} of ${names.length}</span>
      <button type="button" class="btn btn-small" disabled=${page >= pages} onClick=${() => setPage(page + 1)}>Next ›</button>
    </div>`}
    <p class="muted small">Counts are node ${config && config.node_id}'s applied state, read every ${POLL_MS / 1000} s. Leased: tasks whose available time is ahead (claimed, or scheduled).</p>
  </section>`;
}

export function settingsSummary(se) {
  const parts = [];
  parts.push(se.max_running ? `max running ${se.max_running}` : "no concurrency limit");
  parts.push(se.max_attempts ? `max attempts ${se.max_attempts}` : "unlimited attempts");
  parts.push(`back-off ${fmtDuration(se.backoff.base_ms)}×${se.backoff.factor} ≤ ${fmtDuration(se.backoff.max_ms)}`);
  parts.push(`retention ${fmtDuration(se.retention_ms)}`);
  return parts.join(" · ");
}
