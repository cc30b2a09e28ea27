// The hubless search page. Loaded as a file (the server's CSP allows no inline script).
"use strict";
const $ = (id) => document.getElementById(id);
let indexes = [];
let auth = { required: false };
let latest = 0;            // number of the latest search sent; older answers are dropped
let controller = null;     // aborts the search in flight when a newer one starts
let lastQuery = null;      // the last query sent, for "More results"
const STEP = { 10: 10, 12: 12, 20: 20, 50: 50 };

const SCALES = {
  nnn: "NNN's score: cosine similarity minus alpha times the item's bias (its mean similarity to its k nearest bank queries)",
  csls: "CSLS's score: 2 cos(q, r) - r_q - r_r (each side's mean similarity to its k nearest neighbours)",
  dn: "DN's score: (q - lambda mu_B) . (r - lambda mu_G), the similarity after removing the banks' means",
  is: "the inverted-softmax probability of the item for this query (0 .. 1)",
  dis: "the dynamic inverted-softmax probability (0 .. 1; hubs outside the gate keep their cosine)",
  dualis: "the dual inverted-softmax probability (0 .. 1)",
  dualdis: "the dual dynamic inverted-softmax probability (0 .. 1)",
  baseline: "cosine similarity (-1 .. 1): the baseline does not correct",
};

function show(text, error = false) {
  $("message").textContent = text;
  $("message").className = error ? "error" : "";
}

function clearResults() {
  $("corrected").replaceChildren();
  $("uncorrected").replaceChildren();
  $("more").hidden = true;
}

function headers(json) {
  const h = json ? { "content-type": "application/json" } : {};
  const key = sessionStorage.getItem("hubless-api-key");
  if (key) h.authorization = `Bearer ${key}`;
  return h;
}

async function api(path, body, signal) {
  const init = body ? { method: "POST", headers: headers(true), body: JSON.stringify(body), signal } : { headers: headers(false), signal };
  const response = await fetch(path, init);
  const data = await response.json().catch(() => ({ detail: `HTTP ${response.status}` }));
  if (!response.ok) {
    const error = new Error(data.detail || `HTTP ${response.status}`);
    error.status = response.status;
    throw error;
  }
  return data;
}

function current() { return indexes.find((i) => i.name === $("index").value); }

function label(hit) {
  const m = hit.metadata || {};
  return String(m.caption || m.text || m.title || m.path || m.item || `item ${hit.id}`);
}

async function thumbnail(img, url) {
  if (!auth.required) { img.src = url; return; }
  try {   // an <img> cannot send the key: fetch the image, show it from a blob
    const response = await fetch(url, { headers: headers(false) });
    if (!response.ok) throw new Error();
    img.src = URL.createObjectURL(await response.blob());
  } catch { img.remove(); }
}

function card(hit, rank, corrected) {
  const li = document.createElement("li");
  const el = document.createElement("button");
  el.type = "button";
  el.className = "card";
  el.dataset.id = hit.id;
  const head = document.createElement("span");
  head.className = "rank";
  const place = document.createElement("span");
  place.textContent = `#${rank} · id ${hit.id}`;
  head.append(place);
  let change = "";
  if (corrected && hit.rank_change !== undefined) {
    const mark = document.createElement("span");
    if (hit.rank_change === null) { mark.className = "new"; mark.textContent = "new"; change = ", not in the uncorrected list"; }
    else if (hit.rank_change > 0) { mark.className = "up"; mark.textContent = `▲${hit.rank_change}`; change = `, up ${hit.rank_change}`; }
    else if (hit.rank_change < 0) { mark.className = "down"; mark.textContent = `▼${-hit.rank_change}`; change = `, down ${-hit.rank_change}`; }
    if (mark.textContent) { mark.setAttribute("aria-hidden", "true"); head.append(mark); }
  }
  el.append(head);
  const info = current();
  if (info && info.images && hit.metadata && hit.metadata.path) {
    const img = document.createElement("img");
    img.loading = "lazy"; img.alt = ""; img.className = "thumb";
    img.onerror = () => img.remove();
    thumbnail(img, `/items/${encodeURIComponent(info.name)}/${hit.id}/image`);
    el.append(img);
  }
  const text = document.createElement("span");
  text.className = "text";
  text.textContent = label(hit);
  const score = document.createElement("span");
  score.className = "score";
  score.textContent = hit.score === null ? "" : `score ${Number(hit.score).toPrecision(4)}`;
  el.append(text, score);
  el.setAttribute("aria-label", `Rank ${rank}${change}: ${label(hit)}, id ${hit.id}. Search with this item.`);
  el.addEventListener("click", () => { $("query").value = String(hit.id); search(); });
  li.append(el);
  return li;
}

function readWhere() {
  const text = $("where").value.trim();
  if (!text) return null;
  let where;
  try { where = JSON.parse(text); } catch { throw new Error('The filter must be JSON, e.g. {"topic": 3}.'); }
  if (typeof where !== "object" || where === null || Array.isArray(where)) throw new Error('The filter must be a JSON object, e.g. {"topic": 3}.');
  return where;
}

function buildQuery() {
  const info = current();
  const text = $("query").value.trim();
  const body = { index: $("index").value, top_k: Number($("top-k").value) };
  if ($("compare").checked) body.compare = true;
  if (info && info.weight) body.weight = Number($("weight").value);
  const where = readWhere();
  if (where) body.where = where;
  if (/^#?\d+$/.test(text)) body.item = Number(text.replace("#", ""));
  else if (!text) throw new Error("Type a query or an item id.");
  else if (info && info.queries.includes("texts")) body.texts = [text];
  else throw new Error("This index takes no text queries here (no model the server could load for it): search by an item id.");
  return body;
}

async function search(extra) {
  let body;
  try { body = extra || buildQuery(); } catch (e) { clearResults(); show(e.message, true); return; }
  lastQuery = body;
  await send(body);
}

async function send(body) {
  const mine = ++latest;
  if (controller) controller.abort();
  controller = new AbortController();
  show("Searching…");
  try {
    const data = await api("/search", body, controller.signal);
    if (mine !== latest) return;            // a newer search was started: this answer is stale
    render(data, body);
  } catch (e) {
    if (mine !== latest || e.name === "AbortError") return;
    clearResults();
    if (e.status === 401 || e.status === 403) askForKey();
    show(e.message, true);
  }
}

function render(data, body) {
  const result = data.results[0];
  const compare = Boolean(body.compare);
  $("corrected").replaceChildren(...result.hits.map((h, i) => card(h, i + 1, true)));
  $("uncorrected").replaceChildren(...(compare ? result.uncorrected.map((h, i) => card(h, i + 1, false)) : []));
  $("uncorrected-column").hidden = !compare;
  document.querySelector(".columns").classList.toggle("single", !compare);
  $("corrected-title").textContent = `Corrected (${data.method})`;
  const method = data.method.split(":")[0];
  $("scale-corrected").textContent = `Corrected scores: ${SCALES[method] || `${data.method}'s own score`}; higher ranks first.`;
  $("more").hidden = result.hits.length < body.top_k || body.top_k >= 1000;
  const moved = compare ? `; ${result.hits.filter((h) => h.rank_change !== 0).length} differ in place from the uncorrected ranking` : "";
  show(`${result.hits.length} results${moved}.`);
}

function more() {
  if (!lastQuery) return;
  const step = STEP[$("top-k").value] || 10;
  lastQuery = { ...lastQuery, top_k: Math.min(1000, lastQuery.top_k + step) };
  send(lastQuery);
}

function readFile(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result).split(",", 2)[1]);
    reader.onerror = () => reject(new Error("cannot read that file"));
    reader.readAsDataURL(file);
  });
}

async function searchImage() {
  const file = $("image").files[0];
  if (!file) return;
  try {
    const body = { index: $("index").value, top_k: Number($("top-k").value), images: [await readFile(file)] };
    if ($("compare").checked) body.compare = true;
    const info = current();
    if (info && info.weight) body.weight = Number($("weight").value);
    $("query").value = "";
    await search(body);
  } catch (e) { clearResults(); show(e.message, true); }
}

async function showHubness() {
  const panel = $("hubness");
  if (!panel.hidden) { panel.hidden = true; $("show-hubness").setAttribute("aria-expanded", "false"); return; }
  try {
    const h = await api(`/hubness/${encodeURIComponent($("index").value)}`);
    panel.hidden = false;
    $("show-hubness").setAttribute("aria-expanded", "true");
    if (h.before) {
      $("hubness-stats").textContent = `On ${h.n_bank_queries} stored bank queries: N1 skewness ${h.before.skewness.toFixed(2)} -> ${h.after.skewness.toFixed(2)}, ` +
        `largest hub ${h.before.max} -> ${h.after.max}; the bank covers ${(100 * h.coverage).toFixed(1)}% of the gallery.`;
      drawPlot(h.hubs);
      const table = $("hubness-hubs");
      table.replaceChildren();
      const head = table.insertRow();
      for (const t of ["largest hubs", "id", "N1 before", "N1 after"]) { const th = document.createElement("th"); th.scope = "col"; th.textContent = t; head.append(th); }
      for (const x of h.hubs) { const row = table.insertRow(); for (const v of [label(x), x.id, x.n1_before, x.n1_after]) row.insertCell().textContent = String(v); }
    } else {
      $("hubness-stats").textContent = h.note || "No bank-based figures.";
      $("hubness-plot").replaceChildren();
      $("hubness-hubs").replaceChildren();
    }
    const s = h.served;
    $("served-stats").textContent = s.queries === 0 ? "No query served yet." :
      `${s.queries} queries served: N1 skewness of their top results ${s.n1_skewness.toFixed(2)}; the top 1% of items took ${(100 * s.top1pct_share).toFixed(1)}% of all results; ` +
      `largest N1 ${s.n1_max}` + (s.hubs.length ? ` (items ${s.hubs.slice(0, 5).map((x) => `${x.id}: ${x.n1}`).join(", ")}).` : ".");
    showLearning(h.learning);
  } catch (e) { show(e.message, true); }
}

const fmt = (x, d = 2) => (x === null || x === undefined ? "–" : Number(x).toFixed(d));
function age(s) { return s === null || s === undefined ? "–" : s < 120 ? `${Math.round(s)} s` : s < 7200 ? `${Math.round(s / 60)} min` : s < 172800 ? `${Math.round(s / 3600)} h` : `${Math.round(s / 86400)} d`; }

function showLearning(l) {   // --learn-bank: the reservoir and every refit, over time
  $("learning").hidden = !l;
  if (!l) return;
  const r = l.reservoir, o = r.offered, n = Object.entries(l.decisions).map(([k, v]) => `${v} ${k}`).join(", ") || "no refit yet";
  $("learning-stats").textContent = `The bank learned from the traffic holds ${r.size} of ${r.capacity} queries (${r.seed} seed, ${r.traffic} from ${r.clients} clients, ` +
    `oldest ${age(r.oldest_age_s)}), ${r.held_out} held out; offered so far: ${o.admitted} admitted, ${o.held_out} held out, ${o.folded} folded, ${o.over_quota} over quota. Refits: ${n}.`;
  drawLearning(l.history);
  const table = $("learning-table");
  table.replaceChildren();
  const head = table.insertRow();
  for (const t of ["when", "decision", "version", "bank", "median age", "N1 skewness", "N10 skewness", "largest hub", "why"]) { const th = document.createElement("th"); th.scope = "col"; th.textContent = t; head.append(th); }
  for (const x of [...l.history].reverse()) {
    const b = x.before || {}, a = x.after || {}, hub = (f) => (f.hubs && f.hubs.length ? `${f.hubs[0].id} (${(100 * f.top_hub_share).toFixed(1)}%)` : "–");
    const row = table.insertRow();
    const cells = [x.time.replace("T", " ").replace("+00:00", " UTC"), x.decision, x.version ?? "–", x.bank.size, age(x.bank.median_age_s),
      `${fmt(b.n1_skewness)} → ${fmt(a.n1_skewness)}`, `${fmt(b.n10_skewness)} → ${fmt(a.n10_skewness)}`, `${hub(b)} → ${hub(a)}`, x.reasons.join("; ") || "–"];
    cells.forEach((v, i) => { const cell = row.insertCell(); cell.textContent = String(v); if (i === 1) cell.className = x.decision; });
  }
}

function drawLearning(history) {
  const svg = $("learning-plot"), NS = "http://www.w3.org/2000/svg", W = 640, H = 220, pad = 36;
  const title = svg.querySelector("title");
  svg.replaceChildren(title);
  const add = (tag, attrs, text) => { const el = document.createElementNS(NS, tag); for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v); if (text !== undefined) el.textContent = text; svg.append(el); return el; };
  const points = history.filter((x) => x.before && x.after);
  add("line", { x1: pad, y1: H - pad, x2: W - pad, y2: H - pad, stroke: "#6e7781" });
  add("line", { x1: pad, y1: pad / 2, x2: pad, y2: H - pad, stroke: "#6e7781" });
  if (!points.length) { add("text", { x: W / 2, y: H / 2, "font-size": 13, "text-anchor": "middle" }, "No refit judged yet."); return; }
  const t0 = points[0].unix, t1 = Math.max(points[points.length - 1].unix, t0 + 1);
  const ys = points.flatMap((x) => [x.before.n10_skewness, x.after.n10_skewness]);
  const lo = Math.min(0, ...ys), hi = Math.max(...ys, lo + 0.1);
  const X = (t) => pad + (W - 2 * pad) * (points.length === 1 ? 0.5 : (t - t0) / (t1 - t0)), Y = (v) => H - pad - (H - 1.5 * pad) * (v - lo) / (hi - lo);
  for (const v of [lo, (lo + hi) / 2, hi]) add("text", { x: pad - 4, y: Y(v) + 4, "font-size": 10, "text-anchor": "end" }, v.toFixed(1));
  add("text", { x: pad, y: H - 8, "font-size": 10 }, new Date(t0 * 1000).toLocaleString());
  add("text", { x: W - pad, y: H - 8, "font-size": 10, "text-anchor": "end" }, new Date(t1 * 1000).toLocaleString());
  add("polyline", { points: points.map((x) => `${X(x.unix)},${Y(x.before.n10_skewness)}`).join(" "), fill: "none", stroke: "#57606a", "stroke-dasharray": "4 3" });
  for (const x of points) {
    const colour = x.decision === "accepted" ? "#1a7f37" : "#cf222e";
    add("line", { x1: X(x.unix), y1: Y(x.before.n10_skewness), x2: X(x.unix), y2: Y(x.after.n10_skewness), stroke: colour });
    add("circle", { class: x.decision, cx: X(x.unix), cy: Y(x.after.n10_skewness), r: 4, fill: colour }).append(
      Object.assign(document.createElementNS(NS, "title"), { textContent: `${x.time}: ${x.decision}, N10 skewness ${fmt(x.before.n10_skewness)} → ${fmt(x.after.n10_skewness)}` }));
  }
  add("text", { x: W - pad, y: 14, "font-size": 12, "text-anchor": "end" }, "N10 skewness of held-out queries: grey before, dots after (green kept, red rejected)");
}

function drawPlot(hubs) {
  const svg = $("hubness-plot"), NS = "http://www.w3.org/2000/svg", W = 640, H = 220, pad = 28;
  const title = svg.querySelector("title");
  svg.replaceChildren(title);
  const max = Math.max(1, ...hubs.map((x) => x.n1_before));
  const bw = (W - 2 * pad) / Math.max(1, hubs.length);
  const add = (tag, attrs, text) => { const el = document.createElementNS(NS, tag); for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v); if (text) el.textContent = text; svg.append(el); return el; };
  add("line", { x1: pad, y1: H - pad, x2: W - pad, y2: H - pad, stroke: "#6e7781" });
  hubs.forEach((x, i) => {
    const hb = (H - 2 * pad) * x.n1_before / max, ha = (H - 2 * pad) * x.n1_after / max, x0 = pad + i * bw;
    add("rect", { class: "before", x: x0 + 2, y: H - pad - hb, width: Math.max(1, bw / 2 - 3), height: hb, fill: "#cf222e" });
    add("rect", { class: "after", x: x0 + bw / 2, y: H - pad - ha, width: Math.max(1, bw / 2 - 3), height: ha, fill: "#1a7f37" });
    add("text", { x: x0 + bw / 2, y: H - 10, "font-size": 11, "text-anchor": "middle" }, String(x.id));
  });
  add("text", { x: W - pad, y: 16, "font-size": 12, "text-anchor": "end" }, "N1 of the 10 largest hubs: red before, green after");
}

function hint(info) {   // what this index can be searched by: text and images only with a model
  const by = ["an item id"];
  if (info && info.queries.includes("images")) by.unshift("an image");
  if (info && info.queries.includes("texts")) by.unshift("text");
  const ways = by.length > 1 ? `${by.slice(0, -1).join(", ")} or ${by[by.length - 1]}` : by[0];
  return `Search by ${ways}; choose a result to search with it.`;
}

function updateIndex() {
  const info = current();
  $("query").placeholder = info && info.queries.includes("texts") ? "text, or an item id such as 42" : "an item id such as 42";
  $("image-label").hidden = !(info && info.queries.includes("images"));
  $("weight-label").hidden = !info || !info.weight;
  if (info && info.weight) $("weight").value = info.weight.value;
  $("weight-value").textContent = Number($("weight").value).toFixed(2);
}

function askForKey() {
  $("key-label").hidden = false;
  $("api-key").value = sessionStorage.getItem("hubless-api-key") || "";
}

async function init() {
  try {
    const health = await api("/health");
    auth = health.auth || auth;
    if (auth.required) askForKey();
    if (auth.required && !sessionStorage.getItem("hubless-api-key")) { show("This server needs an API key: enter it above.", true); return; }
    await loadIndexes();
  } catch (e) { show(`Cannot reach the server: ${e.message}`, true); }
}

async function loadIndexes() {
  try {
    indexes = await api("/indexes");
  } catch (e) {
    if (e.status === 401 || e.status === 403) askForKey();
    show(e.message, true);
    return;
  }
  $("index").replaceChildren(...indexes.map((i) => { const o = document.createElement("option"); o.value = o.textContent = i.name; return o; }));
  if (!indexes.length) show("No index is served.", true);
  else show(hint(current()));
  updateIndex();
}

document.addEventListener("DOMContentLoaded", () => {
  $("search-form").addEventListener("submit", (e) => { e.preventDefault(); search(); });
  $("weight").addEventListener("input", () => { $("weight-value").textContent = Number($("weight").value).toFixed(2); });
  $("weight").addEventListener("change", () => { if ($("query").value.trim()) search(); });
  $("compare").addEventListener("change", () => { if ($("query").value.trim()) search(); });
  $("top-k").addEventListener("change", () => { if ($("query").value.trim()) search(); });
  $("index").addEventListener("change", () => { updateIndex(); $("hubness").hidden = true; clearResults(); show(hint(current())); });
  $("image").addEventListener("change", searchImage);
  $("more").addEventListener("click", more);
  $("show-hubness").addEventListener("click", showHubness);
  $("api-key").addEventListener("change", () => { sessionStorage.setItem("hubless-api-key", $("api-key").value.trim()); loadIndexes(); });
  init();
});
