// The Rota dashboard: served by every node at /ui from files compiled into the binary.
// Pages are routed by the URL's fragment (#/cluster, #/groups, #/group/NAME, #/dead),
// so the node serves one page and the browser never reloads it.

import { render } from "./vendor/preact/preact.module.js";
import { useEffect, useState } from "./vendor/preact/hooks.module.js";
import { api } from "./api.js";
import { sampler } from "./metrics.js";
import { html, parseHash, Overlays } from "./ui.js";
import { ClusterPage } from "./cluster.js";
import { GroupsPage } from "./groups.js";
import { GroupPage } from "./group.js";
import { DeadPage } from "./dead.js";

function useRoute() {
  const [route, setRoute] = useState(parseHash());
  useEffect(() => {
    const on = () => setRoute(parseHash());
    window.addEventListener("hashchange", on);
    window.addEventListener("rota-route", on);
    return () => {
      window.removeEventListener("hashchange", on);
      window.removeEventListener("rota-route", on);
    };
  }, []);
  return route;
}

function Nav({ page, config }) {
  const link = (to, label, name) =>
    html`<a href=${to} class=${`nav-link${page === name ? " nav-active" : ""}`} id=${`nav-${name}`}>${label}</a>`;
  return html`<header class="top">
    <a class="brand" href="#/cluster">Rota</a>
    <nav>${link("#/cluster", "Cluster", "cluster")}${link("#/groups", "Groups", "groups")}${link("#/dead", "Dead letters", "dead")}</nav>
    <span class="top-right">
      ${config
        ? html`<span class=${`mode ${config.actions ? "mode-actions" : "mode-readonly"}`} id="mode">${config.actions ? "actions enabled" : "read-only"}</span>
            <span class="node-id" id="node-id">node ${config.node_id}</span>`
        : null}
    </span>
  </header>`;
}

function App() {
  const route = useRoute();
  const [config, setConfig] = useState(null);
  const [configError, setConfigError] = useState(null);
  useEffect(() => {
    let stop = false;
    const load = async () => {
      try {
        const c = await api.config();
        if (!stop) setConfig(c);
      } catch (e) {
        if (!stop) {
          setConfigError(e);
          setTimeout(load, 2000);
        }
      }
    };
    load();
    sampler.start();
    return () => {
      stop = true;
    };
  }, []);

  const [first, second] = route.parts;
  const page = first === "group" && second ? "group" : ["cluster", "groups", "dead"].includes(first) ? first : "cluster";
  // Everything but actions works without the config; actions wait for it.
  const shown = config || { actions: false, node_id: null };
  let body;
  if (page === "group") body = html`<${GroupPage} key=${second} config=${shown} name=${second} query=${route.query} />`;
  else if (page === "groups") body = html`<${GroupsPage} config=${shown} />`;
  else if (page === "dead") body = html`<${DeadPage} config=${shown} query=${route.query} />`;
  else body = html`<${ClusterPage} config=${shown} />`;

  return html`<div class="shell">
    <${Nav} page=${page} config=${config} />
    ${config && !config.actions
      ? html`<div class="readonly-note" id="readonly-note">
          <strong>Read-only.</strong> This node was started without <code>--ui-actions</code>, so retry, cancel, pause and
          resume are off here (the API has no authentication yet). To use them, start the node with <code>--ui-actions</code>${" "}
          (or <code>ROTA_UI_ACTIONS=true</code>, or <code>rota dev up --node-arg=--ui-actions</code> for a dev cluster), or use the CLI.
        </div>`
      : null}
    ${!config && configError ? html`<div class="error-line">Cannot read /ui/config: ${configError.message}</div>` : null}
    <main>${body}</main>
    <${Overlays} />
  </div>`;
}

const root = document.getElementById("app");
root.textContent = "";
render(html`<${App} />`, root);
