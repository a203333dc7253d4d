#!/usr/bin/env bash
# The host side of the node suite: what a node changes outside its own
# processes, set up and put back.
#
#   host.sh up STATE                    bridges, routes, the forwarding fence, sysctls (saved in STATE)
#   host.sh stop-containers STATE NODE  kills every container of node NODE's containerd (while it runs)
#   host.sh down STATE                  stops every container of the suite's containerds, then removes
#                      mounts, network namespaces, links, iptables chains, conntrack
#                      entries and STATE's directories, and restores the sysctls
#
# `down` is safe to run twice, and after a crash: each step ignores what is gone.
#
# Every packet stays inside the machine: node A's pods live on the bridge
# balancer0 (10.244.0.0/24, the host is .1), node B's on balancer1
# (10.244.1.0/24), the rest of 10.244.0.0/16 is unreachable (also while a
# bridge is down), Service IPs (10.0.0.0/24) are routed to a bridge with no
# ports (and refused when kube-proxy has not rewritten them), and forwarded pod traffic leaving by any other interface is dropped.
set -uo pipefail

action="$1"
state="$2"
CLUSTER_CIDR=10.244.0.0/16
# bridge, address/prefix: keep in step with node.rs's NODE_A and NODE_B.
POD_BRIDGES=(balancer0 balancer1)
NODE_ADDRESSES=(10.244.0.1/24 10.244.1.1/24)
SERVICE_CIDR=10.0.0.0/24
SERVICE_BRIDGE=balancer-svc0
FENCE=BALANCER-NODE-FENCE
UNTRANSLATED=BALANCER-NODE-UNTRANSLATED
# isolation.rs's chain that drops a silent tenant's sidecar packets (removed by the scenario).
SILENT=BALANCER-NODE-SILENT
# What the kubelet, kube-proxy and this script change.
SYSCTLS=(kernel.panic kernel.panic_on_oops vm.overcommit_memory net.ipv4.conf.all.route_localnet
  net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables)

up() {
  set -e
  mkdir -p "$state"
  : >"$state/sysctls"
  for key in "${SYSCTLS[@]}"; do
    echo "$key=$(sysctl -n "$key")" >>"$state/sysctls"
  done
  local i
  for i in "${!POD_BRIDGES[@]}"; do
    ip link add "${POD_BRIDGES[$i]}" type bridge
    ip addr add "${NODE_ADDRESSES[$i]}" dev "${POD_BRIDGES[$i]}"
    ip link set "${POD_BRIDGES[$i]}" up
  done
  ip route add unreachable "$CLUSTER_CIDR"
  ip link add "$SERVICE_BRIDGE" type bridge
  ip link set "$SERVICE_BRIDGE" up
  ip route add "$SERVICE_CIDR" dev "$SERVICE_BRIDGE"
  # In mangle, which runs before filter, where kube-proxy keeps its own ACCEPT rules first.
  iptables -t mangle -N "$FENCE"
  for i in "${!POD_BRIDGES[@]}"; do
    iptables -t mangle -A "$FENCE" -s "$CLUSTER_CIDR" -o "${POD_BRIDGES[$i]}" -j RETURN
  done
  # Service IPs that kube-proxy did not rewrite (a Service without endpoints) go to the
  # bridge with no ports, where kube-proxy's filter rules reject them at once.
  iptables -t mangle -A "$FENCE" -s "$CLUSTER_CIDR" -d "$SERVICE_CIDR" -o "$SERVICE_BRIDGE" -j RETURN
  iptables -t mangle -A "$FENCE" -s "$CLUSTER_CIDR" -j DROP
  iptables -t mangle -I FORWARD 1 -j "$FENCE"
  # A connection to a Service IP that kube-proxy has not rewritten yet (a Service it has not
  # synced) is refused here, in filter, after nat: its conntrack entry is then never confirmed.
  # Let through, it would leave an untranslated entry for two minutes, and a later connection
  # that happened on the same source port would follow that entry to the bridge with no ports
  # and fail with "no route to host".
  iptables -t filter -N "$UNTRANSLATED"
  iptables -t filter -A "$UNTRANSLATED" -d "$SERVICE_CIDR" -m conntrack ! --ctstate DNAT \
    -j REJECT --reject-with icmp-host-unreachable
  iptables -t filter -I OUTPUT 1 -j "$UNTRANSLATED"
  iptables -t filter -I FORWARD 1 -j "$UNTRANSLATED"
  sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
  # Pods resolve nothing: no nameserver at all (glibc then tries only the pod's own loopback).
  printf 'options ndots:1\n' >"$state/resolv.conf"
  # The kubelet writes pod logs and device plugin sockets here whatever its root directory:
  # each node binds directories of its own over them in its mount namespace.
  local dir
  for dir in /var/log/pods /var/log/containers /var/lib/kubelet /var/lib/kubelet/device-plugins; do
    [ -e "$dir" ] || echo "$dir" >>"$state/created-dirs"
    mkdir -p "$dir"
  done
}

# Kills what node $1's containerd started: its tasks, then its shims.
stop_containers() {
  local sock="$state/$1/containerd/containerd.sock" id
  if [ -S "$sock" ]; then
    for id in $(ctr -a "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr -a "$sock" -n k8s.io tasks kill -s SIGKILL "$id" >/dev/null 2>&1
    done
  fi
  pkill -KILL -f "containerd-shim.*-address $sock" 2>/dev/null
  sleep 0.5
}

# The host ends of the pods' veths: those on the suite's own bridges. A pod whose node went
# first leaves its end behind until its network namespace is gone.
remove_pod_veths() {
  local bridge name
  for bridge in "${POD_BRIDGES[@]}"; do
    for name in $(ip -o link show master "$bridge" type veth 2>/dev/null | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }'); do
      ip link delete "$name" 2>/dev/null
    done
  done
}

unmount_under() { # every mount point under $1, deepest first
  awk -v root="$1" '$2 == root || index($2, root "/") == 1 { print $2 }' /proc/mounts | sort -r |
    while read -r mount; do umount -l "$mount" 2>/dev/null; done
}

down() {
  local dir
  for dir in "$state"/*/containerd; do
    [ -d "$dir" ] && stop_containers "$(basename "$(dirname "$dir")")"
  done
  # The node's own processes, left running by a run that was killed outright.
  pkill -KILL -f -- "$state/" 2>/dev/null
  # The pods' network namespaces were mounted in the nodes' own mount namespaces, which
  # ended with their last process.
  unmount_under "$state"
  remove_pod_veths
  for bridge in "${POD_BRIDGES[@]}"; do ip link delete "$bridge" 2>/dev/null; done
  ip route delete unreachable "$CLUSTER_CIDR" 2>/dev/null
  ip link delete "$SERVICE_BRIDGE" 2>/dev/null
  local table
  for table in mangle filter; do # filter: where runs before the fence moved kept it
    iptables -t "$table" -D FORWARD -j "$FENCE" 2>/dev/null
    iptables -t "$table" -F "$FENCE" 2>/dev/null
    iptables -t "$table" -X "$FENCE" 2>/dev/null
  done
  for hook in OUTPUT FORWARD; do
    iptables -t filter -D "$hook" -j "$UNTRANSLATED" 2>/dev/null
  done
  iptables -t filter -F "$UNTRANSLATED" 2>/dev/null
  iptables -t filter -X "$UNTRANSLATED" 2>/dev/null
  iptables -t mangle -D FORWARD -j "$SILENT" 2>/dev/null
  iptables -t mangle -F "$SILENT" 2>/dev/null
  iptables -t mangle -X "$SILENT" 2>/dev/null
  for tool in iptables ip6tables; do
    # The chains kube-proxy, the kubelet and the CNI plugins made, and the rules jumping to them.
    local saved
    saved="$("$tool-save" 2>/dev/null)" || continue
    if grep -qE 'KUBE-|CNI-' <<<"$saved"; then
      grep -vE 'KUBE-|CNI-' <<<"$saved" | "$tool-restore"
    fi
  done
  conntrack -D -s "$CLUSTER_CIDR" >/dev/null 2>&1
  conntrack -D -d "$CLUSTER_CIDR" >/dev/null 2>&1
  conntrack -D -d "$SERVICE_CIDR" >/dev/null 2>&1
  if [ -s "$state/sysctls" ]; then
    while IFS= read -r setting; do sysctl -qw "$setting" 2>/dev/null; done <"$state/sysctls"
  fi
  # The log directories this script created (the nodes bound their own over them).
  if [ -s "$state/created-dirs" ]; then
    tac "$state/created-dirs" | while IFS= read -r dir; do rmdir "$dir" 2>/dev/null; done
  fi
  [ -e "$state/remove-var-log-pods" ] && rm -rf /var/log/pods /var/log/containers # before the bind mounts
  rm -rf "$state"
}

case "$action" in
  up) up ;;
  stop-containers) stop_containers "$3" ;;
  down) down ;;
  *)
    echo "usage: host.sh up STATE | stop-containers STATE NODE | down STATE" >&2
    exit 2
    ;;
esac
