"""Reading torch.profiler traces: load time and peak memory against the standard
library's parse alone, and the HTML report of a large trace in a real browser.

Each load runs in a fresh process (its peak RSS is the process's own), interleaved with
the baseline (``json.load`` of the same file, which builds every event as a dict and
does nothing else), rounds apart; medians. Targets (issue 24): the OWLv2 trace (132k
events) loads in at most 3 s and 400 MB; a 1,000,000-event trace (tiled from it by
``benchmarks/trace_tile.py``) in at most 15 s and 1 GB; the OWLv2 trace's HTML report
is ready in Chromium in under 1 s.

Usage: python benchmarks/traces.py [--rounds 3] [--quick] [--no-million] [--no-browser]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OWLV2 = ROOT.parent / "shared" / "traces" / "h100_owlv2_inference.json.gz"

#: The child's code: one load (or parse), then its time and peak RSS as JSON.
_CHILD = """
import json, resource, sys, time
kind, path = sys.argv[1], sys.argv[2]
if kind == "layerscope":
    import layerscope, torch  # imported before the clock: what the load itself costs
    start = time.perf_counter()
    profile = layerscope.load(path)
    seconds = time.perf_counter() - start
    nodes = sum(1 for _ in profile.nodes())
else:
    import gzip
    start = time.perf_counter()
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as handle:
        nodes = len(json.load(handle)["traceEvents"])
    seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "count": nodes}))
"""


def _child(kind: str, path: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, kind, str(path)], capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{kind} on {path.name} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def loads(path: Path, rounds: int) -> dict[str, dict[str, float]]:
    """Median seconds and peak RSS of each variant, interleaved over rounds."""
    runs: dict[str, list[dict[str, float]]] = {"json.load": [], "layerscope.load": []}
    for _ in range(rounds):
        runs["json.load"].append(_child("json", path))
        runs["layerscope.load"].append(_child("layerscope", path))
    return {
        name: {
            "seconds": statistics.median(r["seconds"] for r in results),
            "rss_mib": statistics.median(r["rss_mib"] for r in results),
            "count": results[0]["count"],
        }
        for name, results in runs.items()
    }


def browser_ready_ms(html: Path, loads_n: int) -> list[float] | None:
    """Milliseconds from navigation to the report's ready mark, per load (None without
    playwright or Chromium)."""
    chromium = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if chromium is None:
        return None
    times = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            for _ in range(loads_n):
                page = browser.new_page()
                page.goto(html.as_uri())
                page.wait_for_selector("body[data-ready='1']", timeout=60_000)
                # performance.now() counts from the navigation's start: the page's own mark.
                times.append(page.evaluate("() => window.layerscopeReport.readyMs"))
                page.close()
        finally:
            browser.close()
    return times


def _table(title: str, results: dict[str, dict[str, float]], target_s: float, target_mib: float) -> list[str]:
    base = results["json.load"]
    mine = results["layerscope.load"]
    verdict = "met" if mine["seconds"] <= target_s and mine["rss_mib"] <= target_mib else "NOT met"
    return [
        f"{title}: target <= {target_s:g} s and <= {target_mib:g} MiB peak RSS: {verdict}",
        "",
        "| variant | median s | x json.load | median peak RSS MiB | x json.load |",
        "| --- | ---: | ---: | ---: | ---: |",
        f"| `json.load` (parse only) | {base['seconds']:.2f} | 1.00 | {base['rss_mib']:.0f} | 1.00 |",
        f"| `layerscope.load` (to a Profile) | {mine['seconds']:.2f} | {mine['seconds'] / base['seconds']:.2f} | "
        f"{mine['rss_mib']:.0f} | {mine['rss_mib'] / base['rss_mib']:.2f} |",
        "",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, help="fresh-process loads per variant, interleaved (default 3)")
    parser.add_argument("--quick", action="store_true", help="one round, no 1M-event trace, 2 browser loads")
    parser.add_argument("--no-million", action="store_true", help="skip the 1,000,000-event trace")
    parser.add_argument("--no-browser", action="store_true", help="skip the HTML report in Chromium")
    args = parser.parse_args()
    if not OWLV2.exists():
        parser.error(f"the real traces are not here (expected {OWLV2})")
    rounds = 1 if args.quick else args.rounds
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, {rounds} rounds, medians\n")
    lines = _table("OWLv2 trace (132,152 events, 32 MB of JSON)", loads(OWLV2, rounds), 3, 400)
    with tempfile.TemporaryDirectory() as folder:
        if not (args.quick or args.no_million):
            big = Path(folder) / "million.json.gz"
            subprocess.run([sys.executable, str(ROOT / "benchmarks" / "trace_tile.py"), str(OWLV2), str(big),
                            "--events", "1000000"], check=True, capture_output=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT / "src")})  # fmt: skip
            lines += _table("1,000,000 events (OWLv2 tiled)", loads(big, rounds), 15, 1024)
        if not args.no_browser:
            sys.path.insert(0, str(ROOT / "src"))
            import layerscope

            html = Path(folder) / "owlv2.html"
            profile = layerscope.load(OWLV2)
            profile.save(html)
            times = browser_ready_ms(html, 2 if args.quick else 7)
            if times is None:
                lines.append("HTML report in Chromium: skipped (playwright or Debian's chromium missing)")
            else:
                modules = sum(1 for _ in profile.modules())
                verdict = "met" if statistics.median(times) < 1000 else "NOT met"
                lines.append(
                    f"HTML report of the OWLv2 trace ({modules} module nodes, {html.stat().st_size / 2**20:.1f} MiB): "
                    f"ready in Chromium in median {statistics.median(times):.0f} ms, max {max(times):.0f} ms over "
                    f"{len(times)} loads (target < 1000 ms: {verdict})"
                )
    print("\n".join(lines))


if __name__ == "__main__":
    main()
