#!/usr/bin/env bash
# Starts `strata serve` as a TP x PP world under Open MPI's mpirun (docs/distributed.md).
#
#   deploy/mpi/strata-mpirun.sh --config configs/<deployment>.yaml --tp 8 --pp 2 --hostfile hosts.txt
#
# Ranks are placed in hostfile order, one per GPU (or CPU slot): world rank r is pipeline stage r / tp and tensor
# rank r % tp, so with `slots=<tp>` per host a stage's tensor-parallel group shares one node. Rank 0, the leader,
# serves HTTP on the first host. Flags after `--` go to `strata serve` unchanged (--port, --set key=value, ...).
#
# To drain the world (a rolling update): SIGUSR1 to this script's process (it execs mpirun, which forwards it to
# every rank) or SIGTERM to rank 0. SIGTERM to mpirun itself kills the ranks a second later, cutting the requests
# in flight (docs/decisions.md, [hardening]).
#
# Environment (each with a default that suits a cluster; override by exporting it first):
#   STRATA_BIN             the strata binary (default: build/strata next to this script's repository)
#   STRATA_TIMEOUT_S       parallel.timeout_s: a rank silent this long ends the world (default 60)
#   STRATA_IFACE           network interface for MPI and NCCL traffic between nodes (default: let them choose)
#   OMP_NUM_THREADS        CPU threads per rank (default 1: GPU ranks need no CPU compute threads)
#   NCCL_DEBUG             NCCL logging (default WARN)
set -euo pipefail

usage() {
  sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

config="" tp=1 pp=1 hostfile=""
extra=()
while (($#)); do
  case "$1" in
    --config) config="$2"; shift 2 ;;
    --tp) tp="$2"; shift 2 ;;
    --pp) pp="$2"; shift 2 ;;
    --hostfile) hostfile="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) usage ;;
    *) echo "strata-mpirun: unknown flag $1 (flags for strata serve go after --)" >&2; exit 2 ;;
  esac
done
[[ -n "$config" ]] || { echo "strata-mpirun: --config FILE is required" >&2; exit 2; }
[[ "$tp" =~ ^[1-9][0-9]*$ && "$pp" =~ ^[1-9][0-9]*$ ]] || { echo "strata-mpirun: --tp and --pp take integers >= 1" >&2; exit 2; }

repo="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${STRATA_BIN:-$repo/build/strata}"
[[ -x "$bin" ]] || { echo "strata-mpirun: $bin is not an executable (build it, or set STRATA_BIN)" >&2; exit 2; }
n=$((tp * pp))

mpi_args=(-np "$n" --map-by slot --bind-to none)
[[ -n "$hostfile" ]] && mpi_args+=(--hostfile "$hostfile")
# Forwarded to every rank.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
mpi_args+=(-x OMP_NUM_THREADS -x NCCL_DEBUG -x LD_LIBRARY_PATH -x PATH)
if [[ -n "${STRATA_IFACE:-}" ]]; then
  export NCCL_SOCKET_IFNAME="$STRATA_IFACE"
  mpi_args+=(--mca btl_tcp_if_include "$STRATA_IFACE" --mca oob_tcp_if_include "$STRATA_IFACE" -x NCCL_SOCKET_IFNAME)
fi
# When one rank dies mpirun signals the others and kills them after this many seconds: long enough for the leader
# to send the requests in flight their error responses.
mpi_args+=(--mca odls_base_sigkill_timeout 5)

exec mpirun "${mpi_args[@]}" "$bin" serve --config "$config" --tp "$tp" --pp "$pp" \
  --set "parallel.timeout_s=${STRATA_TIMEOUT_S:-60}" "${extra[@]}"
