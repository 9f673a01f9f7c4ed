#!/usr/bin/env bash
# A real OAR 2.5 on localhost for the tests (Debian 12, as root): PostgreSQL,
# the OAR server (Almighty), the OAR node's sshd, one host with N cores, and
# an unprivileged user to submit jobs (OAR refuses root's).
#   envs/schedulers/oar.sh start   install what is missing, configure, start
#                                   (DDLC_OAR_NODES="host=namespace=address=cpus ...":
#                                   one OAR node per entry, its sshd in that network
#                                   namespace, confined to those cores where given, so
#                                   its jobs are too; ./ddlc cluster sets it. Default:
#                                   localhost)
#   envs/schedulers/oar.sh stop    stop what start started (by PID), nothing else
#   envs/schedulers/oar.sh user    the test user's name
#   envs/schedulers/oar.sh grant PATH...
#                                   let the test user reach PATHs (a virtual
#                                   environment whose Python lives under /root):
#                                   an ACL "x" for that user alone on each parent
#                                   directory it cannot cross; stop removes them
# OAR reads /etc/oar: start edits oar.conf (database passwords, no cpusets,
# no scheduler pause) and the job resource manager, which otherwise deletes
# every file of the job's user in /tmp, /dev/shm and /var/tmp when their last
# job ends; the test user has a uid of its own (DDLC_OAR_UID) for the same reason.
set -euo pipefail
dir=${DDLC_OAR_DIR:-/var/lib/ddlc-test/oar}
user=${DDLC_OAR_USER:-ddlcoar}
uid=${DDLC_OAR_UID:-64321}
cores=${DDLC_OAR_CORES:-4}  # per node; more than the machine has: small jobs share it
nodes=${DDLC_OAR_NODES:-localhost}
owner=/var/lib/ddlc-oar-database.owner  # which set-up's resources the one OAR database holds
packages=(postgresql oar-server oar-server-pgsql oar-node oar-user oar-user-pgsql
          libyaml-perl libjson-perl openssh-server openssh-client acl)
say() { printf 'oar.sh: %s\n' "$*" >&2; }

source "$(dirname "$0")/common.sh"  # install_packages

wait_for() {  # seconds, description, command...
  local n=$1 what=$2; shift 2
  for _ in $(seq $((n * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  say "$what did not come up in $n s; logs in $dir/log and /var/log/oar.log"
  return 1
}

alive() { [ -f "$dir/run/$1.pid" ] && running "$(cat "$dir/run/$1.pid")"; }

setting() {  # KEY VALUE: set KEY="VALUE" in oar.conf
  sed -i "s|^#\?$1=.*|$1=\"$2\"|" /etc/oar/oar.conf
}

configure() {
  setting DB_HOSTNAME 127.0.0.1
  setting DB_BASE_PASSWD ddlcoar
  setting DB_BASE_PASSWD_RO ddlcoar_ro
  setting SERVER_HOSTNAME localhost
  setting SCHEDULER_MIN_TIME_BETWEEN_2_CALLS 0  # else each job waits ~11 s
  # A lost node is found within seconds, running jobs or not (OAR's default:
  # every 300 s, and never a node that runs a job): OAR then marks it
  # Suspected and ends its jobs in Error, as Slurm's SlurmdTimeout does.
  setting FINAUD_FREQUENCY 10
  setting CHECK_NODES_WITH_RUNNING_JOB yes
  # A job whose first node is lost is ended (Error, EXTERMINATE_JOB) once
  # Leon has tried to reach it for this long (300 s by default).
  setting JOBDEL_WALLTIME 30
  # A job that waits for the machine adds the wait to its walltime
  # (workflows/share_machine.sh: oarwalltime --force --delay-next-jobs),
  # ahead of the jobs planned after it on its nodes, which wait for the
  # machine too.
  setting WALLTIME_CHANGE_ENABLED yes
  setting WALLTIME_MAX_INCREASE -1
  setting WALLTIME_ALLOWED_USERS_TO_FORCE '*'
  setting WALLTIME_ALLOWED_USERS_TO_DELAY_JOBS '*'
  # No cgroups or cpusets here.
  sed -i 's|^JOB_RESOURCE_MANAGER_PROPERTY_DB_FIELD=|#&|; s|^CPUSET_PATH=|#&|' /etc/oar/oar.conf
  if [ "$nodes" != localhost ]; then
    # Several nodes: oarsh finds a job by its cpuset name (its field), and
    # with no CPUSET_PATH no cpuset is made.
    sed -i 's|^#JOB_RESOURCE_MANAGER_PROPERTY_DB_FIELD=|JOB_RESOURCE_MANAGER_PROPERTY_DB_FIELD=|' \
      /etc/oar/oar.conf
  fi
  sed -i "s|^my @Tmp_dir_to_clear = (.*);|my @Tmp_dir_to_clear = ();|" \
    /etc/oar/job_resource_manager_cgroups.pl
  grep -q '^my @Tmp_dir_to_clear = ();' /etc/oar/job_resource_manager_cgroups.pl
}

create_user() {
  if id "$user" >/dev/null 2>&1; then
    [ "$(id -u "$user")" = "$uid" ] && return 0
    say "user $user exists with uid $(id -u "$user"), not $uid"; return 1
  fi
  if getent passwd "$uid" >/dev/null; then
    say "uid $uid belongs to $(getent passwd "$uid" | cut -d: -f1); set DDLC_OAR_UID"; return 1
  fi
  useradd -m -u "$uid" -s /bin/bash "$user"
}

start_postgres() {
  if pg_lsclusters -h | awk '$1 == 15 && $2 == "main" {print $4}' | grep -q online; then
    return 0  # the machine's own: used, not ours to stop
  fi
  pg_ctlcluster 15 main start
  head -1 /var/lib/postgresql/15/main/postmaster.pid > "$dir/run/postgres.pid"
}

create_database() {
  # One OAR database on this machine, shared by this script's set-ups (the
  # test OAR, the cluster): a set-up that finds another's resources, or the
  # same one's with other nodes (a cluster of 2 after one of 3: OAR would
  # place jobs on hosts that no longer exist), starts afresh. So does one
  # whose server is gone with jobs unfinished (killed under them, or the
  # machine restarted): their processes are gone, OAR cannot end them
  # (oardel waits on their oarexec), and they hold the nodes.
  local mine="$dir $nodes $cores" left=
  alive oar-server || left=$(unfinished_jobs)
  if [ "$(cat "$owner" 2>/dev/null)" = "$mine" ] && oarnodes -J >/dev/null 2>&1 && [ -z "$left" ]; then
    return 0
  fi
  [ -z "$left" ] ||
    say "starting OAR's database afresh: jobs $(echo $left) were left unfinished by a server that is gone"
  oar-database --drop --db-is-local -y >"$dir/log/oar-database.log" 2>&1 || true
  oar-database --create --db-is-local -y >>"$dir/log/oar-database.log" 2>&1
  echo "$mine" > "$owner"
}

start_node_sshd() {
  mkdir -p /run/sshd
  [ -f /etc/oar/oar_ssh_host_rsa_key ] || ssh-keygen -q -t rsa -N '' -f /etc/oar/oar_ssh_host_rsa_key
  local entry host ns address cpus
  for entry in $nodes; do
    IFS== read -r host ns address cpus <<< "$entry"
    alive "sshd-$host" && continue
    local sshd=(${cpus:+taskset --cpu-list "$cpus"} /usr/sbin/sshd -f /etc/oar/sshd_config -o PidFile="$dir/run/sshd-$host.pid"
                -o ListenAddress="${address:-127.0.0.1}" -E "$dir/log/sshd-$host.log")
    if [ -n "$ns" ]; then  # in the node: its network, its host name
      ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$host" "${sshd[@]}"
    else
      "${sshd[@]}"
    fi
    wait_for 10 "OAR's sshd on $host" test -s "$dir/run/sshd-$host.pid"
  done
}

add_resources() {
  local entry host
  oarproperty -a host -c >/dev/null 2>&1 || true
  oarproperty -a cpu >/dev/null 2>&1 || true
  oarproperty -a core >/dev/null 2>&1 || true
  for entry in $nodes; do
    host=${entry%%=*}
    oarnodes -J 2>/dev/null | grep -q "\"$host\"" && continue
    for n in $(seq "$cores"); do
      oarnodesetting -a -h "$host" -p host="$host" -p cpu=1 -p core="$n" -p cpuset=$((n - 1)) >/dev/null
    done
  done
}

revive_nodes() {
  # A node OAR marked Suspected or Absent (lost, then restored: its sshd is
  # back) is taken back, as an administrator does once it is repaired.
  local entry host states
  for entry in $nodes; do
    host=${entry%%=*}
    # Read whole first: with pipefail, grep -q stopping at its first match
    # could fail the pipe (oarnodes killed by SIGPIPE) and skip the node.
    states=$(oarnodes -s "$host" 2>/dev/null) || continue
    grep -Eq 'Suspected|Absent|Dead' <<< "$states" || continue
    say "$host: $(grep -Eo 'Suspected|Absent|Dead' <<< "$states" | sort -u | tr '\n' ' ')-> Alive"
    oarnodesetting -s Alive -h "$host" >/dev/null
  done
}

start_server() {
  alive oar-server && return 0
  /usr/sbin/oar-server
  cp /var/run/oar-server.pid "$dir/run/oar-server.pid"
  wait_for 20 "the OAR server" sh -c "ss -ltn | grep -q ':6666 '"
}

descendants() { local child; for child in $(pgrep -P "$1"); do echo "$child"; descendants "$child"; done; }

end_orphaned_jobs() {
  # A job's oarexec (and the job's processes under it) outlives a server
  # killed under it (reparented to init): once a server starts again, with
  # a database started afresh, it would report its old job's end under an
  # id the new server gives again. No server runs here: none of them is a
  # live server's.
  local pid found=()
  for pid in $(pgrep -u oar -P 1 -f '^perl - [0-9]+ OAREXEC$' || true); do
    found+=("$pid" $(descendants "$pid"))
  done
  [ ${#found[@]} -eq 0 ] && return 0
  say "ending the processes of jobs a server that is gone left running: ${found[*]}"
  kill -KILL "${found[@]}" 2>/dev/null || true
}

unfinished_jobs() {  # the ids of the jobs OAR's database holds that have not ended
  { oarstat -J 2>/dev/null || true; } | sed -n 's/^   "\([0-9][0-9]*\)" : {$/\1/p'
}

start() {
  if ! alive oar-server && ss -Hltn 'sport = :6666' | grep -q .; then
    say "an OAR server already listens on port 6666, not this set-up's ($dir): the cluster's? './ddlc cluster down' stops it (OAR's configuration is one per machine)"
    return 1
  fi
  install_packages
  mkdir -p "$dir"/{run,log}
  configure
  create_user
  alive oar-server || end_orphaned_jobs
  start_postgres
  create_database
  start_node_sshd
  add_resources
  start_server
  revive_nodes
  # A job that runs, as the test user, says the whole chain works. On a node
  # just restored (./ddlc cluster's lost node) a job may end in Error while
  # OAR finds the node again (its launch times out: 30 s was too short);
  # OAR then places the next one: up to 3 jobs.
  local probe state attempt
  for attempt in 1 2 3; do
    probe=$(runuser -u "$user" -- sh -c "cd ~ && oarsub -l core=1,walltime=0:02:00 true" |
            sed -n 's/^OAR_JOB_ID=//p')
    wait_for 90 "a first job" sh -c "oarstat -f -J -j $probe | grep -Eq '\"state\" : \"(Terminated|Error)\"'" ||
      return 1
    state=$(oarstat -f -J -j "$probe" | sed -n 's/.*"state" : "\([A-Za-z]*\)".*/\1/p')
    [ "$state" = Terminated ] && break
    say "job $probe ended in $state (attempt $attempt of 3)"
    [ "$attempt" = 3 ] && return 1
  done
  say "up: submit as $user"
}

grant() {
  local path part parent
  for path in "$@"; do
    for path in "$path" "$(readlink -f "$path")"; do
      parent=""
      # From / down: a directory is only testable once its parents are crossable.
      for part in $(dirname "$path" | tr / ' '); do
        parent="$parent/$part"
        runuser -u "$user" -- test -x "$parent" && continue
        setfacl -m "u:$user:x" "$parent"
        echo "$parent" >> "$dir/granted"
      done
    done
    runuser -u "$user" -- test -r "$path" || { say "$user still cannot read $path"; return 1; }
  done
}

revoke() {
  [ -f "$dir/granted" ] || return 0
  sort -u "$dir/granted" | while read -r path; do setfacl -x "u:$user" "$path" || true; done
  rm -f "$dir/granted"
}


stop() {
  stop_one oar-server
  for pidfile in "$dir"/run/sshd*.pid; do [ -e "$pidfile" ] && stop_one "$(basename "$pidfile" .pid)"; done
  stop_one postgres -INT  # PostgreSQL's fast shutdown
  revoke
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  user) echo "$user" ;;
  grant) shift; mkdir -p "$dir"; grant "$@" ;;
  *) echo "usage: $0 start|stop|user|grant PATH..." >&2; exit 2 ;;
esac
