#!/usr/bin/env bash
#SBATCH --job-name=reinforce_pro
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --exclusive
#SBATCH --output=slurm-%j.out
# SLURM: start a Ray head on the first node and a Ray worker on every other, wait for the cluster, then
# submit a recipe (default: train_reinforce_baseline_ray.sh) with `ray job submit` from the head.
#
# Runs on: a SLURM allocation of N GPU nodes with the `gpu` extra installed (the same venv path everywhere).
# Takes:   the recipe's time; the allocation ends with the job.
# Use:     MODEL=/models/Qwen2.5-7B-Instruct DATA=/data/train.jsonl sbatch examples/scripts/slurm_ray_job.sh
#          RECIPE=examples/scripts/train_ppo_critic_ray.sh ... to submit another recipe.
set -euo pipefail

cd "${SLURM_SUBMIT_DIR:-.}"
RECIPE=${RECIPE:-examples/scripts/train_reinforce_baseline_ray.sh}
RAY=${RAY:-ray}
GCS_PORT=${GCS_PORT:-6379}
DASHBOARD_PORT=${DASHBOARD_PORT:-8265}
GPUS_PER_NODE=${GPUS_PER_NODE:-${SLURM_GPUS_PER_NODE:-8}}

mapfile -t NODE_LIST < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
HEAD=${NODE_LIST[0]}
HEAD_IP=$(srun --nodes=1 --ntasks=1 -w "$HEAD" hostname --ip-address | awk '{print $1}')
echo "Ray head: $HEAD ($HEAD_IP:$GCS_PORT), workers: ${NODE_LIST[*]:1}"

# The GCS listens on the cluster network (the workers must reach it); the dashboard only on loopback: the
# job is submitted from this script, which runs on the head node.
srun --nodes=1 --ntasks=1 -w "$HEAD" "$RAY" start --head --node-ip-address="$HEAD_IP" --port="$GCS_PORT" \
    --dashboard-host=127.0.0.1 --dashboard-port="$DASHBOARD_PORT" --num-gpus="$GPUS_PER_NODE" --block &
sleep "${RAY_START_WAIT:-15}"
for node in "${NODE_LIST[@]:1}"; do
    srun --nodes=1 --ntasks=1 -w "$node" "$RAY" start --address="$HEAD_IP:$GCS_PORT" \
        --num-gpus="$GPUS_PER_NODE" --block &
done

# Wait until every node has joined (at most 5 minutes).
for _ in $(seq 60); do
    alive=$("$RAY" status --address="$HEAD_IP:$GCS_PORT" 2>/dev/null | grep -c "node_" || true)
    if [[ "$alive" -ge "${#NODE_LIST[@]}" ]]; then break; fi
    sleep "${RAY_POLL_S:-5}"
done

RAY_JOB_ADDRESS="http://127.0.0.1:$DASHBOARD_PORT" NODES=${#NODE_LIST[@]} GPUS_PER_NODE=$GPUS_PER_NODE \
    RAY=$RAY bash "$RECIPE"
