"""Tests of the Python package (python/vramplan) over libvramplan.so: the
figures agree with the command-line tool's, errors become exceptions with
the file position, and bad arguments are refused by name. Run from the
repository root by tests/python/run.sh (make test)."""
import ctypes
import json
import os
import subprocess
import unittest

import vramplan

BIN = os.environ.get("VRAMPLAN_BIN", "./vramplan")
BAD_KEY = "tests/data/bad/cli-unknown-key.yaml"


def cli_json(*args):
    out = subprocess.run([BIN] + list(args) + ["--format", "json"],
                         check=False, capture_output=True, text=True)
    return json.loads(out.stdout), out.returncode


class Estimate(unittest.TestCase):
    def test_matches_the_command_line(self):
        e = vramplan.estimate("gpt2-small", batch=2, seq=256,
                              precision="amp-bf16")
        c, rc = cli_json("estimate", "models/gpt2-small.yaml", "--batch",
                         "2", "--seq", "256", "--precision", "amp-bf16")
        self.assertEqual(rc, 0)
        for key in ("params", "peak_alloc", "peak_reserved", "device_used",
                    "peak_step", "peak_op"):
            self.assertEqual(e[key], c[key], key)
        self.assertEqual(e["by_category"], c["by_category"])
        self.assertEqual(len(e["steps"]), 4)
        self.assertTrue(e["fits"])

    def test_target_is_the_decoder_length(self):
        e = vramplan.estimate("t5-base", batch=8, seq=512, target=64,
                              precision="amp-bf16")
        c, rc = cli_json("estimate", "models/t5-base.yaml", "--batch", "8",
                         "--seq", "512", "--target", "64", "--precision",
                         "amp-bf16")
        self.assertEqual(rc, 0)
        self.assertEqual(c["setup"]["target"], 64)
        self.assertEqual(e["peak_alloc"], c["peak_alloc"])
        # activations dominate here: a 4x longer decoder needs more
        longer = vramplan.estimate("t5-base", batch=8, seq=512, target=256,
                                   precision="amp-bf16")
        self.assertGreater(longer["peak_alloc"], e["peak_alloc"])

    def test_lora_matches_the_command_line(self):
        e = vramplan.estimate("gpt2-small", batch=2, seq=256,
                              precision="amp-bf16", base_dtype="bf16",
                              lora="r=8,alpha=16,targets=c_attn",
                              checkpoint="all")
        c, rc = cli_json("estimate", "models/gpt2-small.yaml", "--batch",
                         "2", "--seq", "256", "--precision", "amp-bf16",
                         "--base-dtype", "bf16", "--lora",
                         "r=8,alpha=16,targets=c_attn", "-c", "all")
        self.assertEqual(rc, 0)
        for key in ("params", "total_params", "setup_peak", "peak_alloc",
                    "peak_reserved"):
            self.assertEqual(e[key], c[key], key)
        # c_attn (768 -> 2304) in 12 layers: r * (768 + 2304) each
        self.assertEqual(e["params"], 12 * 8 * (768 + 2304))

    def test_bad_lora_spec_names_the_key(self):
        with self.assertRaises(vramplan.Error) as cm:
            vramplan.estimate("gpt2-small", lora="r=8,rank=3,targets=c_attn")
        self.assertIn("'rank'", str(cm.exception))

    def test_model_name_resolves_through_the_search_path(self):
        e = vramplan.estimate("mlp10")
        self.assertEqual(e["model"], "mlp10")
        self.assertTrue(e["model_path"].endswith("models/mlp10.yaml"))

    def test_does_not_fit_is_an_answer_not_an_exception(self):
        e = vramplan.estimate("gpt2-small", batch=64, budget="4GiB")
        self.assertFalse(e["fits"])
        self.assertIn("out of memory", e["error"])
        self.assertEqual(e["budget"], 4 << 30)

    def test_checkpoint_all_needs_less_memory(self):
        plain = vramplan.estimate("gpt2-small", batch=4, seq=512)
        ckpt = vramplan.estimate("gpt2-small", batch=4, seq=512,
                                 checkpoint="all")
        self.assertLess(ckpt["peak_alloc"], plain["peak_alloc"])

    def test_gpu_sets_the_budget_and_the_context(self):
        e = vramplan.estimate("gpt2-small", gpu="h100-80g")
        c, _ = cli_json("estimate", "models/gpt2-small.yaml", "--gpu",
                        "h100-80g")
        self.assertEqual(e["budget"], c["setup"]["budget"])
        self.assertEqual(e["device_used"], c["device_used"])

    def test_data_parallel_run_matches_the_command_line(self):
        e = vramplan.estimate("gpt2-small", batch=2, seq=256,
                              strategy="fsdp2", world=4,
                              param_dtype="bf16")
        c, rc = cli_json("estimate", "models/gpt2-small.yaml", "--batch",
                         "2", "--seq", "256", "--strategy", "fsdp2",
                         "--world", "4", "--param-dtype", "bf16")
        self.assertEqual(rc, 0)
        self.assertEqual(e["peak_alloc"], c["peak_alloc"])
        self.assertEqual(e["dist"]["roles"], c["dist"]["roles"])
        self.assertEqual(e["dist"]["most_loaded_rank"],
                         c["dist"]["most_loaded_rank"])
        self.assertEqual(sum(r["ranks"] for r in e["dist"]["roles"]), 4)

    def test_deepspeed_run_matches_the_command_line(self):
        e = vramplan.estimate("gpt2-small", batch=2, seq=256,
                              precision="bf16", optimizer="adamw-fused",
                              strategy="deepspeed-zero3", world=4,
                              ds_config={"stage3_max_reuse_distance": 0,
                                         "overlap_comm": False})
        c, rc = cli_json("estimate", "models/gpt2-small.yaml", "--batch",
                         "2", "--seq", "256", "--precision", "bf16",
                         "--optimizer", "adamw-fused", "--strategy",
                         "deepspeed-zero3", "--world", "4", "--ds",
                         "stage3_max_reuse_distance=0,overlap_comm=false")
        self.assertEqual(rc, 0)
        self.assertEqual(e["peak_alloc"], c["peak_alloc"])
        self.assertEqual(e["peak_reserved"], c["peak_reserved"])
        with self.assertRaises(vramplan.Error) as cm:
            vramplan.estimate("gpt2-small", precision="bf16",
                              optimizer="adamw-fused",
                              strategy="deepspeed-zero2", world=2,
                              ds_config={"reduce_bucket": 1})
        self.assertIn("'reduce_bucket'", str(cm.exception))

    def test_data_parallel_fields_need_a_strategy(self):
        with self.assertRaises(vramplan.Error) as cm:
            vramplan.estimate("gpt2-small", world=2)
        self.assertIn("strategy", str(cm.exception))
        with self.assertRaises(vramplan.Error) as cm:
            vramplan.estimate("gpt2-small", strategy="zero3")
        self.assertIn("zero3", str(cm.exception))


class Generate(unittest.TestCase):
    ARGS = ("--batch", "8", "--precision", "bf16", "--generate",
            "prompt=512,new=32", "--cache", "static")

    def test_matches_the_command_line(self):
        e = vramplan.estimate("llama-1b", batch=8, precision="bf16",
                              generate="prompt=512,new=32", cache="static")
        c, rc = cli_json("estimate", "models/llama-1b.yaml", *self.ARGS)
        self.assertEqual(rc, 0)
        self.assertEqual(e["peak_alloc"], c["peak_alloc"])
        for key in ("weights", "kv_cache_bytes", "kv_at_peak",
                    "prefill_peak", "decode_peak", "peak_token"):
            self.assertEqual(e["generate"][key], c["generate"][key], key)

    def test_maxbatch_reports_the_cache_at_the_largest_batch(self):
        m = vramplan.maxbatch("llama-1b", budget="4GiB", precision="bf16",
                              generate="prompt=512,new=32")
        c, rc = cli_json("maxbatch", "models/llama-1b.yaml", "--budget",
                         "4GiB", "--precision", "bf16", "--generate",
                         "prompt=512,new=32")
        self.assertEqual(rc, 0)
        self.assertEqual(m["max_batch"], c["max_batch"])
        self.assertEqual(m["at_max"]["generate"]["kv_cache_bytes"],
                         c["kv_cache_bytes"])

    def test_seq_does_not_apply(self):
        with self.assertRaises(vramplan.Error) as cm:
            vramplan.estimate("llama-1b", seq=512, generate="prompt=8,new=2")
        self.assertIn("'seq'", str(cm.exception))

    def test_a_bad_spec_names_the_item(self):
        with self.assertRaises(vramplan.Error) as cm:
            vramplan.estimate("llama-1b", generate="prompt=8,beams=2")
        self.assertIn("'beams=2'", str(cm.exception))

    def test_cache_needs_generate(self):
        with self.assertRaises(vramplan.Error):
            vramplan.estimate("llama-1b", cache="static")


class MaxBatch(unittest.TestCase):
    def test_matches_the_command_line(self):
        m = vramplan.maxbatch("gpt2-small", budget="12GiB", seq=512,
                              precision="amp-bf16")
        c, rc = cli_json("maxbatch", "models/gpt2-small.yaml", "--budget",
                         "12GiB", "--seq", "512", "--precision",
                         "amp-bf16")
        self.assertEqual(rc, 0)
        self.assertEqual(m["max_batch"], c["max_batch"])
        self.assertEqual(m["at_max"]["peak_reserved"], c["peak_reserved"])
        self.assertLessEqual(m["at_max"]["peak_reserved"], 12 << 30)

    def test_needs_a_budget(self):
        with self.assertRaises(vramplan.Error) as cm:
            vramplan.maxbatch("gpt2-small")
        self.assertIn("budget", str(cm.exception))


class Plan(unittest.TestCase):
    def test_best_candidate_fits_the_gpu(self):
        p = vramplan.plan("gpt2-small", gpu="rtx4090", global_batch=16,
                          seq=512)
        self.assertTrue(p["fits"])
        best = p["candidates"][0]
        self.assertTrue(best["fits"])
        self.assertEqual(best["micro_batch"] * best["accum"], 16)
        self.assertLessEqual(best["peak_reserved"], p["budget"])

    def test_needs_a_gpu(self):
        with self.assertRaises(vramplan.Error) as cm:
            vramplan.plan("gpt2-small")
        self.assertIn("gpu", str(cm.exception))


class Errors(unittest.TestCase):
    def test_model_error_carries_file_line_column(self):
        with self.assertRaises(vramplan.Error) as cm:
            vramplan.estimate(BAD_KEY)
        e = cm.exception
        self.assertEqual((e.path, e.line, e.column), (BAD_KEY, 4, 1))
        self.assertEqual(e.name, "VP_ESCHEMA")
        self.assertTrue(str(e).startswith(BAD_KEY + ":4:1: unknown key"))

    def test_unknown_field_is_named_with_a_suggestion(self):
        with self.assertRaises(vramplan.Error) as cm:
            vramplan.call({"command": "estimate", "model": "mlp10",
                           "bach": 2})
        self.assertIn("unknown field 'bach' (did you mean 'batch'?)",
                      str(cm.exception))

    def test_unknown_keyword_is_a_type_error(self):
        with self.assertRaises(TypeError):
            vramplan.estimate("mlp10", bach=2)

    def test_wrong_type_is_refused(self):
        with self.assertRaises(vramplan.Error) as cm:
            vramplan.estimate("mlp10", batch="two")
        self.assertIn("'batch' must be an integer", str(cm.exception))

    def test_unknown_model_name_suggests(self):
        with self.assertRaises(vramplan.Error) as cm:
            vramplan.estimate("gpt2-smal")
        self.assertIn("did you mean 'gpt2-small'", str(cm.exception))

    def test_fractional_budget_needs_a_gpu(self):
        with self.assertRaises(vramplan.Error):
            vramplan.estimate("mlp10", budget=0.5)

    def test_request_that_is_not_json(self):
        out = ctypes.c_void_p()
        err = vramplan._VpError()
        st = vramplan._lib.vp_api_call(b'{"command": ', ctypes.byref(out),
                                       ctypes.byref(err))
        self.assertEqual(vramplan._lib.vp_err_name(st), b"VP_ESYNTAX")
        self.assertIsNone(out.value)
        self.assertEqual(err.line, 1)


class Library(unittest.TestCase):
    def test_loaded_from_vramplan_lib(self):
        want = os.environ.get("VRAMPLAN_LIB")
        self.assertTrue(want, "make test sets VRAMPLAN_LIB")
        self.assertEqual(vramplan.library_path(), want)


if __name__ == "__main__":
    unittest.main()
