// The dnslb dashboard: polls the JSON API with the operator's token and draws what it sees.
// No framework; Chart.js (served from this origin) draws the charts. Data is only ever put in
// the page as text (textContent), never as HTML.
"use strict";

(() => {
  const TOKEN_KEY = "dnslb.api-token";
  const POLL_MS = Number(document.body.dataset.pollMs) || 2000;
  const MAX_POINTS = 1800;
  const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
    "#7f7f7f", "#bcbd22", "#17becf"];

  // What the page has seen; tests read it (window.dnslb) to check that charts fill and update.
  const board = { polls: 0, charts: {}, error: null, lastScaleEvent: 0 };
  window.dnslb = board;

  const $ = (id) => document.getElementById(id);
  const apiUrl = (path) => new URL(`../v1/${path}`, window.location.href);

  class AuthError extends Error {}

  async function get(path) {
    const token = sessionStorage.getItem(TOKEN_KEY);
    const response = await fetch(apiUrl(path), {
      headers: { Authorization: `Bearer ${token}`, Accept: "application/json" },
      cache: "no-store",
      credentials: "omit",
      referrerPolicy: "no-referrer",
    });
    let body = null;
    try { body = await response.json(); } catch { body = null; }
    if (response.status === 401 || response.status === 403) {
      throw new AuthError((body && body.error) || `refused (${response.status})`);
    }
    if (!response.ok) throw new Error((body && body.error) || `HTTP ${response.status}`);
    return body;
  }

  // -- charts ---------------------------------------------------------------------------------

  const clock = (seconds) => new Date(seconds * 1000).toLocaleTimeString();

  function makeChart(id, { title, min, max, suggestedMax, grace, stepped = false, ticks } = {}) {
    const chart = new Chart($(id), {
      type: "line",
      data: { datasets: [] },
      options: {
        animation: false,
        responsive: true,
        maintainAspectRatio: false,
        parsing: false,
        normalized: true,
        interaction: { mode: "nearest", axis: "x", intersect: false },
        elements: { point: { radius: 0 }, line: { borderWidth: 2, stepped } },
        scales: {
          x: { type: "linear", ticks: { callback: clock, maxTicksLimit: 6 } },
          y: { title: { display: Boolean(title), text: title }, min, max, suggestedMax, grace,
            beginAtZero: true, ticks: ticks || {} },
        },
        plugins: {
          legend: { position: "bottom", labels: { boxWidth: 12 } },
          tooltip: { callbacks: { title: (items) => items.length ? clock(items[0].parsed.x) : "" } },
        },
      },
    });
    board.charts[id.replace("chart-", "")] = chart;
    return chart;
  }

  function series(chart, key, extra = {}) {
    let found = chart.data.datasets.find((dataset) => dataset.key === key);
    if (!found) {
      const index = chart.data.datasets.length;
      const color = COLORS[index % COLORS.length];
      found = { key, label: key, data: [], borderColor: color, backgroundColor: color, ...extra };
      // Pools of the same size draw on top of each other; Chart.js draws the first dataset on
      // top, so each later line is wider and shows around the ones before it.
      if (chart.$layered && !extra.type) found.borderWidth = Math.min(2 + 3 * index, 11);
      chart.data.datasets.push(found);
    }
    return found;
  }

  function push(dataset, x, y) {
    dataset.data.push({ x, y });
    if (dataset.data.length > MAX_POINTS) dataset.data.splice(0, dataset.data.length - MAX_POINTS);
  }

  // -- tables ---------------------------------------------------------------------------------

  const fixed = (value, digits) => (value === null || value === undefined ? "-" : Number(value).toFixed(digits));

  function fillTable(id, rows) {
    const body = $(id).querySelector("tbody");
    body.replaceChildren(...rows.map(({ cells, className }) => {
      const tr = document.createElement("tr");
      if (className) tr.className = className;
      for (const [text, numeric] of cells) {
        const td = document.createElement("td");
        td.textContent = text;
        if (numeric) td.className = "num";
        tr.append(td);
      }
      return tr;
    }));
  }

  const byState = (counts) => Object.entries(counts).map(([s, n]) => `${s} ${n}`).join(", ") || "none";

  function showServers(servers) {
    fillTable("servers", servers.map((s) => {
      const paused = [s.paused && "policy", s.admin_paused && "operator"].filter(Boolean).join(", ");
      return {
        className: paused ? "paused" : s.state,
        cells: [[s.id], [s.pool], [s.address], [s.state], [fixed(s.utilization, 2), true],
          [fixed(s.weight, 1), true], [s.ttl ?? "-", true], [paused || "-"],
          [fixed(s.cost_seconds, 0), true], [String(s.served), true]],
      };
    }));
  }

  function showPools(pools) {
    fillTable("pools", pools.map((p) => ({
      cells: [[p.name], [p.dns_name], [byState(p.servers)], [String(p.scale_events), true],
        [fixed(p.mean_ttl, 1), true], [fixed(p.cost_seconds, 0), true], [String(p.served), true],
        [p.cost_seconds > 0 ? (p.served / p.cost_seconds).toFixed(2) : "-", true]],
    })));
  }

  function showEvents(events) {
    $("events").replaceChildren(...events.map((event) => {
      const li = document.createElement("li");
      const kind = document.createElement("span");
      kind.className = "kind";
      kind.textContent = event.kind;
      const where = [event.pool, event.server].filter(Boolean).join("/");
      const change = event.to_state ? `${event.from_state} -> ${event.to_state}: ` : "";
      li.append(`${clock(event.time)} `, kind, ` ${where}: ${change}${event.reason}`);
      return li;
    }));
  }

  function showSummary(status) {
    const m = status.manager;
    const age = m.plan_age === null ? "" : `, ${m.plan_age.toFixed(1)} s old`;
    $("summary").textContent = `${m.ready ? "ready" : "not ready"} · plan v${m.plan_version}${age}` +
      ` · servers: ${byState(status.servers)} · paused ${status.paused}`;
  }

  // -- polling --------------------------------------------------------------------------------

  let charts = null;
  let timer = null;

  function setUpCharts() {
    if (charts) return charts;
    charts = {
      utilization: makeChart("chart-utilization", { title: "in progress / max", suggestedMax: 1 }),
      weight: makeChart("chart-weight", { title: "weight" }),
      ttl: makeChart("chart-ttl", { title: "seconds" }),
      paused: makeChart("chart-paused", {
        min: 0, max: 1.6, stepped: true,
        ticks: { stepSize: 1, callback: (v) => (v === 0 ? "answered" : v === 1 ? "paused" : "") },
      }),
      pool: Object.assign(
        makeChart("chart-pool", { title: "servers", grace: 1, ticks: { stepSize: 1 } }),
        { $layered: true },
      ),
      cost: makeChart("chart-cost", { title: "server-seconds" }),
    };
    return charts;
  }

  async function poll() {
    const now = Date.now() / 1000;
    const [status, servers, pools, recent, scaling] = await Promise.all([
      get("status"),
      get("servers"),
      get("pools"),
      get("events?limit=15"),
      get("events?kind=scale_out&kind=scale_in&limit=50"),
    ]);
    const c = setUpCharts();
    servers.forEach((s, index) => {
      push(series(c.utilization, s.id), now, s.utilization);
      push(series(c.weight, s.id), now, s.weight);
      push(series(c.ttl, s.id), now, s.ttl);
      // Lines a little apart so that servers paused together stay visible.
      push(series(c.paused, s.id), now, (s.paused || s.admin_paused ? 1 : 0) + index * 0.04);
    });
    const size = {};
    for (const p of pools) {
      size[p.name] = p.servers.active || 0;
      push(series(c.pool, p.name), now, size[p.name]);
      push(series(c.cost, p.name), now, p.cost_seconds);
    }
    const events = series(c.pool, "scale events", {
      type: "scatter", pointRadius: 6, pointStyle: "triangle", showLine: false,
      borderColor: "#000", backgroundColor: "#000",
    });
    for (const event of scaling.events.slice().reverse()) {
      if (event.id <= board.lastScaleEvent) continue;
      board.lastScaleEvent = event.id;
      push(events, event.time, size[event.pool] ?? 0);
    }
    Object.values(c).forEach((chart) => chart.update("none"));
    showSummary(status);
    showServers(servers);
    showPools(pools);
    showEvents(recent.events);
    board.polls += 1;
  }

  async function loop() {
    try {
      await poll();
      board.error = null;
      $("error").textContent = "";
    } catch (error) {
      board.error = String(error.message || error);
      if (error instanceof AuthError) {
        sessionStorage.removeItem(TOKEN_KEY);
        showLogin(error.message);
        return;
      }
      $("error").textContent = `last refresh failed: ${board.error}`;
    }
    timer = window.setTimeout(loop, POLL_MS);
  }

  function showLogin(message) {
    window.clearTimeout(timer);
    $("board").hidden = true;
    $("forget").hidden = true;
    $("login").hidden = false;
    $("login-error").textContent = message || "";
    $("summary").textContent = "not connected";
  }

  function start() {
    $("login").hidden = true;
    $("board").hidden = false;
    $("forget").hidden = false;
    $("interval").textContent = String(POLL_MS / 1000);
    loop();
  }

  $("login").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = $("token").value.trim();
    $("token").value = "";
    if (!token) return;
    sessionStorage.setItem(TOKEN_KEY, token);
    start();
  });
  $("forget").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    showLogin("");
  });

  if (typeof Chart === "undefined") {
    document.body.textContent =
      "The chart library did not load (/dashboard/vendor/chart.umd.js): run scripts/install.";
    return;
  }
  if (sessionStorage.getItem(TOKEN_KEY)) start(); else showLogin("");
})();
