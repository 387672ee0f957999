#!/usr/bin/env bash
# bed.sh -- a multi-host test bed on one machine (issue 17, point 4).
#
# Each emulated host is a network namespace (its own interfaces, addresses
# and ports) whose programs also run in their own UTS namespace with their
# own host name, so torchcomms' topology detection (host name + boot id)
# sees one machine per namespace. The hosts hang off a bridge in a switch
# namespace through veth pairs:
#
#   tcmh-<ID>-h<i>  (host name tcmh<i>, eth0 10.77.0.<i+1>/24)
#        eth0 <--veth--> h<i>  [tcmh-<ID>-sw: bridge br0]
#
# Links are shaped where the kernel allows: `tc ... tbf` (bandwidth, default
# 10gbit) on both ends of every veth, and `netem` delay when the kernel has
# netem (many VM kernels do not); the script says which shaping it used.
#
# usage:
#   bed.sh check                  can the bed run here? (status 77 + why if not)
#   bed.sh run [OPTIONS] -- PROGRAM [ARGS...]
#                                 bed up, one `tcrun --nnodes H` per host
#                                 running PROGRAM (node 0 = host 0 hosts the
#                                 store at 10.77.0.1:29500), bed down; exits
#                                 with the first failing host's status
#   bed.sh up [OPTIONS] [--id ID] leave a bed up (ID default "up")
#   bed.sh exec [--id ID] I -- CMD [ARGS...]
#                                 run CMD on host I of a bed that is up
#   bed.sh down [--id ID]         take it down
#   bed.sh test                   the multi-host tests (make test-multihost):
#                                 mh_check on 2,2 / 2,2,2,2 / 2,1,2 (the cpu
#                                 backend hierarchical, its default), and on
#                                 2,2 / 2,1,2 with TORCHCOMMS_CPU_HIER=0 (flat)
#   bed.sh clean                  remove every namespace of this script whose
#                                 run is gone (also done before each command)
# OPTIONS:
#   --layout N0,N1,...  ranks per host (default 2,2): 2,2,2,2 is 4 hosts x 2
#                       ranks, 2,1,2 an uneven job of 3 hosts
#   --rate RATE         tbf rate of every link (default 10gbit; 0: none)
#   --delay TIME        netem delay of every link, when netem exists
#                       (default 100us; 0: none)
#   --timeout S         tcrun --timeout of each host (default 300)
#
# Exit status: 0 ok; 1 a failure; 2 bad usage; 77 the bed cannot run here
# (not root, no `ip netns`, no veth, no bridge, no UTS namespaces): it
# prints one line "SKIP: <why>" first, so callers can skip with the reason.
#
# Namespaces of a `run`/`test` are named after the script's pid and removed
# on exit (trap), even on failure or a signal; leftovers of a run that was
# SIGKILLed (its pid gone) are removed by the next command.
set -u -o pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BUILD=${BUILD:-$ROOT/build}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
PREFIX=tcmh-
SKIP=77
PORT=29500
NET=10.77.0

LAYOUT=2,2
RATE=10gbit
DELAY=100us
TIMEOUT=300
ID=
SHAPING="none"

say() { printf 'bed: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }
skip() { printf 'SKIP: multi-host test bed: %s\n' "$*"; exit $SKIP; }

ns_host() { echo "${PREFIX}$1-h$2"; }
ns_sw() { echo "${PREFIX}$1-sw"; }

# The namespaces of bed $1.
bed_namespaces() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX}$1-(h[0-9]+|sw)\$" || true
}

# Kills what still runs in namespace $1 (our bed's processes), deletes it.
ns_delete() {
  local pids
  pids=$(ip netns pids "$1" 2>/dev/null || true)
  if [ -n "$pids" ]; then
    kill -TERM $pids 2>/dev/null || true
    local k
    for k in 1 2 3 4 5 6 7 8 9 10; do # up to 1 s for them to go
      pids=$(ip netns pids "$1" 2>/dev/null || true)
      [ -z "$pids" ] && break
      sleep 0.1
    done
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null || true
  fi
  ip netns del "$1" 2>/dev/null || true
}

# Takes bed $1 down (the veths and the bridge go with their namespaces).
bed_down() {
  local ns
  for ns in $(bed_namespaces "$1"); do ns_delete "$ns"; done
}

# Is pid $1 a bed.sh that still runs (not a zombie, not a reused pid)?
run_alive() {
  local state
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "$state" != Z ] && grep -qa bed.sh "/proc/$1/cmdline" 2>/dev/null
}

# Removes the beds of runs that are gone: tcmh-p<pid>-* whose pid is dead
# (a `run` or `test` killed before its trap ran).
clean_stale() {
  local ns id pid
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX}p[0-9]+-" || true); do
    id=${ns#"$PREFIX"}
    id=${id%%-*}
    pid=${id#p}
    if ! run_alive "$pid"; then
      say "removing $ns, left by run $pid (gone)"
      ns_delete "$ns"
    fi
  done
}

# Why the bed cannot run here, or nothing. Tries each kernel feature in a
# throwaway namespace.
why_not() {
  [ "$(id -u)" = 0 ] || { echo "needs root (it creates network namespaces and veth pairs; run as root, e.g. sudo make test-multihost)"; return; }
  command -v ip >/dev/null || { echo "no 'ip' command (install iproute2)"; return; }
  command -v unshare >/dev/null || { echo "no 'unshare' command (install util-linux)"; return; }
  local p="${PREFIX}probe$$" out
  out=$(ip netns add "$p" 2>&1) || { echo "'ip netns add' fails: $out"; return; }
  if ! out=$(ip -n "$p" link add tcmhv0 type veth peer name tcmhv1 2>&1); then
    ip netns del "$p"; echo "no veth pairs in this kernel: $out"; return
  fi
  if ! out=$(ip -n "$p" link add tcmhbr type bridge 2>&1); then
    ip netns del "$p"; echo "no bridges in this kernel: $out"; return
  fi
  if ! out=$(ip netns exec "$p" unshare --uts sh -c 'hostname tcmhprobe && test "$(hostname)" = tcmhprobe' 2>&1); then
    ip netns del "$p"; echo "no UTS namespaces (unshare --uts): $out"; return
  fi
  ip netns del "$p"
}

# Is qdisc $1 available? (tried on the loopback of the switch namespace)
have_qdisc() {
  command -v tc >/dev/null || return 1
  if tc -n "$SWNS" qdisc add dev lo root "$@" >/dev/null 2>&1; then
    tc -n "$SWNS" qdisc del dev lo root >/dev/null 2>&1
    return 0
  fi
  return 1
}

# Shapes link device $2 in namespace $1 (SHAPE_ARGS chosen by bed_up).
shape() {
  [ ${#SHAPE_ARGS[@]} -eq 0 ] && return 0
  tc -n "$1" qdisc add dev "$2" root "${SHAPE_ARGS[@]}" ||
    die "tc qdisc add dev $2 root ${SHAPE_ARGS[*]} failed in $1"
}

# Creates bed ID with one host per entry of LAYOUT.
bed_up() {
  local why
  why=$(why_not)
  [ -z "$why" ] || skip "$why"
  clean_stale
  [ -z "$(bed_namespaces "$ID")" ] || die "a bed with id $ID is up already (bed.sh down --id $ID)"
  HOSTS=$(awk -F, '{print NF}' <<<"$LAYOUT")
  SWNS=$(ns_sw "$ID")
  ip netns add "$SWNS" || die "ip netns add $SWNS failed"
  ip -n "$SWNS" link set lo up
  ip -n "$SWNS" link add br0 type bridge || die "cannot create the bridge"
  ip -n "$SWNS" link set br0 up
  # shaping: netem (delay, and its own rate) if the kernel has it, else tbf
  SHAPE_ARGS=()
  local d=$DELAY r=$RATE
  [ "$d" = 0 ] && d=
  [ "$r" = 0 ] && r=
  if [ -n "$d" ] && have_qdisc netem delay 1us; then
    SHAPE_ARGS=(netem delay "$d" ${r:+rate "$r"})
    SHAPING="netem delay $d${r:+ rate $r} on both ends of every link"
  elif [ -n "$r" ] && have_qdisc tbf rate "$r" burst 1mb latency 5ms; then
    SHAPE_ARGS=(tbf rate "$r" burst 1mb latency 5ms)
    SHAPING="tbf rate $r burst 1mb latency 5ms on both ends of every link"
    [ -n "$d" ] && SHAPING="$SHAPING; no delay: this kernel has no netem qdisc"
  elif [ -n "$r$d" ]; then
    SHAPING="none: this kernel has neither netem nor tbf (or no tc command)"
  fi
  local i ns
  for ((i = 0; i < HOSTS; i++)); do
    ns=$(ns_host "$ID" $i)
    ip netns add "$ns" || die "ip netns add $ns failed"
    ip -n "$ns" link set lo up
    ip -n "$SWNS" link add "h$i" type veth peer name eth0 netns "$ns" ||
      die "cannot create the veth pair of host $i"
    ip -n "$SWNS" link set "h$i" master br0
    ip -n "$SWNS" link set "h$i" up
    ip -n "$ns" addr add "$NET.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    shape "$ns" eth0
    shape "$SWNS" "h$i"
  done
  # every host reaches host 0 (when there is a ping; tcrun's join retries
  # anyway, for up to its --join-timeout)
  command -v ping >/dev/null && for ((i = 1; i < HOSTS; i++)); do
    ip netns exec "$(ns_host "$ID" $i)" ping -c 1 -W 5 "$NET.1" >/dev/null 2>&1 ||
      die "host $i cannot reach host 0 ($NET.1) over the bridge"
  done
  say "$HOSTS hosts (ranks per host: $LAYOUT), namespaces ${PREFIX}$ID-h0..h$((HOSTS - 1)), bridge in $SWNS; link shaping: $SHAPING"
}

# Runs "$@" on host $1 of bed ID, in its own UTS namespace as tcmh<i>.
on_host() {
  local i=$1
  shift
  exec ip netns exec "$(ns_host "$ID" "$i")" unshare --uts \
    sh -c 'hostname "$0" && exec "$@"' "tcmh$i" "$@"
}

# The job: one tcrun per host; the first host to fail stops the others.
run_job() {
  local tcrun=$BUILD/tcrun
  [ -x "$tcrun" ] || die "no $tcrun: build first (make build)"
  local -a n
  IFS=, read -r -a n <<<"$LAYOUT"
  local i pid rc=0 first_fail=
  declare -A host_of=()
  for ((i = 0; i < HOSTS; i++)); do
    (on_host $i "$tcrun" --nnodes "$HOSTS" --node-rank $i --master-addr "$NET.1" \
       --port $PORT --join-timeout 60 --timeout "$TIMEOUT" --tag-output -n "${n[$i]}" \
       -- "$@") > >(sed -u "s/^/[tcmh$i] /") 2> >(sed -u "s/^/[tcmh$i] /" >&2) &
    host_of[$!]=$i
    JOB_PIDS+=($!)
  done
  local -a live=("${JOB_PIDS[@]}")
  local st p
  while [ ${#live[@]} -gt 0 ]; do
    pid=
    wait -n -p pid "${live[@]}"
    st=$?
    if [ -z "${pid:-}" ]; then
      # wait -n named no job: bash had already reaped the one that ended (the
      # exit of a process substitution can make it do so) and left -p's
      # variable unset. "wait PID" still returns each job's saved status.
      pid=${live[0]}
      wait "$pid"
      st=$?
    fi
    local -a still=()
    for p in "${live[@]}"; do [ "$p" = "$pid" ] || still+=("$p"); done
    live=("${still[@]}")
    if [ $st -ne 0 ] && [ -z "$first_fail" ]; then
      first_fail=${host_of[$pid]}
      rc=$st
      say "host tcmh$first_fail: tcrun exited with status $st; stopping the other hosts"
      [ ${#live[@]} -gt 0 ] && kill -TERM "${live[@]}" 2>/dev/null
    fi
  done
  JOB_PIDS=()
  return $rc
}

JOB_PIDS=()
cleanup() {
  local st=$?
  trap - EXIT INT TERM HUP
  [ ${#JOB_PIDS[@]} -gt 0 ] && kill -TERM "${JOB_PIDS[@]}" 2>/dev/null
  [ -n "$ID" ] && bed_down "$ID"
  exit $st
}

parse_opts() {
  while [ $# -gt 0 ]; do
    case $1 in
      --layout) LAYOUT=$2; shift 2 ;;
      --layout=*) LAYOUT=${1#*=}; shift ;;
      --rate) RATE=$2; shift 2 ;;
      --rate=*) RATE=${1#*=}; shift ;;
      --delay) DELAY=$2; shift 2 ;;
      --delay=*) DELAY=${1#*=}; shift ;;
      --timeout) TIMEOUT=$2; shift 2 ;;
      --timeout=*) TIMEOUT=${1#*=}; shift ;;
      --id) ID=$2; shift 2 ;;
      --id=*) ID=${1#*=}; shift ;;
      --) shift; break ;;
      *) break ;;
    esac
  done
  [[ $LAYOUT =~ ^[1-9][0-9]*(,[1-9][0-9]*)+$ ]] ||
    { say "bad --layout '$LAYOUT' (ranks per host, at least 2 hosts: 2,2 or 2,1,2)"; exit 2; }
  [ "$(awk -F, '{print NF}' <<<"$LAYOUT")" -le 200 ] || { say "at most 200 hosts"; exit 2; }
  REST=("$@")
}

# Fails (saying so) if the run of pid $1 left a namespace behind.
left_behind() {
  local left
  left=$(bed_namespaces "p$1")
  [ -z "$left" ] && return 0
  echo "FAIL multihost: the run (pid $1) left namespaces behind:" $left
  return 1
}

# One multi-host job of the tests: mh_check (every operation, exact values)
# on LAYOUT; prints the hosts' output only when it fails.
# $2: TORCHCOMMS_CPU_HIER for the job (default: unset, i.e. auto).
test_layout() {
  local layout=$1 hier=${2:-} out st t0=$SECONDS label
  label="layout $layout${hier:+ TORCHCOMMS_CPU_HIER=$hier}"
  out=$(mktemp /tmp/tcmh-test.XXXXXX)
  if [ -n "$hier" ]; then
    TORCHCOMMS_CPU_HIER=$hier "$0" run --layout "$layout" --timeout 150 -- \
      "$BUILD/multihost/mh_check" >"$out" 2>&1 &
  else
    (unset TORCHCOMMS_CPU_HIER; exec "$0" run --layout "$layout" --timeout 150 -- \
      "$BUILD/multihost/mh_check") >"$out" 2>&1 &
  fi
  local run=$!
  wait $run
  st=$?
  left_behind $run || st=1
  local oks
  oks=$(grep -c "cases OK" "$out")
  local want
  want=$(awk -F, '{s=0; for(i=1;i<=NF;i++) s+=$i; print s}' <<<"$layout")
  if [ $st -eq 0 ] && [ "$oks" = "$want" ]; then
    echo "PASS multihost $label ($want ranks on $(awk -F, '{print NF}' <<<"$layout") hosts): $(grep -m1 'link shaping' "$out" | sed 's/.*link shaping: //'); $((SECONDS - t0)) s"
    grep "rank 0 of" "$out" | sed 's/^/  /'
    rm -f "$out"
    return 0
  fi
  echo "FAIL multihost $label: status $st, $oks of $want ranks OK; output:"
  sed 's/^/  /' "$out"
  rm -f "$out"
  return 1
}

# The Python check: torchcomms.new_comm("cpu") across the hosts, one
# all_reduce of a torch tensor (skipped without the project's venv).
test_python() {
  local py=${VPY:-$ROOT/.venv/bin/python} out st layout=2,1
  if ! [ -x "$py" ] || ! "$py" -c "import torch, torchcomms" >/dev/null 2>&1; then
    echo "SKIP multihost python: no $py with torch and torchcomms (make pyinstall)"
    return 0
  fi
  out=$(mktemp /tmp/tcmh-test.XXXXXX)
  "$0" run --layout $layout --timeout 150 -- "$py" "$HERE/mh_torch.py" >"$out" 2>&1 &
  local run=$!
  wait $run
  st=$?
  left_behind $run || st=1
  if [ $st -eq 0 ] && [ "$(grep -c 'mh_torch: .* OK' "$out")" = 3 ]; then
    echo "PASS multihost python layout $layout: $(grep -m1 'mh_torch: rank 0' "$out" | sed 's/.*\] //')"
    rm -f "$out"
    return 0
  fi
  echo "FAIL multihost python layout $layout: status $st; output:"
  sed 's/^/  /' "$out"
  rm -f "$out"
  return 1
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case $cmd in
  check)
    why=$(why_not)
    [ -z "$why" ] || skip "$why"
    echo "bed: can run here"
    ;;
  run)
    parse_opts "$@"
    [ ${#REST[@]} -gt 0 ] || { say "run: no program given"; exit 2; }
    ID=p$$
    trap cleanup EXIT INT TERM HUP
    bed_up
    run_job "${REST[@]}"
    ;;
  up)
    parse_opts "$@"
    ID=${ID:-up}
    [[ $ID =~ ^[a-zA-Z0-9_]+$ ]] && ! [[ $ID =~ ^p[0-9]+$ ]] ||
      { say "bad --id '$ID' (letters, digits, _; not p<digits>, the runs' own)"; exit 2; }
    [ -z "$(bed_namespaces "$ID")" ] || die "a bed with id $ID is up already (bed.sh down --id $ID)"
    trap cleanup EXIT INT TERM HUP # a bed that could not be completed goes
    bed_up
    trap - EXIT INT TERM HUP
    ;;
  exec)
    parse_opts "$@"
    set -- "${REST[@]}"
    ID=${ID:-up}
    [ $# -ge 2 ] || { say "exec: usage: bed.sh exec [--id ID] I -- CMD [ARGS...]"; exit 2; }
    i=$1
    shift
    [ "${1:-}" = -- ] && shift
    [ -n "$(bed_namespaces "$ID")" ] || die "no bed with id $ID is up (bed.sh up --id $ID)"
    on_host "$i" "$@"
    ;;
  down)
    parse_opts "$@"
    bed_down "${ID:-up}"
    ;;
  clean)
    clean_stale
    ;;
  test)
    why=$(why_not)
    [ -z "$why" ] || skip "$why"
    [ -x "$BUILD/multihost/mh_check" ] || die "no $BUILD/multihost/mh_check: build first (make build)"
    fails=0
    # hierarchical (the default) on every layout, flat on two of them
    for layout in 2,2 2,2,2,2 2,1,2; do
      test_layout $layout || fails=$((fails + 1))
    done
    for layout in 2,2 2,1,2; do
      test_layout $layout 0 || fails=$((fails + 1))
    done
    test_python || fails=$((fails + 1))
    [ $fails -eq 0 ] || { echo "multihost: $fails failed"; exit 1; }
    echo "multihost: all passed"
    ;;
  *)
    sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    [ "$cmd" = -h ] || [ "$cmd" = --help ] || exit 2
    ;;
esac
