#!/bin/bash
#SBATCH --job-name=param-sweep
#SBATCH --array=1-1000%50
#SBATCH --time=2:00:00
#SBATCH --mem=4G
#SBATCH --cpus-per-task=2
#SBATCH --output=logs/%x-%A_%a.out
#SBATCH --error=logs/%x-%A_%a.err

module load python/3.11
echo "task $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_TASK_COUNT in job $SLURM_ARRAY_JOB_ID"
python3 sweep.py --point "$SLURM_ARRAY_TASK_ID"
