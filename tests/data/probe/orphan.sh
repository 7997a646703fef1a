#!/bin/sh
# Starts a child that would outlive this script and writes its pid to
# PIDFILE. MODE: detached (the child's output goes to /dev/null) or holding
# (the child keeps the script's stdout and stderr); then exit (exit 0 at
# once) or hang (sleep until killed). Usage: orphan.sh PIDFILE MODE THEN
pidfile=$1 mode=$2 then=$3
if [ "$mode" = detached ]; then
    sleep 60 </dev/null >/dev/null 2>&1 &
else
    sleep 60 &
fi
echo $! > "$pidfile.tmp" && mv "$pidfile.tmp" "$pidfile"
if [ "$then" = hang ]; then
    sleep 30
fi
exit 0
