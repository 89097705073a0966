#!/usr/bin/env bash
# Make sure the multi-host rig (tests/cluster, benchmarks/cluster.py) can run here: root, and
# Debian's iproute2 (ip netns, veth, bridge), nftables (the faults), iptables and util-linux
# (unshare). Installs what is missing with apt-get (as ensure-services.sh does for the
# servers) and fails loudly if it cannot. Changes nothing else: the rig makes its own
# namespaces and removes them.
set -uo pipefail

fail() { echo "ensure-rig: $*" >&2; exit 1; }

[ "$(id -u)" = "0" ] || fail "the rig needs root (network namespaces, nftables)"
need=()
command -v ip >/dev/null || need+=(iproute2)
command -v nft >/dev/null || need+=(nftables)
command -v iptables >/dev/null || need+=(iptables)
command -v unshare >/dev/null || need+=(util-linux)
command -v runuser >/dev/null || need+=(util-linux)
if [ "${#need[@]}" -gt 0 ]; then
  echo "ensure-rig: installing Debian's ${need[*]}"
  command -v apt-get >/dev/null || fail "apt-get missing; install ${need[*]} by hand"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null) \
    || fail "apt-get install ${need[*]} failed"
fi
ip netns add lstrig-probe 2>/dev/null && ip netns del lstrig-probe \
  || fail "cannot make a network namespace here (a container without CAP_SYS_ADMIN?)"
echo "ensure-rig: ip, nft, iptables, unshare ready"
