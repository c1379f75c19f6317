// The dnslb dashboard: opens on the manager's last hour (/v1/history and /v1/events), then polls
// the JSON API with the operator's token and adds what it sees. Events (scale decisions, pauses,
// state changes) are dashed vertical lines on the charts, drawn by a small plugin of our own.
// No framework; Chart.js (served from this origin) draws the charts. Data is only ever put in
// the page as text (textContent), never as HTML.
"use strict";

(() => {
  const TOKEN_KEY = "dnslb.api-token";
  const POLL_MS = Number(document.body.dataset.pollMs) || 2000;
  const MAX_POINTS = 2600; // an hour of history (720 samples) and an hour of polls (1800)
  const MAX_MARKERS = 500;
  const HISTORY_EVENT_PAGES = 10;
  // Which events are marked, how, and on which charts.
  const MARKS = {
    scale_out: { color: "#000000", glyph: "\u25b2", charts: ["pool", "cost", "utilization"] },
    scale_in: { color: "#000000", glyph: "\u25bc", charts: ["pool", "cost", "utilization"] },
    paused: { color: "#d62728", glyph: "P", charts: ["utilization", "weight", "ttl", "paused"] },
    resumed: { color: "#2ca02c", glyph: "R", charts: ["utilization", "weight", "ttl", "paused"] },
    admin_pause: { color: "#9467bd", glyph: "OP", charts: ["utilization", "weight", "ttl", "paused"] },
    admin_resume: { color: "#9467bd", glyph: "OR", charts: ["utilization", "weight", "ttl", "paused"] },
    state: { color: "#7f7f7f", glyph: "S", charts: ["pool", "paused"] },
  };
  const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
    "#7f7f7f", "#bcbd22", "#17becf"];

  // What the page has seen; tests read it (window.dnslb) to check that charts fill and update.
  const board = {
    polls: 0, charts: {}, error: null, lastScaleEvent: 0, lastMarkedEvent: 0,
    markers: [], historySamples: 0, openedAt: Date.now() / 1000,
  };
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

  // Dashed vertical lines at the marked events' times, with a glyph at the top.
  const markerPlugin = {
    id: "dnslbMarkers",
    afterDatasetsDraw(chart) {
      const name = chart.$name;
      const { ctx, chartArea: area, scales: { x } } = chart;
      if (!area || !x) return;
      ctx.save();
      ctx.lineWidth = 1;
      ctx.setLineDash([4, 3]);
      ctx.font = "10px system-ui, sans-serif";
      for (const mark of board.markers) {
        const style = MARKS[mark.kind];
        if (!style.charts.includes(name)) continue;
        const px = x.getPixelForValue(mark.time);
        if (!(px >= area.left && px <= area.right)) continue;
        ctx.strokeStyle = style.color;
        ctx.fillStyle = style.color;
        ctx.beginPath();
        ctx.moveTo(px, area.top);
        ctx.lineTo(px, area.bottom);
        ctx.stroke();
        ctx.fillText(style.glyph, px + 2, area.top + 9);
      }
      ctx.restore();
    },
  };

  function mark(event) {
    if (!MARKS[event.kind] || event.id <= board.lastMarkedEvent) return;
    board.lastMarkedEvent = Math.max(board.lastMarkedEvent, event.id);
    board.markers.push({ id: event.id, time: event.time, kind: event.kind, pool: event.pool,
      server: event.server, reason: event.reason });
    if (board.markers.length > MAX_MARKERS) board.markers.splice(0, board.markers.length - MAX_MARKERS);
  }

  function makeChart(id, { title, min, max, suggestedMax, grace, stepped = false, ticks } = {}) {
    const chart = new Chart($(id), {
      type: "line",
      plugins: [markerPlugin],
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
    chart.$name = id.replace("chart-", "");
    board.charts[chart.$name] = chart;
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

  // Servers keep the place they were first seen in, so that their paused lines stay apart.
  const places = new Map();
  const place = (id) => {
    if (!places.has(id)) places.set(id, places.size);
    return places.get(id);
  };

  // -- tables ---------------------------------------------------------------------------------

  const percent = (share) => (share === null || share === undefined ? "-" : `${(share * 100).toFixed(1)} %`);
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
          [fixed(s.weight, 1), true], [percent(s.intended_share), true],
          [percent(s.delivered_share), true], [s.ttl ?? "-", true], [paused || "-"],
          [fixed(s.cost_seconds, 0), true], [String(s.served), true], [s.why || s.state_reason]],
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
      get("events?limit=50"),
      get("events?kind=scale_out&kind=scale_in&limit=50"),
    ]);
    const c = setUpCharts();
    servers.forEach((s) => {
      push(series(c.utilization, s.id), now, s.utilization);
      push(series(c.weight, s.id), now, s.weight);
      push(series(c.ttl, s.id), now, s.ttl);
      // Lines a little apart so that servers paused together stay visible.
      push(series(c.paused, s.id), now, (s.paused || s.admin_paused ? 1 : 0) + place(s.id) * 0.04);
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
    recent.events.slice().reverse().forEach(mark);
    Object.values(c).forEach((chart) => chart.update("none"));
    showSummary(status);
    showServers(servers);
    showPools(pools);
    showEvents(recent.events.slice(0, 15));
    board.polls += 1;
  }

  // The manager's last hour, then the events of that hour (newest first, a few pages at most).
  async function loadHistory() {
    const history = await get("history");
    const c = setUpCharts();
    const sizes = {}; // pool -> [[time, active servers], ...], to put scale events at their size
    for (const sample of history.samples) {
      const t = sample.time;
      for (const m of sample.members) {
        push(series(c.utilization, m.id), t, m.utilization);
        push(series(c.weight, m.id), t, m.weight);
        push(series(c.ttl, m.id), t, m.ttl);
        push(series(c.paused, m.id), t, (m.paused ? 1 : 0) + place(m.id) * 0.04);
      }
      const active = sample.servers.active || 0;
      push(series(c.pool, sample.pool), t, active);
      push(series(c.cost, sample.pool), t, sample.cost_seconds);
      (sizes[sample.pool] = sizes[sample.pool] || []).push([t, active]);
    }
    board.historySamples = history.samples.length;
    if (!history.samples.length) return;
    const since = history.samples[0].time - history.resolution;
    const found = [];
    let page = await get("events?limit=500");
    for (let pages = 1; ; pages += 1) {
      found.push(...page.events.filter((event) => event.time >= since));
      const oldest = page.events[page.events.length - 1];
      if (!page.next_before_id || !oldest || oldest.time < since || pages >= HISTORY_EVENT_PAGES) break;
      page = await get(`events?limit=500&before_id=${page.next_before_id}`);
    }
    const events = series(c.pool, "scale events", {
      type: "scatter", pointRadius: 6, pointStyle: "triangle", showLine: false,
      borderColor: "#000", backgroundColor: "#000",
    });
    for (const event of found.reverse()) {
      mark(event);
      if (event.kind !== "scale_out" && event.kind !== "scale_in") continue;
      board.lastScaleEvent = Math.max(board.lastScaleEvent, event.id);
      // A sample's time is the end of its interval: the first one after the event holds it.
      const known = sizes[event.pool] || [];
      const after = known.find(([t]) => t >= event.time) || known[known.length - 1];
      push(events, event.time, after ? after[1] : 0);
    }
    events.data.sort((a, b) => a.x - b.x);
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
    loadHistory()
      .catch((error) => {
        if (error instanceof AuthError) throw error;
        $("error").textContent = `the history could not be loaded: ${error.message || error}`;
      })
      .then(loop, (error) => {
        sessionStorage.removeItem(TOKEN_KEY);
        showLogin(error.message);
      });
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
      "The chart library did not load (/dashboard/vendor/chart.umd.js): reinstall dnslb, which ships it.";
    return;
  }
  if (sessionStorage.getItem(TOKEN_KEY)) start(); else showLogin("");
})();
