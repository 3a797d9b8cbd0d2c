#!/bin/bash
# A stand-in for a training job that checkpoints on SIGTERM and resumes from its
# checkpoint, used by the Slurm integration tests and the local environment.
#
#   sbatch --requeue [-w NODE] checkpoint_job.sh OUTDIR [STEPS] [STEP_SECONDS]
#
# It runs STEPS numbered steps (each STEP_SECONDS long), folding each step number
# into a running result. On SIGTERM it writes OUTDIR/checkpoint ("NEXT_STEP RESULT")
# and exits 143 (128+TERM) without finishing. When started with a checkpoint present
# it resumes from it. When all steps are done it writes OUTDIR/result and exits 0.
# Every event is appended to OUTDIR/events (one line each: event, job id, restart
# count, node, step), so a test can tell what happened where.
set -u
out=${1:?usage: checkpoint_job.sh OUTDIR [STEPS] [STEP_SECONDS]}
steps=${2:-20}
dt=${3:-0.2}
mkdir -p "$out"
ckpt="$out/checkpoint"
node=${SLURMD_NODENAME:-$(hostname)}
jid=${SLURM_JOB_ID:-none}
restarts=${SLURM_RESTART_COUNT:-0}

log() { echo "$1 job=$jid restart=$restarts node=$node step=$2 result=$3 time=$(date +%s.%N)" >>"$out/events"; }

step=0
acc=7
if [ -s "$ckpt" ]; then
  read -r step acc <"$ckpt"
fi
first=$step
log start "$step" "$acc"

term=0
trap 'term=1' TERM

while [ "$step" -lt "$steps" ]; do
  if [ "$term" -eq 1 ]; then
    echo "$step $acc" >"$ckpt.tmp" && mv -f "$ckpt.tmp" "$ckpt"
    log checkpoint "$step" "$acc"
    exit 143
  fi
  acc=$(( (acc * 31 + step * step + 1) % 1000003 ))
  step=$((step + 1))
  # Sleep in the background and wait, so the TERM trap runs at once.
  sleep "$dt" &
  wait $! 2>/dev/null || true
done
if [ "$term" -eq 1 ]; then
  # TERM arrived during the last step: the work is done anyway.
  :
fi
echo "$acc" >"$out/result"
log done "$step" "$acc"
echo "finished steps=$steps first_step=$first result=$acc"
exit 0
