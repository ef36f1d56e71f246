#!/bin/bash -l
#SBATCH -N 16
#SBATCH --ntasks-per-node=128
#SBATCH -t 12:00:00
#SBATCH -p normal
#SBATCH -J cfd-run

module load cray-mpich
srun ./solver input.nml
