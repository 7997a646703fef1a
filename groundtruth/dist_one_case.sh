#!/bin/sh
# Each data-parallel case in its own process, so that its peak reserved is
# not inflated by the segments an earlier case's objects still pin
# (docs/DISTRIBUTED.md, Accuracy). Usage, on the H200, from the repository:
#   sh groundtruth/dist_one_case.sh OUT [W R]
# writes OUT/one-<id>.jsonl (env line, then the case; the filter matches by
# substring, so a "-ckpt" twin may follow: the first case line is the one).
# With W R, rank R of a fake world of W (default 2 0).
set -eu
out=$1; w=${2:-2}; r=${3:-0}
mkdir -p "$out"
for id in gpt2-medium-fsdp1full-bf16-b4 gpt2-medium-fsdp1gradop-bf16-b4 \
          gpt2-medium-fsdp1full-bf16-b4-ckpt gpt2-medium-fsdp2-bf16-b4 \
          gpt2-medium-fsdp2-fp32-b4 gpt2-medium-fsdp2-noreshard-bf16-b4 \
          gpt2-medium-fsdp2-bf16-b4-ckpt gpt2-medium-fsdp1hybrid-bf16-b4 \
          gpt2-medium-fsdp2hsdp-bf16-b4; do
    python3 groundtruth/collect_dist_more.py "$out/one-$id.jsonl" fake "$w" "$r" "$id"
done
