// layerscope's HTML report: draws the profile embedded in #layerscope-data.
//
// Safety: every name in the data comes from user code. The page is built with
// createElement, textContent and setAttribute only; never innerHTML.
// Scale: the module tree builds rows only for expanded nodes, and at most
// CHILD_PAGE children of one node until asked for more; the icicle skips
// boxes narrower than half a pixel; the op table shows OP_PAGE rows at first.
// It runs after page.js (one script), whose helpers it takes from layerscopePage.
(function () {
  const started = performance.now();
  const CHILD_PAGE = 200;
  const OP_PAGE = 200;
  const { fmt, el, svg, section, showTip, hideTip, readData } = layerscopePage;

  // -- the data -------------------------------------------------------------------------
  const DATA = readData("layerscope-html/1");
  const META = DATA.meta || {};
  const TIMED = META.timed !== false;
  const PHASES = DATA.phases;
  const PHASE_LABEL = { forward: "Fwd", backward: "Bwd", recompute: "Recompute" };
  const nodes = DATA.nodes.map((raw, index) => {
    const phases = {};
    for (const [phase, values] of Object.entries(raw.phases)) {
      const stats = {};
      DATA.phase_fields.forEach((name, i) => { stats[name] = values[i]; });
      phases[phase] = stats;
    }
    return Object.assign({}, raw, { index, phases, children: [] });
  });
  const roots = [];
  for (const node of nodes) (node.parent < 0 ? roots : nodes[node.parent].children).push(node.index);
  const modelRoot = nodes[0];

  // A figure summed over a node's phases; null when no phase has it.
  function sum(node, field) {
    let total = null;
    for (const stats of Object.values(node.phases)) {
      if (stats[field] !== null && stats[field] !== undefined) total = (total || 0) + stats[field];
    }
    return total;
  }
  function busy(node) {
    let total = null;
    for (const stats of Object.values(node.phases)) {
      const value = stats.device_time_ns !== null && stats.device_time_ns !== undefined ? stats.device_time_ns : stats.cpu_time_ns;
      total = (total || 0) + value;
    }
    return total;
  }
  function phaseValue(node, phase, field) {
    const stats = node.phases[phase];
    return stats ? stats[field] : null;
  }
  const anyNode = (get) => nodes.some((n) => { const v = get(n); return v !== null && v !== undefined; });

  // -- the tree's columns -----------------------------------------------------------------
  function treeColumns() {
    const cols = [{ key: "type", label: "Type", kind: "text", get: (n) => n.type }];
    if (TIMED) {
      for (const phase of PHASES) {
        const label = PHASE_LABEL[phase] || phase;
        cols.push({ key: phase + "_self", label: label + " self", kind: "time", get: (n) => phaseValue(n, phase, "self_cpu_time_ns") });
        cols.push({ key: phase + "_total", label: label + " total", kind: "time", get: (n) => phaseValue(n, phase, "cpu_time_ns") });
      }
      if (anyNode((n) => sum(n, "device_time_ns"))) {
        cols.push({ key: "device", label: "Device total", kind: "time", get: (n) => sum(n, "device_time_ns") });
      }
    }
    if (anyNode((n) => sum(n, "flops") || n.flops_partial)) {
      // A count that leaves out ops without a formula: "N + ?", or "?" where nothing was counted.
      const partial = (n, v) => !n.flops_partial ? fmt.count(v) : v ? fmt.count(v) + " + ?" : "?";
      if (PHASES.length > 1) {
        // A step's FLOPs per phase, as the text tree and its footer name them: never one sum
        // that reads as a forward's.
        for (const phase of PHASES) {
          const get = (n) => phaseValue(n, phase, "flops");
          cols.push({ key: phase + "_flops", label: (PHASE_LABEL[phase] || phase) + " FLOPs", kind: "count", get, show: (n) => partial(n, get(n)) });
        }
      } else {
        cols.push({ key: "flops", label: "FLOPs", kind: "count", get: (n) => sum(n, "flops"), show: (n) => partial(n, sum(n, "flops")) });
        cols.push({ key: "macs", label: "MACs", kind: "count", get: (n) => sum(n, "macs"), show: (n) => partial(n, sum(n, "macs")) });
      }
      if (TIMED) {
        const rate = (n) => { const f = sum(n, "flops"); const t = busy(n); return f && t ? f * 1e9 / t : null; };
        cols.push({ key: "flop_rate", label: "FLOP/s", kind: "rate", get: rate, show: (n) => fmt.rate(sum(n, "flops"), busy(n)) });
        const peak = META.peak_flops_per_s;
        if (peak) {
          cols.push({ key: "mfu", label: "MFU", kind: "rate", get: (n) => { const r = rate(n); return r === null ? null : r / peak; },
            show: (n) => { const r = rate(n); return r === null ? "" : (100 * r / peak).toFixed(1) + "%"; } });
        }
      }
    }
    if (anyNode((n) => sum(n, "alloc_bytes"))) {
      cols.push({ key: "alloc", label: "Alloc", kind: "bytes", get: (n) => sum(n, "alloc_bytes") });
      cols.push({ key: "peak", label: "Peak mem", kind: "bytes", get: (n) => {
        let best = null;
        for (const stats of Object.values(n.phases)) if (stats.peak_bytes !== null && stats.peak_bytes !== undefined) best = Math.max(best || 0, stats.peak_bytes);
        return best;
      } });
      cols.push({ key: "activations", label: "Activations", kind: "bytes", get: (n) => phaseValue(n, "forward", "activation_bytes") });
    }
    if (anyNode((n) => sum(n, "comm_time_ns"))) {
      cols.push({ key: "comm_time", label: "Comm", kind: "time", get: (n) => sum(n, "comm_time_ns") });
      cols.push({ key: "comm_bytes", label: "Comm bytes", kind: "bytes", get: (n) => sum(n, "comm_bytes") });
    }
    // Counts are known on every node or on none (a profile from a trace without the model):
    // the column is there only when they are, as the text tree's.
    if (modelRoot.params_total !== null) {
      cols.push({ key: "params", label: "Params", kind: "params", get: (n) => (n.kind === "module" ? n.params_total : null) });
    }
    cols.push({ key: "calls", label: "Calls", kind: "int", get: (n) => (n.kind !== "module" && !n.calls ? null : n.calls) });
    for (const col of cols) {
      const get = col.get;
      // A node kept only to hold chosen subtrees (paths=) has no figures of its own.
      if (col.key !== "type") col.get = (n) => (n.profiled ? get(n) : null);
      if (!col.show) col.show = (n) => fmt.as(col.kind, col.get(n));
    }
    return cols;
  }

  // -- sections ---------------------------------------------------------------------------
  function header() {
    const facts = [];
    const fact = (label, value) => { if (value !== null && value !== undefined && value !== "") facts.push(el("div", { class: "fact" }, el("dt", { text: label }), el("dd", { text: value }))); };
    const source = META.mode === "trace" ? (META.source || {}) : null;
    fact("device", source && (source.device_names || []).length ? source.device_names.join(", ") : (META.device || "cpu"));
    if (META.world_size !== undefined && META.world_size !== null) fact("rank", (META.rank ?? "?") + " of " + META.world_size);
    fact("dtype", META.dtype ? META.dtype + (META.autocast ? " (autocast " + META.autocast + ")" : "") : "");
    fact("inputs", DATA.inputs_text);
    fact("torch", META.torch_version);
    fact("mode", modeText());
    if (source) {
      const how = META.modules_from || {};
      const placed = how.placement;
      fact("modules", placed
        ? how.method + ": " + placed.aligned + " of " + placed.ops + " forward ops aligned, " + placed.by_neighbours + " placed by neighbours, " + placed.unplaced + " in no module" + (placed.unaligned.length ? "; not aligned: " + placed.unaligned.join("; ") : "")
        : how.instances ? how.matched + " of " + how.instances + " instances: " + how.method
        : source.with_stack ? "none recorded (Python events but no nn.Module call: no module's forward ran while it recorded)"
        : "none recorded (no nn.Module events: read it with its model and inputs, or record with with_stack=True)");
      const device = META.device_events;
      if (device && (device.orphans || device.outside_steps)) {
        fact("device events in no node", [
          device.orphans ? device.orphans + " launched before the trace began (" + fmt.time(device.orphans_time_ns) + ")" : "",
          device.outside_steps ? device.outside_steps + " launched outside the steps (" + fmt.time(device.outside_steps_time_ns) + ")" : "",
        ].filter(Boolean).join("; "));
      }
      if (META.flops_unknown) fact("FLOPs unknown", META.flops_unknown);
    }
    if (META.peak_from) fact(META.peak_flops_per_s ? "MFU peak" : "MFU unknown", META.peak_from);
    // How noisy the figures are: the repeated passes' spread, or that one pass measured none.
    if (DATA.pass_spread !== null && DATA.pass_spread !== undefined) {
      fact("noise", "±" + (100 * DATA.pass_spread).toFixed(1) + "%: the " + (DATA.passes > 1 ? DATA.passes + " passes'" : "steps'") + " spread, (p90 − p10) / median");
    } else if (META.mode === "profile" || META.mode === "context") {
      fact("noise", "not measured: one pass (profile(repeat=…) or more steps measure it); a figure may be far from typical");
    }
    if (META.step_range) fact("steps", META.step_range[0] + "–" + META.step_range[1] + (META.steps !== undefined ? " (" + META.steps + " timed)" : ""));
    // A compiled model's block holds medians, not sums (its FLOPs are one eager step's).
    const compiled = DATA.compiled_steps_left_out;
    if (compiled !== null && compiled !== undefined) {
      const other = DATA.other_input_steps_left_out;
      fact("figures", "each node's median over the steps" + (compiled ? ", the " + compiled + " that compiled left out" : "") + (other ? ", the " + other + " with other calls than the FLOPs' count left out" : "") + " (a compiled model's block)");
    }
    // A block that detailed some steps and timed the others lightly: which steps gave what.
    if (META.detailed_steps) {
      fact("figures", "times: each node's mean over the " + META.steps + " light steps (timed without shapes or memory); FLOPs, calls, shapes, memory and op rows from step " + META.detailed_steps.join(", ") + ", recorded in detail (its times not used: op rows have none)");
    }
    const spread = DATA.step_spread;
    if (spread) {
      fact("step time", "median " + fmt.time(spread.median_ns) + ", p90 " + fmt.time(spread.p90_ns) + ", min " + fmt.time(spread.min_ns) + ", max " + fmt.time(spread.max_ns) + " over " + spread.steps + " steps");
      if (spread.outliers.length) {
        fact("steps far from the median (x" + spread.far + ")", spread.outliers.map(([n, ns]) => "step " + n + " " + fmt.time(ns) + " (x" + (ns / spread.median_ns).toPrecision(2) + ")").join(", ") + (spread.more ? " and " + spread.more + " more" : ""));
      }
    }
    // Unknown counts show as "?", as an op with no FLOP formula does: never as 0 or left out.
    fact("params", modelRoot.params_total === null ? "?"
      : fmt.count(modelRoot.params_total, "B") + (DATA.param_bytes ? " (" + fmt.bytes(DATA.param_bytes) + ")" : "")
        + (META.trainable_params !== undefined && META.trainable_params !== null && META.trainable_params < modelRoot.params_total
          ? ": " + fmt.count(META.trainable_params, "B") + " trainable, " + fmt.count(modelRoot.params_total - META.trainable_params, "B") + " frozen" : ""));
    const flops = sum(modelRoot, "flops");
    if (flops !== null) {
      // Summed over the phases the run had: say which, so a step's figure is not read as a forward's.
      const phases = Object.entries(modelRoot.phases).filter(([, st]) => st.flops !== null && st.flops !== undefined);
      const split = phases.length > 1 ? ": " + phases.map(([name, st]) => name + " " + fmt.count(st.flops)).join(" + ") : " (" + (phases[0] ? phases[0][0] : "forward") + ")";
      const counted = (v) => !modelRoot.flops_partial ? fmt.count(v) : v ? fmt.count(v) + " + ?" : "?";
      fact("FLOPs", counted(flops) + split + "; MACs " + counted(sum(modelRoot, "macs")));
    }
    // Where the steps' device time went, as the text footer's "Device busy" line says it.
    const ledger = DATA.device;
    if (ledger) {
      const reasons = Object.entries(ledger.unattributed_ns_by_reason || {}).map(([key, ns]) => (DATA.unattributed_reasons[key] || key) + " " + fmt.time(ns));
      const unattributed = Object.values(ledger.unattributed_ns_by_reason || {}).reduce((a, ns) => a + ns, 0);
      fact("device busy", fmt.time(ledger.busy_ns) + " = attributed " + fmt.time(ledger.attributed_ns) + " + unattributed " + fmt.time(unattributed) + (reasons.length ? " (" + reasons.join("; ") + ")" : ""));
      if (ledger.comm_ns) fact("device communication", fmt.time(ledger.comm_ns) + ", of which " + fmt.time(ledger.overlap_ns) + " overlapped with compute");
    }
    const unsupported = Object.keys(DATA.unsupported_ops || {});
    if (unsupported.length) fact("no FLOP formula", unsupported.join(", "));
    return el("header", { class: "card" },
      el("h1", {}, el("span", { text: String(META.model || modelRoot.type) }), el("span", { class: "muted", text: " · layerscope report" })),
      el("dl", { class: "facts" }, ...facts),
      breakdown());
  }

  function modeText() {
    if (META.mode === "profile") return "profile(): median of " + META.repeat + " passes after " + META.warmup + " warm-up";
    if (META.mode === "context") return "Profiler block" + (META.times_from === "dispatch mode" ? ", times under a dispatch mode" : "");
    if (META.mode === "count") return "count_flops (not timed)";
    if (META.mode === "trace") return "torch.profiler trace " + ((META.source || {}).file || "");
    return META.mode || "";
  }

  // The step as a bar: the model's phases, then each part; or the forward alone.
  function breakdown() {
    if (!TIMED) return null;
    const segments = [];
    for (const phase of PHASES) segments.push({ label: { forward: "forward", backward: "backward", recompute: "recompute" }[phase], value: phaseValue(modelRoot, phase, "cpu_time_ns") || 0, cls: "seg-" + phase });
    for (const index of roots.slice(1)) segments.push({ label: nodes[index].path, value: sum(nodes[index], "cpu_time_ns") || 0, cls: "seg-part" });
    const whole = META.step_time_ns || segments.reduce((a, s) => a + s.value, 0);
    const bar = el("div", { class: "bar", role: "img", "aria-label": "step breakdown" });
    const legend = el("ul", { class: "legend" });
    segments.forEach((s, i) => {
      const width = whole ? 100 * s.value / whole : 0;
      const title = s.label + ": " + fmt.time(s.value) + " (" + fmt.percent(s.value, whole) + ")";
      bar.append(el("span", { class: "seg " + s.cls + " c" + (i % 8), style: "width:" + width.toFixed(3) + "%", title }));
      legend.append(el("li", {}, el("span", { class: "swatch " + s.cls + " c" + (i % 8) }), el("span", { text: s.label }),
        el("span", { class: "num", text: " " + fmt.time(s.value) + " · " + fmt.percent(s.value, whole) })));
    });
    return el("div", { class: "breakdown" }, el("div", { class: "muted", text: (META.step_time_ns ? "step " : "forward ") + fmt.time(whole) }), bar, legend);
  }

  // -- the module tree --------------------------------------------------------------------
  function treeSection() {
    const cols = treeColumns();
    const state = { sortKey: null, desc: true, query: "", expanded: new Set([0]), shown: new Map() };
    const search = el("input", { type: "search", id: "tree-search", placeholder: "filter by path or type", "aria-label": "filter modules" });
    const expandAll = el("button", { type: "button", id: "tree-expand", text: "expand level" });
    const collapseAll = el("button", { type: "button", id: "tree-collapse", text: "collapse all" });
    const count = el("span", { class: "muted", id: "tree-count" });
    const headRow = el("tr", {}, el("th", { "data-key": "name", class: "sortable", text: "Module" }));
    for (const col of cols) headRow.append(el("th", { "data-key": col.key, class: "sortable" + (col.kind === "text" ? "" : " num"), text: col.label }));
    const body = el("tbody", {});
    const table = el("table", { id: "tree-table", class: "grid" }, el("thead", {}, headRow), body);

    function value(node, key) {
      if (key === "name") return node.name;
      return cols.find((c) => c.key === key).get(node);
    }
    function ordered(indices) {
      if (!state.sortKey) return indices;
      const key = state.sortKey;
      const sign = state.desc ? -1 : 1;
      return indices.slice().sort((a, b) => {
        const va = value(nodes[a], key);
        const vb = value(nodes[b], key);
        if (va === null || va === undefined) return vb === null || vb === undefined ? a - b : 1;
        if (vb === null || vb === undefined) return -1;
        if (typeof va === "string") return sign * va.localeCompare(vb) || a - b;
        return sign * (va - vb) || a - b;
      });
    }
    function matches() {
      const query = state.query.toLowerCase();
      if (!query) return null;
      const keep = new Set();
      for (const node of nodes) {
        if (node.path.toLowerCase().includes(query) || node.type.toLowerCase().includes(query)) {
          for (let i = node.index; i >= 0 && !keep.has(i); i = nodes[i].parent) keep.add(i);
        }
      }
      return keep;
    }
    function render() {
      const keep = matches();
      const rows = [];
      let shownNodes = 0;
      const visit = (index, depth) => {
        const node = nodes[index];
        shownNodes += 1;
        const open = keep ? node.children.length > 0 : state.expanded.has(index);
        rows.push(row(node, depth, open));
        if (!open) return;
        let kids = ordered(node.children);
        if (keep) kids = kids.filter((k) => keep.has(k));
        const limit = state.shown.get(index) || CHILD_PAGE;
        for (const kid of kids.slice(0, limit)) visit(kid, depth + 1);
        if (kids.length > limit) rows.push(moreRow(index, depth + 1, kids.length - limit));
      };
      for (const index of ordered(roots)) if (!keep || keep.has(index)) visit(index, 0);
      body.replaceChildren(...rows);
      count.textContent = keep ? shownNodes + " rows match or hold a match" : shownNodes + " of " + nodes.length + " rows shown";
      for (const th of headRow.children) {
        th.classList.toggle("sorted", th.dataset.key === state.sortKey);
        th.setAttribute("aria-sort", th.dataset.key === state.sortKey ? (state.desc ? "descending" : "ascending") : "none");
      }
    }
    function row(node, depth, open) {
      const tr = el("tr", { "data-index": node.index, "data-path": node.path, class: "kind-" + node.kind });
      const name = el("td", { class: "name", style: "padding-left:" + (4 + depth * 16) + "px" });
      if (node.children.length) {
        name.append(el("button", { type: "button", class: "toggle", "aria-expanded": open ? "true" : "false", "aria-label": (open ? "collapse " : "expand ") + node.path, text: open ? "▾" : "▸" }));
      } else {
        name.append(el("span", { class: "toggle-space" }));
      }
      name.append(el("span", { class: "label", title: node.path || node.type, text: node.name }));
      tr.append(name);
      for (const col of cols) {
        const raw = col.get(node);
        tr.append(el("td", { class: col.kind === "text" ? "" : "num", "data-key": col.key, "data-value": raw === null || raw === undefined ? "" : raw, text: col.show(node) }));
      }
      return tr;
    }
    function moreRow(parent, depth, hidden) {
      const button = el("button", { type: "button", class: "more", "data-parent": parent, text: "show " + Math.min(hidden, CHILD_PAGE * 5) + " more of " + hidden });
      return el("tr", { class: "more-row" }, el("td", { colspan: cols.length + 1, style: "padding-left:" + (4 + depth * 16) + "px" }, button));
    }

    body.addEventListener("click", (event) => {
      const more = event.target.closest("button.more");
      if (more) {
        const parent = Number(more.dataset.parent);
        state.shown.set(parent, (state.shown.get(parent) || CHILD_PAGE) + CHILD_PAGE * 5);
        render();
        return;
      }
      const toggle = event.target.closest("button.toggle");
      if (!toggle) return;
      const index = Number(toggle.closest("tr").dataset.index);
      if (state.expanded.has(index)) state.expanded.delete(index); else state.expanded.add(index);
      render();
    });
    headRow.addEventListener("click", (event) => {
      const th = event.target.closest("th");
      if (!th) return;
      const key = th.dataset.key;
      if (state.sortKey === key) state.desc = !state.desc; else { state.sortKey = key; state.desc = key !== "name" && key !== "type"; }
      render();
    });
    let pending = 0;
    search.addEventListener("input", () => {
      clearTimeout(pending);
      pending = setTimeout(() => { state.query = search.value.trim(); render(); }, 80);
    });
    expandAll.addEventListener("click", () => {
      // One more level below the deepest level open now.
      const frontier = [...state.expanded].flatMap((i) => nodes[i].children).filter((i) => nodes[i].children.length);
      for (const index of (frontier.length ? frontier : roots)) state.expanded.add(index);
      render();
    });
    collapseAll.addEventListener("click", () => { state.expanded.clear(); render(); });
    render();
    return section("tree", "Module tree",
      el("div", { class: "toolbar" }, search, expandAll, collapseAll, count),
      el("div", { class: "scroll" }, table));
  }

  // -- the icicle -------------------------------------------------------------------------
  function icicleSection() {
    const metrics = [];
    if (TIMED) {
      metrics.push({ key: "time", label: "CPU time (all phases)", kind: "time", get: (n) => sum(n, "cpu_time_ns") });
      if (anyNode((n) => sum(n, "device_time_ns"))) metrics.push({ key: "busy", label: "busy time", kind: "time", get: busy });
    }
    if (anyNode((n) => sum(n, "flops"))) metrics.push({ key: "flops", label: PHASES.length > 1 ? "FLOPs (" + PHASES.map((p) => PHASE_LABEL[p] || p).join(" + ") + ")" : "FLOPs", kind: "count", get: (n) => sum(n, "flops") });
    if (anyNode((n) => sum(n, "alloc_bytes"))) metrics.push({ key: "memory", label: "memory allocated", kind: "bytes", get: (n) => sum(n, "alloc_bytes") });
    if (!metrics.length) return null;
    const state = { metric: metrics[0], focus: -1 };
    const ROW = 20;
    const picker = el("div", { class: "toolbar", role: "group", "aria-label": "icicle metric" });
    for (const metric of metrics) {
      const button = el("button", { type: "button", "data-metric": metric.key, text: metric.label });
      button.addEventListener("click", () => { state.metric = metric; draw(); });
      picker.append(button);
    }
    const crumb = el("span", { class: "muted", id: "icicle-focus" });
    picker.append(crumb);
    const chart = svg("svg", { id: "icicle", class: "icicle", role: "img" });
    const holder = el("div", { class: "chart" }, chart);
    const value = (index) => {
      if (index < 0) return roots.reduce((a, i) => a + Math.max(0, state.metric.get(nodes[i]) || 0), 0);
      return Math.max(0, state.metric.get(nodes[index]) || 0);
    };
    const kids = (index) => (index < 0 ? roots : nodes[index].children);
    const label = (index) => (index < 0 ? (roots.length > 1 ? "step" : "all") : nodes[index].name);

    function draw() {
      for (const button of picker.querySelectorAll("button")) button.classList.toggle("active", button.dataset.metric === state.metric.key);
      chart.setAttribute("data-metric", state.metric.key);
      const width = Math.max(400, holder.clientWidth || 1000);
      const boxes = [];
      const chain = [];
      for (let i = state.focus; ; i = nodes[i].parent) { chain.unshift(i); if (i < 0) break; }
      chain.forEach((index, level) => boxes.push({ index, x: 0, w: width, level, ancestor: index !== state.focus }));
      const lay = (index, x, w, level) => {
        const total = value(index);
        let cursor = x;
        for (const kid of kids(index)) {
          const kw = total > 0 ? w * value(kid) / total : 0;
          if (kw >= 0.5) { boxes.push({ index: kid, x: cursor, w: kw, level }); lay(kid, cursor, kw, level + 1); }
          cursor += kw;
        }
      };
      lay(state.focus, 0, width, chain.length);
      const levels = boxes.reduce((a, b) => Math.max(a, b.level), 0) + 1;
      chart.setAttribute("viewBox", "0 0 " + width + " " + levels * ROW);
      chart.setAttribute("width", width);
      chart.setAttribute("height", levels * ROW);
      const focusTotal = value(state.focus);
      const items = boxes.map((box) => {
        const g = svg("g", { class: "box" + (box.ancestor ? " ancestor" : ""), "data-index": box.index, transform: "translate(" + box.x.toFixed(2) + "," + box.level * ROW + ")" });
        g.append(svg("rect", { width: Math.max(0.5, box.w - 1).toFixed(2), height: ROW - 1, fill: colour(box.index), rx: 2 }));
        if (box.w > 36) {
          const room = Math.floor((box.w - 8) / 6.5);
          const text = label(box.index);
          g.append(svg("text", { x: 4, y: 14, text: text.length > room ? text.slice(0, Math.max(1, room - 1)) + "…" : text }));
        }
        return g;
      });
      chart.replaceChildren(...items);
      crumb.textContent = (state.focus < 0 ? "whole " + label(-1) : nodes[state.focus].path || nodes[state.focus].type) + ": " + fmt.as(state.metric.kind, focusTotal) + (state.focus < 0 ? "" : " · click the top rows to zoom out");
    }
    function colour(index) {
      if (index < 0) return "#b8c2cc";
      const node = nodes[index];
      if (node.kind !== "module") return "hsl(30, 70%, 72%)";
      let hash = 0;
      for (const ch of node.type) hash = (hash * 31 + ch.charCodeAt(0)) | 0;
      return "hsl(" + (200 + (Math.abs(hash) % 120)) + ", 55%, " + (62 + (Math.abs(hash >> 8) % 16)) + "%)";
    }
    chart.addEventListener("click", (event) => {
      const g = event.target.closest("g.box");
      if (!g) return;
      state.focus = Number(g.dataset.index);
      draw();
    });
    chart.addEventListener("mousemove", (event) => {
      const g = event.target.closest("g.box");
      if (!g) { hideTip(); return; }
      const index = Number(g.dataset.index);
      const v = value(index);
      const parent = index < 0 ? -1 : nodes[index].parent;
      const lines = [index < 0 ? label(-1) : (nodes[index].path || "(root)") + " · " + nodes[index].type,
        state.metric.label + ": " + fmt.as(state.metric.kind, v),
        fmt.percent(v, value(-1)) + " of all" + (index >= 0 ? " · " + fmt.percent(v, value(parent)) + " of parent" : "")];
      showTip(event, lines);
    });
    chart.addEventListener("mouseleave", hideTip);
    return { element: section("icicle-section", "Icicle", picker, holder), draw };
  }

  // -- the op table -------------------------------------------------------------------------
  const OP_LABELS = {
    name: "Op", phase: "Phase", module: "Module", module_type: "Module type", input_shapes: "Input shapes", stack: "Stack",
    calls: "Calls", self_cpu_time_ns: "Self CPU", cpu_time_ns: "CPU total", self_device_time_ns: "Self device", device_time_ns: "Device total",
    flops: "FLOPs", macs: "MACs", bytes: "Bytes", unsupported_calls: "No formula", alloc_bytes: "Alloc", self_alloc_bytes: "Self alloc",
    freed_bytes: "Freed", modules: "Modules",
  };
  function opKind(column) {
    if (column.endsWith("_time_ns")) return "time";
    if (column === "flops" || column === "macs") return "count";
    if (column.endsWith("bytes")) return "bytes";
    if (column === "input_shapes") return "shape";
    if (column === "calls" || column === "unsupported_calls" || column === "modules") return "int";
    return "text";
  }
  function opsSection() {
    const groupings = Object.keys(DATA.ops || {});
    if (!groupings.length) return null;
    const state = { grouping: groupings[0], sortCol: null, desc: true, limit: OP_PAGE };
    const picker = el("div", { class: "toolbar", role: "group", "aria-label": "group ops by" }, el("span", { class: "muted", text: "group by " }));
    for (const grouping of groupings) {
      const button = el("button", { type: "button", "data-group": grouping, text: grouping });
      button.addEventListener("click", () => { state.grouping = grouping; state.sortCol = null; state.limit = OP_PAGE; render(); });
      picker.append(button);
    }
    const note = el("span", { class: "muted", id: "ops-count" });
    picker.append(note);
    const table = el("table", { id: "ops-table", class: "grid" });
    const more = el("button", { type: "button", id: "ops-more", hidden: true });
    more.addEventListener("click", () => { state.limit += OP_PAGE * 10; render(); });

    function render() {
      const data = DATA.ops[state.grouping];
      for (const button of picker.querySelectorAll("button")) button.classList.toggle("active", button.dataset.group === state.grouping);
      const cols = data.columns;
      const sortCol = state.sortCol === null ? cols.indexOf(data.sort_by) : state.sortCol;
      let rows = data.rows.map((r, i) => [r, i]);
      if (state.sortCol !== null) {
        const sign = state.desc ? -1 : 1;
        const kind = opKind(cols[sortCol]);
        rows.sort(([a, ia], [b, ib]) => {
          const va = a[sortCol];
          const vb = b[sortCol];
          if (va === null) return vb === null ? ia - ib : 1;
          if (vb === null) return -1;
          if (kind === "text" || kind === "shape") return sign * fmt.as(kind, va).localeCompare(fmt.as(kind, vb)) || ia - ib;
          return sign * (va - vb) || ia - ib;
        });
      }
      const head = el("tr", {});
      cols.forEach((col, i) => {
        const th = el("th", { "data-col": i, class: "sortable" + (opKind(col) === "text" || opKind(col) === "shape" ? "" : " num") + (i === sortCol ? " sorted" : ""), text: OP_LABELS[col] || col });
        th.setAttribute("aria-sort", i === sortCol ? (state.sortCol === null || state.desc ? "descending" : "ascending") : "none");
        head.append(th);
      });
      const unsupportedAt = cols.indexOf("unsupported_calls");
      const flopsAt = cols.indexOf("flops");
      const body = el("tbody", {});
      for (const [r] of rows.slice(0, state.limit)) body.append(opRow(r, cols, unsupportedAt, flopsAt));
      const total = opRow(data.total, cols, unsupportedAt, flopsAt);
      total.classList.add("total");
      table.replaceChildren(el("thead", {}, head), body, el("tfoot", {}, total));
      note.textContent = Math.min(rows.length, state.limit) + " of " + rows.length + " rows";
      more.hidden = rows.length <= state.limit;
      more.textContent = "show " + Math.min(rows.length - state.limit, OP_PAGE * 10) + " more";
    }
    function opRow(r, cols, unsupportedAt, flopsAt) {
      const unsupported = unsupportedAt >= 0 && r[unsupportedAt] > 0;
      const tr = el("tr", { class: unsupported ? "unsupported" : "" });
      cols.forEach((col, i) => {
        const kind = opKind(col);
        let text = fmt.as(kind, r[i]);
        if (i === flopsAt && unsupported) text = r[i] === null ? "?" : text + " + ?";
        // Long names and shapes are cut to the column's width; the whole text is the cell's title.
        const wide = kind === "text" || kind === "shape";
        const td = el("td", { class: wide ? "cut" : "num", "data-value": r[i] === null || typeof r[i] === "object" ? "" : r[i], text, title: wide && text.length > 22 ? text : null });
        if (i === 0 && unsupported) td.append(el("span", { class: "badge", title: "no FLOP formula for " + r[unsupportedAt] + " calls", text: "no formula" }));
        tr.append(td);
      });
      return tr;
    }
    table.addEventListener("click", (event) => {
      const th = event.target.closest("thead th");
      if (!th) return;
      const col = Number(th.dataset.col);
      const kind = opKind(DATA.ops[state.grouping].columns[col]);
      if (state.sortCol === col) state.desc = !state.desc; else { state.sortCol = col; state.desc = kind !== "text" && kind !== "shape"; }
      render();
    });
    render();
    return section("ops", "Operators", picker, el("div", { class: "scroll" }, table), more);
  }

  // -- the memory timeline -------------------------------------------------------------------
  function memorySection() {
    const memory = DATA.memory;
    const timeline = memory && memory.timeline;
    if (!timeline || !timeline.t_ns || !timeline.t_ns.length) return null;
    const t = timeline.t_ns;
    const bytes = timeline.bytes;
    const spans = timeline.spans || [];
    const peak = memory.peak_bytes || Math.max(...bytes);
    const peakAt = memory.peak_at || {};
    const end = Math.max(t[t.length - 1], ...spans.map((s) => s[1]), 1);
    const H = 200;
    const LANE = 16;
    const AXIS = 64;  // room on the left for the bytes axis
    const top = spans.filter((s) => s[2] === "" || s[2].startsWith("<"));
    const inner = spans.filter((s) => !(s[2] === "" || s[2].startsWith("<")));
    const chart = svg("svg", { id: "memory-chart", class: "memory" });
    const holder = el("div", { class: "chart" }, chart);
    let W = 1000;
    const x = (ns) => AXIS + (ns / end) * (W - AXIS);
    const y = (b) => 6 + H - (b / (peak * 1.08)) * H;
    const cursor = svg("line", { class: "cursor", visibility: "hidden" });

    function draw() {
      W = Math.max(400, holder.clientWidth || 1000);
      const height = H + 6 + 2 * LANE + 22;
      chart.setAttribute("viewBox", "0 0 " + W + " " + height);
      chart.setAttribute("width", W);
      chart.setAttribute("height", height);
      const items = [];
      for (const b of [0, peak / 2, peak]) {
        items.push(svg("line", { class: "grid", x1: AXIS, x2: W, y1: y(b), y2: y(b) }));
        items.push(svg("text", { class: "axis", x: AXIS - 4, y: y(b) + 3, "text-anchor": "end", text: fmt.bytes(Math.round(b)) }));
      }
      for (const frac of [0, 0.25, 0.5, 0.75, 1]) {
        items.push(svg("text", { class: "axis", x: x(frac * end), y: height - 4, "text-anchor": frac === 0 ? "start" : frac === 1 ? "end" : "middle", text: fmt.time(Math.round(frac * end)) }));
      }
      items.push(svg("polyline", { class: "line", points: t.map((ns, i) => x(ns).toFixed(1) + "," + y(bytes[i]).toFixed(1)).join(" ") }));
      items.push(svg("line", { class: "baseline", x1: AXIS, x2: W, y1: y(memory.baseline_bytes || 0), y2: y(memory.baseline_bytes || 0) }));
      if (peakAt.t_ns !== undefined && peakAt.t_ns !== null) items.push(svg("circle", { class: "peak", cx: x(peakAt.t_ns), cy: y(peak), r: 4 }));
      [top, inner].forEach((lane, l) => {
        for (const s of lane) {
          const g = svg("g", { class: "span", transform: "translate(" + x(s[0]).toFixed(2) + "," + (H + 10 + l * LANE) + ")" });
          const w = Math.max(0.5, x(s[1]) - x(s[0]));
          g.append(svg("rect", { width: w.toFixed(2), height: LANE - 2, class: "phase-" + (s[3] || "part") }));
          const name = s[2] === "" ? (s[3] || "model") : s[2];
          if (w > 40) g.append(svg("text", { x: 3, y: 11, text: name.length > w / 6 ? name.slice(0, Math.max(1, Math.floor(w / 6) - 1)) + "…" : name }));
          g.append(svg("title", { text: name + (s[3] ? " (" + s[3] + ")" : "") + ": " + fmt.time(s[1] - s[0]) }));
          items.push(g);
        }
      });
      cursor.setAttribute("y1", 6);
      cursor.setAttribute("y2", H + 6);
      items.push(cursor);
      chart.replaceChildren(...items);
    }
    chart.addEventListener("mousemove", (event) => {
      const box = chart.getBoundingClientRect();
      const px = event.clientX - box.left;
      if (px < AXIS) return;
      const ns = ((px - AXIS) / (W - AXIS)) * end;
      let lo = 0;
      let hi = t.length - 1;
      while (lo < hi) { const mid = (lo + hi) >> 1; if (t[mid] < ns) lo = mid + 1; else hi = mid; }
      cursor.setAttribute("x1", x(ns));
      cursor.setAttribute("x2", x(ns));
      cursor.setAttribute("visibility", "visible");
      showTip(event, ["t = " + fmt.time(Math.round(ns)), "live " + fmt.bytes(bytes[lo])]);
    });
    chart.addEventListener("mouseleave", () => { cursor.setAttribute("visibility", "hidden"); hideTip(); });
    const facts = el("dl", { class: "facts" });
    const fact = (label, value) => facts.append(el("div", { class: "fact" }, el("dt", { text: label }), el("dd", { text: value })));
    fact("peak", fmt.bytes(peak) + (peakAt.path !== undefined ? " in " + (peakAt.path === "" ? "the model" : peakAt.path) + (peakAt.phase ? " (" + peakAt.phase + ")" : "") : "") + (peakAt.t_ns !== undefined && peakAt.t_ns !== null ? " at " + fmt.time(peakAt.t_ns) : ""));
    fact("at the start", fmt.bytes(memory.baseline_bytes || 0));
    // The live bytes of "parameters" hold the buffers too: said where the model has any.
    const hasBuffers = Object.keys(memory.buffer_bytes_by_dtype || {}).length > 0;
    for (const [category, value] of Object.entries(memory.peak_categories || {})) {
      fact(category === "parameters" && hasBuffers ? "parameters and buffers" : category.replace("_", " "), fmt.bytes(value));
    }
    const element = section("memory", "Memory over the step", facts, holder,
      el("div", { class: "muted", text: "live bytes over " + fmt.time(end) + (META.steps > 1 ? " of the step with the highest peak (the header's step time is the median step's)" : "") + "; the dot marks the peak, the dashed line the memory at the start; below, the step's parts and the model's modules." }));
    return { element, draw };
  }

  // -- the page ------------------------------------------------------------------------------
  const main = document.getElementById("report");
  const icicle = icicleSection();
  const memory = memorySection();
  const charts = [icicle, memory].filter(Boolean);
  const parts = [header(), treeSection(), icicle && icicle.element, opsSection(), memory && memory.element].filter(Boolean);
  const nav = el("nav", { class: "nav" });
  for (const part of parts.slice(1)) nav.append(el("a", { href: "#" + part.id, text: part.querySelector("h2").textContent }));
  main.replaceChildren(parts[0], nav, ...parts.slice(1));
  // Charts are drawn once in the page: they take its width.
  for (const chart of charts) chart.draw();
  let resizing = 0;
  window.addEventListener("resize", () => { clearTimeout(resizing); resizing = setTimeout(() => charts.forEach((c) => c.draw()), 100); });
  // For tests and benchmarks: ready is measured from the navigation's start, so it
  // includes reading the page and its data; script is this function alone.
  window.layerscopeReport = { fmt, data: DATA, readyMs: performance.now(), scriptMs: performance.now() - started };
  document.body.setAttribute("data-ready", "1");
})();
