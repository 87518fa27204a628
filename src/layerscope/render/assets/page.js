// layerscope's HTML pages: what every page shares. Each page's script follows this one
// in the same script element (the policy allows that one script, by its hash) and
// takes its helpers from layerscopePage.
//
// Safety: every name in the data comes from user code. Pages are built with
// createElement, textContent and setAttribute only; never innerHTML.
"use strict";
const layerscopePage = (function () {
  const SVG_NS = "http://www.w3.org/2000/svg";

  // -- formatting: the page's one set of number formats (as layerscope/fmt.py) ----------
  const fmt = {
    sig4(value) {
      for (const [decimals, floor] of [[3, 10], [2, 100]]) {
        if (Number(value.toFixed(decimals)) < floor) return value.toFixed(decimals);
      }
      return value.toFixed(1);
    },
    time(ns) {
      if (ns === null || ns === undefined) return "";
      if (ns < 1000) return Math.round(ns) + "ns";
      for (const [unit, scale] of [["us", 1e3], ["ms", 1e6], ["s", 1e9]]) {
        const scaled = ns / scale;
        if (scaled < 1000 || unit === "s") {
          const text = fmt.sig4(scaled);
          if (Number(text) < 1000 || unit === "s") return text + unit;
        }
      }
      return (ns / 1e9).toFixed(1) + "s";
    },
    count(value, billions = "G") {
      if (value === null || value === undefined) return "";
      if (Math.abs(value) < 1000) return String(value);
      for (const [suffix, scale] of [["K", 1e3], ["M", 1e6], [billions, 1e9], ["T", 1e12]]) {
        const scaled = value / scale;
        if (Math.abs(scaled) < 999.995 || suffix === "T") return scaled.toFixed(2) + suffix;
      }
      return String(value);
    },
    bytes(value) {
      if (value === null || value === undefined) return "";
      if (Math.abs(value) < 1024) return value + " B";
      let scaled = value;
      let unit = "";
      for (unit of ["KiB", "MiB", "GiB", "TiB"]) {
        scaled /= 1024;
        if (Math.abs(scaled) < 1023.995) break;
      }
      return scaled.toFixed(2) + " " + unit;
    },
    percent(part, whole) {
      if (part === null || part === undefined || !whole) return "";
      return (100 * part / whole).toFixed(1) + "%";
    },
    rate(flops, ns) {
      if (!flops || !ns) return "";
      const perSecond = flops * 1e9 / ns;
      for (const [unit, scale] of [["TFLOP/s", 1e12], ["GFLOP/s", 1e9], ["MFLOP/s", 1e6], ["KFLOP/s", 1e3]]) {
        if (perSecond >= scale) return (perSecond / scale).toFixed(2) + " " + unit;
      }
      return perSecond.toFixed(0) + " FLOP/s";
    },
    shape(value) {
      if (value === null || value === undefined) return "";
      if (Array.isArray(value)) {
        if (value.every((v) => Number.isInteger(v))) return "[" + value.join(", ") + "]";
        return "[" + value.map((v) => (v === null ? "-" : fmt.shape(v))).join(", ") + "]";
      }
      if (typeof value === "object") {
        return "{" + Object.keys(value).map((k) => k + ": " + (value[k] === null ? "-" : fmt.shape(value[k]))).join(", ") + "}";
      }
      return String(value);
    },
    // A value of a column kind: time, count, bytes, rate (already a string), text.
    as(kind, value) {
      if (kind === "time") return fmt.time(value);
      if (kind === "count") return fmt.count(value);
      if (kind === "params") return fmt.count(value, "B");  // billions of parameters: B, as their readers say it
      if (kind === "bytes") return fmt.bytes(value);
      if (kind === "int") return value === null || value === undefined ? "" : String(value);
      if (kind === "shape") return fmt.shape(value);
      return value === null || value === undefined ? "" : String(value);
    },
  };

  // -- DOM helpers: text only, never markup ---------------------------------------------
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    setAttrs(node, attrs);
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(typeof child === "string" ? document.createTextNode(child) : child);
    }
    return node;
  }
  function svg(tag, attrs) {
    const node = document.createElementNS(SVG_NS, tag);
    setAttrs(node, attrs);
    return node;
  }
  function setAttrs(node, attrs) {
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "text") node.textContent = String(value);
      else node.setAttribute(key, String(value));
    }
  }

  // -- sections ---------------------------------------------------------------------------
  function section(id, title, ...children) {
    return el("section", { id, class: "card" }, el("h2", { text: title }), ...children);
  }

  // -- the tooltip ------------------------------------------------------------------------------
  const tip = document.getElementById("tooltip");
  function showTip(event, lines) {
    tip.replaceChildren(...lines.map((line) => el("div", { text: line })));
    tip.hidden = false;
    const left = Math.min(event.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    tip.style.left = Math.max(4, left) + "px";
    tip.style.top = event.clientY + 16 + "px";
  }
  function hideTip() { tip.hidden = true; }

  // -- the data: the one JSON element, of the schema the page draws ------------------------
  function readData(schema) {
    const data = JSON.parse(document.getElementById("layerscope-data").textContent);
    if (data.schema !== schema) throw new Error("unknown page data " + data.schema + "; expected " + schema);
    return data;
  }

  // A change, signed: "+1.20ms", "-3.00 KiB"; a ratio as a signed percent.
  function signed(kind, value) {
    if (value === null || value === undefined) return "";
    if (value === 0) return fmt.as(kind, 0);
    return (value > 0 ? "+" : "-") + fmt.as(kind, Math.abs(value));
  }
  function signedPercent(ratio) {
    if (ratio === null || ratio === undefined) return "";
    return (ratio >= 0 ? "+" : "") + (100 * ratio).toFixed(1) + "%";
  }
  // A value of a table column: the kinds of fmt.as, "delta-<kind>", "relative" (a signed
  // percent), "percent" and "ratio" (x1.25).
  function show(kind, value) {
    if (kind.startsWith("delta-")) return signed(kind.slice(6), value);
    if (kind === "relative") return signedPercent(value);
    if (kind === "ratio") return value === null || value === undefined ? "" : "x" + value.toFixed(2);
    if (kind === "percent") return value === null || value === undefined ? "" : (100 * value).toFixed(1) + "%";
    return fmt.as(kind, value);
  }
  const isText = (kind) => kind === "text" || kind === "shape";

  // Sorting: nulls last either way, ties in the data's order.
  function compare(va, vb, ia, ib, sign) {
    if (va === null || va === undefined) return vb === null || vb === undefined ? ia - ib : 1;
    if (vb === null || vb === undefined) return -1;
    if (typeof va === "string") return sign * va.localeCompare(vb) || ia - ib;
    return sign * (va - vb) || ia - ib;
  }

  // A table sorted by a click on a column's head (again: the other way). ``columns``:
  // {key, label, kind, get(row), title?(row)}; rows stay in the data's order until then.
  // Each cell keeps its raw value in data-value, for tests and copying.
  function sortableTable(id, columns, rows, options) {
    const opts = options || {};
    const state = { key: null, desc: true };
    const head = el("tr", {});
    for (const col of columns) {
      head.append(el("th", { "data-key": col.key, class: "sortable" + (isText(col.kind) ? "" : " num"), title: col.help, text: col.label }));
    }
    const body = el("tbody", {});
    const table = el("table", { id, class: "grid" }, el("thead", {}, head), body);
    function render() {
      const order = rows.map((_, i) => i);
      if (state.key !== null) {
        const col = columns.find((c) => c.key === state.key);
        const sign = state.desc ? -1 : 1;
        order.sort((a, b) => compare(col.get(rows[a]), col.get(rows[b]), a, b, sign));
      }
      body.replaceChildren(...order.map((i) => {
        const row = rows[i];
        const tr = el("tr", Object.assign({ "data-row": i }, opts.attrs ? opts.attrs(row) : {}));
        for (const col of columns) {
          const raw = col.get(row);
          tr.append(el("td", {
            class: (isText(col.kind) ? "" : "num") + (col.cls ? " " + col.cls(row) : ""), "data-key": col.key,
            "data-value": raw === null || raw === undefined || typeof raw === "object" ? "" : raw,
            title: col.title ? col.title(row) : null, text: show(col.kind, raw),
          }));
        }
        return tr;
      }));
      for (const th of head.children) {
        const on = th.dataset.key === state.key;
        th.classList.toggle("sorted", on);
        th.setAttribute("aria-sort", on ? (state.desc ? "descending" : "ascending") : "none");
      }
    }
    head.addEventListener("click", (event) => {
      const th = event.target.closest("th");
      if (!th) return;
      const col = columns.find((c) => c.key === th.dataset.key);
      if (state.key === col.key) state.desc = !state.desc; else { state.key = col.key; state.desc = !isText(col.kind); }
      render();
    });
    render();
    return el("div", { class: "scroll" }, table);
  }

  // Label: value pairs, as the report's header shows them; empty values are left out.
  function facts(pairs) {
    const list = el("dl", { class: "facts" });
    for (const [label, value] of pairs) {
      if (value === null || value === undefined || value === "") continue;
      list.append(el("div", { class: "fact" }, el("dt", { text: label }), el("dd", { text: String(value) })));
    }
    return list;
  }

  // The page drawn: a header card, a nav to the other sections, the sections; then the
  // marker tests and benchmarks wait for, and window[name] for them to read.
  function mount(parts, name, extra) {
    const shown = parts.filter(Boolean);
    const nav = el("nav", { class: "nav" });
    for (const part of shown.slice(1)) nav.append(el("a", { href: "#" + part.id, text: part.querySelector("h2").textContent }));
    document.getElementById("report").replaceChildren(shown[0], nav, ...shown.slice(1));
    window[name] = Object.assign({ fmt }, extra);
    document.body.setAttribute("data-ready", "1");
  }

  return { fmt, el, svg, setAttrs, section, showTip, hideTip, readData, signed, signedPercent, show, compare, sortableTable, facts, mount };
})();
