#!/bin/sh
# Dies by a signal, with nothing about memory on stderr.
echo "about to crash" >&2
kill -SEGV $$
