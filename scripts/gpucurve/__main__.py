"""python3 -m gpucurve {measure,breakdown,fused,report,sync,sync-report} (from scripts/): see
__init__.py, and sync.py for sync."""

from __future__ import annotations

import argparse
import sys

from . import __doc__ as DOC
from .fused import fused
from .measure import breakdown_only, measure
from .paths import DATA, SYNC_PAGE
from .sync import STEPS, WARMUP, sync
from .syncreport import sync_report


def report(args) -> None:
    # Imported here: it needs Python 3.11's tomllib, which measuring does not.
    from .report import report as write_page

    write_page(args)


def main() -> None:
    ap = argparse.ArgumentParser(description=DOC.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="time the steps (needs a GPU and PyTorch)")
    m.add_argument("--out", default=str(DATA))
    m.add_argument("--config", choices=["qwen3-8b", "tiny"], default="qwen3-8b")
    m.add_argument("--device", default="cuda")
    bd = sub.add_parser("breakdown", help="re-take the kernel breakdown into a measurement (needs a GPU)")
    bd.add_argument("--out", default=str(DATA))
    fu = sub.add_parser("fused", help="a few steps again with torch.compile's fusion (needs a GPU)")
    fu.add_argument("--out", default=str(DATA))
    r = sub.add_parser("report", help="fit and write the page (needs cargo)")
    r.add_argument("--data", default=str(DATA))
    s = sub.add_parser("sync", help="what a blocking device read per step costs under async scheduling (needs a GPU)")
    s.add_argument("--out", default=str(DATA))
    s.add_argument("--config", choices=["qwen3-8b", "tiny"], default="qwen3-8b")
    s.add_argument("--device", default="cuda")
    s.add_argument("--steps", type=int, default=STEPS, help="timed steps per loop")
    s.add_argument("--warmup", type=int, default=WARMUP, help="steps before timing, per loop")
    sr = sub.add_parser("sync-report", help="write the page from sync.json (no GPU needed)")
    sr.add_argument("--data", default=str(DATA))
    sr.add_argument("--page", default=str(SYNC_PAGE))
    args = ap.parse_args()
    {"measure": measure, "breakdown": breakdown_only, "fused": fused, "report": report, "sync": sync,
     "sync-report": sync_report}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
