# Sourced by main.sh and test.sh: make .venv (once) and install the project into it
# with the extras given as arguments, e.g. `. scripts/_venv.sh test,dask`.
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e ".${1:+[$1]}"
