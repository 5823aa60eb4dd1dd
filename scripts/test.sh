#!/usr/bin/env bash
# Lint and test mcsync: creates .venv in the repo root if missing, installs the package with its
# test and ray extras (from PyPI) and the test servers of package.json (from npm: Azurite), runs
# ruff and mypy --strict (over mcsync/), then pytest with any arguments given here.
# On CI (CI=true) it first installs the Debian packages tests need, by name, when missing:
# prometheus (its promtool checks deploy/prometheus/). MCSYNC_TEST_LINT=0 skips ruff and mypy.
#   bash scripts/test.sh                      # the default set (the slow tests left out)
#   bash scripts/test.sh -m slow              # the slow set; -m "" runs both
#   bash scripts/test.sh tests/unit -x        # arguments go to pytest
# MCSYNC_TEST_REQUIRE=fuse,ray,promtool (.ci/run sets it): a test that needs one of those and
# cannot get it fails instead of skipping (tests/require.py).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Debian packages, on CI only (a developer's machine is theirs: those tests skip there).
if [[ "${CI:-}" == "true" ]] && ! command -v promtool >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

venv=.venv
if [[ ! -x "$venv/bin/python" ]]; then
    "${PYTHON:-python3}" -m venv "$venv"
fi
py="$venv/bin/python"

# Reinstall only when pyproject.toml or the extras changed (new code needs none: the install is
# editable). The ray extra: CI runs the Ray executor's tests (tests/integration/test_ray.py).
extras='.[test,ray]'
stamp="$venv/.mcsync-test-install"
want="$( (cat pyproject.toml; echo "$extras") | sha256sum | cut -d' ' -f1)"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
    "$py" -m pip install --quiet --disable-pip-version-check -e "$extras"
    echo "$want" > "$stamp"
fi

# Test servers from npm (Azurite): installed from package-lock.json, again when it changes.
npm_stamp=node_modules/.mcsync-test-install
npm_want="$(sha256sum package-lock.json | cut -d' ' -f1)"
if [[ ! -f "$npm_stamp" || "$(cat "$npm_stamp")" != "$npm_want" ]]; then
    npm ci --no-audit --no-fund --loglevel=error
    echo "$npm_want" > "$npm_stamp"
fi

if [[ "${MCSYNC_TEST_LINT:-1}" != "0" ]]; then
    lint_paths=()
    for p in mcsync testbed tests benchmarks scripts; do
        [[ -e "$p" ]] && lint_paths+=("$p")
    done
    "$venv/bin/ruff" check "${lint_paths[@]}"
    "$venv/bin/mypy" mcsync  # strict: [tool.mypy] in pyproject.toml; ray installed, as in CI
    # ... and as a checkout without the ray extra sees it (ray's modules unknown: Any), which
    # must be clean too: the same settings, ray's modules not followed.
    without_ray="$(mktemp --suffix=.toml)"
    { cat pyproject.toml
      printf '\n[[tool.mypy.overrides]]\nmodule = ["ray", "ray.*"]\nfollow_imports = "skip"\n'
    } > "$without_ray"
    status=0
    "$venv/bin/mypy" --config-file "$without_ray" mcsync || status=$?
    rm -f "$without_ray"
    (( status == 0 ))
fi

exec "$venv/bin/pytest" -q "$@"
