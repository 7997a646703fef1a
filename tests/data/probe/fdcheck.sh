#!/bin/sh
# Fails when descriptor $1 was inherited from the caller.
if [ -e "/proc/$$/fd/$1" ]; then
    echo "descriptor $1 leaked into the command" >&2
    exit 1
fi
exit 0
