"""Fault-injection tests (issue #10): killed workers, lost messages, server restarts, hung
servers, against private PostgreSQL and Redis servers started by the tests themselves.

:mod:`.harness` holds the reusable pieces (servers, worker processes, frames, invariants);
:mod:`.worker_main` is the worker entry point with the test-only observation and fault
hooks. The benchmark ``benchmarks/faults.py`` uses the same harness.
"""
