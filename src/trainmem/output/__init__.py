"""What people read: the terminal's tables and verdicts (`render`) and the report pages made from result rows
(`report`: markdown, CSV, plots, HTML; torch-free)."""
