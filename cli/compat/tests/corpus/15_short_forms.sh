#!/bin/bash
#SBATCH -N4
#SBATCH -n16
#SBATCH -t30
#SBATCH -Jshort
#SBATCH -o out.%j
#SBATCH -e err.%j
#SBATCH -p debug
#SBATCH -A physics

srun ./a.out
