# Sourced at the start of every workflow job (the Snakefile's shell prefix):
# the job holds the host-wide measuring lock shared until it ends, so it
# waits while a measurement holds the machine, and no measurement starts
# while it runs (ddlcompare/run/machine_lock.py). A measuring job's command turns
# this same hold exclusive while it measures.
#   source share_machine.sh JOURNAL
# JOURNAL: a file that gets one line per job, "<start> <end> <command>"
# (unix seconds: from the moment the job held the machine to its end), to
# check afterwards that no job ran inside a measured window.
ddlc_lock=${DDLC_MEASURE_LOCK:-/tmp/ddl-compare.measure.lock}
ddlc_journal=$1
ddlc_now() { date +%s.%N; }
ddlc_queued=$(ddlc_now)
# Any entry at the stop file's path is a stop request, a link to nowhere too.
ddlc_stop_file() { [ -n "${DDLC_STOP_FILE:-}" ] && { [ -e "$DDLC_STOP_FILE" ] || [ -L "$DDLC_STOP_FILE" ]; }; }
ddlc_stop_asked() {
  if ddlc_stop_file; then
    echo "stopped: the workflow was told to stop while this job waited for the machine; it did not start" >&2
    exit 143
  fi
}
# A job under a scheduler adds its wait to its time limit, a minute ahead of
# the wait, so that waiting never spends the time its command was given:
# Slurm's `scontrol update TimeLimit+=` (an operator's right on most
# clusters, root's on ./ddlc cluster), OAR's oarwalltime (where the cluster
# allows walltime changes). Where the scheduler refuses, it says so once.
ddlc_extended=0
# The job's own stderr, for the warning below: the turnstile's wait sends
# flock's errors to /dev/null, and the warning went with them.
exec {ddlc_stderr}>&2
ddlc_extend_limit() {
  local waited
  waited=$(awk "BEGIN { print int($(ddlc_now) - $ddlc_queued) }")
  while [ "$ddlc_extended" -ge 0 ] && [ $((ddlc_extended * 60)) -le "$waited" ]; do
    if [ -n "${SLURM_JOB_ID:-}" ]; then
      ddlc_said=$(scontrol update JobId="$SLURM_JOB_ID" TimeLimit+=1 2>&1) || ddlc_extended=-1
    elif [ -n "${OAR_JOB_ID:-}" ]; then
      # OAR grants an increase only up to the next job planned on the same
      # nodes, unless the request may delay it: that job would wait for the
      # machine too. Where the cluster does not let users delay others, the
      # increase that fits.
      ddlc_said=$(oarwalltime --force --delay-next-jobs "$OAR_JOB_ID" +0:01:00 2>&1) ||
        ddlc_said=$(oarwalltime --force "$OAR_JOB_ID" +0:01:00 2>&1) || ddlc_extended=-1
    else
      return 0
    fi
    if [ "$ddlc_extended" -lt 0 ]; then
      echo "warning: the scheduler did not add this job's wait for the machine to its time limit ($ddlc_said): the wait counts against it" >&"$ddlc_stderr"
      return 0
    fi
    ddlc_extended=$((ddlc_extended + 1))
  done
}
# flock in short tries (exit 75: not yet), so that between them a job whose
# workflow was told to stop gives up the wait (75). The caller says why and
# ends (ddlc_stop_asked): here the message could go where the caller sends
# flock's own errors (the turnstile's go to /dev/null).
ddlc_flock() {
  local rc
  while :; do
    rc=0
    flock -E 75 -w 2 "$@" || rc=$?
    [ $rc = 75 ] || return $rc
    ! ddlc_stop_file || return 75
    ddlc_extend_limit
  done
}
if [ -n "${DDLC_MACHINE_HELD:-}" ]; then
  :  # started by a measurement (a bench's workflow): part of it, no lock of its own
elif command -v flock >/dev/null; then
  [ -e "$ddlc_lock" ] || { : >>"$ddlc_lock"; chmod 0666 "$ddlc_lock"; } 2>/dev/null || true
  # A FIFO would hang the open below, a missing folder fail it: say which.
  if [ ! -f "$ddlc_lock" ] || [ ! -r "$ddlc_lock" ]; then
    echo "error: the measuring lock $ddlc_lock is not a readable file (a missing folder, a FIFO, a device?); set DDLC_MEASURE_LOCK to a file in an existing folder, or unset it" >&2
    exit 2
  fi
  exec 9<"$ddlc_lock"  # read-only is enough to lock, whoever made the file
  # A measurement waiting for the machine holds the turnstile: queue behind it.
  [ -e "$ddlc_lock.turn" ] || { : >>"$ddlc_lock.turn"; chmod 0666 "$ddlc_lock.turn"; } 2>/dev/null || true
  # A wait killed by a signal ends the job: it never jumps the queue.
  ddlc_flock -s "$ddlc_lock.turn" true 2>/dev/null || {
    ddlc_rc=$?
    ddlc_stop_asked
    [ $ddlc_rc -le 128 ] || exit $ddlc_rc
  }
  if ! flock -s -n 9; then
    echo "waiting for the machine: a measurement holds $ddlc_lock ($(head -c 200 "$ddlc_lock"))" >&2
    ddlc_flock -s 9 || { ddlc_rc=$?; ddlc_stop_asked; exit $ddlc_rc; }
  fi
  ddlc_stop_asked
else
  echo "warning: no flock command: this job does not wait for measurements (install util-linux)" >&2
fi
exec {ddlc_stderr}>&-
ddlc_job_start=$(ddlc_now)
# What a measurement in this job waited for the machine, counting this wait.
export DDLC_JOB_WAITED_S
DDLC_JOB_WAITED_S=$(awk "BEGIN { print $ddlc_job_start - $ddlc_queued }")
mkdir -p "$(dirname "$ddlc_journal")"
# The job's own command: what follows the prefix's last word.
ddlc_job=${BASH_EXECUTION_STRING##*: ddlc-job; }
ddlc_job_ended() {
  printf '%s %s %s\n' "$ddlc_job_start" "$(ddlc_now)" "${ddlc_job//$'\n'/ }" \
    >>"$ddlc_journal" 2>/dev/null || true
}
trap ddlc_job_ended EXIT
