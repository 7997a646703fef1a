#!/bin/sh
# Never finishes (until killed).
echo "started"
sleep 30
echo "not reached"
