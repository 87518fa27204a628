"""The HTML report at scale: its size and how soon it is interactive in headless chromium.

    python -m benchmarks.html_report [--loads 5] [--modules 10000] [--quick]

Two pages:

1. **BERT-base training step.** ``BertModel(BertConfig())`` (random weights, built from
   its config, nothing downloaded) in a ``layerscope.Profiler`` around 2 training steps
   (AdamW) of 1 x 16 tokens, each timed and detailed, memory tracked.
2. **A tree of ``--modules`` modules.** ``nn.Sequential`` of 100 blocks, each an
   ``nn.Sequential`` of ``Linear(4, 4)`` (100 x 100 = 10,000 Linear, 10,101 modules),
   ``layerscope.profile(backward=True, warmup=0, repeat=1)``.

For each page: its size, then ``--loads`` fresh loads in one chromium (``/usr/bin/chromium``,
or ``LAYERSCOPE_CHROMIUM``), each timed from the navigation's start to the page marking
itself ready (tree, icicle, op table and memory drawn; the page's own
``performance.now()``), and the wall time of three interactions: expanding the root's
first child, switching the icicle to FLOPs, and grouping the op table by module.
Medians are reported. Targets: BERT-base under 3 MB and interactive within 1 s; the
10,000-module page opens.

Needs playwright (``pip install playwright``; its browser download is not used).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import layerscope

CHROMIUM = os.environ.get("LAYERSCOPE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--no-first-run", "--disable-sync",
]


def bert_step() -> Any:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    model = BertModel(BertConfig())
    opt = torch.optim.AdamW(model.parameters())
    ids = torch.randint(0, 30000, (1, 16))
    with layerscope.Profiler(model) as prof:
        for _ in range(2):
            model(input_ids=ids).last_hidden_state.sum().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    return prof.profile


def wide_tree(modules: int) -> Any:
    blocks = max(1, round(modules ** 0.5))
    per_block = max(1, modules // blocks)
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(*[nn.Linear(4, 4) for _ in range(per_block)]) for _ in range(blocks)])
    return layerscope.profile(model, torch.randn(2, 4), backward=True, warmup=0, repeat=1)


def _timed_click(page: Any, selector: str, settled: str) -> float:
    start = time.perf_counter()
    page.click(selector)
    page.wait_for_function(settled)
    return (time.perf_counter() - start) * 1e3


def measure(browser: Any, path: Path, loads: int) -> dict[str, Any]:
    ready, script, expand, icicle, ops = [], [], [], [], []
    for _ in range(loads):
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
        page.goto(path.as_uri())
        page.wait_for_selector("body[data-ready]", timeout=120_000)
        if errors:
            raise RuntimeError(f"{path.name}: {errors}")
        report = page.evaluate("() => [window.layerscopeReport.readyMs, window.layerscopeReport.scriptMs]")
        ready.append(report[0])
        script.append(report[1])
        rows = page.eval_on_selector_all("#tree-table tbody tr", "rows => rows.length")
        expand.append(_timed_click(
            page, "#tree-table tbody tr:nth-child(2) button.toggle",
            f"() => document.querySelectorAll('#tree-table tbody tr').length > {rows}",
        ))
        icicle.append(_timed_click(
            page, '#icicle-section button[data-metric="flops"]',
            "() => document.getElementById('icicle').dataset.metric === 'flops'",
        ))
        ops.append(_timed_click(
            page, '#ops button[data-group="module"]',
            "() => document.querySelector('#ops button.active').dataset.group === 'module'",
        ))
        page.close()
    median = statistics.median
    return {
        "bytes": path.stat().st_size,
        "ready_ms": median(ready), "script_ms": median(script),
        "expand_ms": median(expand), "icicle_ms": median(icicle), "ops_ms": median(ops),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument("--modules", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true", help="1 load and a 1,000-module tree")
    args = parser.parse_args(argv)
    if args.quick:
        args.loads, args.modules = 1, 1000
    from playwright.sync_api import sync_playwright

    torch.set_num_threads(min(2, torch.get_num_threads()))
    profiles = {"BERT-base training step (1 x 16 tokens)": bert_step(), f"{args.modules} x Linear(4, 4), nested": wide_tree(args.modules)}
    results = {}
    with tempfile.TemporaryDirectory() as folder, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        for name, prof in profiles.items():
            path = Path(folder) / "report.html"
            start = time.perf_counter()
            prof.save(str(path))
            render_ms = (time.perf_counter() - start) * 1e3
            nodes = sum(1 for _ in prof.nodes())
            results[name] = {"nodes": nodes, "render_ms": render_ms, **measure(browser, path, args.loads)}
        browser.close()
    print(f"{'page':45} {'nodes':>6} {'size':>9} {'render':>8} {'ready':>8} {'script':>8} {'expand':>8} {'icicle':>8} {'ops':>8}")
    for name, r in results.items():
        print(
            f"{name:45} {r['nodes']:6d} {r['bytes'] / 2**20:7.2f}MB {r['render_ms']:6.0f}ms {r['ready_ms']:6.0f}ms "
            f"{r['script_ms']:6.0f}ms {r['expand_ms']:6.0f}ms {r['icicle_ms']:6.0f}ms {r['ops_ms']:6.0f}ms"
        )
    print(json.dumps(results), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
