"""What the planner hands back: terminal tables and JSON (report.py), pictures (plots.py), and the
directories commands write, staged and moved into place (run_dir.py)."""
