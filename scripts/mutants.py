#!/usr/bin/env python3
"""make mutants: mutate the simulator's rules one at a time and run the tests.

Each mutation of scripts/mutants.tsv (one a line, tab-separated: id, file,
anchor, replacement, the rule it breaks) replaces one exact snippet of a
source file, which must occur there exactly once. The script works in a
scratch copy of the tree (build/mutants/tree: the tracked and untracked,
not ignored, files, and the build outputs already made, so only what a
mutation touches is rebuilt), never in the tree you edit. Per mutation it
rebuilds the library, the program and the test binaries it runs, and runs
make test's checks in turn until one fails: the accuracy gate (validate of
every ground-truth file against groundtruth/bounds.json), then every test
binary (Criterion --fail-fast), then the test scripts. The checks that
killed the most mutations so far run first. A mutation is

  killed    a check failed: the report names the binary and the test (or
            the ground-truth file) and the time it took;
  survived  every check passed;
  stale     its anchor does not occur exactly once (fails the run);
  invalid   the mutated tree does not compile (fails the run).

Before the mutations, the unmutated copy must pass every check (the
baseline), or nothing is run. The report (Markdown) goes to
scripts/mutants.report.md, or --report FILE (--merge keeps its rows of
the mutations not run now, and of the selected ones until they are
rerun, marked *: rerun a few after a fix). The checks run most likely
killer first: the test that killed the mutation in the report alone,
the rule file's usual killers (BY_FILE), then the rest by kills so far.
The exit status is 0 when no
mutation survived outside the list of explained survivors
(scripts/mutants.survivors: id, tab, why no test can see it), and every
mutation applied and compiled.

Usage: scripts/mutants.py [--only ID[,ID...]] [--grep REGEX] [--check]
                          [--merge] [--no-baseline] [--report FILE] [--timeout S]
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIST = os.path.join(ROOT, "scripts", "mutants.tsv")
SURVIVORS = os.path.join(ROOT, "scripts", "mutants.survivors")
REPORT = os.path.join(ROOT, "scripts", "mutants.report.md")
SCRATCH = os.path.join(ROOT, "build", "mutants")
TREE = os.path.join(SCRATCH, "tree")
MAKE = os.environ.get("MAKE", "make")
PYTHON = os.environ.get("PYTHON", "python3")
# Checks that usually kill a simulator rule first; the rest follow in
# name order. The checks that killed most run first as the run goes.
FIRST = ["accuracy", "test_rules_optim", "test_rules_dist", "test_rules_ops", "test_sim", "test_published", "test_cluster",
         "test_techniques", "test_cluster_time", "test_timing",
         "test_validate_dist", "test_allocator", "test_serve", "test_cli"]
# The checks a rule's file is most likely caught by, tried right after the
# mutation's killer of the last report (the cluster planner's rules are not
# in the simulator that validate runs).
BY_FILE = [(r"src/cluster", ["test_rules_dist", "test_cluster",
                             "test_cluster_time"]),
           (r"src/(serve|kvcache)", ["test_serve"]),
           (r"src/optim", ["test_rules_optim"]),
           (r"src/timing", ["test_timing", "test_published"])]
SCRIPTS = ["tests/python/run.sh", "tests/install/run.sh"]
KILLS = {}  # check -> mutations it killed in this run


def unescape(s):
    out, i = [], 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            n = s[i + 1]
            out.append({"n": "\n", "t": "\t", "\\": "\\"}.get(n, "\\" + n))
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def read_list(path):
    muts = []
    with open(path) as f:
        for ln, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.startswith("#"):
                continue
            cols = line.split("\t")
            if len(cols) != 5:
                sys.exit(f"{path}:{ln}: expected 5 tab-separated columns "
                         f"(id, file, anchor, replacement, rule), got "
                         f"{len(cols)}")
            mid, fn, anchor, repl, rule = cols
            if any(m["id"] == mid for m in muts):
                sys.exit(f"{path}:{ln}: mutation {mid} given twice")
            muts.append({"id": mid, "file": fn, "anchor": unescape(anchor),
                         "repl": unescape(repl), "rule": rule, "line": ln})
    return muts


def read_survivors(path):
    why = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.rstrip("\n")
                if line.strip() and not line.startswith("#"):
                    mid, _, text = line.partition("\t")
                    why[mid] = text
    return why


def sh(cmd, cwd=TREE, timeout=None, env=None):
    p = subprocess.run(cmd, cwd=cwd, shell=isinstance(cmd, str),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=timeout, env=env, text=True, errors="replace")
    return p.returncode, p.stdout


def scratch_copy():
    """The tracked and untracked (not ignored) files, and build/, copied
    with their times, so make rebuilds nothing that is up to date."""
    if os.path.isdir(TREE):
        shutil.rmtree(TREE)
    os.makedirs(TREE)
    files = subprocess.run(
        ["git", "ls-files", "-z", "-c", "-o", "--exclude-standard"],
        cwd=ROOT, stdout=subprocess.PIPE, check=True).stdout.split(b"\0")
    for f in files:
        f = f.decode()
        if not f or not os.path.lexists(os.path.join(ROOT, f)):
            continue
        dst = os.path.join(TREE, f)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        src = os.path.join(ROOT, f)
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        elif os.path.isfile(src):
            shutil.copy2(src, dst)
    bsrc = os.path.join(ROOT, "build")
    if os.path.isdir(bsrc):
        shutil.copytree(bsrc, os.path.join(TREE, "build"), symlinks=True,
                        ignore=shutil.ignore_patterns(
                            "mutants", "san-*", "equiv"))
    for f in ("vramplan", "libvramplan.a"):
        if os.path.exists(os.path.join(ROOT, f)):
            shutil.copy2(os.path.join(ROOT, f), os.path.join(TREE, f))


def test_env():
    env = dict(os.environ)
    env.update({
        "VRAMPLAN_BIN": "./vramplan",
        "VRAMPLAN_LIB": os.path.join(TREE, "build", "libvramplan.so.0.1.0"),
        "VRAMPLAN_FAKE_NVML": os.path.join(TREE, "build", "tests",
                                           "libfake_nvml.so"),
        "PYTHON": PYTHON, "VP_SANITIZE": "", "VP_SAN_FLAGS": "",
        "CC": os.environ.get("CC", "cc"), "MAKE": MAKE,
        "PKG_CONFIG": os.environ.get("PKG_CONFIG", "pkg-config"),
    })
    so = glob.glob(os.path.join(TREE, "build", "libvramplan.so.*.*.*"))
    if so:
        env["VRAMPLAN_LIB"] = so[0]
    return env


def gt_files():
    shared = os.path.realpath(os.path.join(ROOT, "..", "shared",
                                           "groundtruth"))
    gt = shared if os.path.isdir(shared) else os.path.join(
        TREE, "tests", "data", "groundtruth")
    out = []
    for pat in (gt + "/*.jsonl", gt + "/dist/*.jsonl",
                TREE + "/groundtruth/*.jsonl",
                TREE + "/groundtruth/dist/*.jsonl",
                TREE + "/groundtruth/heldout/*.jsonl"):
        out += sorted(glob.glob(pat))
    return out


def first_failure(out):
    """The first failing Criterion test in a binary's output."""
    m = re.search(r"\[FAIL\] (\S+)", out)
    if m:
        return m.group(1).rstrip(":")
    m = re.search(r"\[----\] (\S+): (?:CRASH|Timed out|Unexpected)", out)
    if m:
        return m.group(1) + " (crash)"
    m = re.search(r"(tests/\S+:\d+): Assertion Failed", out)
    return m.group(1) if m else "(exit status)"


def run_check(name, timeout, first_gt=None):
    """Runs one check in the scratch tree: None when it passes, else what
    failed. name is "accuracy" (first_gt: the ground-truth file to try
    first), a test binary, "BINARY::suite::test" (that test alone), or a
    test script."""
    env = test_env()
    if name == "accuracy":
        files = gt_files()
        if first_gt:
            files.sort(key=lambda f: not f.endswith(first_gt))
        for f in files:
            p = subprocess.run(["./vramplan", "validate", "--gpu", "h200",
                                "--outliers", "groundtruth/bounds.json", f],
                               cwd=TREE, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, timeout=timeout,
                               env=env, text=True, errors="replace")
            if p.returncode != 0:
                msg = [l for l in p.stderr.splitlines() if l.strip()]
                short = os.path.relpath(f, TREE) if f.startswith(TREE) \
                    else "shared/groundtruth/" + os.path.relpath(
                        f, os.path.realpath(os.path.join(ROOT, "..",
                                                         "shared",
                                                         "groundtruth")))
                first = msg[0].replace(f, short)[:240] if msg else \
                    f"{short}: exit status {p.returncode}"
                return (first
                        + (f" (+{len(msg) - 1} more)" if len(msg) > 1
                           else ""))
        return None
    if name.startswith("tests/"):
        rc, out = sh(["./" + name], timeout=timeout, env=env)
        line = [l for l in out.splitlines() if "Synthesis: Tested:" in l]
        m = re.search(r"Failing: *(\d+)", line[-1]) if line else None
        if rc == 0 and m and m.group(1) == "0":
            return None
        return first_failure(out)
    name, _, test = name.partition("::")
    binary = "build/tests/" + name
    rc, out = sh([MAKE, "-s", "--no-print-directory", binary], env=env,
                 timeout=timeout)
    if rc != 0:
        return "BUILD: " + out.strip().splitlines()[-1][:160]
    args = ["--fail-fast"]
    if test:
        args.append("--filter=" + test.replace("::", "/", 1))
    rc, out = sh(["./" + binary] + args, timeout=timeout, env=env)
    if rc == 0 and "Failing: 0" in out:
        return None
    return first_failure(out)


def build(timeout):
    rc, out = sh([MAKE, "-s", "--no-print-directory", "-j2", "all",
                  "build/tests/libfake_nvml.so"], timeout=timeout)
    return rc, out


def run_checks(order, timeout, hint=None):
    """The checks in order, until one fails: (check, detail, seconds) or
    None. hint: the mutation's killer in the last report (a check and its
    test or ground-truth file): that test alone runs first, and the
    accuracy gate tries that file first."""
    first_gt, pre = None, []
    if hint and hint.get("by") == "accuracy":
        m = re.match(r"(?:shared/)?groundtruth/\S+?\.jsonl", hint["detail"])
        first_gt = m.group(0).split("groundtruth/", 1)[1] if m else None
    elif hint and hint.get("by") in order and \
            re.fullmatch(r"\w+::\w+", hint.get("detail", "")):
        pre = [hint["by"] + "::" + hint["detail"]]
    for name in pre + order:
        t0 = time.time()
        try:
            fail = run_check(name, timeout, first_gt)
        except subprocess.TimeoutExpired:
            fail = f"timed out after {timeout} s"
        if fail is not None:
            return name.partition("::")[0], fail, time.time() - t0
    return None


def obj_of(fn):
    return os.path.join(TREE, "build", fn[:-2] + ".o") \
        if fn.endswith(".c") else None


def force_relink():
    for p in ["libvramplan.a", "vramplan"] + \
             glob.glob(os.path.join(TREE, "build", "libvramplan.so*")):
        p = os.path.join(TREE, p)
        if os.path.lexists(p):
            os.remove(p)


def order_for(m, order):
    """The checks for mutation m: the ones its file is most likely caught
    by first, then the rest in the run's order."""
    first = [c for pat, cs in BY_FILE if re.match(pat, m["file"])
             for c in cs if c in order]
    return first + [c for c in order if c not in first]


def mutate(m, order, timeout, hint=None):
    path = os.path.join(TREE, m["file"])
    if not os.path.isfile(path):
        return {"status": "stale", "detail": "no such file"}
    with open(path) as f:
        text = f.read()
    n = text.count(m["anchor"])
    if n != 1:
        return {"status": "stale", "detail": f"anchor found {n} times"}
    st = os.stat(path)
    obj = obj_of(m["file"])
    saved = {}
    if obj:
        for p in (obj, obj[:-2] + ".d"):
            if os.path.exists(p):
                with open(p, "rb") as f:
                    saved[p] = (f.read(), os.stat(p))
    t0 = time.time()
    try:
        with open(path, "w") as f:
            f.write(text.replace(m["anchor"], m["repl"]))
        try:
            rc, out = build(timeout)
        except subprocess.TimeoutExpired:
            rc, out = 1, "build timed out"
        if rc != 0:
            err = [l for l in out.splitlines() if "error" in l]
            return {"status": "invalid",
                    "detail": (err[0] if err else out[-200:]).strip(),
                    "secs": time.time() - t0}
        res = run_checks(order_for(m, order), timeout, hint)
    finally:
        with open(path, "w") as f:
            f.write(text)
        if saved and len(saved) == 2:
            for p, (data, pst) in saved.items():
                with open(p, "wb") as f:
                    f.write(data)
                os.utime(p, ns=(pst.st_atime_ns, pst.st_mtime_ns))
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        elif not obj:
            # a header: what was compiled with the mutated copy is newer
            # than its restored time; make the header newer still
            os.utime(path)
        force_relink()
    if res is None:
        return {"status": "survived", "secs": time.time() - t0}
    name, fail, _ = res
    if name in order:  # the checks that killed most run first
        KILLS[name] = KILLS.get(name, 0) + 1
        static = default_order()
        order.sort(key=lambda c: (-KILLS.get(c, 0),
                                  static.index(c) if c in static else 0))
    return {"status": "killed", "by": name, "detail": fail,
            "secs": time.time() - t0}


def default_order():
    bins = sorted(os.path.basename(p)[:-2]
                  for p in glob.glob(os.path.join(TREE, "tests",
                                                  "test_*.c")))
    order = [c for c in FIRST if c == "accuracy" or c in bins]
    order += [b for b in bins if b not in order]
    order += [s for s in SCRIPTS if os.path.exists(os.path.join(TREE, s))]
    return order


def md_cell(s):
    return str(s).replace("|", "\\|").replace("\n", " ")


def read_report(path):
    """The rows of an earlier report: id -> its cells (for --merge)."""
    rows = {}
    if not os.path.exists(path):
        return rows
    with open(path) as f:
        for line in f:
            if not line.startswith("| ") or line.startswith("| id |"):
                continue
            cells = [c.strip().replace("\\|", "|") for c in
                     re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if len(cells) == 7:
                rows[cells[0]] = {"status": cells[3], "by": cells[4],
                                  "detail": cells[5],
                                  "secs": float(cells[6] or 0),
                                  "earlier": True}
    return rows


def write_report(path, muts, results, why, baseline_s, total_s, sel):
    counts = {}
    for r in results.values():
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    earlier = sum(1 for r in results.values() if r.get("earlier"))
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                         stdout=subprocess.PIPE, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "src"],
                           cwd=ROOT, stdout=subprocess.PIPE,
                           text=True).stdout.strip()
    lines = [
        "# make mutants: last report",
        "",
        f"Generated by `scripts/mutants.py` ({'make mutants' if not sel else 'selection: ' + sel}) "
        f"at revision {rev}{' (src/ modified)' if dirty else ''}, "
        f"{time.strftime('%Y-%m-%d %H:%M')}. "
        f"Mutations: {len(results)} of {len(muts)} in scripts/mutants.tsv; "
        + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        + f". Baseline (all checks, unmutated): "
        + (f"{baseline_s:.0f} s" if baseline_s is not None else "not run")
        + f"; total {total_s:.0f} s."
        + (f" {earlier} rows (marked *) are kept from the earlier report"
           " (--merge); the others were run now." if earlier else ""),
        "",
        "| id | file | rule | result | by | detail | s |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in muts:
        r = results.get(m["id"])
        if not r:
            continue
        status = r["status"]
        detail = r.get("detail", "")
        if status == "survived" and not r.get("earlier"):
            detail = why.get(m["id"], "UNEXPLAINED")
        lines.append("| " + " | ".join(md_cell(x) for x in (
            m["id"] + ("*" if r.get("earlier") else ""), m["file"],
            m["rule"], status, r.get("by", ""),
            detail, f"{r.get('secs', 0):.0f}")) + " |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated mutation ids")
    ap.add_argument("--grep", help="mutations whose id or rule match")
    ap.add_argument("--no-baseline", action="store_true",
                    help="skip the unmutated run (while developing)")
    ap.add_argument("--check", action="store_true",
                    help="only check that every anchor occurs once")
    ap.add_argument("--report", default=REPORT)
    ap.add_argument("--merge", action="store_true",
                    help="keep the report's rows of mutations not run now")
    ap.add_argument("--timeout", type=int, default=900,
                    help="seconds per build or check (default 900)")
    a = ap.parse_args()
    muts = read_list(LIST)
    why = read_survivors(SURVIVORS)
    for mid in why:
        if not any(m["id"] == mid for m in muts):
            sys.exit(f"{SURVIVORS}: {mid} is not a mutation")
    sel = muts
    if a.only:
        ids = a.only.split(",")
        for i in ids:
            if not any(m["id"] == i for m in muts):
                sys.exit(f"--only: no mutation {i}")
        sel = [m for m in muts if m["id"] in ids]
    if a.grep:
        sel = [m for m in sel if re.search(a.grep, m["id"] + " " + m["rule"])]
    if a.check:
        stale = []
        for m in sel:
            try:
                with open(os.path.join(ROOT, m["file"])) as f:
                    n = f.read().count(m["anchor"])
            except OSError:
                n = 0
            if n != 1:
                stale.append(m["id"])
                print(f"{LIST}:{m['line']}: {m['id']}: stale: anchor "
                      f"found {n} times in {m['file']}")
        print(f"mutants: {len(sel)} mutations, {len(stale)} stale")
        return 1 if stale else 0
    t_start = time.time()
    print(f"mutants: scratch copy in {os.path.relpath(TREE, ROOT)}",
          flush=True)
    scratch_copy()
    rc, out = build(a.timeout)
    if rc != 0:
        sys.exit("mutants: the unmutated copy does not build:\n" + out)
    order = default_order()
    baseline_s = None
    if not a.no_baseline:
        t0 = time.time()
        res = run_checks(order, a.timeout)
        if res is not None:
            sys.exit(f"mutants: the unmutated copy fails {res[0]}: "
                     f"{res[1]}")
        baseline_s = time.time() - t0
        print(f"mutants: baseline passes ({baseline_s:.0f} s)", flush=True)
    results = {}
    prev = read_report(a.report)
    hints = {k.rstrip("*"): r for k, r in prev.items()
             if r["status"] == "killed"}
    if a.merge:
        # every earlier row, the selected ones too until they are rerun
        # (an interrupted run keeps the rows it has not reached)
        for m in muts:
            pid = m["id"]
            if pid in prev:
                results[pid] = prev[pid]
            elif pid + "*" in prev:
                results[pid] = prev[pid + "*"]
        for r in results.values():  # the earlier killers run first
            if r["status"] == "killed" and r["by"]:
                KILLS[r["by"]] = KILLS.get(r["by"], 0) + 1
        static = default_order()
        order.sort(key=lambda c: (-KILLS.get(c, 0),
                                  static.index(c) if c in static else 0))
    for i, m in enumerate(sel, 1):
        r = mutate(m, order, a.timeout, hints.get(m["id"]))
        results[m["id"]] = r
        extra = r.get("by", "")
        if r["status"] == "survived":
            extra = "explained" if m["id"] in why else "UNEXPLAINED"
        print(f"[{i}/{len(sel)}] {m['id']}: {r['status']} {extra} "
              f"{r.get('detail', '')} ({r.get('secs', 0):.0f} s)",
              flush=True)
        write_report(a.report, muts, results, why, baseline_s,
                     time.time() - t_start,
                     "" if sel is muts else (a.only or a.grep or ""))
    bad = [mid for mid, r in results.items()
           if r["status"] in ("stale", "invalid") or
           (r["status"] == "survived" and mid not in why)]
    killed = sum(r["status"] == "killed" for r in results.values())
    print(f"mutants: {len(results)} mutations, {killed} killed, "
          f"{len(bad)} stale, invalid or unexplained survivors"
          + (": " + " ".join(bad) if bad else "")
          + f"; report in {os.path.relpath(a.report, ROOT)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
