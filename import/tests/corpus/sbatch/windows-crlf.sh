#!/bin/bash
#SBATCH --job-name=from-windows
#SBATCH --time=0-01:15
#SBATCH --mem=1500M

echo "hello from a script saved on Windows"
