#!/bin/sh
# Starts a child that would outlive this script and writes its pid to
# PIDFILE. MODE: detached (the child's output goes to /dev/null), holding
# (the child keeps the script's stdout and stderr) or setsid (a double fork:
# a subshell starts a sleep in a new session and ends, so the sleep is in
# neither the script's process group nor its tree); then exit (exit 0 at
# once) or hang (sleep until killed). Usage: orphan.sh PIDFILE MODE THEN
pidfile=$1 mode=$2 then=$3
if [ "$mode" = setsid ]; then
    ( setsid sh -c 'echo $$ > "$1.tmp" && mv "$1.tmp" "$1"; exec sleep 60' \
          sh "$pidfile" </dev/null >/dev/null 2>&1 & )
    while [ ! -f "$pidfile" ]; do sleep 0.01; done
elif [ "$mode" = detached ]; then
    sleep 60 </dev/null >/dev/null 2>&1 &
    echo $! > "$pidfile.tmp" && mv "$pidfile.tmp" "$pidfile"
else
    sleep 60 &
    echo $! > "$pidfile.tmp" && mv "$pidfile.tmp" "$pidfile"
fi
if [ "$then" = hang ]; then
    sleep 30
fi
exit 0
