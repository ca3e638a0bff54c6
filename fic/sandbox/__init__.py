"""The operating-system sandbox for model-written code: Python (`fic.sandbox.python`, started
by the supervisor `fic/sandbox/launcher.py`, which runs the program under `fic/sandbox/guard.py`)
and SQL (`fic.sandbox.sql`, whose queries run in `fic/sandbox/sql_worker.py`). The launcher, the
guard and the worker are programs of the standard library alone, run by path with `python -I -S`.
Below the tasks, which score with it, and the evaluator, which picks its mode; see docs/tasks.md
for what holds."""
