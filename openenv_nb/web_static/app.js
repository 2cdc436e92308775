// openenv-nb web interface: a form built from the action schema, driving this page's room (its
// episode) over /ws/ui. A page gets a room of its own; it joins another's only on purpose, by the
// share link (/web/?join=ID). Fork from here opens a new tab at /web/?fork=ID: a copy of this episode, going on
// on its own.
// Plain JavaScript, no framework, nothing fetched from the internet. Data is always set as text, never as HTML.
(() => {
  "use strict";
  const $ = (sel) => document.querySelector(sel);
  const el = (tag, attrs = {}, ...kids) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") e.className = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v === true ? "" : v);
    }
    for (const k of kids) if (k !== null && k !== undefined) e.append(k);
    return e;
  };

  const ui = { fields: [], resetFields: [], tools: [], tool: "", actionFields: [], history: [], maxHistory: 100, seq: 0, waiting: new Map(), ws: null, retry: 0,
               idle: false, token: "", room: null, began: false, busy: false, full: false };
  const JOIN = new URLSearchParams(location.search).get("join");  // the room it was opened for
  const FORK = new URLSearchParams(location.search).get("fork");  // the room it was opened to copy
  const AUTH = document.body.dataset.auth === "bearer";  // the server asks for a token (set by the server in the page)
  const TOKEN_KEY = "openenv-nb-token", IDLE = 4000;  // where the tab keeps the token; the close code of an idle page

  // ---- form rules (the same as `parse_field` in openenv_nb/web.py) ----
  const NUMBER = /^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/;
  const INTEGER = /^[+-]?\d+$/;
  const OMIT = Symbol("omit");
  const chars = (s) => [...s].length;

  function matches(pattern, s) {  // a pattern JavaScript cannot read is left to the server to check
    let re;
    try { re = new RegExp(pattern, "u"); } catch (e) { return true; }
    return re.test(s);
  }

  function parseField(spec, raw) {
    const k = spec.kind;
    if (k === "boolean") return !!raw;
    const s = raw === null || raw === undefined ? "" : String(raw);
    const isText = k === "string" || k === "textarea" || k === "code";
    if (!isText && s.trim() === "") {
      if (!spec.required) return OMIT;
      if (spec.nullable) return null;
      throw new Error("Required");
    }
    if (isText) {
      if (s === "") {  // nothing typed: a required field is marked, and nothing is sent
        if (!spec.required) return OMIT;
        if (spec.nullable) return null;
        throw new Error("Required");
      }
      if (spec.minLength != null && chars(s) < spec.minLength) throw new Error(`At least ${spec.minLength} characters`);
      if (spec.maxLength != null && chars(s) > spec.maxLength) throw new Error(`At most ${spec.maxLength} characters`);
      if (spec.pattern != null && !matches(spec.pattern, s)) throw new Error(`Must match ${spec.pattern}`);
      return s;
    }
    if (k === "enum") {
      const i = Number(s);
      if (!Number.isInteger(i) || i < 0 || i >= spec.options.length) throw new Error("Choose one of the options");
      return spec.options[i];
    }
    if (k === "integer" || k === "number") {
      const t = s.trim();
      if (k === "integer" && !INTEGER.test(t)) throw new Error("Must be a whole number");
      if (k === "number" && !NUMBER.test(t)) throw new Error("Must be a number");
      const v = Number(t);
      if (k === "integer" && !Number.isSafeInteger(v)) throw new Error("Must be a whole number");
      if (spec.minimum != null && v < spec.minimum) throw new Error(`Must be at least ${spec.minimum}`);
      if (spec.maximum != null && v > spec.maximum) throw new Error(`Must be at most ${spec.maximum}`);
      if (spec.exclusiveMinimum != null && v <= spec.exclusiveMinimum) throw new Error(`Must be more than ${spec.exclusiveMinimum}`);
      if (spec.exclusiveMaximum != null && v >= spec.exclusiveMaximum) throw new Error(`Must be less than ${spec.exclusiveMaximum}`);
      return v;
    }
    let v;  // json
    try { v = JSON.parse(s); } catch (e) { throw new Error("Not valid JSON"); }
    if (spec.json_type === "array" && !Array.isArray(v)) throw new Error("Must be a JSON array");
    if (spec.json_type === "object" && (v === null || typeof v !== "object" || Array.isArray(v))) throw new Error("Must be a JSON object");
    return v;
  }

  // ---- the rules of openenv_nb/forms.py that the page needs: images, tool failures and values ----
  const IMAGE_URL = /^data:image\/(png|jpeg|gif|webp|svg\+xml)[;,]/i;  // `forms.IMAGE_URL`
  const isImage = (v) => typeof v === "string" && IMAGE_URL.test(v);
  const PALETTE = ["#2563eb", "#ea580c", "#16a34a", "#9333ea", "#dc2626", "#0891b2", "#ca8a04", "#db2777"];  // the widget's

  function toolValue(r) {  // `mcp_client.tool_value`: a tool's data, else its structured content, else its text
    if (r === null || typeof r !== "object" || Array.isArray(r)) return r;
    if ("data" in r) return r.data;
    const sc = r.structuredContent ?? r.structured_content;
    if (sc !== null && sc !== undefined) { const ks = Object.keys(sc); return ks.length === 1 && ks[0] === "result" ? sc.result : sc; }
    const texts = (r.content || []).filter((c) => c && c.type === "text").map((c) => c.text);
    return texts.length === 1 ? texts[0] : texts;
  }

  function toolFailure(obs) {  // `widget.tool_failure`: why a tool call failed, or null
    if (!obs || !("tool_name" in obs)) return null;
    const err = obs.error, res = obs.result;
    if (err && typeof err === "object") return `${err.error_type || "error"}: ${err.message || ""}`;
    if (err) return String(err);
    if (res && typeof res === "object" && (res.is_error || res.isError)) return `tool error: ${brief(toolValue(res))}`;
    return null;
  }

  // ---- building the form ----
  function control(spec, id) {
    const k = spec.kind, d = spec.default;
    if (k === "boolean") return el("input", { type: "checkbox", id, name: spec.name, checked: d === true });
    if (k === "enum") {
      const sel = el("select", { id, name: spec.name });
      const hasDefault = spec.options.some((o) => o === d);
      if (!hasDefault || spec.nullable) sel.append(el("option", { value: "", text: "—" }));  // "none" or "choose one"
      spec.options.forEach((o, i) => sel.append(el("option", { value: String(i), text: String(o), selected: o === d && hasDefault })));
      return sel;
    }
    const text = d === undefined || d === null ? "" : (k === "json" ? JSON.stringify(d) : String(d));
    if (k === "textarea" || k === "code" || k === "json") {
      const t = el("textarea", { id, name: spec.name, class: k === "textarea" ? null : k === "json" ? "code json" : "code",
                                spellcheck: k === "textarea" ? null : "false" });
      t.value = text;
      return t;
    }
    const inp = el("input", { type: "text", id, name: spec.name, inputmode: k === "integer" ? "numeric" : k === "number" ? "decimal" : null });
    inp.value = text;
    return inp;
  }

  function typeLabel(spec) {
    if (spec.kind === "enum") return "choice";
    if (spec.kind === "json") return spec.json_type ? `JSON ${spec.json_type}` : "JSON";
    if (spec.kind === "textarea" || spec.kind === "code") return "string";
    return spec.kind;
  }

  function limits(spec) {
    const parts = [];
    if (spec.minimum != null) parts.push(`≥ ${spec.minimum}`);
    if (spec.exclusiveMinimum != null) parts.push(`> ${spec.exclusiveMinimum}`);
    if (spec.maximum != null) parts.push(`≤ ${spec.maximum}`);
    if (spec.exclusiveMaximum != null) parts.push(`< ${spec.exclusiveMaximum}`);
    if (spec.minLength != null) parts.push(`at least ${spec.minLength} chars`);
    if (spec.maxLength != null) parts.push(`at most ${spec.maxLength} chars`);
    if (spec.pattern != null) parts.push(`matches ${spec.pattern}`);
    return parts.join(", ");
  }

  function renderFields(container, specs, prefix) {
    container.replaceChildren();
    if (!specs.length) container.append(el("p", { class: "muted", text: "This action has no fields." }));
    for (const spec of specs) {
      const id = `${prefix}${spec.name}`, c = control(spec, id);
      c.setAttribute("aria-describedby", `error-${id}`);
      const hint = [spec.description, limits(spec)].filter(Boolean).join(" · ");
      const label = spec.kind === "boolean"
        ? el("label", { class: "check", for: id }, c, spec.label)
        : el("label", { for: id }, spec.label, spec.required && !spec.nullable ? el("span", { class: "req", title: "required", text: "*" }) : null,
             el("span", { class: "type", text: typeLabel(spec) }));
      container.append(el("div", { class: "field", "data-field": spec.name },
        label, hint ? el("div", { class: "hint" }, ...prose(hint)) : null, spec.kind === "boolean" ? null : c,
        el("div", { class: "error", id: `error-${id}`, "aria-live": "polite" })));
      c.addEventListener("input", () => setFieldError(prefix, spec.name, ""));
    }
  }

  function prose(text) {  // text with `backticked` parts as code, built as nodes (never parsed as HTML)
    return String(text).split("`").map((part, i) => (i % 2 ? el("code", { text: part }) : document.createTextNode(part)));
  }

  function chooseTool(name) {  // show the form of tool `name` ("" for the environment's own action)
    const t = ui.tools.find((x) => x.name === name);
    ui.tool = t ? name : "";
    ui.fields = t ? t.fields : ui.actionFields;
    $("#tool").value = ui.tool;
    $("#tool-about").replaceChildren(...prose(t ? t.description : ""));
    $("#step").textContent = ui.tool ? "Call" : "Step";
    renderButtons();
    renderFields($("#fields"), ui.fields, "field-");
  }

  function renderTools(d) {  // a tool environment: a picker of its tools, and the chosen one's form
    ui.tools = d.tools || []; ui.actionFields = d.fields;
    const own = !(ui.tools.length && d.tool_env);  // tools alone, or beside an action of the environment's own
    const sel = $("#tool");
    sel.replaceChildren(...(own ? [el("option", { value: "", text: "(the action)" })] : []),
                        ...ui.tools.map((t) => el("option", { value: t.name, text: t.name })));
    $("#tool-pick").hidden = !ui.tools.length;
    $("#action-title").textContent = ui.tools.length ? "Tools" : "Action";
    chooseTool(own ? "" : ui.tools[0].name);
  }

  function setFieldError(prefix, name, msg) {
    const c = document.getElementById(`${prefix}${name}`), e = document.getElementById(`error-${prefix}${name}`);
    if (!c || !e) return false;
    e.textContent = msg;
    if (msg) c.setAttribute("aria-invalid", "true"); else c.removeAttribute("aria-invalid");
    return true;
  }

  function collect(specs, prefix) {
    const data = {}, errors = {};
    for (const spec of specs) {
      const c = document.getElementById(`${prefix}${spec.name}`);
      try {
        const v = parseField(spec, spec.kind === "boolean" ? c.checked : c.value);
        if (v !== OMIT) data[spec.name] = v;
        setFieldError(prefix, spec.name, "");
      } catch (e) { errors[spec.name] = e.message; setFieldError(prefix, spec.name, e.message); }
    }
    const first = Object.keys(errors)[0];
    if (first) document.getElementById(`${prefix}${first}`).focus();
    return [data, errors];
  }

  // ---- talking to the server ----
  function basePath() { return location.pathname.replace(/\/web\/?$/, "").replace(/\/+$/, ""); }

  function wsURL() {
    const room = ui.room || JOIN;
    const q = room ? `?join=${encodeURIComponent(room)}` : FORK ? `?fork=${encodeURIComponent(FORK)}` : "";
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    return `${scheme}//${location.host}${basePath()}/ws/ui${q}`;
  }

  function shareURL(room) {
    return `${location.origin}${basePath()}/web/?join=${encodeURIComponent(room)}`;
  }

  function forkURL(room) {
    return `${location.origin}${basePath()}/web/?fork=${encodeURIComponent(room)}`;
  }

  // ---- the token: asked once, kept for the tab (sessionStorage), sent as a subprotocol (a page cannot set headers) ----
  function storedToken() {
    try { return sessionStorage.getItem(TOKEN_KEY) || ""; } catch (e) { return ui.token; }
  }

  function storeToken(t) {
    ui.token = t;
    try { if (t) sessionStorage.setItem(TOKEN_KEY, t); else sessionStorage.removeItem(TOKEN_KEY); } catch (e) { /* private mode */ }
  }

  function b64url(s) {
    let bin = "";
    for (const b of new TextEncoder().encode(s)) bin += String.fromCharCode(b);
    return btoa(bin).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }

  function askToken(why) {
    setStatus(false, "token needed");
    $("#token-error").textContent = why || "";
    $("#token-form").hidden = false;
    $("#token-input").value = "";
    $("#token-input").focus();
  }

  async function checkToken() {  // the socket was refused: was it the token? (the page cannot read a refused handshake)
    try {
      const r = await fetch(`${basePath()}/schema`, { headers: { Authorization: `Bearer ${storedToken()}` }, cache: "no-store" });
      if (r.status === 401) { storeToken(""); return askToken("The server refused this token."); }
    } catch (e) { /* the server is away: try again below */ }
    retryLater();
  }

  function send(type, data, onReply) {
    if (!ui.ws || ui.ws.readyState !== WebSocket.OPEN) { showMessage("Not connected to the server; retrying…"); return; }
    const id = ++ui.seq, frame = { type, id };
    if (data !== undefined) frame.data = data;
    ui.waiting.set(id, onReply || (() => {}));
    setBusy(true);
    ui.ws.send(JSON.stringify(frame));
  }

  function setBusy(busy) {
    ui.busy = busy;
    for (const b of document.querySelectorAll(".buttons button")) b.disabled = busy;
    renderButtons();
  }

  function renderButtons() {  // Reset leads until an episode exists (or is done)
    const last = ui.history[0], fresh = !ui.began || !!(last && last.done), step = $("#step");
    $("#reset").classList.toggle("primary", fresh);
    step.classList.toggle("primary", !fresh);
    step.disabled = ui.busy || !ui.began;
    $("#fork").disabled = ui.busy || !ui.began || !ui.room;
    step.title = ui.began ? `${step.textContent} (Ctrl+Enter)` : "Reset first: no episode yet";
    $("#step-hint").hidden = ui.began;
  }

  function retryLater() { setTimeout(connect, Math.min(5000, 300 * 2 ** ui.retry++)); }

  function connect() {
    ui.idle = false; ui.full = false;
    if (AUTH && !storedToken()) return askToken("");
    const ws = AUTH ? new WebSocket(wsURL(), ["openenv", `openenv.bearer.${b64url(storedToken())}`]) : new WebSocket(wsURL());
    let opened = false;
    ui.ws = ws;
    ws.onopen = () => { opened = true; ui.retry = 0; setStatus(true); };
    ws.onmessage = (ev) => {
      let m;
      try { m = JSON.parse(ev.data); } catch (e) { return showMessage("The server sent a frame that is not JSON."); }
      handle(m);
    };
    ws.onclose = (ev) => {
      if (ui.ws !== ws) return;
      setStatus(false); ui.waiting.clear(); setBusy(false);
      if (ev.code === IDLE) { ui.idle = true; return setStatus(false, "idle: click to reconnect"); }  // no retry until used
      if (ui.full) { ui.idle = true; return setStatus(false, "no room: click to retry"); }
      if (!opened && AUTH) return checkToken();
      retryLater();
    };
  }

  function wake() { if (ui.idle) connect(); }

  function handle(m) {
    const reply = m.id !== undefined ? ui.waiting.get(m.id) : undefined;
    if (reply) { ui.waiting.delete(m.id); if (!ui.waiting.size) setBusy(false); }
    switch (m.type) {
      case "snapshot": return snapshot(m.data);
      case "update": return update(m.data);
      case "pages": return setPages(m.data.count);
      case "observation": {
        const failed = toolFailure(m.data && m.data.observation);
        if (failed) showMessage(`${m.data.observation.tool_name}: ${failed}`); else hideMessage();
        return reply && reply(m);
      }
      case "state": setRaw(m); return showState(m.data);
      case "error":
        if (!reply && m.data && m.data.code === "CAPACITY_REACHED") ui.full = true;  // refused
        setRaw(m); return showError(m.data);
    }
  }

  function showError(d) {
    const errs = Array.isArray(d.errors) ? d.errors : [];
    const unplaced = [];
    for (const e of errs) {
      const loc = Array.isArray(e.loc) ? e.loc : [];
      const name = String(loc[0] ?? "");
      const placed = ui.fields.some((f) => f.name === name) && setFieldError("field-", name, e.msg || "Invalid value");
      if (!placed && !(ui.resetFields.some((f) => f.name === name) && setFieldError("reset-", name, e.msg || "Invalid value")))
        unplaced.push(`${loc.join(".") || "action"}: ${e.msg}`);
    }
    if (!errs.length || unplaced.length) showMessage(`${d.code || "ERROR"}: ${d.message || ""}${unplaced.length ? "\n" + unplaced.join("\n") : ""}`);
  }

  function showMessage(text) { const b = $("#message"); b.textContent = text; b.hidden = false; }
  function hideMessage() { $("#message").hidden = true; }

  function setStatus(on, text) {
    const s = $("#status");
    s.className = `pill ${on ? "on" : "off"}`;
    s.textContent = text || (on ? "live" : "reconnecting…");
  }

  function setPages(n) { $("#pages").textContent = n === 1 ? "1 page open" : `${n} pages open`; }

  // ---- rendering the episode ----
  function snapshot(d) {
    ui.resetFields = d.reset_fields; ui.maxHistory = d.max_history;
    $("#env-name").textContent = d.name;
    document.title = `${d.name} · openenv-nb`;
    $("#env-description").replaceChildren(...prose(d.description || ""));
    const form = JSON.stringify([d.fields, d.reset_fields, d.tools]);
    if (form !== ui.form) {  // a reconnect to the same environment keeps what was typed
      renderTools(d);
      renderFields($("#reset-fields"), ui.resetFields, "reset-");
      ui.form = form;
    }
    setPages(d.pages);
    hideMessage();  // a snapshot comes on (re)connecting: what went wrong before is over
    ui.room = d.room; ui.began = !!d.began;
    // a forked tab's address becomes its own share link: a reload joins the copy, not forks again
    if (FORK && location.search.includes("fork=")) history.replaceState(null, "", shareURL(d.room));
    renderRoom(d.room, d.notice);
    ui.history = d.history.slice();
    renderEpisode(d.episode);
  }

  function renderRoom(room, notice) {  // the share link; why it is new, if it is
    const link = $("#share-link"), url = shareURL(room);
    link.href = url; link.textContent = url;
    $("#share-what").textContent = room === "http"
      ? "This page drives the episode of the HTTP routes (/web/reset, /web/step); "
        + "watch or drive it from another tab: "
      : "Watch or drive this episode from another tab: ";
    $("#room").hidden = false;
    $("#notice").textContent = notice || "";
    $("#notice").hidden = !notice;
  }

  function update(d) {
    ui.began = true;
    if (d.entry.kind === "reset") ui.history = [];
    ui.history.unshift(d.entry);
    ui.history.length = Math.min(ui.history.length, ui.maxHistory);
    setRaw(replyOf(d.entry));
    renderEpisode(d.episode, true);
  }

  function replyOf(e) {  // the reply frame an entry came from, as the server sent it
    const data = { observation: e.observation, reward: e.reward, done: e.done };
    if (e.metadata && Object.keys(e.metadata).length) data.metadata = e.metadata;
    return { type: "observation", data };
  }

  function setRaw(frame) { $("#raw-json").textContent = JSON.stringify(frame, null, 2); }

  function renderEpisode(ep, fresh) {
    const last = ui.history[0];
    $("#stat-reward").textContent = last && last.reward !== null && last.reward !== undefined ? fmt(last.reward) : "–";
    const done = $("#stat-done");
    done.textContent = last ? (last.done ? "yes" : "no") : "–";
    done.classList.toggle("yes", !!(last && last.done));
    $("#stat-step").textContent = ep && ep.step_count !== null && ep.step_count !== undefined ? String(ep.step_count) : "–";
    $("#stat-episode").textContent = (ep && ep.episode_id) || "–";
    $("#stat-episode").title = (ep && ep.episode_id) || "";
    renderObservation(last);
    renderButtons();
    if (last && !fresh) setRaw(replyOf(last));
    renderPlot();
    renderHistory(fresh);
  }

  function fmt(x) {
    if (typeof x !== "number") return String(x);
    return Number.isInteger(x) ? String(x) : String(Math.round(x * 10000) / 10000);
  }

  function valueCell(v, depth = 0) {  // a value, readably: text with its line breaks, lists and objects unfolded (scrolling when long)
    if (v === null || v === undefined) return el("span", { class: "null", text: "null" });
    if (v === "") return el("span", { class: "null", text: "(empty)" });
    if (isImage(v)) return el("img", { class: "inline-image", src: v, alt: "image" });
    if (typeof v === "string") return v.includes("\n") || v.length > 80 ? el("pre", { class: "code", text: v }) : el("pre", { text: v });
    if (typeof v !== "object") return el("span", { text: fmt(v) });
    if (depth >= 2) return el("pre", { class: "code", text: JSON.stringify(v, null, 2) });
    if (Array.isArray(v)) {
      if (!v.length) return el("span", { class: "null", text: "(empty list)" });
      return el("ol", { class: "list", start: "0" }, ...v.map((x) => el("li", {}, valueCell(x, depth + 1))));
    }
    const rows = Object.entries(v).map(([k, x]) => el("tr", {}, el("th", { text: k }), el("td", {}, valueCell(x, depth + 1))));
    if (!rows.length) return el("span", { class: "null", text: "{}" });
    return el("div", { class: "nested" }, el("table", { class: "kv" }, el("tbody", {}, ...rows)));
  }

  function frames(obs, names) {  // the observation's images, each with its field's name under it
    return names.filter((n) => isImage(obs[n])).map((n) =>
      el("figure", { class: "frame", "data-field": n }, el("img", { src: obs[n], alt: n }), el("figcaption", { text: n })));
  }

  const isEmpty = (v) => v && typeof v === "object" && !Object.keys(v).length;

  function renderObservation(last) {
    const box = $("#observation");
    if (!last) return box.replaceChildren(el("p", { class: "muted" }, "No episode yet: press ", el("b", { text: "Reset" }), " to start one."));
    const obs = last.observation || {}, images = last.images || Object.keys(obs).filter((k) => isImage(obs[k]));
    const shown = Object.entries(obs).filter(([k]) => !images.includes(k) && !(k === "metadata" && last.metadata !== undefined || k === "metadata" && isEmpty(obs[k])));
    const rows = shown.map(([k, v]) => el("tr", {}, el("th", { text: k }), el("td", {}, valueCell(v))));
    if (last.metadata && Object.keys(last.metadata).length)
      rows.push(el("tr", {}, el("th", { text: "metadata" }), el("td", {}, valueCell(last.metadata))));
    if (!rows.length && !images.length) rows.push(el("tr", {}, el("td", { class: "muted", text: "(no fields)" })));
    const pics = frames(obs, images);
    box.replaceChildren(...(pics.length ? [el("div", { class: "frames" }, ...pics)] : []),
                        ...(rows.length ? [el("table", { class: "kv" }, el("tbody", {}, ...rows))] : []));
  }

  function plotSeries(steps) {  // `widget.plot_series`: the reward, then each rubric component but `total` (the reward's line)
    const ok = (v) => typeof v === "number" && Number.isFinite(v);
    const names = [...new Set(steps.flatMap((e) => Object.keys(e.rubric || {}).filter((k) => k !== "total")))];
    const series = [["reward", steps.map((e, i) => [i, e.reward]).filter(([, v]) => ok(v))],
                    ...names.map((n) => [n, steps.map((e, i) => [i, (e.rubric || {})[n]]).filter(([, v]) => ok(v))])];
    return series.filter(([, pts]) => pts.length);
  }

  function renderPlot() {
    const steps = ui.history.filter((e) => e.kind === "step" && (typeof e.reward === "number" || Object.keys(e.rubric || {}).length)).reverse();
    const box = $("#plot");
    if (!steps.length) return box.replaceChildren(el("p", { class: "muted", text: "Rewards appear here as you step." }));
    const series = plotSeries(steps);
    const W = Math.max(240, box.clientWidth || 600), H = 120, L = 40, R = 8, T = 10, B = 18;
    const ys = series.flatMap(([, pts]) => pts.map(([, v]) => v)), lo = Math.min(0, ...ys), hi = Math.max(0, ...ys), span = hi - lo || 1;
    const x = (i) => L + (steps.length === 1 ? (W - L - R) / 2 : (i * (W - L - R)) / (steps.length - 1));
    const y = (v) => T + (H - T - B) * (1 - (v - lo) / span);
    const NS = "http://www.w3.org/2000/svg";
    const s = (tag, attrs, text) => { const e = document.createElementNS(NS, tag); for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v); if (text !== undefined) e.textContent = text; return e; };
    const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "reward per step" });
    svg.append(s("line", { class: "axis", x1: L, x2: W - R, y1: y(0), y2: y(0) }));
    if (hi !== lo) svg.append(s("text", { class: "ylabel", x: 2, y: T + 8 }, fmt(hi)));  // all equal: one label, not two
    svg.append(s("text", { class: "ylabel", x: 2, y: hi === lo ? y(lo) + 3 : H - B }, fmt(lo)));
    svg.append(s("text", { x: steps.length === 1 ? x(0) : L, y: H - 4, "text-anchor": steps.length === 1 ? "middle" : "start" }, `step ${steps[0].step ?? 1}`));
    if (steps.length > 1) svg.append(s("text", { x: W - R, y: H - 4, "text-anchor": "end" }, `step ${steps[steps.length - 1].step ?? steps.length}`));
    series.forEach(([name, pts], k) => {
      const colour = PALETTE[k % PALETTE.length], main = name === "reward";
      const g = s("g", { class: main ? "series reward" : "series part", "data-name": name });
      g.append(s("polyline", { class: "line", stroke: colour, "stroke-width": main ? 2 : 1.5, "stroke-dasharray": main ? "none" : "4 3",
                               points: pts.map(([i, v]) => `${x(i)},${y(v)}`).join(" ") }));
      if (pts.length <= 60) pts.forEach(([i, v]) => g.append(s("circle", { class: "dot", fill: colour, cx: x(i), cy: y(v), r: main ? 2.5 : 2 })));
      svg.append(g);
    });
    const legend = series.length < 2 ? null : el("div", { class: "legend" },
      ...series.map(([name], k) => el("span", { "data-colour": PALETTE[k % PALETTE.length], text: `━ ${name}` })));
    box.replaceChildren(svg, ...(legend ? [legend] : []));
    if (legend) legend.querySelectorAll("span").forEach((sp) => { sp.style.color = sp.dataset.colour; });  // CSSOM, allowed by the CSP
  }


  function brief(v) {
    if (v === null || v === undefined) return "";
    const t = (typeof v === "string" ? v : JSON.stringify(v)).replace(/\r?\n/g, " ⏎ ");
    return t.length > 160 ? t.slice(0, 157) + "…" : t;
  }

  function describe(obj) {
    const entries = Object.entries(obj || {});
    if (entries.length === 1) return brief(entries[0][1]);
    return entries.map(([k, v]) => `${k}=${brief(v)}`).join(" ");
  }

  function did(action) {  // an action in one line: a tool call as `name(arg=value, ...)`
    if (action.type !== "call_tool") return describe(action);
    const args = Object.entries(action.arguments || {}).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(", ");
    return brief(`${action.tool_name}(${args})`);
  }

  function said(obs) {  // an observation in one line: a tool call's value or failure; images named, not spelled out
    if ("tool_name" in obs) return toolFailure(obs) || brief(toolValue(obs.result));
    return describe(Object.fromEntries(Object.entries(obs).filter(([k]) => k !== "metadata")
                                     .map(([k, v]) => [k, isImage(v) ? "[image]" : v])));
  }

  function renderHistory(fresh) {
    const body = $("#history tbody");
    body.replaceChildren(...ui.history.map((e, i) => {
      const action = e.kind === "reset" ? `reset ${describe(e.action)}`.trim() : did(e.action || {});
      const failed = toolFailure(e.observation);
      const obs = said(e.observation || {});
      return el("tr", { class: [e.kind, failed ? "failed" : "", fresh && i === 0 ? "fresh" : ""].join(" ").trim(), "data-n": e.n },
        el("td", { text: e.kind === "reset" ? "↺" : String(e.step ?? "") }), el("td", { text: action, title: action }),
        el("td", { text: obs, title: obs }), el("td", { class: "num", text: e.reward === null || e.reward === undefined ? "" : fmt(e.reward) }),
        el("td", { text: e.done ? "yes" : "" }));
    }));
    $("#history-count").textContent = ui.history.length ? `(${ui.history.length}, newest first)` : "";
  }

  function showState(data) {
    $("#state-card").hidden = false;
    $("#state-view").textContent = JSON.stringify(data, null, 2);
  }

  // ---- buttons ----
  $("#action-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    if (!ui.began) return showMessage("Reset first: no episode yet.");
    const [action, errors] = collect(ui.fields, "field-");
    if (Object.keys(errors).length) return;   // shown beside the fields; nothing is sent
    send("step", ui.tool ? { type: "call_tool", tool_name: ui.tool, arguments: action } : action);
  });
  $("#reset").addEventListener("click", () => {
    const [data, errors] = collect(ui.resetFields, "reset-");
    if (Object.keys(errors).length) { $("#reset-options").open = true; return; }
    send("reset", data);
  });
  $("#state").addEventListener("click", () => send("state"));
  $("#fork").addEventListener("click", () => {  // opened within the click, which browsers allow
    if (!ui.room) return;
    const url = forkURL(ui.room);
    if (!window.open(url, "_blank")) showMessage(`The browser kept the new tab from opening: open ${url}`);
  });
  $("#tool").addEventListener("change", (ev) => chooseTool(ev.target.value));
  let resizing;
  window.addEventListener("resize", () => { clearTimeout(resizing); resizing = setTimeout(renderPlot, 100); });
  document.addEventListener("keydown", (ev) => {
    if ((ev.ctrlKey || ev.metaKey) && ev.key === "Enter") { ev.preventDefault(); $("#action-form").requestSubmit(); }
  });

  $("#token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const t = $("#token-input").value;
    if (!t) return;
    storeToken(t);
    $("#token-input").value = "";
    $("#token-error").textContent = "";
    $("#token-form").hidden = true;
    connect();
  });
  for (const kind of ["pointerdown", "keydown", "focus"]) window.addEventListener(kind, wake, true);
  document.addEventListener("visibilitychange", () => { if (document.visibilityState === "visible") wake(); });

  connect();
})();
