# Sourced by the command-line tests: one case of "this command exits with this status and says
# these things", counted in $failures.
#   expect_error NAME EXPECTED_STATUS NEEDLES COMMAND...
#     NEEDLES: substrings the output must contain, separated by '|'.
failures=0
expect_error() {
  local name=$1 want=$2 needles=$3
  shift 3
  local out status
  out=$("$@" 2>&1)
  status=$?
  if [[ $status -ne $want ]]; then
    echo "FAIL $name: exit status $status, expected $want"; echo "$out" | sed 's/^/    /'; failures=$((failures + 1)); return
  fi
  local needle
  IFS='|' read -ra list <<< "$needles"
  for needle in "${list[@]}"; do
    if [[ "$out" != *"$needle"* ]]; then
      echo "FAIL $name: output lacks '$needle'"; echo "$out" | sed 's/^/    /'; failures=$((failures + 1)); return
    fi
  done
  echo "ok   $name"
}
