#!/usr/bin/env bash
# A real one-node Slurm on localhost for the tests (Debian 12, as root):
# munge, MariaDB, slurmdbd, slurmctld, slurmd.
#   envs/schedulers/slurm.sh start   install what is missing, start, wait until the node is idle
#   envs/schedulers/slurm.sh stop    stop what start started (by PID), nothing else
#   envs/schedulers/slurm.sh env     the variables clients need (SLURM_CONF)
# Its configuration, state and logs live in $DDLC_SLURM_DIR. Clients find it
# through SLURM_CONF, except inside jobs: Snakemake's Slurm job step drops
# every SLURM_* variable, so an srun there reads /etc/slurm/slurm.conf, which
# start links to ours when there is none (and stop removes); a machine's own
# Slurm configuration is never replaced.
set -euo pipefail
dir=${DDLC_SLURM_DIR:-/var/lib/ddlc-test/slurm}
conf=$dir/etc/slurm.conf
packages=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server)
say() { printf 'slurm.sh: %s\n' "$*" >&2; }

source "$(dirname "$0")/common.sh"  # install_packages

# Start "$name" unless its PID file names a live process; the PID file in
# $dir/run is the record of what we started.
started() { [ -f "$dir/run/$1.pid" ] && running "$(cat "$dir/run/$1.pid")"; }

wait_for() {  # seconds, description, command...
  local n=$1 what=$2; shift 2
  for _ in $(seq $((n * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  say "$what did not come up in $n s; logs in $dir/log"
  return 1
}

write_config() {
  local host cpus mem
  host=$(hostname -s)
  mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
  # More CPUs than the machine has, so a few small runs share it at once.
  cpus=4
  mkdir -p "$dir"/{etc,run,log,state,spool}
  cat > "$conf" <<EOF
ClusterName=ddlctest
SlurmctldHost=$host
SlurmUser=root
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1000
SlurmdParameters=config_overrides
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/log/jobcomp.txt
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobAcctGatherType=jobacct_gather/none
MailProg=/bin/true
MinJobAge=300
KillWait=5
SchedulerParameters=sched_interval=2
ReturnToService=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus Boards=1 SocketsPerBoard=1 CoresPerSocket=$cpus ThreadsPerCore=1 RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
  cat > "$dir/etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
PidFile=$dir/run/slurmdbd.pid
LogFile=$dir/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageLoc=ddlc_slurm_acct
StorageUser=ddlcslurm
StoragePass=ddlcslurm
EOF
  chmod 600 "$dir/etc/slurmdbd.conf"
}

start_munge() {
  # A munged already serving the socket (the machine's own) is used as is.
  [ -S /run/munge/munge.socket.2 ] && munge -n >/dev/null 2>&1 && return 0
  mkdir -p /run/munge && chown munge:munge /run/munge
  # munged runs as munge, which cannot write into $dir: copy its PID file.
  runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/ddlc-munged.pid --force
  wait_for 10 munged munge -n
  cp /run/munge/ddlc-munged.pid "$dir/run/munge.pid"
}

start_mariadb() {
  if ! [ -S /run/mysqld/mysqld.sock ] || ! mariadb -e 'select 1' >/dev/null 2>&1; then
    mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
    [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql >/dev/null
    /usr/sbin/mariadbd --user=mysql --skip-networking --socket=/run/mysqld/mysqld.sock \
      --pid-file=/run/mysqld/ddlc-mariadb.pid >"$dir/log/mariadb.log" 2>&1 &
    echo $! > "$dir/run/mariadb.pid"  # it stays in the foreground: $! is the server
    wait_for 30 mariadb mariadb -e 'select 1'
  fi
  mariadb -e "CREATE DATABASE IF NOT EXISTS ddlc_slurm_acct;
    CREATE USER IF NOT EXISTS 'ddlcslurm'@'localhost' IDENTIFIED BY 'ddlcslurm';
    GRANT ALL ON ddlc_slurm_acct.* TO 'ddlcslurm'@'localhost';"
}

link_default_config() {
  if [ -L /etc/slurm/slurm.conf ] && [ "$(readlink /etc/slurm/slurm.conf)" = "$conf" ]; then
    return 0
  fi
  if [ -e /etc/slurm/slurm.conf ]; then
    say "/etc/slurm/slurm.conf exists (this machine's own Slurm?); not replacing it"
    return 1
  fi
  mkdir -p /etc/slurm && ln -s "$conf" /etc/slurm/slurm.conf
}

start() {
  install_packages
  write_config
  link_default_config
  export SLURM_CONF=$conf
  start_munge
  start_mariadb
  started slurmdbd || /usr/sbin/slurmdbd
  wait_for 30 slurmdbd sacctmgr -n list cluster
  sacctmgr -i -Q add cluster ddlctest >/dev/null 2>&1 || true
  started slurmctld || /usr/sbin/slurmctld -f "$conf"
  started slurmd || /usr/sbin/slurmd -f "$conf"
  wait_for 60 "the node" sh -c "sinfo -h -o %t | grep -qx idle"
  say "up: SLURM_CONF=$conf"
}


stop() {
  # mariadb and munge only when this script started them (their PID file is
  # ours); the daemons of Slurm always run from our own configuration.
  for d in slurmd slurmctld slurmdbd mariadb munge; do stop_one "$d"; done
  if [ -L /etc/slurm/slurm.conf ] && [ "$(readlink /etc/slurm/slurm.conf)" = "$conf" ]; then
    rm /etc/slurm/slurm.conf
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  env) echo "SLURM_CONF=$conf" ;;
  *) echo "usage: $0 start|stop|env" >&2; exit 2 ;;
esac
