# shellcheck shell=bash
# Shared by the benchmark scripts (sourced): stopping what they started, and reading the CPU
# time processes used.

# Stops one process we started: TERM, up to 5 s of grace, then KILL.
stop() { # $1: pid
  local pid="$1"
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  wait "$pid" 2>/dev/null || true
}

# CPU ticks (user + system, all threads) used so far by the given processes.
process_ticks() { # pids...
  local pid total=0
  for pid in "$@"; do
    # Fields after "pid (comm) ": state is 1st, utime 12th, stime 13th.
    total=$((total + $(sed 's/^.*) //' "/proc/$pid/stat" | awk '{print $12 + $13}')))
  done
  echo "$total"
}

# After a failure ($1, an exit status, not 0), shows the last lines of each log given that has any.
show_logs_on_failure() { # $1: exit status; then log files
  local status="$1" log
  shift
  [ "$status" -ne 0 ] || return 0
  for log in "$@"; do
    if [ -s "$log" ]; then
      echo "--- $log (last lines)" >&2
      tail -n 20 "$log" >&2
    fi
  done
}
