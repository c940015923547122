// sao-gym view: the front end. Every string that comes from a run (messages, token
// text, task ids, metric names) enters the page through textContent or a text node,
// never as markup; the only links are the app's own "#/..." routes.
"use strict";

const main = document.getElementById("main");
const crumbs = document.getElementById("crumbs");
const tip = document.getElementById("tip");
let timer = null;   // the overview's live refresh
let charts = [];    // uPlot instances of the overview

// ----- DOM helpers (text only) -----
function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === undefined || v === null) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = String(v);
    else if (k === "route") node.setAttribute("href", "#" + v);  // our own routes only
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(node.dataset, v);
    else node.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.appendChild(typeof c === "string" || typeof c === "number"
      ? document.createTextNode(String(c)) : c);
  }
  return node;
}
function clear(node) { while (node.firstChild) node.removeChild(node.firstChild); }
function fmt(v, digits = 4) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "number") {
    if (Number.isInteger(v)) return String(v);
    return Math.abs(v) >= 1e4 || (Math.abs(v) < 1e-3 && v !== 0)
      ? v.toExponential(3) : v.toFixed(digits);
  }
  if (typeof v === "boolean") return v ? "yes" : "no";
  return String(v);
}
async function getJSON(url) {
  const r = await fetch(url, { headers: { "Accept": "application/json" } });
  if (!r.ok) throw new Error(`${r.status}: ${await r.text()}`);
  return r.json();
}
function setCrumbs(...items) {
  clear(crumbs);
  for (const [label, route] of items) {
    crumbs.appendChild(route ? el("a", { route, text: label }) : el("span", { text: label }));
  }
}
function showError(e) {
  clear(main);
  main.appendChild(el("p", { class: "error", text: String(e && e.message || e) }));
}

// ----- routing -----
function parseHash() {
  const raw = location.hash.replace(/^#/, "") || "/";
  const [path, qs] = raw.split("?");
  return { parts: path.split("/").filter(Boolean).map(decodeURIComponent),
           params: new URLSearchParams(qs || "") };
}
async function route() {
  if (timer) { clearInterval(timer); timer = null; }
  charts.forEach(c => c.destroy()); charts = [];
  tip.hidden = true;
  const hash = location.hash;
  delete main.dataset.ready;
  const { parts, params } = parseHash();
  try {
    if (parts.length === 0) await overview();
    else if (parts[0] === "runs" && parts.length === 3) await episodeList(+parts[1], parts[2], params);
    else if (parts[0] === "runs" && parts.length === 4) await episodePage(+parts[1], parts[2], parts[3], params);
    else throw new Error("no such page");
  } catch (e) { showError(e); }
  if (location.hash === hash) {  // this page is drawn (tests wait for it), this long after
    main.dataset.drawnMs = String(Math.round(performance.now()));  // the page's navigation
    main.dataset.ready = hash;
  }
}
window.addEventListener("hashchange", route);

// ----- overview: runs and their curves -----
const DEFAULT_METRICS = ["rollout/success_rate", "rollout/return_mean",
                         "critic/explained_variance", "sao/clip_ratio"];
const COLORS = ["#2456a6", "#c2410c", "#15803d", "#7e22ce", "#b91c1c", "#0e7490", "#a16207"];

async function overview() {
  setCrumbs(["runs", null]);
  const runs = await getJSON("/api/runs");
  clear(main);
  const table = el("table", { id: "runs" },
    el("thead", {}, el("tr", {}, ["run", "path", "steps", "rollouts"].map(h => el("th", { text: h })))),
    el("tbody", {}, runs.map(r => el("tr", {},
      el("td", { text: r.name }), el("td", { class: "muted", text: r.path }),
      el("td", { class: "num steps", text: r.steps }),
      el("td", {}, r.splits.length ? r.splits.map(s => el("a", { route: `/runs/${r.run}/${encodeURIComponent(s)}`,
        text: s, class: "split" })).reduce((acc, a) => acc.concat(acc.length ? [" · ", a] : [a]), [])
        : el("span", { class: "muted", text: "none kept" }))))));
  main.appendChild(table);
  const stepCells = [...table.querySelectorAll("td.steps")];
  main.appendChild(el("h2", { text: "learning curves" }));
  const rows = runs.map(() => []);
  const last = runs.map(() => 0);
  async function poll() {
    await Promise.all(runs.map(async (r, i) => {
      const got = await getJSON(`/api/runs/${r.run}/metrics?after=${last[i]}`);
      if (got.rows.length) { rows[i].push(...got.rows); last[i] = rows[i][rows[i].length - 1].step; }
      stepCells[i].textContent = String(last[i]);
    }));
  }
  await poll();
  const picker = el("select", { id: "add-metric" });
  const area = el("div", { class: "charts", id: "charts" });
  main.appendChild(el("p", {}, "add a curve: ", picker));
  main.appendChild(area);
  const shown = [];
  function allKeys() {
    const keys = new Set();
    rows.forEach(rs => rs.forEach(r => Object.keys(r).forEach(k => {
      if (k !== "step" && (typeof r[k] === "number")) keys.add(k);
    })));
    return [...keys].sort();
  }
  function fillPicker() {
    clear(picker);
    picker.appendChild(el("option", { value: "", text: "—" }));
    allKeys().filter(k => !shown.includes(k)).forEach(k => picker.appendChild(el("option", { value: k, text: k })));
  }
  function series(metric) {
    const steps = [...new Set(rows.flatMap(rs => rs.filter(r => metric in r).map(r => r.step)))].sort((a, b) => a - b);
    const index = new Map(steps.map((s, j) => [s, j]));
    const ys = rows.map(rs => {
      const y = new Array(steps.length).fill(null);
      rs.forEach(r => { if (metric in r && typeof r[metric] === "number") y[index.get(r.step)] = r[metric]; });
      return y;
    });
    return [steps, ...ys];
  }
  function addChart(metric) {
    shown.push(metric);
    const box = el("div", { class: "chart", dataset: { metric } });
    const close = el("button", { title: "remove", text: "×", onclick: () => {
      const k = shown.indexOf(metric); shown.splice(k, 1);
      const c = charts.find(c => c._metric === metric); c.destroy(); charts = charts.filter(x => x !== c);
      box.remove(); fillPicker(); } });
    box.appendChild(el("div", { class: "title" }, el("span", { text: metric }), close));
    area.appendChild(box);
    const opts = { width: 460, height: 240, scales: { x: { time: false } },
      series: [{ label: "step" }, ...runs.map((r, i) => ({ label: r.name, stroke: COLORS[i % COLORS.length],
        width: 1.5, spanGaps: true }))],
      axes: [{ label: "learner step" },
        { values: (u, vals) => vals.map(v => v === null ? "" : String(+v.toPrecision(4))) }] };
    const u = new uPlot(opts, series(metric), box);
    u._metric = metric;
    charts.push(u);
    fillPicker();
  }
  picker.addEventListener("change", () => { if (picker.value) addChart(picker.value); });
  const keys = allKeys();
  const first = DEFAULT_METRICS.filter(k => keys.includes(k));
  (first.length ? first : keys.slice(0, 2)).forEach(addChart);
  fillPicker();
  if (!keys.length) area.appendChild(el("p", { class: "muted", text: "no metrics logged yet" }));
  timer = setInterval(async () => {  // live: follow runs that are training
    try {
      await poll();
      charts.forEach(c => c.setData(series(c._metric)));
      if (picker.options.length - 1 + shown.length !== allKeys().length) fillPicker();
    } catch (e) { /* a run dir mid-write: try again next time */ }
  }, 3000);
}

// ----- episode list -----
const COLUMNS = [["id", "id", true], ["step", "step", true], ["reward", "reward", true],
  ["stop_reason", "stop reason", false], ["env_id", "env", false], ["task_id", "task", false],
  ["turns", "turns", true], ["tokens", "tokens", true], ["action_tokens", "action tokens", true],
  ["truncated", "truncated", false], ["infra_failure", "infra failure", false],
  ["traced", "learner values", false]];
const FILTERS = ["step_min", "step_max", "reward_min", "reward_max", "stop_reason", "env",
  "task", "truncated", "infra", "traced"];

async function episodeList(run, split, params) {
  if (!params.has("size")) params.set("size", "50");
  const [runs, page] = await Promise.all([getJSON("/api/runs"),
    getJSON(`/api/runs/${run}/splits/${encodeURIComponent(split)}/episodes?${params}`)]);
  const r = runs[run];
  if (!r) throw new Error(`no run ${run}`);
  setCrumbs(["runs", "/"], [r.name, null], [split, null]);
  clear(main);
  main.appendChild(el("div", { class: "pager" }, "split: ",
    ...r.splits.map(s => s === split ? el("strong", { text: s })
      : el("a", { route: `/runs/${run}/${encodeURIComponent(s)}`, text: s }))));
  main.appendChild(filterForm(run, split, params, page.facets));
  main.appendChild(el("p", { id: "count", class: "muted", text: `${page.total} episodes` }));
  const sort = params.get("sort") || "id", order = params.get("order") || "asc";
  const head = el("tr", {}, COLUMNS.map(([key, label, num]) => el("th", {
    class: ["sortable", num ? "num" : "", key === sort ? `sorted-${order}` : ""].join(" "),
    dataset: { key }, text: label, onclick: () => {
      const p = new URLSearchParams(params);
      p.set("order", key === sort && order === "asc" ? "desc" : "asc");
      p.set("sort", key); p.set("page", "0");
      location.hash = `#/runs/${run}/${encodeURIComponent(split)}?${p}`;
    } })));
  const body = el("tbody", { id: "episodes" }, page.episodes.map(e => el("tr", { class: "episode" },
    COLUMNS.map(([key, , num]) => {
      const cell = el("td", { class: num ? "num" : "" });
      if (key === "id") cell.appendChild(el("a", { route: `/runs/${run}/${encodeURIComponent(split)}/${e.id}`, text: e.id }));
      else cell.textContent = fmt(e[key], 3);
      return cell;
    }))));
  main.appendChild(el("table", {}, el("thead", {}, head), body));
  const go = p => { const q = new URLSearchParams(params); q.set("page", String(p));
    location.hash = `#/runs/${run}/${encodeURIComponent(split)}?${q}`; };
  main.appendChild(el("div", { class: "pager" },
    el("button", { id: "prev", disabled: page.page === 0 ? "" : null, onclick: () => go(page.page - 1), text: "‹ previous" }),
    el("span", { text: `page ${page.page + 1} of ${page.pages}` }),
    el("button", { id: "next", disabled: page.page + 1 >= page.pages ? "" : null, onclick: () => go(page.page + 1), text: "next ›" })));
}

function filterForm(run, split, params, facets) {
  const input = (name, label, cls) => el("label", {}, label,
    el("input", { name, value: params.get(name) || "", class: cls || "", type: "text" }));
  const choice = (name, label, values) => {
    const sel = el("select", { name }, el("option", { value: "", text: "any" }),
      values.map(v => el("option", { value: v, text: v })));
    sel.value = params.get(name) || "";
    return el("label", {}, label, sel);
  };
  const form = el("form", { class: "filters", id: "filters" },
    input("step_min", "step ≥"), input("step_max", "step ≤"),
    input("reward_min", "reward ≥"), input("reward_max", "reward ≤"),
    choice("stop_reason", "stop reason", facets.stop_reason),
    choice("env", "environment", facets.env),
    input("task", "task contains", "wide"),
    choice("truncated", "truncated", ["yes", "no"]),
    choice("infra", "infra failure", ["yes", "no"]),
    choice("traced", "learner values", ["yes", "no"]),
    el("button", { type: "submit", text: "filter" }));
  form.addEventListener("submit", ev => {
    ev.preventDefault();
    const p = new URLSearchParams();
    for (const k of ["sort", "order", "size"]) if (params.get(k)) p.set(k, params.get(k));
    for (const name of FILTERS) { const v = form.elements[name].value.trim(); if (v) p.set(name, v); }
    location.hash = `#/runs/${run}/${encodeURIComponent(split)}?${p}`;
  });
  form.querySelectorAll("select").forEach(s => s.addEventListener("change", () => form.requestSubmit()));
  return form;
}

// ----- episode page: the conversation, then the token strip -----
const QUANTITIES = [
  ["advantage", "advantage", "diverging"], ["value", "value", "sequential"],
  ["return", "return", "sequential"], ["ratio", "importance ratio", "ratio"],
  ["dis_mask", "DIS mask", "mask"], ["logprob", "learner logprob", "sequential"],
  ["sampler_logprob", "sampler logprob", "sequential"], ["policy_version", "policy version", "sequential"]];

function quantity(rec, key) {
  if (rec.learner && key in rec.learner) return rec.learner[key];
  if (key in rec.tokens) return rec.tokens[key];
  return null;
}

function colourFor(kind, v, lo, hi) {
  if (v === null || v === undefined) return "";
  if (kind === "mask") return v ? "rgba(21,128,61,.22)" : "rgba(180,35,24,.35)";
  if (kind === "ratio") {  // log-scale around 1: below blue, above red
    const x = Math.max(-1, Math.min(1, Math.log(Math.max(v, 1e-9)) / Math.log(2)));
    return x < 0 ? `rgba(36,86,166,${(-x * .6).toFixed(3)})` : `rgba(194,65,12,${(x * .6).toFixed(3)})`;
  }
  if (kind === "diverging") {
    const m = Math.max(Math.abs(lo), Math.abs(hi)) || 1;
    const x = Math.max(-1, Math.min(1, v / m));
    return x < 0 ? `rgba(180,35,24,${(-x * .55).toFixed(3)})` : `rgba(21,128,61,${(x * .55).toFixed(3)})`;
  }
  const x = hi > lo ? (v - lo) / (hi - lo) : 0.5;
  return `rgba(36,86,166,${(0.05 + x * .5).toFixed(3)})`;
}

async function episodePage(run, split, id, params) {
  const [runs, rec] = await Promise.all([getJSON("/api/runs"),
    getJSON(`/api/runs/${run}/splits/${encodeURIComponent(split)}/episodes/${encodeURIComponent(id)}`)]);
  const r = runs[run];
  if (!r) throw new Error(`no run ${run}`);
  const base = `/runs/${run}/${encodeURIComponent(split)}`;
  setCrumbs(["runs", "/"], [r.name, null], [split, base], [`episode ${id}`, null]);
  clear(main);
  const meta = [["split", rec.split], ["id", rec.id], ["learner step", rec.step],
    ["environment", rec.env_id], ["task", rec.task_id], ["seed", rec.seed], ["reward", rec.reward],
    ["stop reason", rec.stop_reason], ["truncated", rec.truncated], ["infra failure", rec.infra_failure],
    ["first policy version", rec.policy_version], ["tokens", rec.tokens.id.length],
    ["segments", (rec.segments || []).length + 1],
    ["learner values from step", rec.learner ? rec.learner.step : null],
    ...Object.entries(rec.metrics || {}).map(([k, v]) => [k, v])];
  main.appendChild(el("dl", { class: "meta", id: "meta" }, meta.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: fmt(v) })])));
  main.appendChild(el("h2", { text: "conversation" }));
  const conv = el("div", { id: "conversation" });
  for (const m of rec.messages || []) {
    const box = el("div", { class: `message ${String(m.role || "")}` }, el("div", { class: "role", text: m.role || "?" }));
    if (m.content !== null && m.content !== undefined) {
      box.appendChild(el("pre", { class: "text", text: typeof m.content === "string" ? m.content : JSON.stringify(m.content, null, 1) }));
    }
    for (const call of m.tool_calls || []) {
      const f = call.function || {};
      const args = typeof f.arguments === "string" ? f.arguments : JSON.stringify(f.arguments);
      box.appendChild(el("pre", { class: "text call", text: `→ ${f.name}(${args})` }));
    }
    conv.appendChild(box);
  }
  main.appendChild(conv);
  main.appendChild(el("h2", { text: "tokens" }));
  const available = QUANTITIES.filter(([k]) => quantity(rec, k));
  const picked = params.get("colour") && available.some(([k]) => k === params.get("colour"))
    ? params.get("colour") : (available.find(([k]) => k === "advantage") || available[0])[0];
  const select = el("select", { id: "colour" }, available.map(([k, label]) => el("option", { value: k, text: label })));
  select.value = picked;
  const legend = el("span", { class: "legend" });
  main.appendChild(el("div", { class: "strip-controls" }, el("label", {}, "colour by ", select), legend,
    el("span", { class: "muted", text: "grey: prompt and observations; struck through: masked by DIS" })));
  const strip = el("div", { class: "strip", id: "strip" });
  const ids = rec.tokens.id, mask = rec.tokens.mask, text = rec.tokens.text;
  const dis = quantity(rec, "dis_mask");
  const spans = ids.map((t, i) => {
    const s = document.createElement("span");
    s.textContent = text ? text[i].replace(/\n/g, "↵\n") : `⟨${t}⟩`;
    s.dataset.i = i;
    s.className = mask[i] ? (dis && !dis[i] ? "act masked" : "act") : "obs";
    return s;
  });
  const fragment = document.createDocumentFragment();
  const breaks = new Map((rec.segments || []).map((start, k) => [start, k + 2]));
  spans.forEach((sp, i) => {
    if (breaks.has(i)) {  // a harness rewrote its history: a new sequence, its own prompt
      fragment.appendChild(el("div", { class: "segment-break",
        text: `segment ${breaks.get(i)}: a new prompt (the harness rewrote its history)` }));
    }
    fragment.appendChild(sp);
  });
  strip.appendChild(fragment);
  function paint(key) {
    const kind = QUANTITIES.find(([k]) => k === key)[2];
    const vals = quantity(rec, key);
    const acts = vals.filter((v, i) => mask[i] && v !== null);
    const lo = Math.min(...acts), hi = Math.max(...acts);
    spans.forEach((s, i) => { s.style.background = mask[i] ? colourFor(kind, vals[i], lo, hi) : ""; });
    legend.textContent = acts.length ? `${fmt(lo)} … ${fmt(hi)} on action tokens` : "";
  }
  paint(picked);  // coloured before it is in the page: one layout
  main.appendChild(strip);
  select.addEventListener("change", () => paint(select.value));
  let hovered = null;
  strip.addEventListener("mousemove", ev => {
    const s = ev.target.closest("span[data-i]");
    if (!s) return;
    if (hovered) hovered.classList.remove("hover");
    hovered = s; s.classList.add("hover");
    const i = +s.dataset.i;
    const lines = [`token ${i}: id ${ids[i]} ${JSON.stringify(text ? text[i] : "")}`,
      mask[i] ? "action (sampled by the policy)" : "prompt / observation"];
    for (const [k, label] of available) lines.push(`${label}: ${fmt(quantity(rec, k)[i], 6)}`);
    tip.textContent = lines.join("\n");
    tip.hidden = false;
    const below = ev.clientY + 16 + tip.offsetHeight < window.innerHeight;
    tip.style.left = Math.max(0, Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 8)) + "px";
    tip.style.top = (below ? ev.clientY + 16 : Math.max(0, ev.clientY - tip.offsetHeight - 10)) + "px";
  });
  strip.addEventListener("mouseleave", () => { tip.hidden = true; if (hovered) hovered.classList.remove("hover"); });
}

route();
