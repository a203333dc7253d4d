# shellcheck shell=sh
# The proxy container's preStop hook (`PRE_STOP` in stop.rs, which says how it waits):
# `/bin/sh -c` with, after its name, the file of TCP counters (laid out as /proc/net/snmp), then
# the wait's minimum, quiet and maximum seconds.
counters=${1:?} min=${2:?} quiet=${3:?} max=${4:?}
# The count of accepted TCP connections (`Tcp: PassiveOpens`), or 0 when it cannot be read.
opens() {
  [ -r "$counters" ] && while read -r proto _ _ _ _ _ f _; do
    if [ "$proto" = Tcp: ] && [ "$f" != PassiveOpens ]; then echo "$f"; return; fi
  done < "$counters"
  echo 0
}
last=$(opens)
last=${last:-0} waited=0 still=0
while [ "$waited" -lt "$max" ]; do
  sleep 1
  waited=$((waited + 1))
  now=$(opens)
  now=${now:-0}
  if [ $((now - last)) -le 1 ]; then still=$((still + 1)); else still=0; fi
  last=$now
  if [ "$waited" -ge "$min" ] && [ "$still" -ge "$quiet" ]; then exit 0; fi
done
