// pglease serve: polls /api/state and renders it. Every value goes into
// the page as text (textContent), never as HTML.
"use strict";

let interval = 2000;

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function dur(ms) {
  if (ms === undefined || ms === null) return "-";
  const s = ms / 1000;
  if (s < 60) return s.toFixed(1) + "s";
  if (s < 3600) return Math.floor(s / 60) + "m" + String(Math.floor(s % 60)).padStart(2, "0") + "s";
  return Math.floor(s / 3600) + "h" + String(Math.floor((s % 3600) / 60)).padStart(2, "0") + "m";
}

function keyOf(o) { return o.key ? o.key : (o.key_hash || "-"); }

function fill(id, rows, cols, empty) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren();
  if (rows.length === 0) {
    const tr = el("tr");
    const td = el("td", empty, "empty");
    td.colSpan = cols;
    tr.append(td);
    body.append(tr);
    return;
  }
  for (const r of rows) body.append(r);
}

function render(st) {
  interval = st.interval_ms || interval;
  document.getElementById("meta").textContent = st.time + " · " + st.schema;
  document.getElementById("mode").textContent = st.can_revoke ? "revoke allowed (token)" : "read-only";
  const err = document.getElementById("error");
  err.hidden = !st.error;
  err.textContent = st.error || "";
  document.getElementById("nheld").textContent = "(" + st.holders.length + ")";
  document.getElementById("nwaiting").textContent = "(" + st.waiters.length + ")";
  document.getElementById("revoke").hidden = !st.can_revoke;

  fill("holders", st.holders.map((h) => {
    const tr = el("tr");
    tr.dataset.keyHash = h.key_hash || "";
    let kind = h.kind;
    if (h.kind === "permits") kind += " " + h.count + "/" + h.limit;
    if (h.kind === "readers") kind += " " + h.count;
    tr.append(el("td", keyOf(h), "key"), el("td", kind), el("td", h.holders.join(", ")), el("td", h.fence || "-"),
      el("td", dur(h.held_ms)), el("td", h.kind === "lease" ? "in " + dur(h.expires_in_ms) : "-"),
      el("td", h.queued ? h.waiting + " + " + h.queued + " in line" : h.waiting));
    const act = el("td");
    if (st.can_revoke && h.kind === "lease") {
      const b = el("button", "revoke");
      b.addEventListener("click", () => revoke(h.key_hash));
      act.append(b);
    }
    tr.append(act);
    return tr;
  }), 8, "nothing held");

  fill("waiters", st.waiters.map((w, i) => {
    const tr = el("tr");
    const what = w.position ? "queued #" + w.position + " (" + w.mode + ")" : w.what;
    tr.append(el("td", i + 1), el("td", keyOf(w), "key"), el("td", what), el("td", w.pid ? w.pid + " " + w.process : w.process),
      el("td", w.waiting_ms ? dur(w.waiting_ms) : "-"));
    return tr;
  }), 5, "nobody waits");

  fill("events", st.events.map((e) => {
    const tr = el("tr", null, e.kind);
    tr.append(el("td", e.time.replace("T", " ").replace(/\.\d+Z$/, "Z")), el("td", e.kind.replace("_", " ")), el("td", keyOf(e), "key"),
      el("td", e.holder || "-"), el("td", (e.fence || "").replace(/^0+/, "") || "-"), el("td", e.detail || ""));
    return tr;
  }), 6, "no change seen yet");

  chart(st.history);
}

function chart(points) {
  const svg = document.getElementById("chart");
  svg.replaceChildren();
  if (!points || points.length === 0) return;
  const ns = "http://www.w3.org/2000/svg";
  const max = Math.max(1, ...points.map((p) => Math.max(p.waiting, p.held)));
  const w = 600 / Math.max(points.length, 30);
  points.forEach((p, i) => {
    const x = 600 - (points.length - i) * w;
    for (const [v, cls, off] of [[p.held, "held", 0], [p.waiting, "waiting", w / 2]]) {
      const h = (v / max) * 110;
      const r = document.createElementNS(ns, "rect");
      r.setAttribute("x", String(x + off));
      r.setAttribute("y", String(118 - h));
      r.setAttribute("width", String(Math.max(w / 2 - 1, 0.5)));
      r.setAttribute("height", String(h));
      r.setAttribute("class", cls);
      const t = document.createElementNS(ns, "title");
      t.textContent = p.time + ": " + p.waiting + " waiting, " + p.held + " held";
      r.append(t);
      svg.append(r);
    }
  });
}

async function revoke(hash) {
  const out = document.getElementById("revokeResult");
  const token = document.getElementById("token").value;
  if (!token) { out.textContent = "enter the token first"; return; }
  if (!window.confirm("Revoke the lease of " + hash + "? Its holder is told at once.")) return;
  const res = await fetch("api/revoke", {
    method: "POST",
    headers: { "Content-Type": "application/json", "Authorization": "Bearer " + token },
    body: JSON.stringify({ key_hash: hash }),
  });
  const body = await res.json();
  out.textContent = body.result || body.error || String(res.status);
  refresh();
}

async function refresh() {
  try {
    const res = await fetch("api/state", { cache: "no-store" });
    if (!res.ok) throw new Error("state: HTTP " + res.status);
    render(await res.json());
    document.body.dataset.updated = String(Date.now());
  } catch (e) {
    const err = document.getElementById("error");
    err.hidden = false;
    err.textContent = "cannot reach pglease serve: " + e.message;
  }
}

async function loop() {
  await refresh();
  setTimeout(loop, Math.max(250, Math.min(interval, 5000)));
}

loop();
