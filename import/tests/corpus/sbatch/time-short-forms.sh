#!/bin/sh
#SBATCH -t 45
#SBATCH -n 4
#SBATCH -N 1
#SBATCH -o out-%j.txt
#SBATCH --array=0-30:10%2
echo "chunk $SLURM_ARRAY_TASK_ID with $SLURM_NTASKS tasks"
