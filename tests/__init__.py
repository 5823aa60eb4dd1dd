"""One package, so that a store's own end-to-end tests (tests/stores/<store>/) share the helpers
of tests/integration/helpers.py."""
