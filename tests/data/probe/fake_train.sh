#!/bin/sh
# A stand-in for a training command: batch $1 "fits" up to $2; above that
# it fails as PyTorch does, with a traceback and torch.OutOfMemoryError on
# stderr and exit status 1. Usage: fake_train.sh BATCH LIMIT
batch=$1 limit=$2
echo "step 1: batch $batch"
if [ "$batch" -gt "$limit" ]; then
    cat >&2 <<MSG
Traceback (most recent call last):
  File "/work/train.py", line 42, in <module>
    loss.backward()
  File "/usr/lib/python3/dist-packages/torch/_tensor.py", line 625, in backward
    torch.autograd.backward(
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which 1.23 GiB is free. Including non-PyTorch memory, this process has 16.50 GiB memory in use. Of the allocated memory 15.90 GiB is allocated by PyTorch, and 120.00 MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)
MSG
    exit 1
fi
echo "step 2: batch $batch"
exit 0
