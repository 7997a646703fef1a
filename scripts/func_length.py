#!/usr/bin/env python3
"""The functions of a C tree longer than a limit (issue 17: none in src/
over 150 lines).

    scripts/func_length.py [--max N] [--top K] [DIR...]   (default: src, 150)

A function is a definition at file scope in the house style: its
signature starts in column 0 and its body opens with a `{` alone in
column 0 and closes with the first `}` alone in column 0 after it. Its
length is the lines from that `{` to that `}`, both counted. Prints each
function over the limit as `FILE:LINE NAME LINES`, or with --top the K
longest whatever their length; exits 1 when one is over the limit, 0
otherwise (2 on a file it cannot read).
"""
import argparse
import os
import re
import sys

NAME = re.compile(r"([A-Za-z_][A-Za-z_0-9]*)\s*\(")


def functions(path):
    """(line of the signature, name, length) of each function in path."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
    out = []
    i = 0
    while i < len(lines):
        if lines[i] != "{":
            i += 1
            continue
        # the signature: the lines above, up to one that starts in column
        # 0 and is not a preprocessor line or a comment
        k = i - 1
        while k > 0 and (lines[k][:1] in (" ", "\t", "") or
                         lines[k].startswith(("*", "/*", "#"))):
            k -= 1
        sig = " ".join(lines[k:i])
        m = NAME.search(sig)
        if m is None or "=" in sig.split("(")[0]:
            i += 1  # an initializer (a table), not a function
            continue
        j = i + 1
        while j < len(lines) and lines[j] != "}":
            j += 1
        out.append((k + 1, m.group(1), j - i + 1))
        i = j + 1
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max", type=int, default=150)
    ap.add_argument("--top", type=int, default=0)
    ap.add_argument("dirs", nargs="*", default=["src"])
    a = ap.parse_args()
    found = []
    for d in a.dirs:
        for root, _, files in os.walk(d):
            for name in sorted(files):
                if name.endswith(".c"):
                    p = os.path.join(root, name)
                    try:
                        found += [(p,) + f for f in functions(p)]
                    except OSError as e:
                        print(f"func_length: {p}: {e.strerror}",
                              file=sys.stderr)
                        return 2
    found.sort(key=lambda f: -f[3])
    over = [f for f in found if f[3] > a.max]
    for p, line, name, n in (found[:a.top] if a.top else over):
        print(f"{p}:{line} {name} {n}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
