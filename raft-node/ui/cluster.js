// The cluster page: this node's view of the members, roles, leader, term, indexes,
// lag and membership, polled every second so that a new leader shows within one
// poll of this node learning of it.

import { useEffect, useRef, useState } from "./vendor/preact/hooks.module.js";
import { api } from "./api.js";
import { html, fmtNum, fmtTime, fmtAgo, usePoll, ErrorLine, useTick } from "./ui.js";

const POLL_MS = 1000;
const LAGGING = 1000;

// A member whose lag stayed above 0 without ever shrinking over the last few polls is
// not replicating (stopped, cut off, or too slow): a dead member shows a steady lag on
// an idle cluster and a growing one on a busy cluster, while a live one under load
// goes up and down and back to 0.
const BEHIND = 10;
const TREND_POLLS = 3;

/** [kind, text] for a member; `lags` is its lag at the last polls, this one included. */
function memberHealth(node, status, ready, lags) {
  if (node.id === status.id) {
    if (status.removed) return ["bad", "removed from the cluster"];
    if (!ready) return ["unknown", "…"];
    return ready.ok ? ["good", "ready"] : ["bad", `not ready (${ready.status})`];
  }
  if (node.role === "shutdown") return ["bad", "shut down"];
  if (node.lag !== null && node.lag !== undefined) {
    if (node.lag === 0) return ["good", "in sync"];
    const recent = lags || [];
    const stuck =
      recent.length === TREND_POLLS + 1 && recent.every((l, i) => l !== null && l > 0 && (i === 0 || l >= recent[i - 1]));
    if (stuck) return [node.lag >= BEHIND ? "bad" : "warn", `not replicating: ${fmtNum(node.lag)} entries behind`];
    return [node.lag > LAGGING ? "warn" : "good", `replicating: ${fmtNum(node.lag)} behind`];
  }
  if (status.leader === null) return ["unknown", "no leader known"];
  // On the leader, no lag means no progress: the member has not answered it this term.
  if (status.leader === status.id) return ["bad", "not replicating: no answer to this leader yet"];
  return ["unknown", "lag known on the leader"];
}

export function ClusterPage({ config }) {
  useTick(1000);
  const { data, error } = usePoll(async () => {
    const [status, ready] = await Promise.all([api.cluster(), api.ready().catch(() => ({ ok: false, status: 0 }))]);
    return { status, ready, at: Date.now() };
  }, POLL_MS, []);
  const [events, setEvents] = useState([]);
  const previous = useRef(null);
  // Each member's lag at the last few polls (updated once per poll, not per render).
  const lagHistory = useRef({ at: 0, byNode: new Map() });
  if (data && data.at !== lagHistory.current.at) {
    lagHistory.current.at = data.at;
    for (const n of data.status.nodes) {
      const h = lagHistory.current.byNode.get(n.id) || [];
      h.push(n.lag ?? null);
      lagHistory.current.byNode.set(n.id, h.slice(-(TREND_POLLS + 1)));
    }
  }

  useEffect(() => {
    if (!data) return;
    const s = data.status;
    const p = previous.current;
    const add = [];
    if (p) {
      if (p.leader !== s.leader) add.push(`leader ${p.leader ?? "none"} → ${s.leader ?? "none"} (term ${s.term})`);
      else if (p.term !== s.term) add.push(`term ${p.term} → ${s.term}`);
      if (String(p.voters) !== String(s.voters) || String(p.learners) !== String(s.learners)) {
        add.push(`membership: voters ${s.voters.join(", ") || "none"}, learners ${s.learners.join(", ") || "none"}`);
      }
    }
    previous.current = s;
    if (add.length) setEvents((list) => [...add.map((text) => ({ text, at: data.at })), ...list].slice(0, 8));
  }, [data]);

  if (!data) {
    return html`<section class="page"><h1>Cluster</h1>${error ? html`<${ErrorLine} error=${error} what="GET /cluster" />` : html`<p class="muted">Loading…</p>`}</section>`;
  }
  const s = data.status;
  const leaderNode = s.nodes.find((n) => n.id === s.leader);
  const inFlight = !s.membership_committed || s.joint;
  return html`<section class="page" id="cluster-page">
    <h1>Cluster <span class="subtitle">as node ${s.id} sees it</span></h1>
    ${error && html`<div class="stale-banner" role="alert">Node ${s.id} did not answer the last poll (${error.message}); showing its view from ${fmtAgo(data.at)}.</div>`}
    <div class="cards">
      <div class=${`card leader-card ${s.leader === null ? "leader-none" : ""}`}>
        <span class="card-label">Leader</span>
        <strong class="card-big" id="leader" data-leader=${s.leader ?? ""}>${s.leader === null ? "none known" : `node ${s.leader}`}</strong>
        <span class="card-note">${leaderNode ? leaderNode.api_addr : s.leader === null ? "elections in progress, or no quorum" : ""}</span>
      </div>
      <div class="card"><span class="card-label">Term</span><strong class="card-big" id="term">${fmtNum(s.term)}</strong></div>
      <div class="card">
        <span class="card-label">Commit / applied index</span>
        <strong class="card-big"><span id="commit-index">${fmtNum(s.commit_index)}</span> / <span id="applied-index">${fmtNum(s.applied_index)}</span></strong>
        <span class="card-note">behind commit: ${fmtNum((s.commit_index || 0) - (s.applied_index || 0))}</span>
      </div>
      <div class="card">
        <span class="card-label">Snapshot / purged index</span>
        <strong class="card-big">${fmtNum(s.snapshot_index)} / ${fmtNum(s.purged_index)}</strong>
      </div>
      <div class="card">
        <span class="card-label">Log time applied</span>
        <strong class="card-mid">${s.applied_time_ms ? fmtTime(s.applied_time_ms) : "—"}</strong>
        <span class="card-note">polled ${fmtAgo(data.at)}</span>
      </div>
    </div>

    ${inFlight &&
    html`<div class="warn-banner" id="membership-in-flight" role="status">
      ${`Membership change in flight: ${s.joint ? "joint configuration (old and new voters both decide)" : "configuration"} at log index ${fmtNum(s.membership_index)} is ${s.membership_committed ? "committed" : "not committed yet"}.`}
    </div>`}
    ${s.removed && html`<div class="error-line">This node was removed from the cluster: stop it and wipe its data directory.</div>`}

    <h2>Members</h2>
    <table class="table" id="members">
      <thead>
        <tr><th>Node</th><th>Role</th><th>API address</th><th>Raft address</th><th class="num">Lag (entries)</th><th>Health</th></tr>
      </thead>
      <tbody>
        ${s.nodes.map((n) => {
          const [kind, text] = memberHealth(n, s, data.ready, lagHistory.current.byNode.get(n.id));
          const role = n.id === s.leader ? "leader" : n.role;
          return html`<tr key=${n.id} class=${n.id === s.leader ? "row-leader" : ""} data-node=${n.id} data-role=${role}>
            <td>node ${n.id}${n.id === s.id ? html` <span class="tag">serving this page</span>` : null}</td>
            <td><span class=${`badge role-${role}`}>${role}</span></td>
            <td class="mono">${n.api_addr}</td>
            <td class="mono">${n.raft_addr}</td>
            <td class="num">${n.lag === null || n.lag === undefined ? "—" : fmtNum(n.lag)}</td>
            <td><span class=${`health health-${kind}`}>${text}</span></td>
          </tr>`;
        })}
      </tbody>
    </table>
    <p class="muted small">
      Roles and lag are node ${s.id}'s view; lag is known only on the leader${s.id === s.leader ? "" : ` (open the dashboard on node ${s.leader ?? "?"} for it)`}.
    </p>

    <div class="two-col">
      <div>
        <h2>Membership</h2>
        <dl class="facts">
          <dt>Voters</dt><dd id="voters">${s.voters.join(", ") || "none"}</dd>
          <dt>Learners</dt><dd id="learners">${s.learners.join(", ") || "none"}</dd>
          <dt>Retired ids</dt><dd id="retired">${(s.retired || []).join(", ") || "none"}</dd>
          <dt>Configuration</dt>
          <dd>index ${fmtNum(s.membership_index)}, ${s.membership_committed ? "committed" : "not committed"}${s.joint ? ", joint" : ""}</dd>
        </dl>
      </div>
      <div>
        <h2>Recent changes</h2>
        ${events.length
          ? html`<ul class="events" id="cluster-events">${events.map((e, i) => html`<li key=${i}><span class="muted">${fmtTime(e.at)}</span> ${e.text}</li>`)}</ul>`
          : html`<p class="muted">No leader, term or membership change since this page opened.</p>`}
      </div>
    </div>
  </section>`;
}
