# shellcheck shell=sh
# The readiness of a proxy without a plain TCP port (`READINESS` in nginx.rs): `/bin/sh -c` with
# nginx's pid file, then nginx's arguments, after it. nginx runs (it wrote its pid file, which
# the entrypoints remove first) and accepts its configuration.
pid_file=${1:?}
shift
test -s "$pid_file" && exec nginx -t -q "$@"
