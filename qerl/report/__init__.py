"""The report stage: the paper's numbers, the artifact registry, and the table and figure renderers.

Modules: paper (every number of the paper), inputs (file readers), context (paths from the config; each
artifact's header line comes from qerl.provenance), tables (the Table model and its Markdown / LaTeX / CSV / HTML
files), accuracy_tables (Tables 1, 2, 4), efficiency_tables (Tables 3, 5-8, 9), figures, batch_sweep, beyond, registry
(one entry per artifact), claims with claims_learning / claims_speed / claims_verdicts (the headline claims).
Run: `qerl render --config config/config.yaml --artifact table1` (qerl/commands/render.py), `qerl claims ...`.
"""
__all__ = ["paper", "inputs", "context", "tables", "accuracy_tables", "efficiency_tables", "figures", "batch_sweep",
           "beyond", "registry", "claims", "claims_learning", "claims_speed", "claims_verdicts"]
