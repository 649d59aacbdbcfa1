"""`qerl claims --config FILE --out MD [--html PAGE]`: the paper's headline claims checked against this scale's
results (qerl.report.claims.render_claims), as Markdown and optionally as an HTML page."""
from __future__ import annotations

from qerl.config import load_config
from qerl.io import write_text
from qerl.report.claims import markdown_to_html, render_claims

__all__ = ["add_arguments", "run"]


def add_arguments(parser) -> None:
    """Arguments of `qerl claims`."""
    parser.add_argument("--config", required=True, help="YAML config file (the one the runs were made with)")
    parser.add_argument("--out", required=True, help="Markdown file to write (e.g. results/tiny/claims.md)")
    parser.add_argument("--html", default=None, help="also write the document as an HTML page here")


def run(args) -> int:
    cfg = load_config(args.config, check_data=False)
    text = render_claims(cfg)
    print(write_text(args.out, text))
    if args.html:
        title = f"Headline claims of QeRL at the {cfg['scale']} scale"
        print(write_text(args.html, markdown_to_html(text, title)))
    return 0
