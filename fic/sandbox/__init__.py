"""The operating-system sandbox for model-written code: Python (`fic.sandbox.python`, started
by the supervisor `fic/sandbox/launcher.py`) and SQL (`fic.sandbox.sql`). Below the tasks, which
score with it, and the evaluator, which picks its mode; see docs/tasks.md for what holds."""
