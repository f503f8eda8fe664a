#!/usr/bin/env bash
# One pytest leg of `make test`: PYTHON -m pytest over the tests MARKS selects, those that
# launch several processes (marker `processes`) apart from the others.
#
#   tools/test_leg.sh PYTHON MARKS [PYTEST ARGS...]
#
# The other tests run first, in the parallel workers LEG_ARGS asks for (`-n 2`); the
# `processes` tests then run one at a time, alone, so that their processes - and the timeouts
# they are checked against - never share the cores with other tests. Exits 0 when both parts
# pass (pytest's 5, nothing selected, counts as passing), else 1.
set -u
python=$1
marks=$2
shift 2
status=0
# shellcheck disable=SC2086  # LEG_ARGS holds several arguments
"$python" -m pytest -q ${LEG_ARGS:-} "$@" -m "($marks) and not processes"
code=$?
[ $code -eq 0 ] || [ $code -eq 5 ] || status=1
"$python" -m pytest -q "$@" -m "($marks) and processes"
code=$?
[ $code -eq 0 ] || [ $code -eq 5 ] || status=1
exit $status
