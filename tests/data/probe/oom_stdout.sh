#!/bin/sh
# Prints an out-of-memory message on stdout only, then fails: not an OOM
# by the rules (the message must be on stderr).
echo "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB."
echo "some other failure" >&2
exit 1
