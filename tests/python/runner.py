"""Runs tests/python/test_*.py with unittest and prints the result in
Criterion's synthesis form, which `make test` adds up."""
import sys
import unittest

suite = unittest.defaultTestLoader.discover("tests/python", pattern="test_*.py",
                                            top_level_dir="tests/python")
result = unittest.TextTestRunner(stream=sys.stdout, verbosity=2).run(suite)
failed = len(result.failures) + len(result.errors) + \
    len(result.unexpectedSuccesses) + len(result.skipped)
run = result.testsRun
print("[====] Synthesis: Tested: %d | Passing: %d | Failing: %d | Crashing: 0"
      % (run, run - failed, failed))
sys.exit(1 if failed or run == 0 else 0)
