"""The report stage: the paper's numbers, the artifact registry, and the table and figure renderers.

Modules: paper (every number of the paper), inputs (file contracts and readers), context (paths from the config),
provenance (header line), tables (the Table model and its Markdown / LaTeX / CSV / HTML files), accuracy_tables
(Tables 1, 2, 4), efficiency_tables (Tables 3, 5-8, 9), figures, registry (one entry per artifact), render (the `qerl
render` CLI).
Run: `qerl render --config config/config.yaml --artifact table1`.
"""
__all__ = ["paper", "inputs", "context", "provenance", "tables", "accuracy_tables", "efficiency_tables", "figures",
           "registry", "render"]
