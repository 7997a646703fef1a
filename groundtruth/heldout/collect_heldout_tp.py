"""Held-out FSDP2 + TP cases (stop 25), measured after the 2-D rules were checked on
groundtruth/dist/h200-torch2.11-fsdp2tp-fakepg.jsonl and kept from the session that wrote them: other batches,
lengths, a 7B shape, worlds of 8, and ranks other than 0. Protocol and fields are groundtruth/collect_tp_fake.py's
(imported); only the cases are new.

    python3 groundtruth/heldout/collect_heldout_tp.py OUT.jsonl DP TP RANK [filter] [--lp 0]
"""
import os, sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import collect_tp_fake as T  # noqa: E402

T.CASES.clear()
T.add("llama-1b", 4, 1024)
T.add("llama-1b", 8, 1024, ckpt=True)
T.add("mistral-2b", 2, 2048)
T.add("llama-7b", 1, 2048, ckpt=True)

if __name__ == "__main__":
    T.main()
