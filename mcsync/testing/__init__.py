"""Tools for a user's own tests: ``faults.faulty`` wraps any store in injected failures, delays
and crash points, with no server. (The local servers and the fault-injecting HTTP proxy that
mcsync's own tests run against are not part of the package: ``testbed/`` in the repository.)"""
