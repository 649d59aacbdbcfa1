"""The report stage: the paper's numbers, the artifact registry, and the table and figure renderers.

Modules: paper (every number of the paper), inputs (file contracts and readers), context (paths from the config),
provenance (header line), tables, figures, registry (one entry per artifact), render (the `qerl render` CLI).
Run: `qerl render --config config/config.yaml --artifact table1`.
"""
__all__ = ["paper", "inputs", "context", "provenance", "tables", "figures", "registry", "render"]
