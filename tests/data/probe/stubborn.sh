#!/bin/sh
# Ignores SIGTERM, so only SIGKILL ends it.
trap '' TERM
echo "started"
while :; do sleep 0.05; done
