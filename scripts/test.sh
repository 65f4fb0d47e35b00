#!/usr/bin/env bash
# The README's test command: set up a virtual environment with the project and
# its test extra, install the tools the integration tests run, then run the
# default test suite.
#
# The tools: procmail and maildrop (the delivery tests run the README's recipes
# through them) and systemd-analyze (Debian's systemd package: checks the units
# in contrib/systemd) and spamc (SpamAssassin's client, which the --spamd tests
# talk to spamnb serve with) and dovecot (Debian's dovecot-imapd: the IMAP tests
# run a private Dovecot per test, see tests/dovecot.py). Missing ones are
# installed when we are root and apt-get is there; otherwise, or when that
# fails, each missing one is named here and its tests are skipped with the
# reason.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_venv.sh test,dask  # dask: the cluster test of sharded training

missing_tools() {  # "command:package" pairs whose command is not on PATH
    local pair
    for pair in procmail:procmail maildrop:maildrop systemd-analyze:systemd spamc:spamc dovecot:dovecot-imapd; do
        command -v "${pair%%:*}" >/dev/null || echo "$pair"
    done
}

missing=$(missing_tools)
if [ -n "$missing" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        packages=$(for pair in $missing; do echo "${pair#*:}"; done)
        # shellcheck disable=SC2086 # one word per package
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $packages) >/dev/null 2>&1 \
            || true
        missing=$(missing_tools)
        for pair in $missing; do
            echo "note: ${pair%%:*} could not be installed (apt-get install ${pair#*:} failed); its tests will be skipped" >&2
        done
    else
        why=$([ "$(id -u)" = 0 ] && echo "there is no apt-get" || echo "not root")
        for pair in $missing; do
            echo "note: ${pair%%:*} is not installed and $why, so its tests will be skipped" \
                 "(to run them: apt-get install ${pair#*:} as root)" >&2
        done
    fi
fi
exec .venv/bin/python -m pytest "$@"
