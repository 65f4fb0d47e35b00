# Sourced by main.sh and test.sh: make .venv (once) and install the project into it
# with the extras given as arguments, e.g. `. scripts/_venv.sh test,dask`. pip's
# output (and setuptools' notes about editable installs) is kept in .venv/pip.log
# and shown only when the install fails.
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
if ! { .venv/bin/python -m pip install -q --upgrade pip \
       && .venv/bin/python -m pip install -q -e ".${1:+[$1]}"; } > .venv/pip.log 2>&1; then
    cat .venv/pip.log >&2
    echo "scripts/_venv.sh: installing into .venv failed (the lines above say why)" >&2
    exit 1
fi
