#!/usr/bin/env bash
# The README's test command: set up a virtual environment with the project and
# its test extra, install the mail-delivery tools the integration tests use
# (when we are root and apt is there), then run the default test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_venv.sh test,dask  # dask: the cluster test of sharded training
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null && ! command -v procmail >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq procmail) >/dev/null 2>&1 \
        || echo "note: procmail could not be installed; its integration test will be skipped" >&2
fi
exec .venv/bin/python -m pytest "$@"
