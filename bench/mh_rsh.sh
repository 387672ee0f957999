#!/usr/bin/env bash
# mh_rsh.sh -- Open MPI's remote-shell agent (plm_rsh_agent) for the emulated
# hosts of tests/multihost/bed.sh, used by bench/multihost.py:
#
#   mh_rsh.sh HOST COMMAND...
#
# runs COMMAND (the words joined, through sh, as ssh would) on emulated host
# HOST -- its address 10.77.0.<i+1> or its name tcmh<i> -- of the bed whose
# id is $MH_BED_ID: in network namespace tcmh-<id>-h<i>, in its own UTS
# namespace with host name tcmh<i> (what `bed.sh exec` does).
set -u
[ $# -ge 2 ] || { echo "usage: mh_rsh.sh HOST COMMAND..." >&2; exit 2; }
[ -n "${MH_BED_ID:-}" ] || { echo "mh_rsh.sh: MH_BED_ID (the bed's id) is not set" >&2; exit 2; }
host=$1
shift
case $host in
  10.77.0.*) i=$((${host#10.77.0.} - 1)) ;;
  tcmh[0-9]*) i=${host#tcmh} ;;
  *) echo "mh_rsh.sh: unknown host '$host' (want 10.77.0.<i+1> or tcmh<i>)" >&2; exit 2 ;;
esac
ns=tcmh-$MH_BED_ID-h$i
exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' "tcmh$i" "$*"
