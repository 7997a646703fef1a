#!/bin/sh
# Writes MB megabytes of progress lines to stderr with a CUDA out-of-memory
# line in the middle, then fails. Usage: chatty.sh MB
half=$(( $1 * 524288 ))
yes 'step 17/1000 loss 2.3418 lr 3.0e-04 tokens/s 51234' | head -c "$half" >&2
echo 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB' >&2
yes 'step 18/1000 loss 2.3417 lr 3.0e-04 tokens/s 51230' | head -c "$half" >&2
echo 'last line' >&2
exit 1
