#!/bin/bash
#SBATCH --ntasks=512
#SBATCH --time=04:00:00
#SBATCH --job-name=lammps

mpirun -np $SLURM_NTASKS lmp -in in.lj
