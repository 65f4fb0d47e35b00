#!/usr/bin/env bash
# The README's test command: set up a virtual environment with the project and
# its test extra, install the tools the integration tests run, then run the
# default test suite.
#
# The tools: procmail and maildrop (the delivery tests run the README's recipes
# through them), systemd-analyze (Debian's systemd package: checks the units in
# contrib/systemd), spamc (SpamAssassin's client, which the --spamd tests talk to
# spamnb serve with), dovecot (Debian's dovecot-imapd: the IMAP tests run a private
# Dovecot per test, see tests/dovecot.py), exim4 (exim4-daemon-heavy: the Exim
# spam= ACL test), prometheus (Debian's prometheus, with promtool: it scrapes a
# running spamnb serve --metrics in tests/test_prometheus.py), redis-server (the
# store tests start a private one on a Unix socket in a temporary folder, and one with
# TLS on a port of 127.0.0.1), redis-sentinel (tests/test_redis_sentinel.py runs a
# primary, a replica and three Sentinels and kills the primary), dovecot-sieve (Pigeonhole:
# the IMAPSieve tests and sievec, which compiles the shipped Sieve recipes), openssl (makes that server's throwaway CA), chromium and
# chromium-driver (the `spamnb web` tests drive Debian's headless Chromium with
# selenium; nothing downloads a browser), miltertest (OpenDKIM's MTA-side milter
# test client: tests/test_milter_door.py drives `spamnb serve --milter` with it). Missing ones are installed when we are
# root and apt-get is there, except one whose install would remove another package
# (exim4 and postfix each replace the other MTA); otherwise, or when that fails, each missing one is
# named here and its tests are skipped with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/_venv.sh test,dask  # dask: the cluster test of sharded training

missing_tools() {  # "command:package" pairs whose command is neither on PATH nor in an sbin folder
    local pair
    for pair in procmail:procmail maildrop:maildrop systemd-analyze:systemd spamc:spamc dovecot:dovecot-imapd \
                exim4:exim4-daemon-heavy prometheus:prometheus promtool:prometheus \
                redis-server:redis-server redis-sentinel:redis-sentinel sievec:dovecot-sieve openssl:openssl \
                chromium:chromium chromedriver:chromium-driver miltertest:miltertest; do
        # dovecot and exim4 are daemons in /usr/sbin, off a user's PATH (their tests look there too)
        PATH="$PATH:$SBIN" command -v "${pair%%:*}" >/dev/null || echo "$pair"
    done
}
SBIN=${SBIN:-/usr/sbin:/sbin}

missing=$(missing_tools)
if [ -n "$missing" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq >/dev/null 2>&1 || true
        # Never at the cost of what is there: a package whose install would remove
        # another (exim4 and postfix each replace the other MTA) is left out.
        packages="" kept=""
        for pair in $missing; do
            removes=$(apt-get -s install "${pair#*:}" 2>/dev/null | awk '/^Remv /{printf "%s ", $2}')
            if [ -n "$removes" ]; then
                echo "note: ${pair%%:*} is not installed: installing ${pair#*:} would remove ${removes% }," \
                     "so its tests will be skipped" >&2
                kept="$kept ${pair%%:*}"
            else
                packages="$packages ${pair#*:}"
            fi
        done
        if [ -n "$packages" ]; then
            # shellcheck disable=SC2086 # one word per package
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $packages >/dev/null 2>&1 || true
        fi
        missing=$(missing_tools)
        for pair in $missing; do
            case " $kept " in *" ${pair%%:*} "*) continue ;; esac
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
# Postfix, spamass-milter and Sendmail (tests/test_postfix.py, tests/test_milter.py,
# tests/test_sendmail_milter.py) are unpacked into the tree, never installed: Postfix
# and Sendmail would each remove Exim, and all of them start services.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    .venv/bin/python tools/harnesses/postfix_milter.py --unpack-only >/dev/null \
        || echo "note: Postfix and spamass-milter could not be unpacked; their tests will be skipped" >&2
    .venv/bin/python tools/harnesses/sendmail_own_milter.py --unpack-only >/dev/null \
        || echo "note: Sendmail could not be unpacked; its test will be skipped" >&2
fi
exec .venv/bin/python -m pytest "$@"
