#!/usr/bin/env bash
# One pytest leg of `make test`: PYTHON -m pytest over the tests MARKS selects (a pytest `-m`
# expression; empty: every test), those that launch several processes (marker `processes`)
# apart from the others.
#
#   tools/test_leg.sh PYTHON MARKS [PYTEST ARGS...]
#
# The other tests run first, in the parallel workers LEG_ARGS asks for (`-n 2`); the
# `processes` tests then run one at a time, alone, so that their processes - and the timeouts
# they are checked against - never share the cores with other tests. That second run collects
# only the test files that name the marker (`mark.processes`) under the paths among the
# arguments (files, folders, `file::test` ids; options are passed on as they are): collecting
# the whole tree again, which imports every test module, cost more than some of the tests.
# Exits 0 when both parts pass (pytest's 5, nothing selected, counts as passing), else 1.
set -u
python=$1
marks=$2
shift 2
selected=""
[ -z "$marks" ] || selected="($marks) and "
status=0
# shellcheck disable=SC2086  # LEG_ARGS holds several arguments
"$python" -m pytest -q ${LEG_ARGS:-} "$@" -m "${selected}not processes"
code=$?
[ $code -eq 0 ] || [ $code -eq 5 ] || status=1

# The arguments again, each path narrowed to the files that hold `processes` tests.
args=()
paths=0
found=0
for arg in "$@"; do
  path=${arg%%::*}
  if [[ $arg != -* ]] && [ -e "$path" ]; then
    paths=$((paths + 1))
    if [ -d "$path" ]; then
      while IFS= read -r file; do
        args+=("$file")
        found=$((found + 1))
      done < <(grep -rl --include='test_*.py' 'mark\.processes' "$path" | sort)
    elif grep -q 'mark\.processes' "$path"; then
      args+=("$arg")
      found=$((found + 1))
    fi
  else
    args+=("$arg")
  fi
done
# No path argument: pytest's own default (its configured paths), unnarrowed.
if [ $paths -eq 0 ] || [ $found -gt 0 ]; then
  "$python" -m pytest -q "${args[@]}" -m "${selected}processes"
  code=$?
  [ $code -eq 0 ] || [ $code -eq 5 ] || status=1
fi
exit $status
