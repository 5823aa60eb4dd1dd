"""What tests, benchmarks and the quickstart run mcsync against, kept out of the wheel.

Local servers started as child processes (``servers``: SeaweedFS and moto; ``gcs``: the GCS
emulator; ``azurite``: Azure Blob; ``processes``: the children themselves; ``tls``: a private CA
for https), a fault-injecting HTTP proxy (``faultproxy``, naming requests with
``s3_requests``), a read-only S3 bucket of computed keys for scale (``synthetic``), and the
launcher that measures a command's wall time, CPU and peak memory (``rusage``).

Not installed: ``pyproject.toml``'s ``pythonpath`` puts the repository's root on the tests'
``sys.path``; the benchmarks and scripts add it themselves; a Python child started as
``python -m testbed.…`` is given it in ``PYTHONPATH`` (``processes.python_child_env``). Nothing
here imports ``mcsync``. (``mcsync.testing.faults``, which wraps a store in injected faults
without any server, is a user's test tool and stays in the package.)
"""
