// layerscope's ranks page: the merged run embedded in #layerscope-data (ranks_html.py).
(function () {
  const { fmt, el, section, readData, sortableTable, facts, mount } = layerscopePage;
  const DATA = readData("layerscope-ranks-html/1");
  const RUN = DATA.run;
  const PHASE_LABEL = { forward: "fwd", backward: "bwd", recompute: "recompute" };

  function header() {
    const steps = RUN.step_time_ns;
    return el("header", { class: "card" },
      el("h1", {}, el("span", { text: String(RUN.model || "model") }), el("span", { class: "muted", text: " · layerscope ranks" })),
      facts([
        ["ranks", RUN.ranks.length + (RUN.world_size !== null ? " of " + RUN.world_size : "")],
        ["missing", RUN.missing_ranks.join(", ")],
        ["run", RUN.run_id],
        ["steps", RUN.step_range ? RUN.step_range[0] + "–" + RUN.step_range[1] : ""],
        ["time", RUN.time_metric],
        ["median rank", RUN.median_rank],
        ["step time", steps.length ? fmt.time(Math.min(...steps)) + " – " + fmt.time(Math.max(...steps)) : ""],
      ]));
  }

  // Blue below the row's median, red above: full colour at half and one and a half times it.
  function heat(value, median) {
    if (value === null || !median) return null;
    const ratio = value / median;
    if (ratio >= 1) return "background:hsl(0,75%," + (100 - 30 * Math.min(1, (ratio - 1) / 0.5)).toFixed(1) + "%)";
    return "background:hsl(210,70%," + (100 - 25 * Math.min(1, (1 - ratio) / 0.5)).toFixed(1) + "%)";
  }

  function heatSection() {
    if (!DATA.heat.length) return null;
    const state = { metric: "time" };
    const picker = el("div", { class: "toolbar", role: "group", "aria-label": "heat map metric" }, el("span", { class: "muted", text: "time " }));
    const table = el("table", { id: "heatmap", class: "grid" });
    for (const [key, label] of [["time", "total"], ["self", "self"]]) {
      const button = el("button", { type: "button", "data-metric": key, text: label });
      button.addEventListener("click", () => { state.metric = key; draw(); });
      picker.append(button);
    }
    function draw() {
      const key = state.metric;
      table.setAttribute("data-metric", key);
      for (const button of picker.querySelectorAll("button")) button.classList.toggle("active", button.dataset.metric === key);
      const head = el("tr", {}, el("th", { text: "Node" }), el("th", { text: "Phase" }), el("th", { class: "num", text: "Median" }), el("th", { class: "num", text: "Max / median" }));
      for (const rank of RUN.ranks) head.append(el("th", { class: "num", text: "rank " + rank }));
      const body = el("tbody", {});
      for (const row of DATA.heat) {
        const node = DATA.nodes[row.node];
        const values = row[key];
        const median = row[key + "_median"];
        const max = Math.max(...values.filter((v) => v !== null));
        const tr = el("tr", { "data-path": node.path, "data-phase": row.phase, class: "kind-" + node.kind });
        tr.append(el("td", { class: "name", style: "padding-left:" + (8 + node.depth * 14) + "px", title: node.path + " · " + node.type, text: node.name }));
        tr.append(el("td", { text: PHASE_LABEL[row.phase] || row.phase }));
        tr.append(el("td", { class: "num", "data-key": "median", "data-value": median, text: fmt.time(median) }));
        tr.append(el("td", { class: "num", "data-key": "imbalance", text: median ? "x" + (max / median).toFixed(2) : "" }));
        values.forEach((value, i) => {
          tr.append(el("td", {
            class: "num heat", "data-rank": RUN.ranks[i], "data-value": value === null ? "" : value, style: heat(value, median),
            title: "rank " + RUN.ranks[i] + ": " + (value === null ? "not on this rank" : fmt.time(value) + (median ? " (" + fmt.percent(value, median) + " of the median)" : "")),
            text: value === null ? "–" : fmt.time(value),
          }));
        });
        body.append(tr);
      }
      table.replaceChildren(el("thead", {}, head), body);
    }
    draw();
    const legend = el("div", { class: "heat-legend muted" }, el("span", { text: "half the row's median" }), el("span", { class: "heat-scale" }), el("span", { text: "1.5× the median and above" }));
    return section("heat", "Time per rank", picker, legend, el("div", { class: "scroll" }, table));
  }

  function stragglersSection() {
    const columns = [
      { key: "path", label: "Node", kind: "text", get: (r) => r.path },
      { key: "phase", label: "Phase", kind: "text", get: (r) => r.phase },
      { key: "rank", label: "Rank", kind: "int", get: (r) => r.rank },
      { key: "self", label: "Self time", kind: "time", get: (r) => r.self_time_ns },
      { key: "others", label: "Others' median", kind: "time", get: (r) => r.others_median_ns },
      { key: "excess", label: "Excess", kind: "time", get: (r) => r.excess_ns },
      { key: "relative", label: "Slower by", kind: "relative", get: (r) => r.relative },
    ];
    const rule = "self time over the other ranks' median by more than " + (100 * RUN.threshold).toFixed(0) + "% and " + fmt.time(RUN.min_time_ns) + ", largest excess first";
    const body = DATA.stragglers.length
      ? sortableTable("stragglers", columns, DATA.stragglers, { attrs: (r) => ({ "data-path": r.path, "data-rank": r.rank }) })
      : el("div", { id: "stragglers-none", text: "No straggler." });
    return section("stragglers-section", "Stragglers", el("div", { class: "muted", text: rule }), body);
  }

  function waitingSection() {
    const columns = [
      { key: "rank", label: "Rank", kind: "int", get: (r) => r.rank },
      { key: "wait", label: "Waiting in collectives", kind: "time", get: (r) => r.wait_ns },
      { key: "step", label: "Step", kind: "time", get: (r) => r.step_time_ns },
      { key: "fraction", label: "Share of the step", kind: "percent", get: (r) => r.fraction },
    ];
    return section("waiting-section", "Waiting per rank",
      el("div", { class: "muted", text: "the <communication> part: the fast ranks wait for the slow one" }),
      sortableTable("waiting", columns, DATA.waiting, { attrs: (r) => ({ "data-rank": r.rank }) }));
  }

  mount([header(), heatSection(), stragglersSection(), waitingSection()], "layerscopeRanks", { data: DATA });
})();
