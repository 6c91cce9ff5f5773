// d2ops console: plain JavaScript, no build step and nothing fetched from elsewhere.
// Every number comes from the status API through this page's own server (/api/...); the
// "try an image" box posts to /api/endpoints/<name>/invocations, which calls the endpoint; on a run waiting
// for review, Approve / Reject post to /api/runs/<run>/decision (the status API's decision route).
// Text from the API is always set with textContent, never parsed as HTML.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const COLOURS = {"succeeded": "#2e7d32", "failed": "#c62828", "caught": "#ef6c00", "running": "#1565c0",
                 "not reached": "#9e9e9e"};
const FILLS = {"succeeded": "#e8f5e9", "failed": "#ffebee", "caught": "#fff3e0", "running": "#e3f2fd",
               "not reached": "#fafafa"};
const MODEL_COLOURS = {"challenger": "#1565c0", "champion": "#ef6c00"};
const BOX_COLOURS = ["#e6194b", "#3cb44b", "#4363d8", "#f58231", "#911eb4", "#42d4f4", "#f032e6", "#bfef45"];

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = String(text);
  return node;
}

function clear(id) {
  const node = document.getElementById(id);
  node.replaceChildren();
  return node;
}

function say(id, text, isError) {
  const node = document.getElementById(id);
  node.textContent = text || "";
  node.className = isError ? "error" : "";
}

// A read that the status API failed (500), could not serve (502/503/504) or never answered is asked
// again twice before the page says so: a report view that failed once would otherwise stay empty
// until the user reloads.
const TRANSIENT = new Set([500, 502, 503, 504]);

async function fetchJson(path, attempt = 0) {
  let response;
  try {
    response = await fetch("/api" + path, {headers: {"Accept": "application/json"}});
  } catch (e) {
    if (attempt < 2) return later(() => fetchJson(path, attempt + 1), attempt);
    throw e;
  }
  if (TRANSIENT.has(response.status) && attempt < 2) return later(() => fetchJson(path, attempt + 1), attempt);
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok) {
    const error = new Error((body && body.message) || ("HTTP " + response.status));
    error.status = response.status;
    throw error;
  }
  return body;
}

function later(retry, attempt) {
  return new Promise(resolve => setTimeout(resolve, 1000 * (attempt + 1))).then(retry);
}

function fmtSeconds(s) {
  if (s === null || s === undefined) return "-";
  if (s < 120) return s.toFixed(1) + " s";
  if (s < 7200) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}

function duration(run) {
  if (!run.started_at) return null;
  const end = run.stopped_at ? Date.parse(run.stopped_at) : Date.now();
  return (end - Date.parse(run.started_at)) / 1000;
}

function fmtNumber(v, digits) {
  return (v === null || v === undefined) ? "-" : Number(v).toFixed(digits === undefined ? 3 : digits);
}

function fmtCost(cost) {
  if (!cost || cost.total_usd === null || cost.total_usd === undefined) return "-";
  return "$" + Number(cost.total_usd).toFixed(cost.total_usd < 1 ? 4 : 2);
}

function facts(dl, pairs) {
  for (const [k, v] of pairs) {
    if (v === null || v === undefined || v === "") continue;
    dl.append(el("dt", {}, k), v instanceof Node ? el("dd", {}, v) : el("dd", {}, String(v)));
  }
  return dl;
}

function table(headers, rows, attrs) {
  const t = el("table", attrs || {});
  t.append(el("thead", {}, el("tr", {}, ...headers.map(h => el("th", {}, h)))));
  const body = el("tbody");
  for (const row of rows) {
    body.append(el("tr", {}, ...row.map(c => (c instanceof Node && c.tagName === "TD") ? c
      : (typeof c === "number" ? el("td", {"class": "num"}, String(c)) : el("td", {}, c === null ? "-" : c)))));
  }
  t.append(body);
  return t;
}

// ----- the run list ----------------------------------------------------------------------
async function showRuns() {
  currentView += 1;
  document.getElementById("runs-view").hidden = false;
  document.getElementById("run-view").hidden = true;
  document.getElementById("monitoring-view").hidden = true;
  showEndpointLink();  // not awaited: the runs do not wait for the registry
  const body = document.querySelector("#runs tbody");
  let listing;
  try {
    listing = await api("/runs?limit=100");
  } catch (e) {
    say("message", "Could not list runs: " + e.message, true);
    return;
  }
  body.replaceChildren();
  if (!listing.runs.length) say("message", "No runs yet: start one with `d2ops run DATASET_DIR` or `d2ops demo`.");
  for (const run of listing.runs) {
    const cells = {cost: el("td", {"class": "num cost"}, "…"), gate: el("td", {"class": "gate"}, "…")};
    const link = el("a", {"href": "#run=" + encodeURIComponent(run.run_id)}, run.run_id);
    body.append(el("tr", {"class": "run", "data-run": run.run_id},
      el("td", {}, link), el("td", {}, run.dataset_name || "-"), el("td", {}, run.dataset_version || "-"),
      el("td", {"class": "status-" + run.status}, run.status), el("td", {"class": "num"}, fmtSeconds(duration(run))),
      cells.cost, cells.gate));
    // Cost and the gate's decision are in the run's detail: filled in as they arrive.
    api("/runs/" + encodeURIComponent(run.run_id)).then(detail => {
      cells.cost.textContent = fmtCost(detail.cost);
      const decision = detail.gate ? detail.gate.decision : "-";
      cells.gate.textContent = decision;
      cells.gate.className = "gate decision-" + decision;
    }).catch(e => { cells.gate.textContent = "? (" + e.message + ")"; })
      .finally(() => cells.gate.setAttribute("data-loaded", "1"));
  }
}

// ----- one run ---------------------------------------------------------------------------
// Answers for a view the user has left (a slow report of the previous run) are dropped.
let currentView = 0;

async function api(path) {
  const view = currentView;
  const answer = await fetchJson(path);
  if (view !== currentView) return new Promise(() => {});  // never settles: nothing is drawn
  return answer;
}

async function showRun(runId) {
  currentView += 1;
  document.getElementById("runs-view").hidden = true;
  document.getElementById("run-view").hidden = false;
  document.getElementById("monitoring-view").hidden = true;
  document.getElementById("run-title").textContent = "Run " + runId;
  for (const id of ["run-facts", "review", "graph", "validation", "gate", "data-diff", "evaluation", "errors",
                    "deployment", "history", "monitoring", "try-detections"]) clear(id);
  document.getElementById("review").hidden = true;
  clear("try-canvas").setAttribute("width", "0");
  say("try-message", "");
  let run;
  try {
    run = await api("/runs/" + encodeURIComponent(runId));
  } catch (e) {
    say("message", "Could not open run " + runId + ": " + e.message, true);
    return;
  }
  const dataset = run.dataset || {};
  const statusNode = el("span", {"class": "status-" + run.status}, run.status + (run.error ? " (" + run.error + ")" : ""));
  facts(document.getElementById("run-facts"), [
    ["status", statusNode], ["dataset", dataset.name ? dataset.name + " " + dataset.version : null],
    ["dataset uri", dataset.bucket ? "s3://" + dataset.bucket + "/" + dataset.prefix : null],
    ["started", run.started_at], ["stopped", run.stopped_at], ["duration", fmtSeconds(duration(run))],
    ["now in", run.current_state], ["cost", run.cost ? fmtCost(run.cost) + " (prices of " + run.cost.prices_as_of +
      ", " + run.cost.prices_region + ")" : null],
    ["training job", run.training ? run.training.job_name + " " + (run.training.status || "") : null],
    ["cause", run.status !== "SUCCEEDED" ? run.cause : null],
  ]);
  showReview(runId, run);
  showTraining(run);
  followTraining(runId, run);  // not awaited: it asks again while the run runs
  await Promise.all([drawGraph(runId), showValidation(runId, run), showGate(run), showDataDiff(run),
                     showEvaluation(runId, run), showDeployment(run)]);
}

// ----- training progress ---------------------------------------------------------------------
// The training job's progress as the status API reads it from CloudWatch (training.progress). While the
// run runs, the view asks for the run again every POLL_SECONDS and redraws this panel: the latest
// iteration, loss and time left move as the job publishes them, the loss curve gains a point a period.
const POLL_SECONDS = 5;

async function followTraining(runId, run) {
  const view = currentView;
  let polled = false;
  while (run.status === "RUNNING") {
    await new Promise(resolve => setTimeout(resolve, POLL_SECONDS * 1000));
    if (view !== currentView) return;  // the user opened another view: stop asking
    try {
      run = await fetchJson("/runs/" + encodeURIComponent(runId));
    } catch (e) {
      continue;  // asked again next time (fetchJson already retried a busy API twice)
    }
    if (view !== currentView) return;
    polled = true;
    showTraining(run);
  }
  if (polled && view === currentView) showRun(runId);  // it ended: the gate, evaluation and deployment now exist
}

function showTraining(run) {
  const box = clear("training");
  const training = run.training;
  if (!training) {
    box.append(el("p", {"class": "muted"}, "no training job (the run did not reach training)"));
    return;
  }
  const progress = training.progress;
  if (!progress) {
    const waiting = run.status === "RUNNING" && run.current_state === "Train model";
    box.append(el("p", {"class": "muted"}, waiting ? "training job " + training.job_name + " has published no "
      + "metrics yet (SageMaker publishes them about once a minute)" : "no training progress published"));
    return;
  }
  box.append(el("p", {"id": "training-progress"}, progressLine(progress)));
  box.append(lossChart(progress));
}

function progressLine(p) {
  const known = v => v !== null && v !== undefined;
  let head = "iter " + p.iteration;
  if (p.total_iterations) head += "/" + p.total_iterations + " (" + Math.floor((p.fraction || 0) * 100) + "%)";
  const parts = [head];
  if (known(p.loss)) parts.push("loss " + fmtNumber(p.loss, 3));
  if (known(p.learning_rate)) parts.push("lr " + Number(p.learning_rate).toPrecision(3));
  if (known(p.images_per_second)) parts.push(fmtNumber(p.images_per_second, 1) + " img/s");
  if (known(p.seconds_left)) parts.push("~" + fmtSeconds(p.seconds_left) + " left");
  parts.push("as of " + p.updated_at);
  return parts.join(" · ");
}

function lossChart(p) {
  const width = 480, height = 200, left = 56, right = 14, top = 24, bottom = 34;
  const points = p.loss_series || [];
  const root = svg("svg", {"id": "loss-curve", "width": width, "height": height, "data-points": points.length});
  root.append(svg("text", {"x": left, "y": 14, "font-size": 12, "font-weight": "bold"},
                  `training loss (mean of each ${p.period_seconds} s)`));
  const plotW = width - left - right, plotH = height - top - bottom;
  root.append(svg("rect", {"x": left, "y": top, "width": plotW, "height": plotH, "fill": "none", "stroke": "#bbb"}));
  if (!points.length) return root;
  // x: iterations up to the run's total (the curve grows towards the right edge); y: 0 to the highest loss
  const xMax = Math.max(p.total_iterations || 0, ...points.map(q => q.iteration), 1);
  const losses = points.map(q => q.loss);
  const yMin = Math.min(0, ...losses), yMax = Math.max(...losses) > yMin ? Math.max(...losses) : yMin + 1;
  const x = i => left + (i / xMax) * plotW, y = v => top + (1 - (v - yMin) / (yMax - yMin)) * plotH;
  for (const [value, anchor] of [[0, "start"], [xMax, "end"]]) {
    root.append(svg("text", {"x": x(value), "y": top + plotH + 12, "font-size": 9, "text-anchor": anchor}, value));
  }
  for (const value of [yMin, yMax]) {
    root.append(svg("text", {"x": left - 4, "y": y(value) + 3, "font-size": 9, "text-anchor": "end"},
                    fmtNumber(value, 3)));
  }
  root.append(svg("text", {"x": left + plotW / 2, "y": height - 4, "font-size": 10, "text-anchor": "middle"},
                  "iteration"));
  const line = svg("polyline", {"class": "loss", "fill": "none", "stroke": MODEL_COLOURS.challenger,
                                "stroke-width": 1.6, "points": points.map(q => `${x(q.iteration)},${y(q.loss)}`).join(" ")});
  line.append(svg("title", {}, "mean training loss of each period"));
  root.append(line);
  const last = points[points.length - 1];
  const dot = svg("circle", {"class": "latest", "cx": x(last.iteration), "cy": y(last.loss), "r": 3,
                             "fill": MODEL_COLOURS.challenger});
  dot.append(svg("title", {}, `iteration ${last.iteration}: loss ${fmtNumber(last.loss, 4)}`));
  root.append(dot);
  return root;
}

// The run by stage (GET /runs/{runId}/graph's `stages`, d2ops_core.state_graph.stage_view): one column a
// stage in the pipeline's order, headed by the run's outcome there and its time; each opens to the states
// the run went through (a wait loop as one line: "Wait for endpoint ×10"), an expected miss as "missed";
// the stage's states the run never entered are folded into "+N not reached", which opens to name them.
function fmtDuration(s) {  // as d2ops_core.stage_timeline.human_duration says it
  if (s === null || s === undefined) return "-";
  if (s < 0.05) return "0s";
  if (s < 10) return s.toFixed(1) + "s";
  const whole = Math.round(s);
  if (whole < 60) return whole + "s";
  const pad = n => String(n).padStart(2, "0");
  if (whole < 3600) return Math.floor(whole / 60) + "m " + pad(whole % 60) + "s";
  return Math.floor(whole / 3600) + "h " + pad(Math.floor(whole % 3600 / 60)) + "m";
}

function lineTitle(line) {
  return (line.loop || line.rounds > 1) ? line.title + " \u00d7" + line.rounds : line.title;
}

async function drawGraph(runId) {
  const box = document.getElementById("graph");
  let graph;
  try {
    graph = await api("/runs/" + encodeURIComponent(runId) + "/graph");
  } catch (e) {
    box.append(el("p", {"class": "error"}, "graph: " + e.message));
    return;
  }
  const titles = Object.fromEntries(graph.stages.map(s => [s.key, s.title]));
  const list = el("ol", {"id": "stages", "class": "stages"});
  graph.stages.forEach((stage, i) => {
    const next = graph.stages[i + 1];
    const item = el("li", {"class": "stage status-" + stage.status.replace(" ", "-"), "data-stage": stage.key,
                           "data-status": stage.status});
    if (next && stage.next_stages.includes(next.key)) item.classList.add("to-next");  // the run went on in order
    const details = el("details", {"class": "stage-body"});
    details.open = stage.lines.length > 0;
    const time = stage.duration_seconds !== null ? " \u00b7 " + fmtDuration(stage.duration_seconds) : "";
    details.append(el("summary", {}, el("span", {"class": "stage-title"}, stage.title),
                      el("span", {"class": "stage-detail"}, stage.status + time)));
    const lines = el("ol", {"class": "lines"});
    for (const line of stage.lines) {
      const said = line.status + (line.duration_seconds !== null ? " \u00b7 " + fmtDuration(line.duration_seconds) : "");
      const tip = line.states.length > 1 ? line.states.join(", ") : line.states[0];
      const row = el("li", {"class": "line status-" + line.status, "data-status": line.status,
                            "data-name": line.title, "title": tip + (line.error ? " [" + line.error + "]" : "")},
                     el("span", {"class": "line-title"}, lineTitle(line)),
                     el("span", {"class": "line-detail"}, said));
      if (line.note) row.append(el("span", {"class": "line-note"}, line.note));
      else if (line.error && line.status !== "succeeded") row.append(el("span", {"class": "line-note"}, line.error));
      lines.append(row);
    }
    details.append(lines);
    if (stage.folded.length) {
      const folded = el("details", {"class": "folded"},
                        el("summary", {}, "+" + stage.folded.length + " not reached"),
                        el("ol", {}, ...stage.folded.map(name => el("li", {"class": "state"}, name))));
      details.append(folded);
    }
    const away = stage.next_stages.filter(key => !next || key !== next.key);
    if (away.length) {  // the run left this stage for one further on (a failure path)
      details.append(el("p", {"class": "stage-away"}, "\u2192 " + away.map(key => titles[key] || key).join(", ")));
    }
    item.append(details);
    list.append(item);
  });
  box.append(list);
}

async function showValidation(runId, run) {
  const box = document.getElementById("validation");
  let report;
  try {
    report = await api("/runs/" + encodeURIComponent(runId) + "/validation");
  } catch (e) {
    box.append(el("p", {"class": "muted"}, e.status === 404 ? "no validation report" : "validation: " + e.message));
    return;
  }
  box.append(el("p", {"class": report.valid ? "decision-approved" : "decision-rejected"},
    (report.valid ? "valid" : "rejected") + `: ${report.error_count} errors, ${report.warning_count} warnings`));
  const counts = Object.entries(report.issue_counts || {});
  if (counts.length) {
    const examples = {};
    for (const issue of [...report.errors, ...report.warnings]) {
      if (!(issue.code in examples)) examples[issue.code] = issue;
    }
    box.append(table(["code", "count", "first", "where"], counts.map(([code, n]) => [
      code, n, examples[code] ? examples[code].message : "-", examples[code] ? examples[code].location : "-"]),
      {"id": "validation-codes"}));
  }
  for (const [split, stats] of Object.entries(report.splits || {})) {
    box.append(el("p", {"class": "muted"}, `${split}: ${stats.images} images, ${stats.instances} instances ` +
                                         `(${stats.file})`));
    box.append(table(["class", "images", "instances", "small", "medium", "large", "tiny"],
      stats.per_class.map(c => [c.name, c.images, c.instances, c.box_sizes.small, c.box_sizes.medium,
                                c.box_sizes.large, c.box_sizes.tiny]), {"class": "class-stats", "data-split": split}));
  }
}

function showGate(run) {
  const box = document.getElementById("gate");
  const gate = run.gate, ev = run.evaluation;
  if (!gate) {
    box.append(el("p", {"class": "muted"}, "the run did not reach the quality gate"));
    return;
  }
  box.append(el("p", {"id": "gate-decision", "class": "decision-" + gate.decision},
                gate.decision + " (" + gate.approval_status + ")"));
  box.append(el("p", {}, gate.reason));
  if (ev) {
    // The gate judged the paired-bootstrap interval of challenger - champion, not the two point estimates.
    const iv = ev.interval;
    const level = iv => `${+(iv.confidence * 100).toPrecision(4)}%`;
    const span = iv => `[${fmtNumber(iv.low, 4)}, ${fmtNumber(iv.high, 4)}]`;
    facts(box.appendChild(el("dl", {"id": "gate-facts", "class": "facts"})), [
      ["metric", ev.primary_metric], ["challenger", fmtNumber(ev.challenger_value, 4)],
      ["champion", ev.has_champion ? fmtNumber(ev.champion_value, 4) : "none yet"],
      ["difference", iv ? fmtNumber(iv.difference, 4) : null],
      ["interval", iv ? `${span(iv)} (${level(iv)}, ${ev.resamples} resamples)` : null],
      ["min_map", fmtNumber(ev.min_map, 4)], ["max_regression", fmtNumber(ev.max_regression, 4)],
      ["more val images", ev.more_val_images ? `about ${ev.more_val_images} more (${ev.val_images} now) would ` +
                          `narrow the interval to ±${ev.max_regression}` : null]]);
    if (ev.class_regressions && ev.class_regressions.length) {
      box.append(table(["class", "challenger", "champion", "difference", "interval", "instances"],
        ev.class_regressions.map(r => [r.class_name, fmtNumber(r.challenger_ap, 4), fmtNumber(r.champion_ap, 4),
          r.interval ? fmtNumber(r.interval.difference, 4) : "-",
          r.interval ? `${span(r.interval)} (${level(r.interval)})` : "-", r.instances]),
        {"id": "gate-classes"}));
    }
  }
}

// ----- a person's review ------------------------------------------------------------------
// The gate could not settle it (run.review): why, on how many images, until when the run waits, and the
// Approve / Reject pair; once decided, who decided what, why and when. The page's server passes the
// decision on to the status API as the console's caller, who must be a reviewer (403 says so otherwise).
const REVIEW_STATES = {
  "requested": "the quality gate asked for a person's review; the run is entering its wait",
  "waiting": "waiting for a reviewer: approve to deploy it as if the gate had approved, or reject",
  "approved": "approved by a reviewer", "rejected": "rejected by a reviewer",
  "not decided": "not decided: the wait ended without a decision (it timed out, or the run stopped)"};

function showReview(runId, run) {
  const box = document.getElementById("review");
  const review = run.review;
  if (!review) return;
  box.hidden = false;
  box.className = "review-" + review.status.replace(" ", "-");
  box.append(el("h3", {}, "Review"));
  box.append(el("p", {"id": "review-status", "data-status": review.status}, REVIEW_STATES[review.status] ||
                review.status));
  const compared = review.images_compared === null || review.images_compared === undefined ? null
    : review.images_compared + " held-out val images" + (review.images_excluded ?
      ` (${review.images_excluded} left out: a model trained on them)` : "");
  facts(box.appendChild(el("dl", {"id": "review-facts", "class": "facts"})), [
    ["why", review.gate_reason], ["because", (review.review_because || []).join(", ")],
    ["images compared", compared], ["waiting since", review.requested_at],
    ["refused unless decided by", review.status === "waiting" ? review.expires_at : null],
    ["model package", review.model_package_arn], ["decided by", review.decided_by],
    ["reason", review.reason], ["decided at", review.decided_at]]);
  if (review.status !== "waiting") return;
  const reason = el("input", {"id": "review-reason", "type": "text", "maxlength": "1000",
                              "placeholder": "reason (optional to approve, required to reject)"});
  const approve = el("button", {"type": "button", "id": "review-approve"}, "Approve");
  const reject = el("button", {"type": "button", "id": "review-reject"}, "Reject");
  box.append(el("form", {"id": "review-form"}, reason, approve, reject),
             el("p", {"id": "review-message", "role": "status"}));
  approve.addEventListener("click", () => decide(runId, "approve"));
  reject.addEventListener("click", () => decide(runId, "reject"));
}

async function decide(runId, decision) {
  const field = document.getElementById("review-reason");
  const reason = field.value.trim();
  if (decision === "reject" && !reason) {
    say("review-message", "a rejection needs a reason: say why in the box", true);
    field.focus();
    return;
  }
  const buttons = document.querySelectorAll("#review-form button");
  buttons.forEach(b => { b.disabled = true; });
  say("review-message", (decision === "approve" ? "approving" : "rejecting") + " ...");
  const body = reason ? {decision, reason} : {decision};
  let response, answer = null;
  try {
    response = await fetch("/api/runs/" + encodeURIComponent(runId) + "/decision", {
      method: "POST", body: JSON.stringify(body),
      headers: {"Content-Type": "application/json", "Accept": "application/json", "X-D2ops-Console": "1"}});
    try { answer = await response.json(); } catch (e) { answer = null; }
  } catch (e) {
    response = {ok: false, status: 0};
    answer = {message: String(e)};
  }
  if (!response.ok) {
    say("review-message", "not decided: " + ((answer && answer.message) || ("HTTP " + response.status)), true);
    buttons.forEach(b => { b.disabled = false; });
    return;
  }
  say("message", `run ${runId} ${answer.decision} by ${answer.decided_by}: ${answer.reason}`);
  showRun(runId);  // the run view now shows the decision
}

// The run's dataset diff against the champion's dataset (its summary; the whole diff is at its uri,
// and `d2ops diff s3://<ArtifactsBucket>/runs/<champion>/ s3://<ArtifactsBucket>/runs/<run>/` prints it).
function showDataDiff(run) {
  const box = document.getElementById("data-diff");
  const diff = run.dataset_diff;
  if (!diff) {
    box.append(el("p", {"class": "muted"}, "no data diff: no champion to compare with, or the run did not reach " +
                                          "training"));
    return;
  }
  if (diff.error) {
    box.append(el("p", {"id": "data-diff-error", "class": "error"}, "not computed: " + diff.error));
    return;
  }
  if (diff.same) {
    box.append(el("p", {"id": "data-diff-same"}, "same data as the champion's (" + diff.against + ")"));
    return;
  }
  const list = names => names && names.length ? names.join(", ") : null;
  facts(box.appendChild(el("dl", {"id": "data-diff-facts", "class": "facts"})), [
    ["against", diff.against + (diff.champion_run_id ? " (run " + diff.champion_run_id + ")" : "")],
    ["images", diff.images_a + " → " + diff.images_b],
    ["added", diff.added], ["removed", diff.removed], ["renamed", diff.renamed || null],
    ["changed bytes", diff.content_changed || null], ["relabelled", diff.annotations_changed || null],
    ["moved train↔val", diff.split_moved || null],
    ["from the champion's train to val", diff.train_to_val || null],
    ["instances", (diff.instances_delta > 0 ? "+" : "") + diff.instances_delta],
    ["new classes", list(diff.classes_new)], ["vanished classes", list(diff.classes_vanished)],
    ["full diff", diff.uri]]);
  if (diff.largest_shifts && diff.largest_shifts.length) {
    box.append(table(["class", "champion", "this run", "shift"], diff.largest_shifts.map(c => [
      c.name, c.instances_a, c.instances_b, (c.instances_b >= c.instances_a ? "+" : "") + (c.instances_b - c.instances_a)]),
      {"id": "data-diff-classes"}));
  }
  if (diff.train_to_val) {  // the champion trained on them: the comparison leaves them out
    box.append(el("p", {"id": "data-diff-train-to-val", "class": "error"},
                  "warning: " + diff.train_to_val + " val image(s) of this run are in the champion's training split" +
                  (diff.train_to_val_examples && diff.train_to_val_examples.length
                   ? " (e.g. " + diff.train_to_val_examples.slice(0, 3).join(", ") + ")" : "") +
                  ": the comparison leaves them out"));
  }
  for (const note of diff.notes || []) box.append(el("p", {"class": "muted"}, note));
}

async function showEvaluation(runId, run) {
  const box = document.getElementById("evaluation");
  let report;
  try {
    report = await api("/runs/" + encodeURIComponent(runId) + "/evaluation");
  } catch (e) {
    box.append(el("p", {"class": "muted"}, e.status === 404 ? "no evaluation report" : "evaluation: " + e.message));
    showErrors(null);
    return;
  }
  showErrors(report.errors, report.primary_metric.startsWith("segm") ? "segm" : "bbox");
  const models = {"challenger": report.challenger};
  if (report.champion) models.champion = report.champion;
  const names = [...new Set(Object.values(models).flatMap(m => Object.keys(m.metrics)))].sort();
  box.append(table(["metric", ...Object.keys(models)],
    names.map(n => [n, ...Object.values(models).map(m => el("td", {"class": "num"}, fmtNumber(m.metrics[n], 4)))]),
    {"id": "evaluation-metrics"}));
  box.append(el("p", {"class": "muted"}, `${report.val_images} val images; ${report.report_uri}`));
  if (report.truncated) {  // over Lambda's 6 MB: parts left out, the whole documents linked (presigned)
    const note = el("p", {"class": "muted", "id": "evaluation-truncated"},
                    "too large for one answer; left out: " + report.left_out.join(", ") + ". Whole documents:");
    for (const link of report.full_report.filter(l => /^https?:\/\//.test(l.url))) {
      note.append(" ", el("a", {"href": link.url, "rel": "noreferrer"}, link.name));
    }
    box.append(note);
  }
  const iou = report.primary_metric.startsWith("segm") ? "segm" : "bbox";
  const classes = [...new Set(Object.values(models).flatMap(m => Object.keys(m.per_class)))].sort();
  box.append(perClassChart(classes, models, iou + "_AP"));
  if (!report.pr_curves) {
    box.append(el("p", {"class": "muted"}, "this report has no precision-recall curves"));
    return;
  }
  const charts = el("div", {"class": "charts", "id": "pr-curves"});
  for (const name of classes) charts.append(prChart(name, report.pr_curves, iou, models));
  box.append(charts);
}

// ----- error analysis (report/errors.json, d2ops_core.documents.error_analysis) ------------------------
const MAX_SIZE_ROWS = 40;

function showErrors(errors, primaryIou) {
  const box = document.getElementById("errors");
  if (!errors) {
    box.append(el("p", {"class": "muted"}, "no error analysis (reports written before it have none)"));
    return;
  }
  const who = Object.keys(errors.models);
  // AP by size of the primary IoU type (segm for instance segmentation); the matrix is on boxes
  const iou = primaryIou in errors.models.challenger.ap_by_size ? primaryIou : "bbox";
  const sizeCells = sizes => ["small", "medium", "large"].map(
    s => el("td", {"class": "num"}, fmtNumber((sizes || {})[s])));
  const perClass = w => (errors.models[w].per_class_ap_by_size || {})[iou] || {};
  const classes = [...new Set(who.flatMap(w => Object.keys(perClass(w))))].sort();
  const rows = [["all classes", ...who.flatMap(w => sizeCells(errors.models[w].ap_by_size[iou]))],
                ...classes.slice(0, MAX_SIZE_ROWS).map(c => [c, ...who.flatMap(w => sizeCells(perClass(w)[c]))])];
  box.append(el("h4", {}, iou + " AP by object size (small < 32², medium < 96², large ≥ 96² pixels)"));
  box.append(table(["class", ...who.flatMap(w => [w + " small", w + " medium", w + " large"])], rows,
                   {"id": "ap-by-size"}));
  if (classes.length > MAX_SIZE_ROWS) {
    box.append(el("p", {"class": "muted"}, `${classes.length - MAX_SIZE_ROWS} more classes in errors.json`));
  }
  const matrices = el("div", {"class": "columns"});
  for (const w of who) matrices.append(confusionTable(w, errors.models[w], errors.iou_threshold));
  box.append(matrices);
  box.append(el("h4", {}, "The challenger's worst val images, each model's boxes drawn"));
  box.append(el("p", {"class": "muted"}, "ranked by " + errors.error_score));
  const legend = el("p", {"class": "legend", "id": "error-legend"});
  for (const [colour, meaning] of Object.entries(errors.legend)) {
    const swatch = el("b", {}, "■ ");
    swatch.style.color = colour;
    legend.append(el("span", {}, swatch, meaning));
  }
  box.append(legend);
  if (!errors.gallery.length) {
    box.append(el("p", {"class": "muted", "id": "error-gallery"}, "no errors at these thresholds"));
    return;
  }
  const gallery = el("div", {"class": "gallery", "id": "error-gallery"});
  for (const image of errors.gallery) {
    const pair = el("div", {"class": "pair"});
    for (const w of who) {
      const count = image.errors[w];
      const uri = (image.thumbnails || {})[w];
      if (!count || !uri || !uri.startsWith("data:image/")) continue;  // only pictures the job drew, inline
      pair.append(el("div", {"class": "worst-model", "data-model": w},
        el("img", {"src": uri, "alt": `${w}: ${image.file_name}`}),
        el("div", {}, `${w}: ${count.missed} missed, ${count.false_positives} false positive(s), ` +
                      `${count.confused} confused`)));
    }
    gallery.append(el("figure", {"class": "worst", "data-image": image.image_id}, pair,
                      el("figcaption", {}, image.file_name)));
  }
  box.append(gallery);
}

function confusionTable(who, model, iouThreshold) {
  // rows: the true class (the last, background: false positives); columns: the predicted class (the last,
  // background: missed objects); a cell is shaded by its share of the row, the diagonal blue, errors red
  const m = model.confusion;
  const t = el("table", {"class": "confusion", "data-model": who});
  t.append(el("caption", {}, `${who}: confusion at IoU ${iouThreshold}, thresholds ${model.thresholds_from}`));
  t.append(el("thead", {}, el("tr", {}, el("th", {}, "true \\ predicted"),
                                ...m.labels.map(l => el("th", {"scope": "col"}, l)))));
  const body = el("tbody");
  m.labels.forEach((label, i) => {
    const total = m.counts[i].reduce((a, b) => a + b, 0) || 1;
    const cells = m.counts[i].map((n, j) => {
      const share = n / total, diagonal = i === j && i !== m.labels.length - 1;  // the last is background, by place
      const cell = el("td", {"data-true": label, "data-predicted": m.labels[j]}, String(n));
      // the CSSOM, not a style attribute: the page's CSP (style-src 'self') refuses inline styles
      cell.style.background = `rgba(${diagonal ? "30,144,255" : "255,0,0"},${share.toFixed(2)})`;
      return cell;
    });
    body.append(el("tr", {}, el("th", {"scope": "row"}, label), ...cells));
  });
  t.append(body);
  const t2 = model.totals;
  return el("div", {}, t, el("p", {"class": "muted"}, `${t2.objects} objects, ${t2.correct} found, ` +
    `${t2.confused} confused, ${t2.missed} missed; ${t2.false_positives} false positive(s)` +
    (m.folded.length ? `; ${m.folded.length} classes folded into one row` : "")));
}

function perClassChart(classes, models, metric) {
  const who = Object.keys(models);
  const barH = 12, groupH = barH * who.length + 8, left = 110, width = 460;
  const height = classes.length * groupH + 40;
  const root = svg("svg", {"id": "per-class-ap", "width": width + 20, "height": height});
  root.append(svg("text", {"x": 0, "y": 14, "font-size": 13, "font-weight": "bold"}, `per-class ${metric}`));
  who.forEach((w, i) => {
    const x = 180 + i * 110;  // right of the title
    root.append(svg("rect", {"x": x, "y": 4, "width": 10, "height": 10, "fill": MODEL_COLOURS[w]}));
    root.append(svg("text", {"x": x + 14, "y": 13, "font-size": 11}, w));
  });
  const scale = width - left - 50;
  classes.forEach((name, row) => {
    const y0 = 24 + row * groupH;
    root.append(svg("text", {"x": left - 6, "y": y0 + groupH / 2 + 2, "text-anchor": "end", "font-size": 11}, name));
    who.forEach((w, i) => {
      const value = (models[w].per_class[name] || {})[metric];
      const y = y0 + i * barH;
      const bar = svg("rect", {"class": "bar " + w, "data-class": name, "x": left, "y": y,
                               "width": Math.max(0, (value || 0) * scale), "height": barH - 2, "fill": MODEL_COLOURS[w]});
      bar.append(svg("title", {}, `${w} ${name}: ${fmtNumber(value, 4)}`));
      root.append(bar);
      root.append(svg("text", {"x": left + Math.max(0, (value || 0) * scale) + 4, "y": y + barH - 3,
                               "font-size": 10}, fmtNumber(value, 3)));
    });
  });
  return root;
}

function prChart(name, curves, iou, models) {
  const size = 200, pad = 30;
  const root = svg("svg", {"class": "pr-curve", "data-class": name, "width": size + pad + 10, "height": size + pad + 24});
  root.append(svg("text", {"x": pad, "y": 14, "font-size": 12, "font-weight": "bold"}, name));
  const x = r => pad + r * size, y = p => 20 + (1 - p) * size;
  root.append(svg("rect", {"x": pad, "y": 20, "width": size, "height": size, "fill": "none", "stroke": "#bbb"}));
  for (const t of [0, 0.5, 1]) {
    root.append(svg("text", {"x": x(t), "y": 20 + size + 12, "font-size": 9, "text-anchor": "middle"}, t));
    root.append(svg("text", {"x": pad - 4, "y": y(t) + 3, "font-size": 9, "text-anchor": "end"}, t));
  }
  root.append(svg("text", {"x": pad + size / 2, "y": 20 + size + 24, "font-size": 10, "text-anchor": "middle"},
                  "recall (solid IoU .5, dashed .5:.95)"));
  for (const who of Object.keys(models)) {
    const curve = (((curves.curves[who] || {})[iou]) || {})[name];
    if (!curve) continue;
    for (const [key, dash] of [["iou50", null], ["iou50_95", "4,3"]]) {
      const points = curves.recall.map((r, i) => [r, curve[key][i]]).filter(([, p]) => p !== null);
      if (!points.length) continue;
      const line = svg("polyline", {"class": `curve ${who} ${key}`, "fill": "none", "stroke": MODEL_COLOURS[who],
                                    "stroke-width": 1.6, "points": points.map(([r, p]) => `${x(r)},${y(p)}`).join(" ")});
      if (dash) line.setAttribute("stroke-dasharray", dash);
      line.append(svg("title", {}, `${who} ${key}`));
      root.append(line);
    }
  }
  return root;
}

async function showDeployment(run) {
  const box = document.getElementById("deployment");
  const endpoint = run.endpoint;
  const failure = run.failure || {};
  let name = endpoint && endpoint.name;
  if (endpoint) {
    facts(box.appendChild(el("dl", {"class": "facts", "id": "deployment-facts"})), [
      ["endpoint", endpoint.name], ["mode", endpoint.mode === "update" ? "update (blue/green)" : endpoint.mode],
      ["status", endpoint.status], ["endpoint config", endpoint.endpoint_config],
      ["model package", run.model_package_arn],
      ["rollback", failure.rollback ? (failure.rollback.action || JSON.stringify(failure.rollback)) : null]]);
  } else {
    box.append(el("p", {"class": "muted"}, "this run did not deploy" +
                                         (run.model_package_arn ? " (model package " + run.model_package_arn + ")" : "")));
  }
  if (!name) {
    try {
      const models = await api("/models?limit=1");
      name = models.champion ? models.champion.endpoint_name : null;
    } catch (e) { name = null; }
  }
  document.getElementById("try-form-endpoint").value = name || "";
  document.getElementById("try-endpoint").textContent = name ? "endpoint " + name : "no endpoint yet";
  if (name) await showMonitoring(document.getElementById("monitoring"), name, await showHistory(name));
  else document.getElementById("history").append(el("p", {"class": "muted"}, "no endpoint has been deployed yet"));
}

async function showHistory(name) {
  const box = document.getElementById("history");
  let history;
  try {
    history = await api("/endpoints/" + encodeURIComponent(name) + "/history");
  } catch (e) {
    box.append(el("p", {"class": "muted"}, e.status === 404 ? `endpoint ${name}: no recorded deployments`
                                                             : "history: " + e.message));
    return null;
  }
  box.append(table(["run", "dataset", "model package", "metric", "served from", "served to", "why it was promoted",
                    "why it was replaced"],
    history.served.map(p => [p.run_id, p.dataset_name + " " + p.dataset_version, p.model_package_arn,
                             `${p.primary_metric} ${fmtNumber(p.primary_value, 4)}`, p.served_from,
                             p.served_to || "serving now", p.promoted_because, p.why_replaced || "-"]),
    {"id": "history-served"}));
  if (history.rolled_back.length) {
    box.append(el("p", {}, "Deployments rolled back:"));
    // rolled_back_by: the pipeline's own check, or SageMaker's auto-rollback on the named alarms.
    box.append(table(["run", "dataset", "model package", "at", "rolled back by", "why", "what undoing did",
                      "kept serving"],
      history.rolled_back.map(r => [r.run_id, r.dataset_name + " " + r.dataset_version, r.model_package_arn || "-",
                                    r.at, rolledBackBy(r), r.why, r.action || "-", r.kept_serving || "-"]),
      {"id": "history-rolled-back"}));
  }
  return history;
}

// ----- the endpoint's monitoring ------------------------------------------------------------
// GET /endpoints/{name}/monitoring (the monitor's windows, newest first) beside the endpoint's history: a strip
// of the windows' verdicts, then one small chart a statistic, its test value (blue points, joined) against its
// threshold (red dashes) over the windows' start times. A window where the statistic drifted is a larger red
// point; each deployment (a served period's start) is a purple vertical line across every chart.
const VERDICT_COLOURS = {"ok": "#2e7d32", "drifted": "#c62828", "too_few_records": "#9e9e9e",
                         "no_baseline": "#e0e0e0"};
const DEPLOYMENT_COLOUR = "#6a1b9a";
const MONITORING_LIMIT = 168;  // a week of hourly windows

async function showEndpointLink() {
  const box = clear("endpoint-link");
  try {
    const models = await api("/models?limit=1");
    const name = models.champion ? models.champion.endpoint_name : null;
    if (name) box.append("endpoint " + name + ": ", el("a", {"href": "#monitoring=" + encodeURIComponent(name)},
                                                        "monitoring"));
  } catch (e) { /* no registry yet: no link */ }
}

async function showMonitoringView(name) {
  currentView += 1;
  document.getElementById("runs-view").hidden = true;
  document.getElementById("run-view").hidden = true;
  document.getElementById("monitoring-view").hidden = false;
  document.getElementById("monitoring-title").textContent = "Monitoring of endpoint " + name;
  const box = clear("monitoring-page");
  let history = null;
  try {
    history = await api("/endpoints/" + encodeURIComponent(name) + "/history");
  } catch (e) {
    box.append(el("p", {"class": "muted"}, e.status === 404 ? "no recorded deployments to draw"
                                                             : "history: " + e.message));
  }
  await showMonitoring(box, name, history);
}

async function showMonitoring(box, name, history) {
  let answer;
  try {
    answer = await api("/endpoints/" + encodeURIComponent(name) + "/monitoring?limit=" + MONITORING_LIMIT);
  } catch (e) {
    box.append(el("p", {"class": "error"}, "monitoring: " + e.message));
    return;
  }
  box.append(monitoringPanel(answer, history));
}

function fmtMinute(t) {
  return new Date(t).toISOString().slice(5, 16).replace("T", " ");
}

function monitoringPanel(answer, history) {
  const panel = el("div", {"class": "monitoring-panel"});
  for (const p of answer.problems || []) panel.append(el("p", {"class": "error problem"}, p.key + ": " + p.message));
  const windows = answer.windows.slice().reverse();  // oldest first: time runs left to right
  if (!windows.length) {
    panel.append(el("p", {"class": "muted"}, `endpoint ${answer.endpoint}: no monitoring windows yet (the monitor `
                                             + "writes one per window of captured traffic)"));
    return panel;
  }
  const newest = answer.windows[0];
  const drifted = windows.filter(w => w.verdict === "drifted");
  const moved = newest.statistics.filter(s => s.drifted).map(s => s.statistic).join(", ");
  panel.append(el("p", {"class": "monitoring-summary"},
    `${windows.length} window(s) from ${windows[0].window_start} to ${newest.window_start}; `,
    el("span", {"class": drifted.length ? "drifted" : ""}, `${drifted.length} drifted`),
    "; newest ", el("span", {"class": "verdict-" + newest.verdict}, newest.verdict + (moved ? " (" + moved + ")" : "")),
    answer.older_windows ? " (older windows not shown)" : ""));
  const times = windows.map(w => Date.parse(w.window_start));
  let t0 = Math.min(...times), t1 = Math.max(...times.map((t, i) => Math.max(t, Date.parse(windows[i].window_end))));
  if (t1 <= t0) t1 = t0 + 3600e3;
  const deployments = ((history && history.served) || []).map(p => ({run: p.run_id, at: Date.parse(p.served_from),
    label: `${p.run_id} (${p.dataset_name} ${p.dataset_version}) deployed ${p.served_from}`}))
    .filter(d => d.at >= t0 && d.at <= t1);
  const names = [];
  for (const w of answer.windows) for (const s of w.statistics) if (!names.includes(s.statistic)) names.push(s.statistic);
  const driftedIn = n => windows.filter(w => w.statistics.some(s => s.statistic === n && s.drifted)).length;
  names.sort((a, b) => driftedIn(b) - driftedIn(a));  // what moved first (a stable sort keeps the monitor's order)
  panel.append(verdictStrip(windows, t0, t1, deployments));
  const charts = el("div", {"class": "monitoring-charts"});
  for (const name of names) charts.append(statisticChart(name, windows, t0, t1, deployments));
  panel.append(charts);
  panel.append(el("p", {"class": "legend"}, el("span", {}, "blue: the test's value"),
                  el("span", {}, "red dashes: its threshold"), el("span", {}, "large red point: drifted"),
                  el("span", {}, "purple line: a deployment"),
                  el("span", {}, "verdict: green ok, red drifted, grey too few records, pale no baseline")));
  return panel;
}

function timeAxis(root, t0, t1, left, plotW, top, plotH) {
  const x = t => left + (t - t0) / (t1 - t0) * plotW;
  for (const [t, anchor] of [[t0, "start"], [t1, "end"]]) {
    root.append(svg("text", {"x": x(t), "y": top + plotH + 11, "font-size": 9, "text-anchor": anchor}, fmtMinute(t)));
  }
  return x;
}

function deploymentLines(root, deployments, x, top, plotH) {
  for (const d of deployments) {
    const line = svg("line", {"class": "deployment", "data-run": d.run, "x1": x(d.at), "x2": x(d.at), "y1": top - 2,
                              "y2": top + plotH, "stroke": DEPLOYMENT_COLOUR, "stroke-width": 1.5});
    line.append(svg("title", {}, d.label));
    root.append(line);
  }
}

function verdictStrip(windows, t0, t1, deployments) {
  const width = 736, height = 40, left = 44, right = 10, top = 4, plotH = 18, plotW = width - left - right;
  const root = svg("svg", {"class": "verdict-strip", "width": width, "height": height});
  root.append(svg("text", {"x": left - 4, "y": top + 13, "font-size": 10, "text-anchor": "end"}, "verdict"));
  const x = timeAxis(root, t0, t1, left, plotW, top, plotH);
  for (const w of windows) {
    const start = Date.parse(w.window_start), end = Date.parse(w.window_end);
    const cell = svg("rect", {"class": "window verdict-" + w.verdict, "data-start": w.window_start, "x": x(start),
                              "y": top, "width": Math.max(2, x(Math.min(end, t1)) - x(start) - 0.5), "height": plotH,
                              "fill": VERDICT_COLOURS[w.verdict] || "#bdbdbd"});
    cell.append(svg("title", {}, `${w.window_start}: ${w.verdict}, ${w.records} records` +
                                (w.unreadable ? `, ${w.unreadable} unreadable` : "")));
    root.append(cell);
  }
  deploymentLines(root, deployments, x, top, plotH);
  return root;
}

function statisticChart(name, windows, t0, t1, deployments) {
  const width = 360, height = 140, left = 44, right = 10, top = 20, bottom = 16;
  const plotW = width - left - right, plotH = height - top - bottom;
  const points = windows.map(w => [w, w.statistics.find(s => s.statistic === name)]).filter(([, s]) => s);
  const test = points.length ? points[points.length - 1][1].test : "";
  const root = svg("svg", {"class": "monitoring-chart", "data-statistic": name, "width": width, "height": height});
  root.append(svg("text", {"x": left, "y": 13, "font-size": 12, "font-weight": "bold"},
                  `${name} (${test === "ks" ? "KS distance" : "PSI"})`));
  root.append(svg("rect", {"x": left, "y": top, "width": plotW, "height": plotH, "fill": "none", "stroke": "#bbb"}));
  const yMax = Math.max(...points.flatMap(([, s]) => [s.value, s.threshold]), 1e-6) * 1.15;
  const y = v => top + (1 - Math.max(0, v) / yMax) * plotH;
  for (const value of [0, yMax]) {
    root.append(svg("text", {"x": left - 4, "y": y(value) + 3, "font-size": 9, "text-anchor": "end"},
                    fmtNumber(value, 2)));
  }
  const x = timeAxis(root, t0, t1, left, plotW, top, plotH);
  deploymentLines(root, deployments, x, top, plotH);
  const at = ([w]) => x((Date.parse(w.window_start) + Date.parse(w.window_end)) / 2);  // the window's middle
  root.append(svg("polyline", {"class": "threshold", "fill": "none", "stroke": VERDICT_COLOURS.drifted,
                               "stroke-dasharray": "4 3", "stroke-width": 1.2,
                               "points": points.map(p => `${at(p)},${y(p[1].threshold)}`).join(" ")}));
  root.append(svg("polyline", {"class": "value", "fill": "none", "stroke": MODEL_COLOURS.challenger,
                               "stroke-width": 1.4, "points": points.map(p => `${at(p)},${y(p[1].value)}`).join(" ")}));
  for (const p of points) {
    const [w, s] = p;
    const dot = svg("circle", {"class": "point" + (s.drifted ? " drifted" : ""), "data-start": w.window_start,
                               "cx": at(p), "cy": y(s.value), "r": s.drifted ? 4.5 : 2.5,
                               "fill": s.drifted ? VERDICT_COLOURS.drifted : MODEL_COLOURS.challenger});
    dot.append(svg("title", {}, `${w.window_start}: ${name} ${fmtNumber(s.value, 3)} (threshold ` +
      `${fmtNumber(s.threshold, 3)})${s.drifted ? " DRIFTED" : ""}; ${w.records} records` +
      (s.baseline !== null && s.baseline !== undefined ? `; mean ${fmtNumber(s.window, 3)} vs baseline ` +
        fmtNumber(s.baseline, 3) : "")));
    root.append(dot);
  }
  return root;
}

function rolledBackBy(r) {
  if (r.rolled_back_by !== "alarm") return "pipeline";
  const alarms = (r.alarms || []).join(", ") || "an alarm no longer in ALARM";
  const reasons = (r.alarm_reasons || []).join("; ");
  return "alarm: " + alarms + (reasons ? " (" + reasons + ")" : "");
}

// ----- try an image ----------------------------------------------------------------------
async function tryImage(event) {
  event.preventDefault();
  const file = document.getElementById("try-file").files[0];
  const name = document.getElementById("try-form-endpoint").value;
  if (!file) { say("try-message", "choose an image first", true); return; }
  if (!name) { say("try-message", "no endpoint to send it to", true); return; }
  say("try-message", "sending " + file.name + " to " + name + " ...");
  const response = await fetch("/api/endpoints/" + encodeURIComponent(name) + "/invocations", {
    method: "POST", body: file,
    headers: {"Content-Type": file.type || "application/octet-stream", "X-D2ops-Console": "1",
              "X-Score-Threshold": document.getElementById("try-threshold").value}});
  let answer = null;
  try { answer = await response.json(); } catch (e) { answer = null; }
  if (!response.ok) {
    say("try-message", "the endpoint answered " + response.status + ": " + ((answer && answer.message) || "?"), true);
    return;
  }
  const detections = Array.isArray(answer) ? answer : (answer.detections || []);
  drawDetections(file, detections, answer.image || {});
  say("try-message", `${detections.length} detection(s)`);
}

function drawDetections(file, detections, image) {
  const canvas = clear("try-canvas");
  const list = clear("try-detections");
  const url = URL.createObjectURL(file);
  const probe = new Image();
  probe.onload = () => {
    const w = image.width || probe.naturalWidth, h = image.height || probe.naturalHeight;
    const scale = Math.max(1, Math.min(4, 512 / Math.max(w, h)));  // small images drawn larger
    canvas.setAttribute("width", w * scale);
    canvas.setAttribute("height", h * scale);
    canvas.setAttribute("viewBox", `0 0 ${w} ${h}`);
    canvas.setAttribute("data-detections", detections.length);
    canvas.append(svg("image", {"href": url, "x": 0, "y": 0, "width": w, "height": h}));
    detections.forEach((d, i) => {
      const [x1, y1, x2, y2] = d.box;
      const colour = BOX_COLOURS[(d.class_id || 0) % BOX_COLOURS.length];
      const rect = svg("rect", {"class": "detection", "x": x1, "y": y1, "width": x2 - x1, "height": y2 - y1,
                                "fill": "none", "stroke": colour, "stroke-width": Math.max(1, 2 / scale)});
      rect.append(svg("title", {}, `${d.class_name} ${d.score.toFixed(3)}`));
      canvas.append(rect);
      canvas.append(svg("text", {"x": x1 + 1, "y": Math.max(8 / scale, y1 - 1), "font-size": 10 / scale,
                                 "fill": colour}, `${d.class_name} ${d.score.toFixed(2)}`));
      list.append(el("li", {}, `${d.class_name} ${d.score.toFixed(3)} [${d.box.map(v => v.toFixed(1)).join(", ")}]`));
    });
  };
  probe.src = url;
}

// ----- routing -----------------------------------------------------------------------------
function route() {
  say("message", "");
  const match = /^#run=(.+)$/.exec(location.hash);
  const monitoring = /^#monitoring=(.+)$/.exec(location.hash);
  if (match) showRun(decodeURIComponent(match[1]));
  else if (monitoring) showMonitoringView(decodeURIComponent(monitoring[1]));
  else showRuns();
}

document.addEventListener("DOMContentLoaded", () => {
  const hidden = el("input", {"type": "hidden", "id": "try-form-endpoint"});
  document.getElementById("try").append(hidden);
  document.getElementById("try").addEventListener("submit", e => { tryImage(e).catch(err => say("try-message", String(err), true)); });
  window.addEventListener("hashchange", route);
  route();
});
