"""Running a run's tasks in other processes: the worker pool protocol and its local and Ray pools,
and the runner a worker executes."""
