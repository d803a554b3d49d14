"""Connect arguments for the SQLite metadata DB of the `airflow standalone` a Stack starts (the demo, the tests).

SQLite lets one writer in at a time and makes the others wait for its lock up to a timeout: Python's default,
5 s, ended a scheduler with "database is locked" on a loaded 2-core machine. Every component waits up to a
minute instead. Airflow imports these by path (`[database] sql_alchemy_connect_args`, and `_async` for the
api-server's async engine)."""

SQLITE_CONNECT_ARGS = {"timeout": 60}
SQLITE_CONNECT_ARGS_ASYNC = {"timeout": 60}
