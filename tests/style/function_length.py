#!/usr/bin/env python3
"""Checks that no function in daemon/, client/, gpu/ or objstore/ is longer than 80 lines (issue 15).

  tests/style/function_length.py

A function is a definition that starts at column 0 (`Type Name(...) {`, the signature may span
lines) and ends at the next `}` at column 0; its length counts the lines between the two braces.
Functions defined inside class bodies are short by house style and not measured. Every function
over the limit is named, with its file, line and length."""
import os
import re
import sys

LIMIT = 80
ROOTS = ("daemon", "client", "gpu", "objstore")
HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.path.join(HERE, "../.."))

NOT_FUNCTIONS = re.compile(r"^(namespace|struct|class|enum|union|extern|template\s*<[^>]*>\s*(struct|class))\b")


def functions(path):
    """(name, first line, length) of every column-0 function definition in a .cc file."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line and not line[0].isspace() and not line.startswith(("#", "//", "}")) and \
                not NOT_FUNCTIONS.match(line) and "(" in line:
            # The signature ends at the first line ending in "{" (a definition), ";" (not one) or
            # "}" (a one-line definition).
            j = i
            while j < len(lines) and not lines[j].rstrip().endswith(("{", ";", "}")):
                j += 1
            if j < len(lines) and lines[j].rstrip().endswith("{") and "=" not in line.split("(")[0]:
                end = j + 1
                while end < len(lines) and not lines[end].startswith("}"):
                    end += 1
                name = re.sub(r"\s+", " ", line.split("(")[0]).split(" ")[-1]
                out.append((name, i + 1, end - j - 1))
                i = end
        i += 1
    return out


def main():
    problems = []
    for root in ROOTS:
        for dirpath, _, files in os.walk(os.path.join(SOURCE, root)):
            for f in sorted(files):
                if not f.endswith(".cc"):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, SOURCE)
                for name, line, length in functions(path):
                    if length > LIMIT:
                        problems.append(f"{rel}:{line}: {name} is {length} lines (limit {LIMIT}): split it")
    for p in problems:
        print(p, file=sys.stderr)
    print(f"function length: {len(problems)} function(s) over {LIMIT} lines in {', '.join(ROOTS)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
