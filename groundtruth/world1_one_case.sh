#!/bin/sh
# Each world-1 case of groundtruth/dist/h200-torch2.11-world1.jsonl in its own process (torchrun, one rank, NCCL), so
# that no case's figures carry an earlier case's objects (docs/DISTRIBUTED.md, Accuracy: in one process the previous
# DDP reducer is freed inside the next case, and reserved segments carry over). Usage, on the H200, from the
# repository:
#   sh groundtruth/world1_one_case.sh OUT.jsonl
# writes OUT.jsonl: the first process's env line, then one line per case (each process's own env line dropped).
set -eu
out=$1; tmp=$(mktemp -d)
: > "$out"
first=1
for id in gpt2-medium-fsdp1full-bf16-b4 gpt2-medium-fsdp1gradop-bf16-b4 gpt2-medium-fsdp1full-bf16-b4-ckpt \
          gpt2-medium-fsdp2-bf16-b4 gpt2-medium-fsdp2-fp32-b4 gpt2-medium-fsdp2-noreshard-bf16-b4 \
          gpt2-medium-fsdp2-bf16-b4-ckpt llama-1b-fsdp1full-bf16-b2 llama-1b-fsdp1gradop-bf16-b2 \
          llama-1b-fsdp1full-bf16-b2-ckpt llama-1b-fsdp2-bf16-b2 llama-1b-fsdp2-noreshard-bf16-b2 \
          llama-1b-fsdp2-bf16-b2-ckpt gpt2-medium-ddp-bf16-b4 gpt2-medium-ddpbv-bf16-b4 gpt2-medium-zero1-bf16-b4 \
          llama-1b-ddp-bf16-b2 llama-1b-ddpbv-bf16-b2 llama-1b-zero1-bf16-b2 llama-1b-fsdp2-fp32-b2; do
    torchrun --standalone --nproc_per_node=1 groundtruth/collect_dist_more.py "$tmp/$id.jsonl" nccl "=$id"
    if [ $first = 1 ]; then head -n 1 "$tmp/$id.jsonl" >> "$out"; first=0; fi
    tail -n +2 "$tmp/$id.jsonl" >> "$out"
done
rm -rf "$tmp"
