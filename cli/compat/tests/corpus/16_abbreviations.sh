#!/bin/bash
#SBATCH --ntasks-per-n=4
#SBATCH --nodes=3
#SBATCH --job=abbrev
#SBATCH --part=normal
#SBATCH --dep=afterany:77

srun ./a.out
