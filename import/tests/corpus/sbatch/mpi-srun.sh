#!/bin/bash -l
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=32
#SBATCH --time=30:00
#SBATCH --mem-per-cpu=2000
#SBATCH --exclusive
#SBATCH --account=proj-123
#SBATCH --mail-type=END,FAIL
#SBATCH --mail-user=someone@example.org

module purge
module load openmpi/4.1 gromacs
srun --mpi=pmix gmx_mpi mdrun -s topol.tpr -deffnm run
