"""The accuracy gate of `make test` sees a 5 % change in one measurement
(issue 20's "done when"): in every shared ground-truth file, each case's
measurement moved 5 % away from the simulation makes `vramplan validate
--outliers groundtruth/bounds.json` fail, naming the case, while the file
as measured passes. Away from the simulation, a case's |error| grows by
about 5 points, past every bound of those files (each under 5 %, checked
here) and past its documented error's tolerance when it is an outlier.
One measurement per case (peak_reserved and device_used by turns; the
largest batch of a max-batch case), so the check stays short under the
sanitizers. Run from the repository root by tests/python/run.sh."""
import json
import math
import os
import shutil
import subprocess
import tempfile
import unittest

BIN = os.environ.get("VRAMPLAN_BIN", "./vramplan")
BOUNDS = "groundtruth/bounds.json"
SHARED = "../shared/groundtruth"
COPY = "tests/data/groundtruth"  # make test's fallback without ../shared
FILES = ["h200-torch2.11-cases.jsonl", "h200-torch2.11-maxbatch.jsonl",
         "dist/h200x2-torch2.11-dist.jsonl"]
METRICS = ["peak_reserved", "device_used"]
# the bound group (validate.h's vp_metric_group) of each metric changed
GROUPS = {"peak_reserved": "reserved", "device_used": "device_used",
          "max_batch": "max_batch"}


def gt_dir():
    return SHARED if os.path.isdir(SHARED) else COPY


def validate(path, *extra):
    return subprocess.run([BIN, "validate", "--gpu", "h200", "--outliers",
                           BOUNDS, path] + list(extra), check=False,
                          capture_output=True, text=True)


def predicted(path):
    """(case id, metric) -> the simulated value, from validate's jsonl."""
    out = validate(path, "--format", "jsonl")
    pred = {}
    for line in out.stdout.splitlines():
        r = json.loads(line)
        pred[(r["id"], r["metric"])] = r["predicted"]
    return out.returncode, pred


def away(measured, sim, integer=False):
    """measured moved 5 % away from sim (at least one unit when integer)."""
    up = sim < measured
    v = measured * (1.05 if up else 0.95)
    if integer:
        return max(math.ceil(v), measured + 1) if up else \
            min(math.floor(v), measured - 1)
    return int(round(v))


class AccuracyGate(unittest.TestCase):
    def bound_of(self, name):
        with open(BOUNDS) as f:
            b = json.load(f)
        for entry in b["files"]:
            if entry["file"] == os.path.basename(name):
                return entry, b["tolerance"]
        self.fail(f"{BOUNDS} has no entry for {name}")

    def check_file(self, name):
        src = os.path.join(gt_dir(), name)
        self.assertTrue(os.path.isfile(src), f"{src}: missing")
        entry, tol = self.bound_of(name)
        bounds = {}
        for spec in entry["max_error"].split(","):
            group, _, vals = spec.partition("=")
            bounds[group] = float(vals.split("/")[-1])
        self.assertLess(tol, 5.0)
        rc, pred = predicted(src)
        self.assertEqual(rc, 0, f"{name} as measured is over its bounds")
        with open(src) as f:
            lines = f.read().splitlines()
        tmp = tempfile.mkdtemp(prefix="vp-gate-")
        self.addCleanup(shutil.rmtree, tmp)
        path = os.path.join(tmp, os.path.basename(name))
        n = 0
        for i, line in enumerate(lines):
            case = json.loads(line)
            if "id" not in case:
                continue
            if "max_batch" in case:
                key, metric, integer = "max_batch", "max_batch", True
            else:
                key = METRICS[n % len(METRICS)]
                metric = (f"rank{case['rank']}.{key}" if "rank" in case
                          else key)
                integer = False
            group = ("rank_" if "rank" in case else "") + GROUPS[key]
            self.assertLess(bounds.get(group, 0.0), 5.0,
                            f"{name}: {group}'s bound does not see 5 %")
            self.assertIn((case["id"], metric), pred,
                          f"{name}:{i + 1}: validate made no {metric}")
            changed = dict(case)
            changed[key] = away(case[key], pred[(case["id"], metric)],
                                integer)
            with open(path, "w") as f:
                f.write("\n".join(lines[:i] + [json.dumps(changed)] +
                                  lines[i + 1:]) + "\n")
            out = validate(path)
            self.assertNotEqual(out.returncode, 0,
                                f"{name}:{i + 1}: {case['id']}'s {key} "
                                f"{case[key]} -> {changed[key]} passes")
            self.assertIn(case["id"], out.stderr,
                          f"{name}:{i + 1}: the error does not name the "
                          f"case: {out.stderr[:300]}")
            n += 1
        self.assertGreater(n, 0, f"{name}: no case")

    def test_single_gpu_cases(self):
        self.check_file(FILES[0])

    def test_max_batch_cases(self):
        self.check_file(FILES[1])

    def test_two_gpu_cases(self):
        self.check_file(FILES[2])


if __name__ == "__main__":
    unittest.main()
