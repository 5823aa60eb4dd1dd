#!/usr/bin/env bash
# Fresh machine → a real sync: installs mcsync into .venv, starts a local SeaweedFS on 127.0.0.1
# as the Meta Storage target, makes a sample checkpoint and dataset shards, syncs them to
# meta://ckpt-store/demo/, and prints the report. Everything it makes lives under .quickstart/.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[demo]'
exec .venv/bin/python scripts/quickstart.py "$@"
