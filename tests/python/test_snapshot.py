"""The snapshot that `vramplan estimate --snapshot` writes, read back with
Python's pickle and checked against what PyTorch's readers of
torch.cuda.memory._dump_snapshot files rely on (torch/cuda/_memory_viz.py:
segsum, trace, _write_blocks; torch/utils/viz/MemoryViz.js: unpickle,
annotate_snapshot, process_alloc_data). Run from the repository root."""
import os
import pickle
import pickletools
import subprocess
import tempfile
import unittest

BIN = os.environ.get("VRAMPLAN_BIN", "./vramplan")

# The opcodes MemoryViz.js's unpickler reads.
JS_OPCODES = {"PROTO", "EMPTY_DICT", "EMPTY_LIST", "MARK", "SETITEMS",
              "APPENDS", "APPEND", "TUPLE2", "BINUNICODE",
              "SHORT_BINUNICODE", "BININT1", "BININT2", "BININT", "LONG1",
              "NEWTRUE", "NEWFALSE", "NONE", "BINFLOAT", "BINPUT",
              "LONG_BINPUT", "BINGET", "LONG_BINGET", "MEMOIZE", "FRAME",
              "STOP"}


def snapshot(*args):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "s.pickle")
        subprocess.run([BIN, "estimate"] + list(args) +
                       ["--snapshot", path, "--format", "json"],
                       check=True, capture_output=True)
        with open(path, "rb") as f:
            raw = f.read()
    return pickle.loads(raw), raw


class Gpt2(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.snap, cls.raw = snapshot("models/gpt2-small.yaml", "--batch",
                                     "2", "--seq", "256", "--precision",
                                     "amp-bf16", "--steps", "2")
        cls.trace = cls.snap["device_traces"][0]

    def test_top_level_keys(self):
        self.assertEqual(set(self.snap),
                         {"segments", "device_traces", "allocator_settings"})
        self.assertEqual(len(self.snap["device_traces"]), 1)

    def test_only_opcodes_that_memory_viz_reads(self):
        ops = {op.name for op, _, _ in pickletools.genops(self.raw)}
        self.assertLessEqual(ops, JS_OPCODES, ops - JS_OPCODES)

    def test_blocks_tile_their_segment(self):
        # segsum asserts free + internal + allocated == total_size
        for seg in self.snap["segments"]:
            addr = seg["address"]
            for b in seg["blocks"]:
                self.assertEqual(b["address"], addr)
                self.assertLessEqual(b["requested_size"], b["size"])
                addr += b["size"]
            self.assertEqual(addr, seg["address"] + seg["total_size"])
            active = [b for b in seg["blocks"]
                      if b["state"] == "active_allocated"]
            self.assertEqual(seg["allocated_size"],
                             sum(b["size"] for b in active))
            self.assertEqual(seg["requested_size"],
                             sum(b["requested_size"] for b in active))
            self.assertIn(seg["segment_type"], ("small", "large"))

    def test_trace_replays_to_the_final_segments(self):
        # MemoryViz.simulate_memory walks the trace back from the final
        # state: every free must match a live allocation at its address,
        # and what is live at the end must be the active blocks
        live, segs = {}, {}
        for e in self.trace:
            a = e["action"]
            if a == "alloc":
                self.assertNotIn(e["addr"], live)
                live[e["addr"]] = e["size"]
            elif a == "free_requested":
                self.assertEqual(live[e["addr"]], e["size"])
            elif a == "free_completed":
                self.assertEqual(live.pop(e["addr"]), e["size"])
            elif a == "segment_alloc":
                segs[e["addr"]] = e["size"]
            elif a == "segment_free":
                self.assertEqual(segs.pop(e["addr"]), e["size"])
            else:
                self.fail("unexpected action " + a)
        blocks = {b["address"]: b["requested_size"]
                  for s in self.snap["segments"] for b in s["blocks"]
                  if b["state"] == "active_allocated"}
        self.assertEqual(live, blocks)
        self.assertEqual(segs, {s["address"]: s["total_size"]
                                for s in self.snap["segments"]})

    def test_entries_have_the_trace_entry_keys(self):
        for e in self.trace:
            self.assertLessEqual({"action", "addr", "size", "stream",
                                  "time_us", "frames", "category"}, set(e))
            for f in e["frames"]:
                self.assertEqual(set(f), {"filename", "line", "name"})

    def test_categories_include_unknown(self):
        # MemoryViz's annotate_snapshot pushes 'unknown' to a misspelt
        # field when categories are given without it
        cats = {e["category"] for e in self.trace}
        self.assertIn("unknown", cats)
        self.assertIn("activations", cats)

    def test_time_is_the_event_order(self):
        t = [e["time_us"] for e in self.trace]
        self.assertEqual(t, sorted(t))

    def test_peak_matches_the_estimate(self):
        out = subprocess.run([BIN, "estimate", "models/gpt2-small.yaml",
                              "--batch", "2", "--seq", "256", "--precision",
                              "amp-bf16", "--steps", "2", "--format", "csv"],
                             check=True, capture_output=True, text=True)
        want = dict(l.split(",") for l in out.stdout.split())
        cur = peak = 0
        for e in self.trace:
            if e["action"] == "alloc":
                cur += e["size"]
                peak = max(peak, cur)
            elif e["action"] == "free_completed":
                cur -= e["size"]
        # the requested bytes (the trace's sizes) stay under the rounded
        # blocks of max_memory_allocated, less the workspaces allocated
        # before the model, by the rounding only (1.05 % here)
        rel = peak - int(want["baseline"])
        self.assertLessEqual(rel, int(want["peak_alloc"]))
        self.assertGreater(rel, int(want["peak_alloc"]) * 0.985)


class Expandable(unittest.TestCase):
    def test_mapped_ranges_are_expandable_segments(self):
        snap, _ = snapshot("models/mlp10.yaml", "--expandable-segments",
                           "--steps", "1")
        acts = {e["action"] for e in snap["device_traces"][0]}
        self.assertIn("segment_map", acts)
        self.assertNotIn("segment_alloc", acts)
        self.assertTrue(all(s["is_expandable"] for s in snap["segments"]))
        self.assertEqual(snap["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"],
                         "expandable_segments:True")


if __name__ == "__main__":
    unittest.main()
