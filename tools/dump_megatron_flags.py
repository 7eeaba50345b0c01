"""Write the option table of Megatron-LM's own argument parser (megatron.training.arguments) as TSV.

Run with the Python of the validator environment (.ci/megatron_env.sh prints it):

    $(bash .ci/megatron_env.sh) tools/dump_megatron_flags.py > planner/inputs/data/megatron_flags.tsv

Columns: flag, nargs (0 for switches, 1, ?, *, + or an integer), dest.  The planner's flag reader
(planner/inputs/megatron_flags.py) uses the table to refuse flags Megatron does not know, as
Megatron's parser does.
"""

from __future__ import annotations

import argparse
import sys
import warnings


def main() -> None:
    warnings.filterwarnings("ignore")
    import megatron.core
    from megatron.training import arguments

    parser = argparse.ArgumentParser(allow_abbrev=False)
    build = getattr(arguments, "add_megatron_arguments", None)
    if build is not None:
        parser = build(parser)
    else:  # parse_args builds the parser itself; capture it
        captured = {}
        real = argparse.ArgumentParser.parse_known_args

        def grab(self, *a, **k):
            captured["p"] = self
            raise SystemExit(0)

        argparse.ArgumentParser.parse_known_args = grab
        try:
            arguments.parse_args(ignore_unknown_args=True)
        except SystemExit:
            pass
        argparse.ArgumentParser.parse_known_args = real
        parser = captured["p"]
    print(f"# megatron-core {megatron.core.__version__}: option strings of megatron.training.arguments")
    print("flag\tnargs\tdest")
    rows = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        nargs = action.nargs
        if nargs is None:
            nargs = 0 if action.__class__.__name__ in ("_StoreTrueAction", "_StoreFalseAction", "_StoreConstAction",
                                                       "_CountAction", "BooleanOptionalAction") else 1
        for opt in action.option_strings:
            rows.append((opt, str(nargs), action.dest))
    for row in sorted(set(rows)):
        print("\t".join(row))


if __name__ == "__main__":
    sys.argv = ["pretrain_gpt.py"]
    main()
