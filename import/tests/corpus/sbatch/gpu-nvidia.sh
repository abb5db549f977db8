#!/bin/bash
#SBATCH -J train-resnet
#SBATCH --partition=gpu
#SBATCH --qos=high
#SBATCH --gres=gpu:a100:2
#SBATCH -c 8
#SBATCH --mem-per-cpu=8G
#SBATCH --time=1-12
#SBATCH --chdir=/scratch/resnet

module load cuda/12.4 pytorch
python train.py --gpus 2
