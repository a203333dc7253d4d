# shellcheck shell=sh
# The proxy container's entrypoint without the metrics sidecar (`ENTRYPOINT` in nginx.rs, which
# says what it does): `/bin/sh -c` with nginx's arguments after it. Its files are in its
# environment (`entrypoint_environment`): BALANCER_MOUNTED, BALANCER_RUNNING, BALANCER_PID_FILE,
# BALANCER_IPV6_PROBE and BALANCER_DRAIN_SECONDS; BALANCER_CONFIG_HASH, when set, is the SHA-256
# the mounted file must have.
trap 'exit 143' TERM
: "${BALANCER_MOUNTED:?}" "${BALANCER_RUNNING:?}" "${BALANCER_PID_FILE:?}"
: "${BALANCER_IPV6_PROBE:?}" "${BALANCER_DRAIN_SECONDS:?}"
mounted=$BALANCER_MOUNTED running=$BALANCER_RUNNING
rm -f "$BALANCER_PID_FILE"
check=${BALANCER_CONFIG_HASH:-}
if [ -n "$check" ] && ! command -v sha256sum >/dev/null; then
  echo "balancer: no sha256sum in the image; nginx does not start on $mounted unchecked" >&2
  exit 1
fi
told=
until cat "$mounted" > "$running" && { [ -z "$check" ] || { sum=$(sha256sum "$running") && [ "${sum%% *}" = "$check" ]; }; }; do
  [ -n "$told" ] || echo "balancer: waiting for the kubelet to mount $mounted with hash $check" >&2
  told=1
  sleep 1
done
if [ ! -e "$BALANCER_IPV6_PROBE" ]; then
  echo "balancer: this node has no IPv6; nginx listens on IPv4 only" >&2
  grep -vF 'listen [::]:' "$running" > "$running.ipv4" && mv "$running.ipv4" "$running"
fi
trap 'kill -QUIT "$nginx"; { sleep "$BALANCER_DRAIN_SECONDS"; kill -TERM "$nginx"; } 2>/dev/null & wait "$nginx"; exit $?' TERM
nginx "$@" & nginx=$!
wait "$nginx"
