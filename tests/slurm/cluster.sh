#!/usr/bin/env bash
# A real single-node Slurm cluster (Debian's slurm-wlm) under one directory, on loopback:
# munge with its own key and socket, slurmctld and slurmd as root. For the tests and the
# bench; nothing here touches /etc.
#
#   cluster.sh start DIR [accounting [preemption]]
#                          writes DIR/slurm.conf, starts the daemons, waits until the node
#                          is idle, prints `SLURM_CONF=DIR/slurm.conf`; with `accounting`,
#                          slurmdbd on a MariaDB of its own (socket only, data in DIR/mysql)
#                          keeps every job for `sacct`, and the controller forgets ended
#                          jobs after 2 s (MinJobAge) instead of 10 minutes; with
#                          `preemption` too, QoS preemption (`preempt/qos`, `REQUEUE`): QoS
#                          `urgent` preempts QoS `preemptible`, root may use both
#   cluster.sh stop DIR    stops them by the PIDs in DIR/*.pid
#
# The node has at least 8 CPUs, 2 fake GPUs (gres `gpu`, devices DIR/dev/nvidia0..1, symlinks to /dev/null:
# Slurm sets CUDA_VISIBLE_DEVICES for them), memory limits enforced by polling
# (jobacct_gather/linux with OverMemoryKill: no cgroups needed), and a default memory per
# CPU so that jobs without `--mem` share the node.
set -euo pipefail

cmd=${1:?usage: cluster.sh start|stop DIR}
dir=$(realpath -m "${2:?usage: cluster.sh start|stop DIR}")

daemons="slurmd slurmctld slurmdbd mariadbd munged"
stop() {
  for name in $daemons; do
    if [ -f "$dir/$name.pid" ]; then
      kill "$(cat "$dir/$name.pid")" 2>/dev/null || true
    fi
  done
  # The daemons leave on SIGTERM within a second or two; whatever is left is killed.
  for _ in $(seq 50); do
    alive=0
    for name in $daemons; do
      if [ -f "$dir/$name.pid" ] && kill -0 "$(cat "$dir/$name.pid")" 2>/dev/null; then alive=1; fi
    done
    [ $alive = 0 ] && return 0
    sleep 0.1
  done
  for name in $daemons; do
    [ -f "$dir/$name.pid" ] && kill -9 "$(cat "$dir/$name.pid")" 2>/dev/null || true
  done
}

if [ "$cmd" = stop ]; then
  stop
  exit 0
fi
[ "$cmd" = start ] || { echo "usage: cluster.sh start|stop DIR" >&2; exit 2; }
accounting=${3:-}
preemption=${4:-}

for tool in munged slurmctld slurmd sbatch; do
  command -v "$tool" >/dev/null || { echo "cluster.sh: $tool not found (apt-get install slurmctld slurmd slurm-client munge)" >&2; exit 3; }
done

mkdir -p "$dir/munge" "$dir/state" "$dir/spool" "$dir/dev"
chmod 755 "$dir" "$dir/munge"   # munged refuses a socket directory others can write to
if [ ! -f "$dir/munge/munge.key" ]; then
  dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
fi
chmod 600 "$dir/munge/munge.key"
for i in 0 1; do ln -sf /dev/null "$dir/dev/nvidia$i"; done

host=$(hostname -s)
# Eight CPUs at least whatever the machine has (config_overrides): the driving loop's
# 3-rank training is one allocation of 3 tasks, as on a real node.
cpus=$(( $(nproc) > 8 ? $(nproc) : 8 ))
mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 ))
# A job without `--mem` gets its share of the node per CPU, 1 GiB at least (PyTorch's
# ranks hold ~800 MB each; memory is enforced by polling what the processes hold).
def_mem=$(( mem_mb / cpus > 1024 ? mem_mb / cpus : 1024 ))
# Ports of their own, so that two clusters (or a leftover one) do not meet: three per
# cluster from this script's PID (clusters started at once never share one), all below
# the kernel's ephemeral range (32768 and up here), where an outgoing connection of any
# other test may hold a port (slurmctld then died with "Address already in use").
port=${SLURM_TEST_PORT:-$(( 20000 + ($$ % 4000) * 3 ))}

cat > "$dir/slurm.conf" <<CONF
ClusterName=dt
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
DependencyParameters=kill_invalid_depend
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$def_mem
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=1
JobAcctGatherParams=OverMemoryKill
AccountingStorageType=accounting_storage/none
GresTypes=gpu
KillWait=2
MinJobAge=600
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem_mb Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
PartitionName=long Nodes=ALL MaxTime=INFINITE State=UP
CONF
cat > "$dir/gres.conf" <<CONF
NodeName=$host Name=gpu File=$dir/dev/nvidia[0-1]
CONF

setsid munged --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.sock" \
  --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/seed" \
  --force </dev/null >/dev/null 2>&1

if [ "$accounting" = accounting ]; then
  for tool in mariadbd mariadb-install-db slurmdbd; do
    command -v "$tool" >/dev/null || { echo "cluster.sh: $tool not found (apt-get install mariadb-server slurmdbd)" >&2; exit 3; }
  done
  # The controller reaches slurmdbd's munge only through AccountingStoragePass; it
  # forgets an ended job after 2 s, so what it forgot is asked of accounting.
  sed -i -e 's|^AccountingStorageType=.*|AccountingStorageType=accounting_storage/slurmdbd|' \
    -e 's|^MinJobAge=.*|MinJobAge=2|' -e 's|^SchedulerParameters=.*|&,purge_job_interval=1|' \
    "$dir/slurm.conf"
  cat >> "$dir/slurm.conf" <<CONF
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$((port + 2))
AccountingStoragePass=$dir/munge/munge.sock
CONF
  cat > "$dir/slurmdbd.conf" <<CONF
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.sock
DbdAddr=127.0.0.1
DbdHost=localhost
DbdPort=$((port + 2))
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
PidFile=$dir/slurmdbd.pid
LogFile=$dir/slurmdbd.log
CONF
  chmod 600 "$dir/slurmdbd.conf"
  if [ ! -d "$dir/mysql/mysql" ]; then
    mariadb-install-db --no-defaults --datadir="$dir/mysql" --user=root \
      --auth-root-authentication-method=socket --skip-test-db >"$dir/mariadb-install.log" 2>&1
  fi
  setsid mariadbd --no-defaults --datadir="$dir/mysql" --socket="$dir/mysql.sock" \
    --skip-networking --user=root --pid-file="$dir/mariadbd.pid" --log-error="$dir/mariadb.err" \
    </dev/null >/dev/null 2>&1 &
  for _ in $(seq 100); do [ -S "$dir/mysql.sock" ] && break; sleep 0.1; done
  # slurmdbd finds MariaDB's socket through MYSQL_UNIX_PORT, its config beside SLURM_CONF.
  MYSQL_UNIX_PORT="$dir/mysql.sock" SLURM_CONF="$dir/slurm.conf" setsid slurmdbd </dev/null >"$dir/slurmdbd.out" 2>&1
  for _ in $(seq 100); do
    (echo > "/dev/tcp/127.0.0.1/$((port + 2))") 2>/dev/null && break
    sleep 0.1
  done
fi

export SLURM_CONF="$dir/slurm.conf"
if [ "$preemption" = preemption ]; then
  [ "$accounting" = accounting ] || { echo "cluster.sh: preemption needs accounting (QoS)" >&2; exit 2; }
  sed -i 's|^SchedulerType=.*|&\nPreemptType=preempt/qos\nPreemptMode=REQUEUE|' "$SLURM_CONF"
fi
setsid slurmctld -f "$SLURM_CONF" </dev/null >"$dir/slurmctld.out" 2>&1
setsid slurmd -f "$SLURM_CONF" </dev/null >"$dir/slurmd.out" 2>&1

for _ in $(seq 200); do
  if ! kill -0 "$(cat "$dir/slurmctld.pid" 2>/dev/null)" 2>/dev/null && [ -f "$dir/slurmctld.log" ] \
      && grep -q fatal "$dir/slurmctld.log"; then
    break
  fi
  if timeout 2 sinfo -h -o %t 2>/dev/null | grep -qx idle; then
    if [ "$preemption" = preemption ]; then
      # A job that may not be requeued (`--no-requeue`, as the engine submits) is
      # cancelled as PREEMPTED, after SIGTERM and KillWait.
      sacctmgr -i add qos preemptible >/dev/null
      sacctmgr -i add qos urgent Preempt=preemptible PreemptMode=requeue Priority=100 >/dev/null
      sacctmgr -i modify user root set qos+=preemptible,urgent >/dev/null
    fi
    echo "SLURM_CONF=$SLURM_CONF"
    exit 0
  fi
  sleep 0.1
done
echo "cluster.sh: the node did not become idle" >&2
tail -n 20 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
stop
exit 1
