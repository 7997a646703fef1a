#!/bin/sh
# A training command that fails for another reason than memory.
echo "loading data"
cat >&2 <<MSG
Traceback (most recent call last):
  File "/work/train.py", line 12, in <module>
    cfg = load_config(args.config)
ValueError: unknown optimizer 'adamx' in config.yaml
MSG
exit 1
