"""One module per report kind (``reports/*/config.toml``); the plumbing: ``analysis/report.py``.

Each module has a ``build(ctx)`` that reads its knobs from the config (one-line errors for missing
ones), runs the sweeps through the same functions the CLI and notebooks use, and appends Markdown
to the README. ``specsim.analysis.report.KINDS`` names them; nothing here is imported by it.
"""
