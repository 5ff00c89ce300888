// Dead letters: a group's dead jobs (GET /dead, paged by key) with retry and cancel,
// one by one or for the selected rows. Groups with dead jobs are found from their
// counts (GET /groups/{g}/stats) among the groups this browser knows.

import { useState } from "./vendor/preact/hooks.module.js";
import { api } from "./api.js";
import { html, fmtNum, fmtTime, truncate, firstLine, usePoll, ErrorLine, ActionButton, Pager, href, setQuery } from "./ui.js";
import { knownGroups, rememberGroups } from "./groups.js";
import { retryJobs, cancelJobs } from "./group.js";

const PER_PAGE = 50;
const POLL_MS = 3000;

export function DeadPage({ config, query }) {
  const asked = query.group || "";
  const overview = usePoll(
    async () => {
      const listed = await api.groups();
      rememberGroups(asked ? [...listed, asked] : listed);
      const names = [...new Set([asked, ...listed, ...knownGroups()].filter(Boolean))].slice(0, 200);
      const stats = await Promise.all(names.map((g) => api.stats(g).catch(() => null)));
      return names.map((g, i) => ({ group: g, dead: stats[i] ? stats[i].jobs.dead : null })).filter((r) => r.dead);
    },
    POLL_MS * 2,
    [asked],
  );
  const withDead = overview.data || [];
  const group = query.group || (withDead[0] && withDead[0].group) || "";
  const [typed, setTyped] = useState("");

  return html`<section class="page" id="dead-page">
    <h1>Dead letters</h1>
    <p class="muted small">Jobs out of attempts keep their payload until retried (a fresh attempt budget) or cancelled.</p>
    <div class="toolbar">
      <div class="group-pills">
        ${withDead.map(
          (r) => html`<a key=${r.group} href=${href(["dead"], { group: r.group })} class=${`pill${r.group === group ? " pill-active" : ""}`} data-group=${r.group}>
            ${r.group} <span class="pill-count">${fmtNum(r.dead)}</span></a>`,
        )}
        ${overview.data && withDead.length === 0 ? html`<span class="muted" id="no-dead">No dead jobs in the groups this page knows.</span>` : null}
      </div>
      <form class="search" role="search" onSubmit=${(e) => {
        e.preventDefault();
        if (typed.trim()) setQuery({ group: typed.trim() }, false);
      }}>
        <input type="search" id="dead-group" placeholder="another group" value=${typed} onInput=${(e) => setTyped(e.target.value)} onChange=${(e) => setTyped(e.target.value)} />
        <button type="submit" class="btn btn-small">Show</button>
      </form>
    </div>
    <${ErrorLine} error=${overview.error} what="reading the groups" />
    ${group ? html`<${DeadList} key=${group} config=${config} group=${group} />` : null}
  </section>`;
}

function DeadList({ config, group }) {
  const [cursors, setCursors] = useState([undefined]);
  const [checked, setChecked] = useState(new Set());
  const after = cursors[cursors.length - 1];
  const list = usePoll(() => api.dead(group, { after, limit: PER_PAGE }), POLL_MS, [group, after]);
  const rows = list.data ? list.data.jobs : [];
  const keys = rows.map((r) => r.key);
  const selectedKeys = keys.filter((k) => checked.has(k));
  const toggle = (k) => {
    const next = new Set(checked);
    if (next.has(k)) next.delete(k);
    else next.add(k);
    setChecked(next);
  };
  const all = keys.length > 0 && selectedKeys.length === keys.length;
  const act = async (f, ks) => {
    if (await f(group, ks)) {
      setChecked(new Set());
      list.reload();
    }
  };

  return html`<div class="dead-list" data-group=${group}>
    <h2><a href=${href(["group", group], { tab: "jobs", state: "dead" })}>${group}</a></h2>
    <div class="toolbar">
      <${ActionButton} config=${config} id="retry-selected" action="retry" small=${true} disabled=${!selectedKeys.length} onClick=${() => selectedKeys.length && act(retryJobs, selectedKeys)}>Retry selected (${selectedKeys.length})<//>
      <${ActionButton} config=${config} id="cancel-selected" action="cancel" small=${true} disabled=${!selectedKeys.length} danger=${true} onClick=${() => selectedKeys.length && act(cancelJobs, selectedKeys)}>Cancel selected (${selectedKeys.length})<//>
    </div>
    <${ErrorLine} error=${list.error} what="GET /dead" />
    ${list.data && rows.length === 0
      ? html`<p class="muted" id="no-rows">No dead jobs in ${group}${cursors.length > 1 ? " on this page" : ""}.</p>`
      : html`<table class="table" id="dead-table">
          <thead><tr>
            <th><input type="checkbox" aria-label="select all" checked=${all} onChange=${() => setChecked(all ? new Set() : new Set(keys))} /></th>
            <th>Key</th><th class="num">Attempts</th><th>Reason</th><th>Last error</th><th>Data</th><th>Died</th><th></th>
          </tr></thead>
          <tbody>
            ${rows.map((jb) => {
              const last = jb.history.length ? jb.history[jb.history.length - 1] : null;
              return html`<tr key=${jb.key} data-key=${jb.key}>
                <td><input type="checkbox" aria-label=${`select ${jb.key}`} checked=${checked.has(jb.key)} onChange=${() => toggle(jb.key)} /></td>
                <td class="mono"><a href=${href(["group", group], { tab: "jobs", state: "dead", sel: `j:${jb.key}` })}>${jb.key}</a></td>
                <td class="num">${jb.attempts}</td>
                <td class="data-cell">${truncate(jb.reason, 60)}</td>
                <td class="data-cell">${truncate(firstLine(last && last.error), 60)}</td>
                <td class="data-cell">${truncate(jb.data, 40)}</td>
                <td class="small">${fmtTime(jb.finished_at)}</td>
                <td class="row-actions">
                  <${ActionButton} config=${config} small=${true} testKey=${jb.key} action="retry" onClick=${() => act(retryJobs, [jb.key])}>Retry<//>
                  <${ActionButton} config=${config} small=${true} danger=${true} testKey=${jb.key} action="cancel" onClick=${() => act(cancelJobs, [jb.key])}>Cancel<//>
                </td>
              </tr>`;
            })}
          </tbody>
        </table>`}
    ${list.data &&
    html`<${Pager}
      page=${cursors.length}
      perPage=${PER_PAGE}
      count=${rows.length}
      hasNext=${!!list.data.next}
      onFirst=${() => setCursors([undefined])}
      onPrev=${() => setCursors(cursors.slice(0, -1))}
      onNext=${() => setCursors([...cursors, list.data.next])}
    />`}
  </div>`;
}
