// layerscope's diff page: the ProfileDiff embedded in #layerscope-data (diff_html.py).
(function () {
  const { fmt, el, section, readData, sortableTable, facts, mount, signed, signedPercent } = layerscopePage;
  const DATA = readData("layerscope-diff-html/1");
  const TOTAL = DATA.total_kind === "step" ? "step time" : "forward time";
  const LABELS = {
    time_ns: TOTAL, device_time_ns: "device time", flops: "FLOPs", params: "params", peak_bytes: "peak memory",
    self_time_ns: "self time", self_device_time_ns: "self device time", macs: "MACs", alloc_bytes: "allocated",
    activation_bytes: "activations", self_flops: "self FLOPs", self_alloc_bytes: "self allocated",
  };
  // A node's regression names its row field; the model's, a summary field (or the root's allocations).
  const NODE_LABELS = { ...LABELS, time_ns: "total time", device_time_ns: "total device time" };
  const totalRegression = DATA.regressions.find((r) => r.path === null);
  const kindOf = (metric) => (metric.endsWith("_ns") ? "time" : metric.endsWith("_bytes") ? "bytes" : "count");
  const delta = (pair) => (pair[0] === null || pair[1] === null ? null : pair[1] - pair[0]);
  const relative = (pair) => (pair[0] === null || pair[1] === null || pair[0] === 0 ? null : (pair[1] - pair[0]) / pair[0]);
  const trend = (value) => (value > 0 ? "worse" : value < 0 ? "better" : "");
  const regressed = new Set(DATA.regressions.map((r) => (r.path === null ? "\u0000total" : r.path)));
  const limit = (100 * DATA.threshold).toFixed(DATA.threshold * 100 % 1 ? 1 : 0) + "%";

  function describe(side) {
    return [side.model, side.kind, side.device].filter(Boolean).join(", ");
  }

  function noiseText(noise) {
    // How much each side's repeated passes spread; changes within the larger are "noise".
    if (noise.band === null) return "not measured (one pass each)";
    const side = (v) => (v === null ? "one pass" : (100 * v).toFixed(1) + "%");
    return "±" + (100 * noise.band).toFixed(1) + "% (base " + side(noise.base) + ", new " + side(noise.new) + ")";
  }

  function header() {
    const warnings = DATA.warnings.map((w) => el("div", { class: "warning", text: "warning: " + w }));
    return el("header", { class: "card" },
      el("h1", {}, el("span", { text: "Diff" }), el("span", { class: "muted", text: " · layerscope" })),
      facts([["base", describe(DATA.base)], ["new", describe(DATA.new)], ["phases", DATA.phases.join(", ")],
        ["noise floor", DATA.timed ? fmt.time(DATA.min_time_ns) : ""],
        ["noise", DATA.timed ? noiseText(DATA.noise) : ""]]),
      ...warnings);
  }

  function summarySection() {
    const rows = DATA.summary.filter((r) => r[1] !== null || r[2] !== null)
      .map(([metric, base, now]) => ({ metric, pair: [base, now] }));
    const columns = [
      { key: "metric", label: "", kind: "text", get: (r) => LABELS[r.metric] || r.metric },
      { key: "base", label: "Base", kind: "raw", get: (r) => r.pair[0] },
      { key: "new", label: "New", kind: "raw", get: (r) => r.pair[1] },
      { key: "change", label: "Change", kind: "raw", get: (r) => delta(r.pair) },
      { key: "percent", label: "%", kind: "relative", get: (r) => relative(r.pair) },
    ];
    // Each row is in its own unit: draw the cells by the row's metric.
    const body = el("tbody", {});
    for (const row of rows) {
      const kind = kindOf(row.metric);
      const isTotal = totalRegression !== undefined && row.metric === totalRegression.metric;
      const tr = el("tr", { "data-metric": row.metric, class: isTotal && regressed.has("\u0000total") ? "regression" : "" });
      for (const col of columns) {
        const raw = col.get(row);
        const text = col.key === "metric" ? raw : col.key === "change" ? signed(kind, raw) : col.key === "percent" ? signedPercent(raw) : fmt.as(kind, raw);
        const cls = col.key === "metric" ? "" : "num" + (col.key === "change" || col.key === "percent" ? " " + trend(raw) : "");
        tr.append(el("td", { class: cls, "data-key": col.key, "data-value": raw === null ? "" : raw, text }));
      }
      body.append(tr);
    }
    const head = el("tr", {}, ...columns.map((c) => el("th", { class: c.key === "metric" ? "" : "num", text: c.label })));
    return section("summary", "Model", el("table", { id: "diff-summary", class: "grid" }, el("thead", {}, head), body));
  }

  // The diff's metric's columns first (base, new, change, %), then the others but it.
  function byMetric(metrics, rows, field, others) {
    const named = others.find(([name]) => name === field);
    const label = named ? named[1] : (NODE_LABELS[field] || field).replace(/^./, (c) => c.toUpperCase());
    const first = [[field, label, true]];
    return [...first, ...others.filter(([name]) => name !== field)]
      .flatMap(([name, label, full]) => metricColumns(metrics, rows, name, label, full));
  }

  // Columns of one metric: base, new, change, %; only when some row has it.
  function metricColumns(metrics, rows, metric, label, full) {
    const at = metrics.indexOf(metric);
    if (!rows.some((r) => r.values[at][0] !== null || r.values[at][1] !== null)) return [];
    const kind = kindOf(metric);
    const cols = [];
    if (full) {
      cols.push({ key: metric + ":base", label: label + " base", kind, get: (r) => r.values[at][0] });
      cols.push({ key: metric + ":new", label: label + " new", kind, get: (r) => r.values[at][1] });
    }
    cols.push({ key: metric + ":delta", label: label + " Δ", kind: "delta-" + kind, get: (r) => delta(r.values[at]), cls: (r) => trend(delta(r.values[at])) });
    if (full) cols.push({ key: metric + ":percent", label: label + " %", kind: "relative", get: (r) => relative(r.values[at]), cls: (r) => trend(relative(r.values[at])) });
    return cols;
  }
  function statusOf(row) {
    // A matched row whose metric (a time) moved within the runs' measured noise says so.
    if (row.status === "matched") return row.noise ? "noise" : "";
    return row.status;
  }

  function modulesSection() {
    const rows = DATA.rows;
    if (!rows.length) return null;
    const m = DATA.node_metrics;
    const columns = [
      { key: "path", label: "Module", kind: "text", get: (r) => r.path || "(model)", title: (r) => (regressed.has(r.path) ? "regressed above " + limit : null) },
      { key: "type", label: "Type", kind: "text", get: (r) => (r.type_base && r.type_new && r.type_base !== r.type_new ? r.type_base + " → " + r.type_new : r.type_new || r.type_base) },
      { key: "status", label: "Status", kind: "text", get: statusOf },
      ...byMetric(m, rows, DATA.metric_fields.node, [["self_time_ns", "Self", true], ["time_ns", "Total", false],
        ["device_time_ns", "Device", false], ["flops", "FLOPs", false], ["alloc_bytes", "Alloc", false], ["peak_bytes", "Peak", false]]),
    ];
    const table = sortableTable("diff-modules", columns, rows, {
      attrs: (r) => ({ "data-path": r.path, class: "kind-" + r.kind + (regressed.has(r.path) ? " regression" : "") }),
    });
    const count = DATA.regressions.filter((r) => r.path !== null).length;
    return section("modules", "Modules",
      el("div", { class: "muted", text: rows.length + " modules and parts, largest change in " + (DATA.timed ? "self time" : "FLOPs") + " first; " + count + " regressed above " + limit + " (highlighted); click a column to sort" }),
      table);
  }

  // An op paired across shapes shows base → new; with several shapes (or another number
  // of calls) on a side, each shape with its calls: the row's figures are their sums.
  function shapesOf(r) {
    if (!r.new_input_shapes) return fmt.shape(r.input_shapes);
    const b = r.shapes_base || [], n = r.shapes_new || [];
    if (!b.length || (b.length === 1 && n.length === 1 && b[0].calls === n[0].calls)) {
      return fmt.shape(r.input_shapes) + " → " + fmt.shape(r.new_input_shapes);
    }
    const side = (list) => list.map((s) => fmt.shape(s.input_shapes) + " ×" + s.calls).join(", ");
    return side(b) + " → " + side(n);
  }

  function opsSection() {
    const rows = DATA.ops;
    if (!DATA.ops_total) return null;
    const m = DATA.op_metrics;
    const columns = [
      { key: "op", label: "Op", kind: "text", get: (r) => r.op },
      { key: "path", label: "Module", kind: "text", get: (r) => r.path },
      { key: "phase", label: "Phase", kind: "text", get: (r) => r.phase },
      // An op matched by name whose shapes changed (the batch size did) shows base → new.
      { key: "shapes", label: "Input shapes", kind: "text", get: shapesOf },
      { key: "status", label: "Status", kind: "text", get: statusOf },
      ...byMetric(m, rows, DATA.metric_fields.op, [["self_time_ns", "Self", true], ["flops", "FLOPs", false], ["alloc_bytes", "Alloc", false]]),
    ];
    return section("ops", "Changed ops",
      el("div", { class: "muted", text: rows.length + " of " + DATA.ops_total + " ops changed (added, removed, paired across shapes, or another self time, FLOPs or " + DATA.metric_label + ")" }),
      rows.length ? sortableTable("diff-ops", columns, rows, { attrs: (r) => ({ "data-path": r.path }) }) : null);
  }

  function regressionsSection() {
    const list = el("ul", { id: "regressions" });
    for (const r of DATA.regressions) {
      const pair = [r.base, r.new];
      const kind = kindOf(r.metric);
      const what = r.path === null ? "the model's " + (r.metric === "time_ns" ? TOTAL : LABELS[r.metric] || r.metric)
        : r.path + " (" + r.phase + " " + (NODE_LABELS[r.metric] || r.metric) + ")";
      list.append(el("li", { "data-path": r.path === null ? "" : r.path, "data-phase": r.phase },
        el("span", { text: what }),
        el("span", { class: "num", text: ": " + fmt.as(kind, r.base) + " → " + fmt.as(kind, r.new) + " (" + signedPercent(relative(pair)) + ")" })));
    }
    const verdict = DATA.regressions.length ? "Regressed above " + limit + ":" : "No regression above " + limit + ".";
    const how = DATA.gated ? "" : " (the page's default threshold; layerscope diff --fail-above sets another)";
    return section("regressions-section", "Regressions", el("div", { text: verdict + how }), DATA.regressions.length ? list : null);
  }

  function imbalanceSection() {
    if (!DATA.imbalance || !DATA.imbalance.length) return null;
    const columns = [
      { key: "path", label: "Node", kind: "text", get: (r) => r.path },
      { key: "phase", label: "Phase", kind: "text", get: (r) => r.phase },
      { key: "base", label: "max/median base", kind: "ratio", get: (r) => r.base },
      { key: "new", label: "max/median new", kind: "ratio", get: (r) => r.new },
    ];
    return section("imbalance", "Imbalance over ranks", sortableTable("diff-imbalance", columns, DATA.imbalance));
  }

  mount([header(), summarySection(), regressionsSection(), modulesSection(), opsSection(), imbalanceSection()], "layerscopeDiff", { data: DATA });
})();
