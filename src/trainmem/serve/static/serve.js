// trainmem serve: keep the answer in step with the form. The server renders every fragment; this script only
// asks for them as the form changes, swaps them in, and polls while the simulation runs in the background.
"use strict";
const $ = (id) => document.getElementById(id);
const LIMIT = { config: 256 * 1024, rows: 8 * 1024 * 1024 };
let current = "";   // the query of the answer the page wants now
let shown = "";     // the query of the table on the page
let committed = $("model").value.trim();  // the model as last committed: Enter, leaving the field, a pick
let debounce = null, poll = null, planQuery = "";

function params() {
  const p = new URLSearchParams();
  for (const [k, v] of new FormData($("setup"))) if (typeof v === "string") p.append(k, k === "model" ? committed : v);
  return p.toString();
}

function describe() {  // the setup being asked for, in words: named over the greyed table while it is replaced
  const f = new FormData($("setup"));
  const ranks = +f.get("gpus") > 1 ? `, one rank of ${f.get("gpus")} (${f.get("shard")})` : "";
  return `${committed}: micro-batch ${f.get("batch_size")} x ${f.get("grad_accum")}, ${f.get("seq_len")} tokens, ` +
    `${f.get("peft") === "none" ? "full" : f.get("peft")}, ${f.get("precision")}, ${f.get("optimizer")}` +
    `${f.get("checkpointing") ? ", checkpointing" : ""}${ranks}`;
}

function replacing(on) {
  on = on && $("cards").innerHTML !== "";
  for (const id of ["cards", "breakdown"]) $(id).classList.toggle("replacing", on);
  $("replacing").hidden = !on;
  if (on) $("replacing").textContent = `being replaced by the answer for ${describe()}`;
}

function lines(list, where = "problems") {
  $(where).innerHTML = "";
  for (const line of list) {
    const li = document.createElement("li");
    li.className = "problem";
    li.textContent = line;
    $(where).append(li);
  }
}

async function getJSON(url, options) {
  try {
    const r = await fetch(url, options);
    return await r.json();
  } catch (e) {
    return { problems: [`the server did not answer (${e.message}); is trainmem serve still running?`] };
  }
}

async function refresh() {
  const query = params();
  current = query;
  clearTimeout(poll);
  $("download").href = "/api/result.json?" + query;
  if (query !== shown) replacing(true);
  const data = await getJSON("/api/estimate?" + query);
  if (query !== current) return;          // the form changed meanwhile: a newer answer is on its way
  lines(data.problems || []);
  if (data.waiting) {                     // a lookup or a first answer: the old table stays, greyed and named
    $("status").innerHTML = data.html.status;
  } else if (data.html) {
    $("cards").innerHTML = data.html.cards;
    $("breakdown").innerHTML = data.html.breakdown;
    $("status").innerHTML = data.html.status;
    shown = query;
    replacing(false);
  } else {
    $("cards").innerHTML = $("breakdown").innerHTML = "";
    $("status").textContent = "fix the setup above to see an answer";
    shown = "";
    replacing(false);
  }
  if (data.pending) poll = setTimeout(refresh, 800);
}

function commitModel() {  // a hub id goes to the network: it is sent when committed, not at each keystroke
  const model = $("model").value.trim();
  if (model === committed) return;
  committed = model;
  refresh();
}

async function retry() {
  await getJSON("/api/retry?" + current, { method: "POST" });
  refresh();
}

function later() {
  clearTimeout(debounce);
  debounce = setTimeout(refresh, 80);
}

async function readFile(input, limit, what) {
  const file = input.files[0];
  if (!file) return null;
  if (file.size > limit) return { problems: [`${what}: ${file.size.toLocaleString()} bytes; at most ${limit.toLocaleString()} here`] };
  return { name: file.name, text: await file.text() };
}

async function uploadConfig(event) {
  event.stopPropagation();               // the form's own listener would ask with the old model meanwhile
  const sent = await readFile(event.target, LIMIT.config, "config.json");
  if (!sent) return;
  const data = sent.problems ? sent : await getJSON("/api/config", {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(sent) });
  lines(data.problems || [], "config-problems");   // beside the file input: the polling answer leaves it be
  if (data.model) {
    $("model").value = committed = data.model;
    refresh();
  }
}

async function plan() {
  const p = new URLSearchParams(params());
  p.set("target", $("target").value);
  for (const box of document.querySelectorAll("#plan-form input[name=allow]:checked")) p.append("allow", box.value);
  const query = p.toString();
  planQuery = query;
  const start = performance.now();
  $("plan-result").innerHTML = "";
  const tick = async () => {
    if (planQuery !== query) return;
    const data = await getJSON("/api/plan?" + query);
    if (planQuery !== query) return;
    const seconds = ((performance.now() - start) / 1000).toFixed(0);
    if (data.pending) {
      $("plan-progress").innerHTML = `<progress></progress> searching: the analytic estimate of every micro-batch, ` +
        `then each row it lists simulated (${seconds} s)`;
      setTimeout(tick, 1000);
    } else if (data.html) {
      $("plan-progress").textContent = `planned in ${seconds} s`;
      $("plan-result").innerHTML = data.html;
    } else {
      $("plan-progress").textContent = "";
      $("plan-result").innerHTML = '<ul class="problems" id="plan-problems"></ul>';
      lines(data.problems || [], "plan-problems");
    }
  };
  tick();
}

async function report(event) {
  const sent = await readFile(event.target, LIMIT.rows, "FILE.jsonl");
  if (!sent) return;
  $("report-problems").innerHTML = "<li><progress></progress> writing the report…</li>";
  sent.gpu = $("card").value;
  const data = sent.problems ? sent : await getJSON("/api/report", {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(sent) });
  lines(data.problems || [], "report-problems");
  if (data.url) {
    $("report-timeline").innerHTML = data.timeline;
    $("report").hidden = false;           // shown first: a document laid out in a hidden frame keeps its width
    $("report").src = data.url;
  }
}

const picked = (e) => e.target.tagName === "SELECT" || e.target.type === "checkbox";
const typed = (e) => e.target.id === "model";   // committed on Enter, on leaving the field, or picked from the list
$("setup").addEventListener("input", (e) => { if (!typed(e) && !picked(e)) later(); });   // typing: wait for a pause
$("setup").addEventListener("change", (e) => { if (!typed(e)) (picked(e) ? refresh() : later()); });
$("model").addEventListener("keydown", (e) => { if (e.key === "Enter") commitModel(); });
$("model").addEventListener("blur", commitModel);
$("model").addEventListener("input", (e) => { if (!e.inputType || e.inputType === "insertReplacementText") commitModel(); });
$("status").addEventListener("click", (e) => { if (e.target.id === "retry") retry(); });
for (const form of document.forms) form.addEventListener("submit", (e) => e.preventDefault());  // Enter sends nothing
$("config-file").addEventListener("change", uploadConfig);
$("plan-button").addEventListener("click", plan);
$("rows-file").addEventListener("change", report);
refresh();
