// launch dashboard: fills pages from the server's JSON and server-sent events. Text is set with textContent only.
"use strict";
function url(path, params) {
  const u = new URL(path, location.href);
  for (const [k, v] of Object.entries(params || {})) if (v !== "" && v != null) u.searchParams.set(k, v);
  const token = document.body.dataset.token;  // loaded in the head: the body is read when a page asks
  if (token) u.searchParams.set("token", token);
  return u.toString();
}
function cell(tr, text, cls) { const td = tr.insertCell(); td.textContent = text == null ? "-" : String(text); if (cls) td.className = cls; return td; }
function num(v, d) { return v == null ? "-" : Number(v).toFixed(d); }
function when(t) { return t == null ? "-" : new Date(t * 1000).toLocaleString(); }
function dur(a, b) { if (a == null) return "-"; const s = Math.round((b || Date.now() / 1000) - a); return s < 3600 ? `${Math.floor(s / 60)}m${s % 60}s` : `${Math.floor(s / 3600)}h${Math.floor(s % 3600 / 60)}m`; }

function launchJobs() {
  let jobs = [];
  const form = document.getElementById("filter"), body = document.querySelector("#jobs tbody");
  function draw() {
    const state = form.state.value, name = form.name.value.toLowerCase();
    body.replaceChildren();
    for (const j of jobs) {
      if (state && j.state !== state) continue;
      if (name && !(j.name || "").toLowerCase().includes(name) && !j.id.includes(name)) continue;
      const m = j.metrics || {}, tr = body.insertRow();
      const a = document.createElement("a"); a.href = url("/jobs/" + encodeURIComponent(j.id)); a.textContent = j.id;
      tr.insertCell().appendChild(a);
      cell(tr, j.state, "state-" + j.state); cell(tr, j.user); cell(tr, j.cluster);
      cell(tr, `${j.nnodes} x ${j.nproc_per_node}`);
      cell(tr, `${m.steps ?? 0} / ${j.max_steps ?? "?"}`); cell(tr, j.eta_s == null ? "-" : dur(0, j.eta_s));
      cell(tr, num(m.samples_per_sec, 1)); cell(tr, m.peak_mem_mb == null ? "-" : num(m.peak_mem_mb, 0) + " MB");
      cell(tr, when(j.started_at)); cell(tr, dur(j.started_at, j.ended_at));
    }
  }
  form.addEventListener("input", draw);
  const es = new EventSource(url("/api/jobs/events"));
  es.onmessage = (e) => { jobs = JSON.parse(e.data); draw(); };
}

const PLOTS = [["samples_per_sec", "samples/s", 1], ["step_time_s", "step time (s)", 1], ["loss", "loss", 1], ["mem_peak_bytes", "peak memory (MiB)", 1 / 1048576]];
function launchJob(id) {
  const logs = document.getElementById("logs"), form = document.getElementById("logfilter");
  let es = null;
  function follow() {
    if (es) es.close();
    logs.replaceChildren();
    es = new EventSource(url(`/api/jobs/${encodeURIComponent(id)}/logs`, { node: form.node.value, rank: form.rank.value, pattern: form.pattern.value }));
    es.addEventListener("lines", (e) => {
      const text = JSON.parse(e.data).join("\n") + "\n";
      logs.appendChild(document.createTextNode(text));
      if (form.follow.checked) logs.scrollTop = logs.scrollHeight;
    });
    es.addEventListener("end", () => es.close());
  }
  form.addEventListener("change", follow);
  follow();
  const plots = {}, box = document.getElementById("plots");
  const series = new EventSource(url(`/api/jobs/${encodeURIComponent(id)}/series`));
  series.onmessage = (e) => {
    const ranks = JSON.parse(e.data).ranks, names = Object.keys(ranks);
    if (!names.length) return;
    const steps = [...new Set(names.flatMap((r) => ranks[r].step))].sort((a, b) => a - b);
    for (const [key, label, scale] of PLOTS) {
      const cols = names.map((r) => { const at = new Map(ranks[r].step.map((s, i) => [s, ranks[r][key][i]])); return steps.map((s) => at.has(s) && at.get(s) != null ? at.get(s) * scale : null); });
      const d = [steps, ...cols];
      const p = plots[key];
      if (p && p.series.length === names.length + 1) { p.setData(d); continue; }
      if (p) p.destroy();
      const div = document.createElement("div"); div.dataset.plot = key; box.appendChild(div);
      plots[key] = new uPlot({ title: label, width: 420, height: 220, scales: { x: { time: false } }, axes: [{ label: "step" }, { size: 60 }], series: [{ label: "step" }, ...names.map((r, i) => ({ label: /^\d+$/.test(r) ? "rank " + r : r + " of the ranks", stroke: `hsl(${(i * 67) % 360},70%,45%)`, spanGaps: true }))] }, d, div);
    }
    box.dataset.points = String(steps.length);
  };
}

function launchCluster() {
  const body = document.querySelector("#cluster tbody"), waiting = document.getElementById("waiting"), read = document.getElementById("read");
  const es = new EventSource(url("/api/cluster/events"));
  es.onmessage = (e) => {
    const q = JSON.parse(e.data);
    read.textContent = q.error ? "cannot read the cluster: " + q.error : "read " + when(q.t);
    body.replaceChildren();
    for (const n of q.nodes) {
      if (n.error) { const tr = body.insertRow(); cell(tr, n.host); cell(tr, n.kind); cell(tr, "-"); cell(tr, n.lines[0], "error"); continue; }
      n.devices.forEach((d, i) => {
        const tr = body.insertRow(); tr.className = d.holder ? "held" : "free";
        cell(tr, n.host); cell(tr, n.kind === "gpu" ? "GPU" : "slot"); cell(tr, d.index); cell(tr, n.lines[i]);
      });
    }
    waiting.replaceChildren();
    if (!q.waiting.length) { const li = document.createElement("li"); li.textContent = "no job waiting"; waiting.appendChild(li); }
    for (const w of q.waiting) {
      const li = document.createElement("li");
      li.textContent = `job ${w.job} (user ${w.user}, from ${w.from}, since ${when(w.since)}) for ${w.hosts.join(", ")}`;
      waiting.appendChild(li);
    }
  };
}
