"""One run, composed: listing and planning, the preflight checks, the driver (the only writer of
state), the engine that builds and runs them, the manifest's copy at the target, and watch mode."""
