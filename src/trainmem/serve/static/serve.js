// trainmem serve: keep the answer in step with the form. The server renders every fragment; this script only
// asks for them as the form changes, swaps them in, and polls while the simulation runs in the background.
"use strict";
const $ = (id) => document.getElementById(id);
const LIMIT = { config: 256 * 1024, rows: 8 * 1024 * 1024 };
let current = "";   // the query of the answer the page wants now
let debounce = null, poll = null, planQuery = "";

function params() {
  const p = new URLSearchParams();
  for (const [k, v] of new FormData($("setup"))) if (typeof v === "string") p.append(k, v);
  return p.toString();
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
  const data = await getJSON("/api/estimate?" + query);
  if (query !== current) return;          // the form changed meanwhile: a newer answer is on its way
  lines(data.problems || []);
  if (data.html) {
    $("cards").innerHTML = data.html.cards;
    $("breakdown").innerHTML = data.html.breakdown;
    $("status").innerHTML = data.html.status;
  } else {
    $("cards").innerHTML = $("breakdown").innerHTML = "";
    $("status").textContent = "fix the setup above to see an answer";
  }
  if (data.pending) poll = setTimeout(refresh, 800);
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
    $("model").value = data.model;
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
$("setup").addEventListener("input", (e) => { if (!picked(e)) later(); });   // typing: wait for a pause
$("setup").addEventListener("change", (e) => (picked(e) ? refresh() : later()));
for (const form of document.forms) form.addEventListener("submit", (e) => e.preventDefault());  // Enter sends nothing
$("config-file").addEventListener("change", uploadConfig);
$("plan-button").addEventListener("click", plan);
$("rows-file").addEventListener("change", report);
refresh();
