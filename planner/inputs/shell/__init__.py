"""A small interpreter for the subset of bash that training launchers use (lexer, syntax,
arithmetic, evaluation).  planner/inputs/script.py is the entry point: parse_launcher_script."""
