#!/bin/bash
#SBATCH --job-name=md-rocm
#SBATCH --nodes=2
#SBATCH --gpus-per-node=mi300x:4
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=16
#SBATCH --mem=512G
#SBATCH --time=2-00:30:00

module load rocm/6.1
srun --ntasks-per-node=4 --gpus-per-task=1 ./md-engine input.tpr
