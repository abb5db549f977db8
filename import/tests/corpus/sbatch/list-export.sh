#!/usr/bin/env bash
#SBATCH --array=0,3,7-9%2
#SBATCH --time=5
#SBATCH --export=ALL,DATASET=/data/set-a,MODE=fast,HOME_DIR
#SBATCH --gpus=2
#SBATCH --mem-per-gpu=20G
#SBATCH --comment="nightly reprocessing"
#SBATCH --constraint=haswell
#SBATCH --requeue
echo "$DATASET $MODE $SLURM_ARRAY_TASK_ID"
