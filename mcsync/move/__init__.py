"""Moving one action's bytes: the dispatch unit and its limits, the transfer of each kind (whole,
in parts, delta, server-side copy, delete), the parts sent in this process or as tasks, compare and
verify."""
