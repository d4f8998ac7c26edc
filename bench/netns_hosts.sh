# shellcheck shell=bash
# "Hosts" on one machine, sourced by the benchmarks that need them
# (bench/slow_links.sh, bench/replicas_netns.sh, bench/gpu/hosts.sh): each host
# is a network namespace with an address of its own on a bridge in this one,
# reached through a veth pair, its outgoing link shaped with tc where asked.
# Needs root. `ip` and `tc` are $IP and $TC (default: those on the PATH; the
# GPU machine has none, bench/gpu/hosts.sh carries them).
#
#   hosts_up N PREFIX     namespaces PREFIX-0 .. PREFIX-(N-1): ${hosts_ns[i]},
#                         ${hosts_addr[i]} (10.<a>.<b>.(11+i), a /24 no interface
#                         here uses), the bridge's own address in $hosts_gateway
#   hosts_shape LINK      every host's outgoing link at LINK (10gbit, 1gbit, ...;
#                         tbf, a burst of 2 ms at that rate, at least 64 KB),
#                         with netem's $HOSTS_DELAY (e.g. 0.2ms) in front where
#                         the kernel has netem; `none` unshaped. Sets $hosts_delay
#                         to the delay applied (0 without netem).
#   hosts_down            removes them: the sourcing script calls it from its
#                         EXIT trap
IP=${IP:-ip}
TC=${TC:-tc}
hosts_ns=() hosts_veth=() hosts_addr=()
hosts_bridge=
hosts_gateway=
hosts_delay=0

hosts_up() {
  local n=$1 prefix=$2 i net= a b
  for a in 79 80 81; do
    for b in $(seq 0 255); do
      "$IP" -o -4 addr | grep -q " 10\.$a\.$b\." || { net=10.$a.$b; break 2; }
    done
  done
  [ -n "$net" ] || { echo "netns_hosts: no free 10.79-81.N.0/24" >&2; return 1; }
  hosts_bridge=${prefix}br
  hosts_gateway=$net.1
  "$IP" link add "$hosts_bridge" type bridge || return 1
  "$IP" addr add "$hosts_gateway/24" dev "$hosts_bridge"
  "$IP" link set "$hosts_bridge" up
  for ((i = 0; i < n; i++)); do
    hosts_ns+=("$prefix-$i") hosts_veth+=("${prefix}v$i") hosts_addr+=("$net.$((11 + i))")
    "$IP" netns add "${hosts_ns[i]}" || return 1
    "$IP" link add "${hosts_veth[i]}" type veth peer name eth0 netns "${hosts_ns[i]}"
    "$IP" link set "${hosts_veth[i]}" master "$hosts_bridge"
    "$IP" link set "${hosts_veth[i]}" up
    "$IP" -n "${hosts_ns[i]}" addr add "${hosts_addr[i]}/24" dev eth0
    "$IP" -n "${hosts_ns[i]}" link set eth0 up
    "$IP" -n "${hosts_ns[i]}" link set lo up
  done
  # netem (the delay) is a module some kernels lack (a Firecracker VM's 6.18 has
  # tbf but no sch_netem): links then get their rate alone.
  hosts_delay=${HOSTS_DELAY:-0}
  if [ "$hosts_delay" != 0 ] && ! "$TC" -n "${hosts_ns[0]}" qdisc add dev lo root netem delay "$hosts_delay" 2> /dev/null; then
    echo "netns_hosts: this kernel has no netem qdisc: links shaped by rate only, no added delay" >&2
    hosts_delay=0
  fi
  "$TC" -n "${hosts_ns[0]}" qdisc del dev lo root 2> /dev/null || true
}

hosts_shape() {
  local link=$1 i rate_bits burst parent=root
  for ((i = 0; i < ${#hosts_ns[@]}; i++)); do
    "$TC" -n "${hosts_ns[i]}" qdisc del dev eth0 root 2> /dev/null || true
    [ "$link" = none ] && continue
    rate_bits=$(( ${link%gbit} * 1000000000 ))
    burst=$(( rate_bits / 8 / 500 )); [ "$burst" -ge 65536 ] || burst=65536
    parent=root
    if [ "$hosts_delay" != 0 ]; then
      "$TC" -n "${hosts_ns[i]}" qdisc add dev eth0 root handle 1: netem delay "$hosts_delay" limit 100000
      parent="parent 1:1"
    fi
    # shellcheck disable=SC2086  # $parent is two words or one
    "$TC" -n "${hosts_ns[i]}" qdisc add dev eth0 $parent handle 10: tbf rate "$link" burst "$burst" latency 50ms
  done
}

hosts_down() {
  local n v
  for n in "${hosts_ns[@]}"; do "$IP" netns del "$n" 2> /dev/null || true; done
  for v in "${hosts_veth[@]}"; do "$IP" link del "$v" 2> /dev/null || true; done
  [ -z "$hosts_bridge" ] || "$IP" link del "$hosts_bridge" 2> /dev/null || true
  hosts_ns=() hosts_veth=() hosts_addr=() hosts_bridge=
}
