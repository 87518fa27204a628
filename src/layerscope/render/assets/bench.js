// layerscope's bench page: the BenchResult embedded in #layerscope-data (bench_html.py).
(function () {
  const { fmt, el, svg, section, readData, sortableTable, facts, mount, showTip, hideTip } = layerscopePage;
  const DATA = readData("layerscope-bench-html/1");
  const perSecond = (value) => (value === null || value === undefined ? "" : fmt.count(Math.round(value)) + "/s");

  function header() {
    const machine = DATA.machine || {};
    const warnings = DATA.warnings.map((w) => el("div", { class: "warning", text: "warning: " + w }));
    return el("header", { class: "card" },
      el("h1", {}, el("span", { text: String(DATA.model) }), el("span", { class: "muted", text: " · layerscope bench" })),
      facts([
        ["mode", DATA.mode], ["device", DATA.device],
        ["dtype", DATA.dtype + (DATA.autocast ? " (autocast " + DATA.autocast + ")" : "") + (DATA.compiled ? ", compiled" : "")],
        ["params", fmt.count(DATA.params) + " (" + fmt.bytes(DATA.model_bytes) + ")"],
        ["FLOPs per sample", DATA.flops_per_sample === null ? "unknown" : fmt.count(DATA.flops_per_sample)],
        ["input", DATA.inputs.length ? DATA.inputs.map((i) => i.name + " " + i.dtype + " " + fmt.shape(i.shape)).join(", ") + " (at batch size " + DATA.count_batch_size + ")" : ""],
        ["tokens per sample", DATA.tokens_per_sample],
        ["machine", [machine.cpu, machine.gpu, machine.torch ? "torch " + machine.torch : null].filter(Boolean).join(", ")],
        ["best throughput", DATA.best_batch_size === null ? "" : "batch size " + DATA.best_batch_size],
        ["max batch", DATA.max_batch_size],
      ]),
      ...warnings);
  }

  // A small chart of one figure over the batch sizes (evenly spaced, as measured): a dot
  // per batch size, a whisker from low to high when given, a line through the dots.
  function chart(id, title, kind, get, range, line) {
    const points = DATA.batches.filter((b) => get(b) !== null && get(b) !== undefined);
    if (!points.length) return null;
    const W = 380, H = 210, LEFT = 64, RIGHT = 12, TOP = 12, BOTTOM = 34;
    const top = Math.max(...points.map((b) => (range ? range(b)[1] : get(b)))) * 1.1 || 1;
    const x = (i) => LEFT + (points.length === 1 ? (W - LEFT - RIGHT) / 2 : (i * (W - LEFT - RIGHT)) / (points.length - 1));
    const y = (v) => TOP + (H - TOP - BOTTOM) * (1 - v / top);
    const show = (v) => (kind === "rate" ? perSecond(v) : fmt.as(kind, v));
    const node = svg("svg", { id, class: "chart-small", width: W, height: H, viewBox: "0 0 " + W + " " + H, role: "img", "aria-label": title });
    for (const v of [0, top / 2, top]) {
      node.append(svg("line", { class: "grid", x1: LEFT, x2: W - RIGHT, y1: y(v), y2: y(v) }));
      node.append(svg("text", { class: "axis", x: LEFT - 4, y: y(v) + 3, "text-anchor": "end", text: show(kind === "time" || kind === "bytes" ? Math.round(v) : v) }));
    }
    points.forEach((b, i) => node.append(svg("text", { class: "axis", x: x(i), y: H - BOTTOM + 14, "text-anchor": "middle", text: String(b.batch_size) })));
    node.append(svg("text", { class: "axis", x: (LEFT + W - RIGHT) / 2, y: H - 4, "text-anchor": "middle", text: "batch size" }));
    if (line && points.length > 1) node.append(svg("polyline", { class: "line", points: points.map((b, i) => x(i).toFixed(1) + "," + y(get(b)).toFixed(1)).join(" ") }));
    points.forEach((b, i) => {
      const g = svg("g", { class: "point", "data-batch": b.batch_size, "data-value": get(b) });
      const lines = ["batch size " + b.batch_size, title + ": " + show(get(b))];
      if (range) {
        const [low, high] = range(b);
        g.append(svg("line", { class: "whisker", x1: x(i), x2: x(i), y1: y(low), y2: y(high) }));
        lines.push("p10 " + show(low) + " · p90 " + show(high));
      }
      g.append(svg("circle", { class: "dot", cx: x(i), cy: y(get(b)), r: 4 }));
      g.addEventListener("mousemove", (event) => showTip(event, lines));
      g.addEventListener("mouseleave", hideTip);
      node.append(g);
    });
    return el("figure", { style: "margin:0" }, node, el("figcaption", { class: "muted", text: title }));
  }

  function chartsSection() {
    const charts = [
      chart("latency-chart", "latency (p50; p10 to p90)", "time", (b) => b.p50_ns, (b) => [b.p10_ns, b.p90_ns], false),
      chart("throughput-chart", "throughput (samples/s)", "rate", (b) => b.throughput_per_s, null, true),
      chart("memory-chart", "peak memory", "bytes", (b) => b.peak_memory_bytes, null, true),
    ].filter(Boolean);
    if (!charts.length) return null;
    return section("charts", "Per batch size", el("div", { class: "charts" }, ...charts));
  }

  function tableSection() {
    const columns = [
      { key: "batch", label: "Batch", kind: "int", get: (b) => b.batch_size },
      { key: "status", label: "Status", kind: "text", get: (b) => (b.status === "ok" ? "" : b.status) },
      { key: "p10", label: "p10", kind: "time", get: (b) => b.p10_ns },
      { key: "p50", label: "p50", kind: "time", get: (b) => b.p50_ns },
      { key: "p90", label: "p90", kind: "time", get: (b) => b.p90_ns },
      { key: "p99", label: "p99", kind: "time", get: (b) => b.p99_ns },
      { key: "mean", label: "Mean", kind: "time", get: (b) => b.mean_ns },
      { key: "std", label: "Std", kind: "time", get: (b) => b.std_ns },
      { key: "cv", label: "CV", kind: "percent", get: (b) => b.cv },
      { key: "runs", label: "Runs", kind: "int", get: (b) => b.runs },
      { key: "throughput", label: "Samples/s", kind: "count", get: (b) => (b.throughput_per_s === null ? null : Math.round(b.throughput_per_s)) },
    ];
    if (DATA.tokens_per_sample !== null) columns.push({ key: "tokens", label: "Tokens/s", kind: "count", get: (b) => (b.throughput_per_s === null ? null : Math.round(b.throughput_per_s * DATA.tokens_per_sample)) });
    if (DATA.batches.some((b) => b.peak_memory_bytes !== null)) columns.push({ key: "peak", label: "Peak mem", kind: "bytes", get: (b) => b.peak_memory_bytes });
    return section("table", "Batch sizes", sortableTable("bench-table", columns, DATA.batches, { attrs: (b) => ({ "data-batch": b.batch_size }) }));
  }

  mount([header(), chartsSection(), tableSection()], "layerscopeBench", { data: DATA });
})();
